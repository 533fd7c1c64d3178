"""The system C compiler: finding it, invoking it for a library, caching what it built.

- Compiler: ``$CC`` (may carry arguments, e.g. ``"ccache gcc"``), else ``cc``.
- Flags: ``$TILEWORK_CFLAGS``, else ``-O3 -march=native -fno-math-errno -fno-trapping-math
  -fno-tree-loop-distribute-patterns -fopenmp -shared -fPIC`` (and ``-mprefer-vector-width=512``
  on an AVX-512 host, ``=256`` on an AVX/AVX2 one); the source
  and ``-lm`` follow them. ``-fno-math-errno`` and ``-fno-trapping-math`` change no value:
  kernels never read ``errno`` or the floating-point exception flags; without the first
  ``sqrt`` and friends cannot be vectorized or hoisted (the compiler must keep the call that
  may set it), without the second GCC does not if-convert a float comparison (it may raise
  "invalid"), so the prelude's branch-free ``tw_exp_f``/``tw_erf_f``/``tw_tanh_f`` stay
  scalar in a simd loop (a GELU epilogue took as long as its matmul).
  ``-fno-tree-loop-distribute-patterns`` keeps GCC from turning a loop into a ``memcpy`` /
  ``memset`` call: a matmul tile's store of its local accumulators to the output (a plain copy
  when there is no epilogue) became a ``memcpy`` from the local buffer, whose address then
  escaped, so its accumulators lived on the stack through the ``k`` loop (a linear layer
  without bias at 7 rows, AVX2: 2.4x slower).
- Cache (``tilework.codegen.cache``: a private directory, nothing in it trusted): a shared
  object is stored under a key, the SHA-256 of the C source, the compiler command (resolved
  path, size and mtime of its executable), the flags, the CPU (architecture and feature flags)
  and the tilework code that emits and loads it. The object's file is named by key and
  content (``k-<key>-<digest>.so``, beside its ``.c`` source) and a record ``k-<key>.json``
  names it; the object is loaded only when its bytes have the digest recorded when it was
  built: a truncated, swapped, planted or garbage object is set aside with a warning and
  rebuilt, never loaded, and one that verifies but does not load is set aside too. A second
  record, keyed by the source, flags and CPU alone, finds an object built earlier when no
  compiler is available now (a warm cache needs no compiler). A read-only cache is used
  read-only: what has to be built goes to a private scratch directory.
- A large library comes in translation units (``CModule.units``): each is compiled to an
  object file, ``compile_jobs()`` at once (``$TILEWORK_COMPILE_JOBS``, else the CPUs this
  process may use), and the objects are linked. Each object is cached like a library (key: the
  unit's text, compiler, flags, CPU, tilework; ``o-<key>-<digest>.o`` and ``o-<key>.json``,
  verified before it is linked), so a kernel already compiled for another library is not
  compiled again. A unit may add flags of its own after the library's (``CUnit.flags``: the
  native graph code's ``-O1``), part of its key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from tilework.codegen import cache
from tilework.codegen.cache import cache_dir
from tilework.codegen.c.emit import CUnit
from tilework.errors import BuildError


DEFAULT_CFLAGS = "-O3 -march=native -fno-math-errno -fno-trapping-math -fno-tree-loop-distribute-patterns -fopenmp -shared -fPIC"
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
    data: bytes | None = None  # the verified bytes of ``path``: what is loaded


def compiler_command() -> list[str]:
    """The compiler argv prefix with its executable resolved; BuildError when there is none."""
    raw = os.environ.get("CC") or "cc"
    argv = _split(raw)
    if not argv:
        raise BuildError(f"CC is empty. {_INSTALL_HINT}")
    exe = shutil.which(argv[0])
    if exe is None:
        origin = f"CC={raw!r}" if os.environ.get("CC") else "`cc`"
        raise BuildError(f"no C compiler found ({origin} is not an executable on PATH). {_INSTALL_HINT}")
    return [exe, *argv[1:]]


def compiler_flags() -> list[str]:
    """``$TILEWORK_CFLAGS``, else ``DEFAULT_CFLAGS`` with the vector width the register tiles
    of the schedules are sized for (``tilework.schedule.rules.common.host_registers``): on an
    x86 host ``-mprefer-vector-width=512`` with AVX-512 (32 registers of 64 bytes; gcc's tuning
    for Intel cores prefers 256-bit vectors, and an 8 x 32 float matmul tile in them is 32
    accumulators, the whole register file: it spills), ``=256`` with AVX/AVX2 alone (16 of 32
    bytes; gcc's tuning for the first Zen cores prefers 128-bit vectors, and a 6 x 16 tile in
    them is 24 accumulators in a file of 16: the MLP 1024 -> 4096 -> 1024 ran 1.2-1.4x slower
    at 8 to 256 rows)."""
    flags = os.environ.get("TILEWORK_CFLAGS")
    if flags is not None:
        return _split(flags)
    width = _vector_width() if platform.machine() in ("x86_64", "AMD64") else None
    return _split(DEFAULT_CFLAGS) + ([f"-mprefer-vector-width={width}"] if width else [])


def _split(raw: str) -> list[str]:
    """``shlex.split(raw)``, parsed once per string (asked for with every cache lookup: 1,800
    times in a first LLM start, 0.25 s of shlex), a new list each call."""
    return list(_split_once(raw))


@functools.lru_cache(maxsize=16)
def _split_once(raw: str) -> tuple[str, ...]:
    return tuple(shlex.split(raw))


def predefined_macros() -> frozenset[str]:
    """The names of the macros the compiler predefines under ``compiler_flags()`` (``-dM -E``:
    ``__AVX512BF16__`` where the target has AVX-512 BF16): what a source's ``#if`` will see,
    known without compiling it. BuildError without a compiler, or where it fails."""
    return _predefined_macros(tuple(compiler_command()), tuple(compiler_flags()))


@functools.lru_cache(maxsize=4)
def _predefined_macros(cmd: tuple[str, ...], flags: tuple[str, ...]) -> frozenset[str]:
    keep = [f for f in flags if f not in ("-shared", "-fPIC") and not f.startswith(("-o", "-W"))]
    try:
        proc = subprocess.run([*cmd, *keep, "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"the C compiler could not be run ({e})") from e
    if proc.returncode:
        raise BuildError(f"the C compiler could not list its predefined macros under {' '.join(flags)}: {proc.stderr.strip()[:400]}")
    return frozenset(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define ") and len(line.split()) > 1)


BACKGROUND_NICE = 10  # how far a background build's thread and its compilers step back
_AHEAD = [0]  # builds running ahead of need (in_background)
_AHEAD_LOCK = threading.Lock()


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Build ahead of need in this thread: at a lower priority (``yield_to_foreground``; the
    thread keeps it), and counted while it runs, so that ``idle_jobs`` leaves it its core."""
    yield_to_foreground()
    with _AHEAD_LOCK:
        _AHEAD[0] += 1
    try:
        yield
    finally:
        with _AHEAD_LOCK:
            _AHEAD[0] -= 1


def idle_jobs() -> int:
    """``compile_jobs()`` less the builds running ahead of need (``in_background``), at least
    one: how many units a foreground build should split its C into (the native graph code of
    an fp32 LLM, whose quant library is built by then, 11.6-12.0 -> 10.0-10.4 s at its first
    start in two units on the 2-core Zen 4; that of `q`, while its library is still building,
    0.4 s slower so: one)."""
    with _AHEAD_LOCK:
        return max(1, compile_jobs() - _AHEAD[0])


def yield_to_foreground() -> None:
    """Lower the scheduling priority of the calling thread, and so of every compiler it starts
    from now on, by ``BACKGROUND_NICE``: for a thread that builds ahead of need (the quant
    library during an LLM's first start), whose compilers should take the cores the foreground
    leaves idle rather than share the ones its own compiles are waiting for (a first `q`
    start 6.7-7.6 -> 5.7-6.3 s on the 2-core Zen 4). Linux only, where a nice value is a
    thread's and the processes it starts inherit it (elsewhere it is the whole process's:
    nothing is changed); a thread cannot raise it again, so call it in a thread of its own."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE)
    except OSError:
        pass  # not permitted (a sandbox): the build runs at the foreground's priority


def _vector_width() -> int | None:
    """The bits of the widest vectors of this x86 host (its ``/proc/cpuinfo`` flags), or None."""
    flags = f" {_machine_identity()} "
    return 512 if " avx512f " in flags else 256 if " avx " in flags else None


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
    """The key of a shared object: its C source, the compiler (resolved path, size and mtime of
    its executable), the flags, the CPU and the tilework code that loads it."""
    blob = json.dumps([source, _compiler_identity(cmd), list(flags), _machine_identity(), _emitter_identity()]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def source_key(source: str, flags: Sequence[str]) -> str:
    """The key of a source for any compiler: what the no-compiler lookup uses."""
    blob = json.dumps([source, list(flags), _machine_identity(), _emitter_identity()]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def compile_source(source: str, functions: Mapping[str, tuple[int, int]] | None = None, units: Sequence[CUnit] = ()) -> CompileResult:
    """Compile C ``source`` into a shared object, or find it in the cache.

    ``functions`` maps kernel names to their 1-based line ranges in ``source``, so a compile
    error can show the offending kernel's C lines. ``units`` (``CModule.units``), when given,
    are what is compiled: each to an object file (cached by its own text, so an identical
    kernel of another library is not compiled again), up to ``compile_jobs()`` at once, then
    linked; the library is still cached and found under ``source``'s key.
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
        return _compile_cached(source, functions or {}, cmd, flags, key, units)
    except OSError as e:
        raise BuildError(f"cannot use the kernel cache directory ({e}); set TILEWORK_CACHE_DIR to a writable directory") from e


def cached_result(source: str) -> CompileResult | None:
    """The shared object ``compile_source(source)`` would return where the kernel cache has it
    (no compiler runs, no build in progress is waited for); None where it would be compiled."""
    flags = compiler_flags()
    try:
        cmd = compiler_command()
    except BuildError:
        return _built_without_compiler(source, flags)
    try:
        return _lookup(cache_dir(), _cached_key(source, tuple(cmd), tuple(flags)))
    except OSError:
        return None


@functools.lru_cache(maxsize=64)
def _cached_key(source: str, cmd: tuple[str, ...], flags: tuple[str, ...]) -> str:
    """``cache_key`` of a source asked about again and again (``cached_result``: a loader's
    question, a tensor at a time, until the library is built; ``quant.library_if_built`` asks
    about some 16 builds in turn, which a smaller cache would evict one by one)."""
    return cache_key(source, cmd, flags)


def _record(root: Path, key: str) -> Path:
    return root / f"k-{key}.json"


def _lookup(root: Path, key: str, kind: str = "k") -> CompileResult | None:
    """The verified shared object built for ``key`` (see ``tilework.codegen.cache``): the
    record ``k-<key>.json`` names the object, whose bytes must have the digest it recorded. A
    damaged or foreign object is set aside, and None tells the caller to build it again.
    ``kind`` ``"o"``: the object file of a unit, ``o-<key>.json`` naming ``o-<key>-<digest>.o``."""
    rec = cache.read_json(root / f"{kind}-{key}.json")
    name = rec.get("object") if rec is not None else None
    ext = "so" if kind == "k" else "o"
    if not isinstance(name, str) or not re.fullmatch(rf"{kind}-{key}-[0-9a-f]{{16}}\.{ext}", name):
        return None
    so = root / name
    data = cache.read_verified(so, key)
    if data is None:
        return None
    return CompileResult(so, True, key, data)


def _found(record: Path) -> CompileResult | None:
    """Follow a ``{"key": ...}`` record (by source, by loop IR) to its verified object."""
    rec = cache.read_json(record)
    key = rec.get("key") if rec is not None else None
    if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{32}", key):
        return None
    return _lookup(record.parent, key)


def _built_without_compiler(source: str, flags: Sequence[str]) -> CompileResult | None:
    try:
        root = cache_dir()
    except BuildError:
        return None
    return _found(root / f"s-{source_key(source, flags)}.json")


@functools.lru_cache(maxsize=1)
def _emitter_identity() -> str:
    """A digest of the code that turns loop IR into C: records made by another version of it
    do not apply. That code is the code generator (``tilework/codegen``), the IR it reads and
    the symbolic algebra that simplifies the indices it writes (``tilework/ir``), and the
    reduction lowering it calls: every Python file of those, so that a changed simplification
    rule is a new identity too (compiles look modules up by loop IR, ``CpuTarget.build``)."""
    pkg = Path(__file__).resolve().parents[2]
    files = sorted([*(pkg / "codegen").rglob("*.py"), *(pkg / "ir").rglob("*.py"), pkg / "schedule" / "reduction_primitives.py"])
    h = hashlib.sha256(_tilework_version().encode())
    for path in files:
        h.update(str(path.relative_to(pkg)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _tilework_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilework")
    except PackageNotFoundError:
        return "unknown"


def _ir_record(root: Path, ir_digest: str) -> Path:
    blob = json.dumps([ir_digest, _emitter_identity(), compiler_flags(), _machine_identity()]).encode()
    return root / f"ir-{hashlib.sha256(blob).hexdigest()[:32]}.json"


def remember_loop_ir(ir_digest: str, key: str) -> None:
    """Record that the loop IR whose text has SHA-256 ``ir_digest`` compiled to object ``key``
    (with this tilework, these flags, this CPU): a later load of that text finds the object
    without parsing the IR or emitting C again."""
    try:
        root = cache_dir()
        if cache.writable(root):
            cache.write_atomic(_ir_record(root, ir_digest), json.dumps({"key": key}).encode())
    except (OSError, BuildError):
        pass  # the shortcut is lost, nothing else


def lookup_loop_ir(ir_digest: str) -> CompileResult | None:
    """The object built from the loop IR text with digest ``ir_digest``, when the cache holds it
    intact."""
    try:
        root = cache_dir()
    except BuildError:
        return None
    return _found(_ir_record(root, ir_digest))


def _compile_cached(source: str, functions: Mapping[str, tuple[int, int]], cmd: list[str], flags: list[str], key: str, units: Sequence[CUnit] = ()) -> CompileResult:
    root = cache_dir()
    found = _lookup(root, key)
    if found is not None:
        return found
    with cache.building(root, key):
        return _lookup(root, key) or _compile_new(source, functions, cmd, flags, key, units, root)


def _compile_new(source: str, functions: Mapping[str, tuple[int, int]], cmd: list[str], flags: list[str], key: str, units: Sequence[CUnit], root: Path) -> CompileResult:
    keep = cache.writable(root)
    out_dir = root if keep else cache.scratch_dir(root)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        out = Path(tmp) / "kernels.so"
        if len(units) > 1:
            objects = _unit_objects(units, cmd, flags, Path(tmp), root, keep)
            _run_compiler([*cmd, *flags, "-o", str(out), *map(str, objects), "-lm"], out, cmd, "", {})
        else:
            src = Path(tmp) / "kernels.c"
            src.write_text(source)
            lto = _parallel_lto(cmd, flags, source)
            try:
                _run_compiler([*cmd, *flags, *lto, "-o", str(out), str(src), "-lm"], out, cmd, source, functions)
            except BuildError:
                if not lto:
                    raise
                _run_compiler([*cmd, *flags, "-o", str(out), str(src), "-lm"], out, cmd, source, functions)  # the plain build decides
        data = out.read_bytes()
        # named by key and content: a name always holds the same bytes, so concurrent builders
        # never see a record and an object that disagree, and a rebuilt object is a new name
        so = out_dir / f"k-{key}-{cache.digest(data)[:16]}.so"
        os.replace(out, so)
    if keep:
        cache.write_atomic(so.with_suffix(".c"), source.encode())
        cache.write_record(so, key, data)
        cache.write_atomic(_record(root, key), json.dumps({"key": key, "object": so.name}).encode())
        cache.write_atomic(root / f"s-{source_key(source, flags)}.json", json.dumps({"key": key}).encode())
    return CompileResult(so, False, key, data)


def compile_jobs() -> int:
    """How many compiler processes run at once: ``$TILEWORK_COMPILE_JOBS``, else the CPUs this
    process may use."""
    raw = os.environ.get("TILEWORK_COMPILE_JOBS", "")
    if raw:
        try:
            jobs = int(raw)
        except ValueError:
            raise BuildError(f"TILEWORK_COMPILE_JOBS must be a positive integer, got {raw!r}") from None
        if jobs < 1:
            raise BuildError(f"TILEWORK_COMPILE_JOBS must be a positive integer, got {raw!r}")
        return jobs
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


LTO_MIN_CHARS = 100_000  # a single translation unit at least this large is optimized in parallel


def _parallel_lto(cmd: Sequence[str], flags: Sequence[str], source: str) -> list[str]:
    """Extra flags that let GCC optimize one large translation unit in ``compile_jobs()``
    processes: link-time optimization in partitions (``-flto=N``), the whole build still one
    command. A source that is not split into units (the quant library: about 120 KB of C that
    one gcc process took 9 s to compile, the critical path of an LLM's first start) then takes
    about half as long on 2 cores; the code is the same (its kernels' outputs bit for bit, their
    speed within the noise). Nothing for other compilers (clang's ``-flto`` differs), smaller
    sources, one job, or flags that already choose link-time optimization. The cache key does
    not change: the object computes what the plain build's does."""
    jobs = compile_jobs()
    if jobs < 2 or len(source) < LTO_MIN_CHARS or any(f.startswith(("-flto", "-fno-lto")) for f in flags):
        return []
    if not _is_gcc(tuple(cmd)):
        return []
    return [f"-flto={jobs}", "-flto-partition=balanced"]


@functools.lru_cache(maxsize=8)
def _is_gcc(cmd: tuple[str, ...]) -> bool:
    """Whether ``cmd`` is GCC: its ``--version`` names the Free Software Foundation (also when
    it is called ``cc``; clang's names clang)."""
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()


def _unit_objects(units: Sequence[CUnit], cmd: list[str], flags: list[str], tmp: Path, root: Path, keep: bool) -> list[Path]:
    """The object file of each unit in ``tmp`` (``u<i>.o``, to link): the verified bytes of a
    cached one (copied, so that what is linked is what was verified), else compiled (the
    largest first, ``compile_jobs()`` at once) and cached by the unit's key."""
    paths = [tmp / f"u{i}.o" for i in range(len(units))]
    keys = [cache_key("object file\n" + u.text, cmd, [*flags, *u.flags]) for u in units]
    todo = []
    for i, (unit, key) in enumerate(zip(units, keys)):
        found = _lookup(root, key, "o")
        if found is not None and found.data is not None:
            paths[i].write_bytes(found.data)
        else:
            todo.append(i)

    def build(i: int) -> None:
        src = tmp / f"u{i}" / "kernels.c"  # the name compile errors are matched by
        src.parent.mkdir()
        src.write_text(units[i].text)
        _run_compiler([*cmd, *flags, *units[i].flags, "-c", "-o", str(paths[i]), str(src)], paths[i], cmd, units[i].text, units[i].lines)

    todo.sort(key=lambda i: -len(units[i].text))
    with ThreadPoolExecutor(max_workers=min(compile_jobs(), max(len(todo), 1))) as pool:
        for f in [pool.submit(build, i) for i in todo]:
            f.result()  # the first failure, in order of submission
    if keep:
        for i in todo:
            data = paths[i].read_bytes()
            obj = root / f"o-{keys[i]}-{cache.digest(data)[:16]}.o"
            cache.write_atomic(obj, data)
            cache.write_record(obj, keys[i], data)
            cache.write_atomic(root / f"o-{keys[i]}.json", json.dumps({"key": keys[i], "object": obj.name}).encode())
    return paths


def _run_compiler(argv: list[str], out: Path, cmd: list[str], source: str, functions: Mapping[str, tuple[int, int]]) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"could not run the C compiler {cmd[0]}: {e}. {_INSTALL_HINT}") from e
    if proc.returncode != 0 or not out.exists():
        raise BuildError(_compile_error(argv, proc.stderr or proc.stdout, source, functions))


def set_aside(result: CompileResult, why: str) -> None:
    """Set aside a cached object that verified but could not be used (it does not load)."""
    cache.set_aside(result.path, why)


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
    """Put the bytes of a shared object into the cache (by their hash) and return its path: a
    file under that name that holds other bytes is replaced; a read-only cache gets nothing
    (the bytes go to this process's scratch directory)."""
    root = cache_dir()
    d = cache.digest(data)
    path = root / f"lib-{d[:32]}.so"
    if cache.read_verified(path, d) is not None:
        return path
    if path.exists():
        cache.set_aside(path, "it does not hold the bytes its name promises")
    if not cache.writable(root):
        path = cache.scratch_dir(root) / path.name
    cache.write_entry(path, data, d)
    return path
