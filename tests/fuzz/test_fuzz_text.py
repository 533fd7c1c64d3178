"""Fuzzing the text parser: token soup, random characters, and real printed modules mutated
(spans cut, repeated, swapped; tokens replaced; lines re-indented). Every input parses to a
module or raises a ``TileworkError``; a module that parses also verifies or raises one, prints,
and parses back from its print to a structurally equal module (invariant 3)."""

from __future__ import annotations

import textwrap

from hypothesis import given
from hypothesis import strategies as st

import tilework.text
from tests.fuzz.util import fuzz_settings, result_or_tilework_error
from tests.text.modules import graph_module
from tilework.ir.structural import structural_equal
from tilework.ir.verify import verify
from tilework.models.reference import TransformerConfig, transformer_block
from tilework.ir import sym
from tilework.text import parse, print_module

SEEDS = [
    print_module(graph_module()),
    textwrap.dedent(tilework.text.__doc__.split("A module is a sequence of items::", 1)[1].split("Every sym var", 1)[0]),
    print_module(transformer_block(TransformerConfig(layers=1, hidden=8, heads=2, ffn=16), sym.SymVar("batch", 1), sym.SymVar("seq", 1, 64))),
]

WORDS = (
    "@graph @tensor def main x y n m sym lo hi with dataflow ( ) output return Tensor Shape Prim Tuple Any Func "
    "Buffer for in range parallel block spatial reduce reads writes if else match_cast call_tensor const meta "
    "shape prim add exp matmul float32 int64 bool -> : = , . [ ] { } + - * // % < <= == 1 0 4 -1 2.5 1e400 "
    '"float32" "x" \'\\x\' @kernel @ # \\n'
).split()


def _check(text: str) -> None:
    mod = result_or_tilework_error(lambda: parse(text))
    if mod is None:
        return
    result_or_tilework_error(lambda: verify(mod))
    printed = print_module(mod)
    back = parse(printed)
    assert structural_equal(mod, back), f"does not round-trip:\n{text}\n--- printed ---\n{printed}"


@fuzz_settings(150)
@given(st.lists(st.sampled_from(WORDS) | st.sampled_from(["\n", "\n    ", "\n        ", " "]), max_size=60))
def test_token_soup(words: list[str]) -> None:
    _check(" ".join(words))


@fuzz_settings(100)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_random_characters(text: str) -> None:
    _check(text)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        kind = draw(st.sampled_from(["cut", "repeat", "swap_lines", "replace", "insert", "indent"]))
        i = draw(st.integers(0, len(text) - 1))
        j = draw(st.integers(i, min(len(text), i + 40)))
        if kind == "cut":
            text = text[:i] + text[j:]
        elif kind == "repeat":
            text = text[:j] + text[i:j] + text[j:]
        elif kind == "replace":
            text = text[:i] + draw(st.sampled_from(WORDS)) + text[j:]
        elif kind == "insert":
            text = text[:i] + draw(st.text(max_size=5)) + text[i:]
        else:
            lines = text.split("\n")
            a = draw(st.integers(0, len(lines) - 1))
            b = draw(st.integers(0, len(lines) - 1))
            if kind == "swap_lines":
                lines[a], lines[b] = lines[b], lines[a]
            else:
                lines[a] = " " * draw(st.integers(0, 12)) + lines[a].lstrip(" ")
            text = "\n".join(lines)
    return text


@fuzz_settings(100)
@given(mutated())
def test_mutated_real_modules(text: str) -> None:
    _check(text)


def test_seeds_parse() -> None:
    """The seeds themselves are valid, so the mutations start from real modules."""
    for text in SEEDS:
        assert structural_equal(parse(text), parse(print_module(parse(text))))
