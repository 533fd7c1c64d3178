"""Graph patterns: the language (``core``), the block matcher (``graph``) and rewriting of
matched subgraphs (``rewrite``).

    from tilework.pattern import is_op, wildcard, is_const, find_matches, rewrite_subgraphs

    mm = is_op("matmul", wildcard("x"), wildcard("w")).single_use()
    bias_add = is_op("add", mm, wildcard("b").has_rank(1)).has_dtype("float32")
    for m in find_matches(bias_add, mod):
        print(m.root_binding.var, [b.var for b in m.bindings], m.inputs, m.outputs)
    mod = rewrite_subgraphs(mod, [(bias_add, lambda m: op.linear(...))])
"""

from tilework.pattern.core import (
    AllOf,
    AnyOf,
    Check,
    IsConst,
    IsItem,
    IsOp,
    IsTuple,
    IsVar,
    Match,
    Named,
    Not,
    Pattern,
    Predicate,
    Wildcard,
    dim_holds,
    is_const,
    is_item,
    is_op,
    is_tuple,
    is_var,
    op_call,
    wildcard,
)
from tilework.pattern.graph import BlockGraph, PatternMatch, find_matches, graphs_of, match_at, out_info
from tilework.pattern.rewrite import Replacement, rewrite_blocks, rewrite_subgraphs

__all__ = [
    "AllOf",
    "AnyOf",
    "Check",
    "IsConst",
    "IsItem",
    "IsOp",
    "IsTuple",
    "IsVar",
    "Match",
    "Named",
    "Not",
    "Pattern",
    "Predicate",
    "Wildcard",
    "dim_holds",
    "is_const",
    "is_item",
    "is_op",
    "is_tuple",
    "is_var",
    "op_call",
    "wildcard",
    "BlockGraph",
    "PatternMatch",
    "find_matches",
    "graphs_of",
    "match_at",
    "out_info",
    "Replacement",
    "rewrite_blocks",
    "rewrite_subgraphs",
]
