"""Reading the model files commands take (``build``, ``export``, ...): one place, so that every
command names the file and says what is wrong with it in the same words (docs/errors.md)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Sequence

from tilework.errors import ParseError, TileworkError, WellFormedError

MODEL_INPUTS = "a module in the text format, a .pt2 program (torch.export.save) or an .onnx model, told apart by the file's extension"
_BINARY_KINDS = ((b"PK\x03\x04", "a zip archive (a .pt2 program?)", ".pt2"), (b"\x89TWEXE", "a tilework executable (run it with `tilework run`)", None))


def read_text_module(path: str) -> Any:
    """The verified IRModule in the text format at ``path``; every error names the file."""
    import tilework

    with open(path, "rb") as fh:
        data = fh.read()
    for magic, kind, ext in _BINARY_KINDS:
        if data.startswith(magic):
            rename = f": name it {os.path.splitext(path)[0]}{ext}" if ext else ""
            raise TileworkError(f"{path} is {kind}, not a module in the text format{rename}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TileworkError(f"{path} is not a module in the text format (byte {e.start} is not UTF-8 text); expected {MODEL_INPUTS}") from None
    try:
        mod = tilework.parse(text)
    except ParseError as e:
        raise ParseError(f"{path}: {e}", e.line, e.column) from None
    if not len(mod):
        raise TileworkError(f"{path} defines no function; expected {MODEL_INPUTS}")
    if not any(True for _ in mod.graph_funcs()):
        n = sum(1 for _ in mod.tensor_funcs())
        raise TileworkError(f"{path} defines no @graph function to compile (it has {n} @tensor function(s))")
    try:
        tilework.verify(mod)
    except WellFormedError as e:
        raise WellFormedError(f"{path}: {e}") from None
    return mod


def load_pt2(path: str) -> Any:
    """The ``torch.export`` program saved at ``path``."""
    import zipfile

    try:
        import torch
    except ImportError:
        raise TileworkError(f"reading {path} needs torch (pip install torch)") from None
    if not os.path.exists(path):
        raise TileworkError(f"no such file: {path}")
    if not zipfile.is_zipfile(path):
        raise TileworkError(f"{path} is not a torch.export program: a .pt2 file is a zip archive written by torch.export.save")
    import logging

    kept: list[BaseException] = []

    class Keep(logging.Handler):  # torch logs the real error (with a traceback), then raises a vague one
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                kept.append(record.exc_info[1])

    log = logging.getLogger("torch.export")
    handlers, propagate = log.handlers[:], log.propagate
    log.handlers, log.propagate = [Keep()], False
    try:
        return torch.export.load(path)
    except Exception as e:  # untrusted input: torch reports a bad file with many exception types
        cause = kept[-1] if kept else e
        first = next((line for line in str(cause).splitlines() if line.strip()), "")
        raise TileworkError(f"{path} is not a torch.export program that this torch can read ({type(cause).__name__}: {first})") from None
    finally:
        log.handlers, log.propagate = handlers, propagate


def check_output(source: str, output: str) -> None:
    """Before compiling ``source`` to ``-o output``: the output is writable (not a device, FIFO
    or directory: ``tilework.runtime.atomic``) and is not the input file (under any spelling)."""
    from tilework.runtime.atomic import write_target

    write_target(output)
    if _same_file(source, output):
        raise TileworkError(f"-o {output} is the input file{'' if output == source else f' ({source})'}: name another output")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_export_dir(source: str, out_dir: str, names: Sequence[str]) -> None:
    """Before exporting ``source`` into ``out_dir``: the directory is one (or missing), and
    none of the files ``names`` that the export writes there is the input."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise TileworkError(f"cannot write {out_dir!r}: not a directory (-o names the directory the export writes)")
    for name in names:
        path = os.path.join(out_dir, name)
        if _same_file(source, path):
            raise TileworkError(f"{source} is {path}, a file the export writes: export into another directory")


INT64_MAX = (1 << 63) - 1


def _check_bounds(spec: str, rng: tuple[int | None, int | None]) -> None:
    for bound in rng:
        if bound is not None and not -INT64_MAX - 1 <= bound <= INT64_MAX:
            raise TileworkError(f"--dim {spec!r}: the bound {bound} does not fit in int64 (at most {INT64_MAX})")


def backends_arg(value: str | None) -> str | None:
    """``--backends LIST`` checked: names separated by commas, each once (None: not given)."""
    from tilework.backend.base import check_names

    if value is not None:
        check_names(value, [n.strip() for n in value.split(",")], "--backends", "--backends blas,codegen")
    return value


def pt2_dims(specs: Sequence[str]) -> tuple[dict[str, str], dict[str, tuple[int | None, int | None]]]:
    """The renames and bounds of ``--dim`` specs for a .pt2 program."""
    from tilework.frontend.torch import parse_dim_spec

    names: dict[str, str] = {}
    bounds: dict[str, tuple[int | None, int | None]] = {}
    for spec in specs:
        ref, new, rng = parse_dim_spec(spec)
        _check_bounds(spec, rng)
        if new is not None:
            names[ref] = new
        if rng != (None, None):
            _narrow(bounds, new or ref, rng)
    return names, bounds


def onnx_dim_bounds(specs: Sequence[str]) -> dict[str, tuple[int | None, int | None]]:
    """The bounds of ``--dim`` specs for an ONNX model."""
    from tilework.frontend.onnx.compile import parse_dim_spec

    bounds: dict[str, tuple[int | None, int | None]] = {}
    for spec in specs:
        name, rng = parse_dim_spec(spec)
        _check_bounds(spec, rng)
        _narrow(bounds, name, rng)
    return bounds


@contextlib.contextmanager
def as_dim_option() -> Iterator[None]:
    """Errors about the ``dim_bounds`` of an ONNX model said as errors of ``--dim``, which gave them."""
    try:
        yield
    except TileworkError as e:
        from tilework.frontend.onnx.importer import UnknownDimError

        if isinstance(e, UnknownDimError):
            raise e.for_option("--dim") from None
        raise


def _narrow(bounds: dict[str, tuple[int | None, int | None]], name: str, rng: tuple[int | None, int | None]) -> None:
    """Repeated specs of one dim narrow it together (``n>=2`` then ``n<=8``)."""
    (lo, hi), (old_lo, old_hi) = rng, bounds.get(name, (None, None))
    lo = old_lo if lo is None else lo if old_lo is None else max(lo, old_lo)
    hi = old_hi if hi is None else hi if old_hi is None else min(hi, old_hi)
    if lo is not None and hi is not None and lo > hi:
        raise TileworkError(f"--dim: no value of {name} is both >= {lo} and <= {hi}")
    bounds[name] = (lo, hi)


__all__ = ["read_text_module", "load_pt2", "pt2_dims", "onnx_dim_bounds", "as_dim_option", "check_output", "check_export_dir", "backends_arg", "MODEL_INPUTS"]
