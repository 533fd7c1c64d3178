"""Fuzzing the executable loader: files cut short, with bits flipped or bytes spliced in (the
header's digest must catch them), and files whose JSON metadata or sections were changed and
then signed again with a correct digest, so that every check behind the digest is reached.
Every file loads or raises a ``TileworkError``, and every file that loads is run on small
inputs: the run gives a result or a ``TileworkError`` (the VM checks each kernel call of a
loaded executable against the kernel's loop IR), never a crash."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import tilework as tw
from tests.fuzz.util import fuzz_settings, result_or_tilework_error
from tests.test_errors import TEXT_MODULE
from tilework.runtime.archive import ALIGN, HEADER

X = np.arange(6, dtype=np.float32).reshape(2, 3)
Y = np.ones((3, 2), np.float32)


@functools.cache
def executable_bytes(target: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.tw")
        tw.build(tw.parse(TEXT_MODULE), target=target).save(path)
        with open(path, "rb") as f:
            return f.read()


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The metadata and the section area of a file."""
    magic, version, flags, meta_len, data_len, _ = HEADER.unpack_from(data, 0)
    meta = json.loads(data[HEADER.size : HEADER.size + meta_len])
    start = HEADER.size + meta_len + (-(HEADER.size + meta_len)) % ALIGN
    return meta, data[start : start + data_len]


def signed(meta: Any, sections: bytes, data: bytes) -> bytes:
    """A file with ``meta`` and ``sections`` and a digest that matches them."""
    magic, version, flags, _, _, _ = HEADER.unpack_from(data, 0)
    body = json.dumps(meta, separators=(",", ":")).encode()
    digest = hashlib.sha256(body + sections).digest()
    pad = b"\0" * ((-(HEADER.size + len(body))) % ALIGN)
    return HEADER.pack(magic, version, flags, len(body), len(sections), digest) + body + pad + sections


def load(data: bytes) -> None:
    fd, path = tempfile.mkstemp(suffix=".tw")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        exe = result_or_tilework_error(lambda: tw.load(path))
        if exe is not None:
            exe.stats()
            vm = result_or_tilework_error(lambda: tw.VM(exe))  # binds builtins, builds lazy kernels
            if vm is not None:
                result_or_tilework_error(lambda: [vm[name](X, Y) for name in exe.functions])
    finally:
        os.unlink(path)


@fuzz_settings(60)
@given(st.sampled_from(["interp", "cpu"]), st.data())
def test_damaged_files(target: str, draw: st.DataObject) -> None:
    buf = bytearray(executable_bytes(target))
    kind = draw.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if kind == "truncate":
        buf = buf[: draw.draw(st.integers(0, len(buf) - 1))]
    elif kind == "flip":
        for _ in range(draw.draw(st.integers(1, 8))):
            i = draw.draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw.draw(st.integers(0, 7))
    else:
        i = draw.draw(st.integers(0, len(buf)))
        buf[i:i] = draw.draw(st.binary(min_size=1, max_size=16))
    load(bytes(buf))


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, 1, -1, 2, 3, 7, 10, 64, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["", "main", "x", "float32", "int64", "kernel", "builtin", "r", "i", "c", "t", "f", "vm_alloc_tensor", "fused_permute_dims_add"]),
)
JSON = st.recursive(JSON_LEAVES, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(["t", "f", "name", "x"]), kids, max_size=2), max_leaves=6)


def _paths(v: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*at, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, (*at, i))
    return out


def _mutate_json(meta: Any, draw: st.DataObject) -> Any:
    path = draw.draw(st.sampled_from(_paths(meta)[1:]))
    parent = functools.reduce(lambda v, k: v[k], path[:-1], meta)
    key, old = path[-1], functools.reduce(lambda v, k: v[k], path, meta)
    kind = draw.draw(st.sampled_from(["replace", "delete", "nudge", "duplicate", "swap"]))
    if kind == "delete":
        del parent[key]
    elif kind == "nudge" and isinstance(old, int) and not isinstance(old, bool):
        parent[key] = old + draw.draw(st.sampled_from([-1, 1, 2, 1000]))
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, old)
    elif kind == "swap" and isinstance(parent, list) and len(parent) > 1:
        other = draw.draw(st.integers(0, len(parent) - 1))
        parent[key], parent[other] = parent[other], parent[key]
    else:
        parent[key] = draw.draw(JSON)
    return meta


@fuzz_settings(120)
@given(st.sampled_from(["interp", "cpu"]), st.data())
def test_signed_mutated_metadata(target: str, draw: st.DataObject) -> None:
    data = executable_bytes(target)
    meta, sections = split(data)
    for _ in range(draw.draw(st.integers(1, 3))):
        meta = _mutate_json(meta, draw)
    load(signed(meta, sections, data))


@fuzz_settings(60)
@given(st.data())
def test_signed_mutated_sections(draw: st.DataObject) -> None:
    """The loop IR (parsed, then rebuilt by the interpreter target) and the native code
    section (ignored unless trusted) changed behind a valid digest."""
    data = executable_bytes("interp")
    meta, sections = split(data)
    buf = bytearray(sections)
    for _ in range(draw.draw(st.integers(1, 6))):
        i = draw.draw(st.integers(0, len(buf) - 1))
        if draw.draw(st.booleans()):
            buf[i] = draw.draw(st.sampled_from(b"()[]:,=+-*/0123456789 \nabnmxy@"))
        else:
            del buf[i]
    meta["sections"][0]["nbytes"] = len(buf) - (len(sections) - meta["sections"][0]["nbytes"])
    load(signed(meta, bytes(buf), data))


def test_the_unmutated_files_run() -> None:
    for target in ("interp", "cpu"):
        data = executable_bytes(target)
        meta, sections = split(data)
        fd, path = tempfile.mkstemp(suffix=".tw")
        with os.fdopen(fd, "wb") as f:
            f.write(signed(meta, sections, data))
        try:
            np.testing.assert_array_equal(tw.VM(tw.load(path))["main"](X, Y), X + Y.T)
        finally:
            os.unlink(path)
