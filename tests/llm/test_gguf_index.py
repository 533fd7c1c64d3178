"""``read_gguf``: the JSON index of a GGUF file's metadata and tensor table kept in the cache
directory gives what ``gguf.GGUFReader`` reads, is data only, and a damaged or stale one is
read again from the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tilework.errors import TileworkError, UnsupportedError
from tilework.llm.gguf import GGUFFile, open_gguf, raw_tensors, read_gguf

gguf = pytest.importorskip("gguf")


def _write(path: Path, rows: int = 4, value: float = 1.0) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tiny ünïcode")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "\u0120c"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.25, 3.0])
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tensor("token_embd.weight", np.full((rows, 8), value, np.float32))
    w.add_tensor("output_norm.weight", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _index_files(cache: Path) -> list[Path]:
    return sorted((cache / "llm").glob("gguf-*.json"))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _same(a: GGUFFile, b: GGUFFile) -> None:
    assert a.metadata == b.metadata
    assert a.tensors == b.tensors
    ta, tb = raw_tensors(a), raw_tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].shape == tb[name].shape and ta[name].fmt == tb[name].fmt
        assert np.array_equal(ta[name].data, tb[name].data)


def test_the_index_gives_what_the_reader_reads(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path)
    first = read_gguf(path)  # reads the file, writes the index
    assert len(_index_files(cache)) == 1
    index = json.loads(_index_files(cache)[0].read_text())
    assert set(index) == {"version", "metadata", "tensors"}  # data only
    second = read_gguf(path)  # from the index
    _same(first, second)
    _same(second, read_gguf(open_gguf(path)))
    assert second.metadata["general.name"] == "tiny ünïcode"
    assert second.metadata["tokenizer.ggml.scores"] == [0.5, -1.25, 3.0]
    assert dict((t.name, t.shape) for t in second.tensors) == {"token_embd.weight": (4, 8), "output_norm.weight": (8,)}


def test_a_changed_file_is_read_again(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path, rows=4)
    assert read_gguf(path).tensors[0].shape == (4, 8)
    _write(path, rows=6, value=2.0)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1_000_000))
    again = read_gguf(path)
    assert again.tensors[0].shape == (6, 8)
    assert float(raw_tensors(again)["token_embd.weight"].dequantize().max()) == 2.0


@pytest.mark.parametrize("damage", ["not json", '{"version": 1}', '{"version": 99, "metadata": {}, "tensors": []}', '{"version": 1, "metadata": {}, "tensors": [["x", 0]]}'])
def test_a_damaged_index_is_ignored(tmp_path: Path, cache: Path, damage: str) -> None:
    path = tmp_path / "m.gguf"
    _write(path)
    want = read_gguf(path)
    _index_files(cache)[0].write_text(damage)
    _same(read_gguf(path), want)


def test_an_index_past_the_end_of_the_file_is_an_error(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path)
    read_gguf(path)
    index = _index_files(cache)[0]
    blob = json.loads(index.read_text())
    blob["tensors"][0][3] = os.path.getsize(path)  # an offset at the end of the file
    index.write_text(json.dumps(blob))
    with pytest.raises(TileworkError, match="truncated"):
        raw_tensors(read_gguf(path))


def test_not_a_gguf_file(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(UnsupportedError, match="not a GGUF file"):
        read_gguf(path)
    with pytest.raises(TileworkError, match="no such file"):
        read_gguf(tmp_path / "missing.gguf")
    assert not _index_files(cache)


def test_without_a_cache_nothing_is_written(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path)
    read_gguf(path, use_cache=False)
    assert not _index_files(cache)
