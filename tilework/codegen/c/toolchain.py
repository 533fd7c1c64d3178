"""The system C compiler: finding it, invoking it once per library, caching what it built.

- Compiler: ``$CC`` (may carry arguments, e.g. ``"ccache gcc"``), else ``cc``.
- Flags: ``$TILEWORK_CFLAGS``, else ``-O3 -march=native -fno-math-errno -fopenmp -shared
  -fPIC``; the source and ``-lm`` follow them. ``-fno-math-errno`` changes no value: kernels
  never read ``errno``, and without it ``sqrt`` and friends cannot be vectorized or hoisted
  (the compiler must keep the call that may set it).
- Cache: ``$TILEWORK_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilework``, else
  ``~/.cache/tilework``. A shared object is stored under the SHA-256 of the C source, the
  compiler command (resolved path, size and mtime of its executable), the flags and the CPU
  (architecture and feature flags), beside its ``.c`` source and a record of its SHA-256. Files
  are written to a temporary name and moved into place with ``os.replace``, so concurrent
  builds never see a partial file. A cached object is used only when its bytes still have the
  recorded digest (a truncated, replaced or planted file is rebuilt, never loaded). A second
  record, keyed by the source, flags and CPU alone, finds an object built earlier when no
  compiler is available now (a machine whose compiler went away keeps its warm cache).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from tilework.errors import BuildError


DEFAULT_CFLAGS = "-O3 -march=native -fno-math-errno -fopenmp -shared -fPIC"
_INSTALL_HINT = (
    "tilework compiles CPU kernels with the system C compiler. Install one "
    "(Debian/Ubuntu: `apt-get install gcc`; Fedora: `dnf install gcc`; macOS: "
    "`xcode-select --install`) or point the CC environment variable at a C compiler."
)


@dataclass(frozen=True)
class CompileResult:
    """A shared object on disk; ``cache_hit`` is True when no compiler ran for it."""

    path: Path
    cache_hit: bool
    key: str


def compiler_command() -> list[str]:
    """The compiler argv prefix with its executable resolved; BuildError when there is none."""
    raw = os.environ.get("CC") or "cc"
    argv = shlex.split(raw)
    if not argv:
        raise BuildError(f"CC is empty. {_INSTALL_HINT}")
    exe = shutil.which(argv[0])
    if exe is None:
        origin = f"CC={raw!r}" if os.environ.get("CC") else "`cc`"
        raise BuildError(f"no C compiler found ({origin} is not an executable on PATH). {_INSTALL_HINT}")
    return [exe, *argv[1:]]


def compiler_flags() -> list[str]:
    return shlex.split(os.environ.get("TILEWORK_CFLAGS", DEFAULT_CFLAGS))


def cache_dir() -> Path:
    """The kernel cache directory (created on demand)."""
    env = os.environ.get("TILEWORK_CACHE_DIR")
    if env:
        path = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg) if xdg else Path.home() / ".cache") / "tilework"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _compiler_identity(cmd: Sequence[str]) -> list[object]:
    st = os.stat(cmd[0])
    return [*cmd, st.st_size, st.st_mtime_ns]


@functools.lru_cache(maxsize=1)
def _machine_identity() -> str:
    """The CPU the code is built for (``-march=native`` output differs between CPUs that may
    share one cache directory, e.g. a network home)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.system()} {flags.strip()}"


def cache_key(source: str, cmd: Sequence[str], flags: Sequence[str]) -> str:
    blob = json.dumps([source, _compiler_identity(cmd), list(flags), _machine_identity()]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def source_key(source: str, flags: Sequence[str]) -> str:
    """The key of a source for any compiler: what the no-compiler lookup uses."""
    blob = json.dumps([source, list(flags), _machine_identity()]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def compile_source(source: str, functions: Mapping[str, tuple[int, int]] | None = None) -> CompileResult:
    """Compile C ``source`` into a shared object, or find it in the cache.

    ``functions`` maps kernel names to their 1-based line ranges in ``source``, so a compile
    error can show the offending kernel's C lines.
    """
    flags = compiler_flags()
    try:
        cmd = compiler_command()
    except BuildError:
        found = _built_without_compiler(source, flags)
        if found is None:
            raise
        return found
    key = cache_key(source, cmd, flags)
    try:
        return _compile_cached(source, functions or {}, cmd, flags, key)
    except OSError as e:
        raise BuildError(f"cannot use the kernel cache directory ({e}); set TILEWORK_CACHE_DIR to a writable directory") from e


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(so: Path) -> bool:
    """``so`` exists and still has the digest recorded when it was built."""
    record = so.with_suffix(".json")
    try:
        want = json.loads(record.read_text()).get("sha256")
        return isinstance(want, str) and _digest(so) == want
    except (OSError, ValueError, AttributeError):
        return False


def _built_without_compiler(source: str, flags: Sequence[str]) -> CompileResult | None:
    try:
        root = cache_dir()
        ref = json.loads((root / f"s-{source_key(source, flags)}.json").read_text())
        key = ref["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or not key.isalnum():
        return None
    so = root / f"k-{key}.so"
    return CompileResult(so, True, key) if _intact(so) else None


@functools.lru_cache(maxsize=1)
def _emitter_identity() -> str:
    """A digest of the code that turns loop IR into C: records made by another version of it
    do not apply."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in (here / "emit.py", here / "prelude.py", here.parent / "loop_emit.py"):
        h.update(path.read_bytes())
    return h.hexdigest()


def _ir_record(ir_digest: str) -> Path:
    blob = json.dumps([ir_digest, _emitter_identity(), compiler_flags(), _machine_identity()]).encode()
    return cache_dir() / f"ir-{hashlib.sha256(blob).hexdigest()[:32]}.json"


def remember_loop_ir(ir_digest: str, key: str) -> None:
    """Record that the loop IR whose text has SHA-256 ``ir_digest`` compiled to object ``key``
    (with this tilework, these flags, this CPU): a later load of that text finds the object
    without parsing the IR or emitting C again."""
    try:
        write_atomic(_ir_record(ir_digest), json.dumps({"key": key}).encode())
    except OSError:
        pass  # a read-only cache only loses the shortcut


def lookup_loop_ir(ir_digest: str) -> CompileResult | None:
    """The object built from the loop IR text with digest ``ir_digest``, when the cache holds it
    intact."""
    try:
        key = json.loads(_ir_record(ir_digest).read_text())["key"]
        root = cache_dir()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or not key.isalnum():
        return None
    so = root / f"k-{key}.so"
    return CompileResult(so, True, key) if _intact(so) else None


def _compile_cached(source: str, functions: Mapping[str, tuple[int, int]], cmd: list[str], flags: list[str], key: str) -> CompileResult:
    root = cache_dir()
    so = root / f"k-{key}.so"
    if so.exists() and _intact(so):
        return CompileResult(so, True, key)
    write_atomic(root / f"k-{key}.c", source.encode())
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        src = Path(tmp) / "kernels.c"
        src.write_text(source)
        out = Path(tmp) / "kernels.so"
        argv = [*cmd, *flags, "-o", str(out), str(src), "-lm"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True)
        except OSError as e:
            raise BuildError(f"could not run the C compiler {cmd[0]}: {e}. {_INSTALL_HINT}") from e
        if proc.returncode != 0 or not out.exists():
            raise BuildError(_compile_error(argv, proc.stderr or proc.stdout, source, functions))
        digest = _digest(out)
        os.replace(out, so)
    write_atomic(so.with_suffix(".json"), json.dumps({"sha256": digest}).encode())
    write_atomic(root / f"s-{source_key(source, flags)}.json", json.dumps({"key": key}).encode())
    return CompileResult(so, False, key)


def _compile_error(argv: Sequence[str], message: str, source: str, functions: Mapping[str, tuple[int, int]]) -> str:
    lines = source.splitlines()
    errs = [int(m.group(1)) for m in re.finditer(r"kernels\.c:(\d+):\d+: (?:fatal )?error", message)]
    text = message.strip()
    if len(text) > 6000:
        text = text[:6000] + "\n... (truncated)"
    out = [f"C compilation failed: {shlex.join(argv)}", text]
    if not errs:
        return "\n".join(out)
    first = errs[0]
    owner = next((n for n, (a, b) in functions.items() if a <= first <= b), None)
    if owner is not None:
        lo, hi = functions[owner]
        if hi - lo > 80:
            lo, hi = max(lo, first - 30), min(hi, first + 30)
        out.append(f"in kernel {owner}:")
    else:
        lo, hi = max(1, first - 6), min(len(lines), first + 6)
    for n in range(lo, hi + 1):
        mark = ">>" if n in errs else "  "
        out.append(f"{mark}{n:5d} | {lines[n - 1] if n <= len(lines) else ''}")
    return "\n".join(out)


def store_shared_object(data: bytes) -> Path:
    """Put the bytes of a shared object into the cache (by their hash) and return its path."""
    digest = hashlib.sha256(data).hexdigest()
    path = cache_dir() / f"lib-{digest[:32]}.so"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        write_atomic(path, data)  # a file under the name that holds other bytes is replaced
    return path
