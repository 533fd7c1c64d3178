"""The tilework file container: a checked header, JSON metadata and raw sections.

Layout (all integers little-endian; ``docs/executable-format.md`` is the full description)::

    offset 0   magic     8 bytes  b"\\x89TWEXE\\r\\n"
           8   version   u32      FORMAT_VERSION
          12   flags     u32      0
          16   meta_len  u64      bytes of the JSON metadata
          24   data_len  u64      bytes of the section area
          32   sha256    32 bytes digest of the metadata and the section area, in file order
          64   metadata  meta_len bytes of UTF-8 JSON
               padding   to a multiple of 64
               sections  data_len bytes; each section starts 64-byte aligned

The metadata lists the sections (``{"name", "offset", "nbytes"}``, offsets relative to the
section area) beside whatever the writer stores. Reading checks the magic, the version, the
lengths against the file size and the digest before anything is interpreted, and every error
names the file and the problem. Nothing in a file is executed: the metadata is parsed as JSON,
arrays are raw bytes with a dtype and shape, text is text. The file is memory-mapped, so arrays
read from it are read-only views that cost no copy. Writes go through ``tilework.runtime.atomic``
(a temporary file that replaces the target atomically; a target that is not a regular file is
refused, a symbolic link is written through).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import zipfile
from typing import Any

import numpy as np

from tilework.errors import FileFormatError, TileworkError
from tilework.ir.dtype import decode_array, encode_array
from tilework.runtime.atomic import write_atomic

MAGIC = b"\x89TWEXE\r\n"
FORMAT_VERSION = 2
HEADER = struct.Struct("<8sIIQQ32s")  # 64 bytes
ALIGN = 64
_ZIP_MAGIC = b"PK\x03\x04"


class FormatError(FileFormatError):
    """A file is not a readable tilework file: wrong kind, other version, truncated, corrupt."""


def _pad(n: int) -> int:
    return (-n) % ALIGN


class ArchiveWriter:
    """Collects sections and metadata, then ``write(path)`` puts them in one file."""

    def __init__(self) -> None:
        self.sections: list[dict[str, Any]] = []
        self._blobs: list[bytes] = []
        self._size = 0

    def add_bytes(self, name: str, data: bytes) -> int:
        """Add a section; returns its index."""
        pad = _pad(self._size)
        if pad:
            self._blobs.append(b"\0" * pad)
            self._size += pad
        self.sections.append({"name": name, "offset": self._size, "nbytes": len(data)})
        self._blobs.append(data)
        self._size += len(data)
        return len(self.sections) - 1

    def add_text(self, name: str, text: str) -> int:
        return self.add_bytes(name, text.encode("utf-8"))

    def add_array(self, name: str, a: np.ndarray) -> dict[str, Any]:
        """Add an array as a section; returns its entry ``{"section", "dtype", "shape"}``."""
        dtype, shape, raw = encode_array(a)
        return {"section": self.add_bytes(name, raw), "dtype": dtype, "shape": list(shape)}

    def write(self, path: str, meta: dict[str, Any]) -> None:
        body = json.dumps({**meta, "sections": self.sections}, separators=(",", ":"), allow_nan=False).encode("utf-8")
        head_pad = b"\0" * _pad(HEADER.size + len(body))
        digest = hashlib.sha256()
        digest.update(body)
        for blob in self._blobs:
            digest.update(blob)
        header = HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body), self._size, digest.digest())

        def put(f: Any) -> None:
            f.write(header)
            f.write(body)
            f.write(head_pad)
            for blob in self._blobs:
                f.write(blob)

        write_atomic(path, put)


class Archive:
    """A tilework file opened for reading; see the module docstring."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise FormatError(f"{path!r} is empty: not a tilework executable")
                self._map: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise TileworkError(f"cannot read {path!r}: {e.strerror or e}") from None
        view = memoryview(self._map)
        if size < HEADER.size:
            if bytes(view[:4]) == _ZIP_MAGIC:
                self._refuse_zip()
            raise FormatError(f"{path!r} is truncated or not a tilework executable ({size} bytes, the header alone is {HEADER.size})")
        magic, version, _flags, meta_len, data_len, digest = HEADER.unpack_from(view, 0)
        if magic != MAGIC:
            if bytes(view[:4]) == _ZIP_MAGIC:
                self._refuse_zip()
            if path.endswith(".onnx"):
                raise FormatError(f"{path!r} is an ONNX model, not a tilework executable: compile it first (tilework build {path} -o model.tw, or tilework.compile)")
            raise FormatError(f"{path!r} is not a tilework executable (no tilework header)")
        if version != FORMAT_VERSION:
            age = "an older" if version < FORMAT_VERSION else "a newer"
            raise FormatError(f"{path!r} has executable format version {version}, written by {age} tilework; this one reads version {FORMAT_VERSION}: rebuild the model with this version")
        data_at = HEADER.size + meta_len + _pad(HEADER.size + meta_len)
        if data_at + data_len != size:
            raise FormatError(f"{path!r} is truncated or has trailing bytes: the header announces {data_at + data_len} bytes, the file has {size}")
        check = hashlib.sha256()
        check.update(view[HEADER.size : HEADER.size + meta_len])
        check.update(view[data_at : data_at + data_len])
        if check.digest() != digest:
            raise FormatError(f"{path!r} is corrupt: its content does not match the digest in its header")
        try:
            meta = json.loads(bytes(view[HEADER.size : HEADER.size + meta_len]).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FormatError(f"{path!r} has malformed metadata: {e}") from None
        if not isinstance(meta, dict):
            raise FormatError(f"{path!r} has malformed metadata: not an object")
        self.meta: dict[str, Any] = meta
        self._data = view[data_at : data_at + data_len]
        self._sections = self._check_sections(meta.get("sections"), data_len)

    def _refuse_zip(self) -> None:
        """Refuse a zip archive, saying which kind: tilework's format 1 (a manifest and pickles,
        never loaded), a torch.export program, a NumPy .npz, or another (only its directory of
        names is read)."""
        try:
            with zipfile.ZipFile(self.path) as zf:
                names = zf.namelist()
        except (OSError, zipfile.BadZipFile, ValueError, EOFError):
            names = []
        bases = {n.rpartition("/")[2] for n in names}
        if "manifest.json" in names and any(n.endswith(".pkl") for n in names):
            raise FormatError(
                f"{self.path!r} is an executable of format 1 (a zip archive of pickles, written by an older tilework); "
                "this version never loads pickles: rebuild the model with this version of tilework"
            )
        if "archive_format" in bases or any(n.endswith("serialized_exported_program.json") for n in names):
            raise FormatError(f"{self.path!r} is a torch.export program (.pt2), not a tilework executable: compile it first (tilework build {self.path} -o model.tw, or tilework.compile)")
        if names and all(n.endswith(".npy") for n in names):
            raise FormatError(f"{self.path!r} is a NumPy .npz archive, not a tilework executable")
        raise FormatError(f"{self.path!r} is a zip archive, not a tilework executable")

    def _check_sections(self, sections: Any, data_len: int) -> list[tuple[int, int]]:
        if not isinstance(sections, list):
            raise FormatError(f"{self.path!r} has malformed metadata: no section table")
        out = []
        for s in sections:
            if not isinstance(s, dict) or type(s.get("offset")) is not int or type(s.get("nbytes")) is not int:
                raise FormatError(f"{self.path!r} has a malformed section entry {s!r}")
            off, n = s["offset"], s["nbytes"]
            if off < 0 or n < 0 or off + n > data_len:
                raise FormatError(f"{self.path!r}: section {s.get('name')!r} lies outside the file")
            out.append((off, n))
        return out

    def section(self, index: Any) -> memoryview:
        """The bytes of section ``index`` (a read-only view of the mapped file)."""
        if type(index) is not int or not 0 <= index < len(self._sections):
            raise FormatError(f"{self.path!r}: reference to a missing section {index!r}")
        off, n = self._sections[index]
        return self._data[off : off + n]

    def text(self, index: Any) -> str:
        try:
            return bytes(self.section(index)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{self.path!r}: section {index} is not UTF-8 text ({e})") from None

    def array(self, entry: Any, *, copy: bool = False) -> np.ndarray:
        """The array of an entry made by ``ArchiveWriter.add_array`` (read-only unless
        ``copy``)."""
        if not isinstance(entry, dict):
            raise FormatError(f"{self.path!r}: malformed array entry {entry!r}")
        try:
            return decode_array(entry.get("dtype"), entry.get("shape"), self.section(entry.get("section")), copy=copy)
        except FormatError:
            raise
        except TileworkError as e:
            raise FormatError(f"{self.path!r}: {e}") from None


__all__ = ["Archive", "ArchiveWriter", "FormatError", "FORMAT_VERSION", "MAGIC"]
