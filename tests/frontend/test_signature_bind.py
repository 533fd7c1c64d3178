"""``Signature.bind`` takes a call's inputs in the order found for the first call of the same
form (positional count, keywords in order) when every argument is an array or a tensor: the
same inputs as flattening the torch pytree spec, for every form; calls that do not match still
raise with their own values in the message; non-leaf arguments take the full path."""

from __future__ import annotations

import numpy as np
import pytest

from tilework.errors import TileworkError
from tilework.frontend.registry import Signature

torch = pytest.importorskip("torch", reason="torch is an optional extra")
pytree = pytest.importorskip("torch.utils._pytree")


def _signature(nargs: int, keywords: list[str]) -> Signature:
    leaf = torch.zeros(1)
    _, spec = pytree.tree_flatten((tuple(leaf for _ in range(nargs)), {k: leaf for k in keywords}))
    names = [f"arg{i}" for i in range(nargs)] + keywords
    return Signature([{"name": n, "tensor": True, "value": None} for n in names], pytree.treespec_dumps(spec), None)


def _slow(sig: Signature, args: tuple, kwargs: dict) -> list:
    return sig._flatten(args, kwargs)


@pytest.mark.parametrize("seq", [1, 7])
def test_every_call_form_gives_the_flattened_inputs(seq: int) -> None:
    sig = _signature(1, ["input_ids", "attention_mask", "token_type_ids"])
    x, ids, mask, types = (torch.full((1, seq), float(i)) for i in range(4))
    calls = [
        ((x,), {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}),
        ((x,), {"token_type_ids": types, "input_ids": ids, "attention_mask": mask}),  # keywords in another order
        ((x, ids), {"attention_mask": mask, "token_type_ids": types}),  # a keyword input given by position
        ((x, ids, mask, types), {}),
        ((x.numpy(),), {"input_ids": ids.numpy(), "attention_mask": mask, "token_type_ids": types}),
    ]
    for _ in range(2):  # the second time from the orders found the first
        for args, kwargs in calls:
            got = sig.bind(args, kwargs)
            assert [id(v) for v in got] == [id(v) for v in _slow(sig, args, kwargs)]
            assert [id(v) for v in got] == [id(v) for v in (x if not isinstance(args[0], np.ndarray) else args[0], *_by_name(args, kwargs))]
    assert len(sig._orders) == 4


def _by_name(args: tuple, kwargs: dict) -> list:
    rest = dict(zip(["input_ids", "attention_mask", "token_type_ids"], args[1:]))
    rest.update(kwargs)
    return [rest["input_ids"], rest["attention_mask"], rest["token_type_ids"]]


def test_a_call_that_does_not_match_raises_with_its_values() -> None:
    sig = _signature(1, ["mask"])
    x, m = torch.zeros(2), torch.ones(2)
    sig.bind((x,), {"mask": m})
    with pytest.raises(TileworkError, match="does not match") as info:
        sig.bind((x,), {"other": m})
    assert "_Mark" not in str(info.value)
    assert not any("other" in form for form in sig._orders)
    with pytest.raises(TileworkError, match="does not match"):
        sig.bind((x, m, m), {})


def test_non_leaf_arguments_take_the_full_path() -> None:
    leaf = torch.zeros(1)
    _, spec = pytree.tree_flatten(((leaf, [leaf, leaf]), {}))
    sig = Signature([{"name": n, "tensor": True, "value": None} for n in "abc"], pytree.treespec_dumps(spec), None)
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [id(v) for v in sig.bind((a, [b, c]), {})] == [id(a), id(b), id(c)]
    assert not sig._orders
