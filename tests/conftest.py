"""Shared test configuration.

Every IRModule that a test builds with ``BlockBuilder.get()`` must print to text and parse back
to a structurally equal module with the same structural hash (invariant 3 of the design); an
autouse fixture checks it at teardown. A test whose modules are deliberately not expressible (e.g. malformed IR given to the
verifier) opts out with ``@pytest.mark.no_roundtrip``.

Every pass that runs in the tests, called directly or in a pipeline (``tilework.build``
included), is followed by the well-formedness verifier (invariant 2): ``set_verify_passes(True)``
is set here, in code, so no environment variable can switch it off.

Under ``pytest -n N`` the workers share the cores: an OpenMP thread of one worker that spins
between parallel regions (tilework's default ``GOMP_SPINCOUNT``) holds a core another worker's
threads wait for. There (``-n`` given) the kernels' threads sleep at once instead, unless the
user set ``GOMP_SPINCOUNT``: the LLM and attention tests, kernels cached, -n 2 on 2 cores:
72 -> 55 s; every kernel still runs with all its threads. Likewise a build runs one compiler
process there (``TILEWORK_COMPILE_JOBS=1``, unless the user set it): each worker started two
(units in parallel, GCC's partitions of one large unit), four on two cores; the whole suite, -n 2
on the 2-core Zen 4, one run each: 506 -> 494 s, CPU time 996 -> 966 s. Tests of the parallel
builds set their own.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterator

import pytest

_USER_SPINCOUNT = os.environ.get("GOMP_SPINCOUNT")  # read before tilework sets its default

from tilework.ir.builder import BlockBuilder  # noqa: E402
from tilework.ir.module import IRModule  # noqa: E402
from tilework.transform.base import set_verify_passes  # noqa: E402

set_verify_passes(True)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("numprocesses", None):  # the workers, started after this, inherit these
        if _USER_SPINCOUNT is None:
            os.environ["GOMP_SPINCOUNT"] = "0"
        os.environ.setdefault("TILEWORK_COMPILE_JOBS", "1")
    config.addinivalue_line("markers", "no_roundtrip: do not check that built modules survive print -> parse")
    config.addinivalue_line("markers", "slow: a test that takes more than a second or two")


# what survived print -> parse in this process: the modules (``_module_key``) and, within them,
# the functions (name, structural hash, digest of the text printed alone) and module attrs (their
# hash). A pipeline rebuilds many modules equal to earlier ones, or sharing most of their
# functions with them (the same model, config or kernels in several tests, one pass changing
# one function); parsing the same text again would check nothing new
_ROUND_TRIPPED: set[tuple[Any, ...]] = set()
_FUNCS_ROUND_TRIPPED: set[tuple[str, int, bytes]] = set()
_ATTRS_ROUND_TRIPPED: set[int] = set()


def _module_key(mod: IRModule, seen: dict[tuple[int, str], tuple[int, bytes]]) -> tuple[Any, ...]:
    """What decides a module's round trip: its attrs and, for each function in order, its name,
    its structural hash and the digest of its text printed alone. Two modules with one key print
    to the same text (the same functions in the same order; a meta section's constants are
    structurally part of their functions) and hash alike, so one round trip checks both. Each
    function object is hashed and printed once (``seen``: by its id and name, while the test's
    modules, which hold it, are alive): a pipeline's modules share most of their functions."""
    from tilework.ir.structural import structural_hash
    from tilework.text import print_module

    funcs = []
    for name, func in mod.items():
        k = (id(func), name)
        if k not in seen:
            try:
                text = print_module(IRModule({name: func}))
            except Exception:  # (printed alone it fails: the whole module's round trip will say why)
                text = f"unprintable alone: {id(func)}"
            seen[k] = (structural_hash(func), hashlib.blake2b(text.encode(), digest_size=16).digest())
        funcs.append((name, *seen[k]))
    return (structural_hash(IRModule({}, mod.attrs)), tuple(funcs))  # (the attrs hashed as a module hashes them)


@pytest.fixture(autouse=True)
def roundtrip_built_modules(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[IRModule]]:
    """Records the modules built during the test and checks their text round trip afterwards:
    each prints, parses back structurally equal, and the parsed module's functions (and attrs)
    hash as the built one's (so the module hashes alike)."""
    built: list[IRModule] = []
    if request.node.get_closest_marker("no_roundtrip") is not None:
        yield built
        return
    original = BlockBuilder.get

    def recording_get(self: BlockBuilder) -> IRModule:
        mod = original(self)
        built.append(mod)
        return mod

    monkeypatch.setattr(BlockBuilder, "get", recording_get)
    yield built
    monkeypatch.undo()

    funcs: dict[tuple[int, str], tuple[int, bytes]] = {}
    for mod in built:
        key = _module_key(mod, funcs)
        if key in _ROUND_TRIPPED:
            continue  # a module that prints to the same text and hashes alike already round-tripped in this process
        fresh = [f for f in key[1] if f not in _FUNCS_ROUND_TRIPPED]
        if not fresh and key[0] in _ATTRS_ROUND_TRIPPED:
            _ROUND_TRIPPED.add(key)
            continue  # every function and the attrs round-tripped, in other modules
        # the functions not yet checked, with the attrs; if they do not parse without the rest
        # (a call to a function left out), the whole module is checked, and its failure reported
        part = IRModule({name: mod[name] for name, _, _ in fresh}, mod.attrs)
        if len(fresh) == len(key[1]) or _round_trip_failure(part, _module_key(part, funcs)) is not None:
            problem = _round_trip_failure(mod, key)
            if problem is not None:
                pytest.fail(problem, pytrace=False)
        _ROUND_TRIPPED.add(key)
        _FUNCS_ROUND_TRIPPED.update(key[1])
        _ATTRS_ROUND_TRIPPED.add(key[0])


def _round_trip_failure(mod: IRModule, key: tuple[Any, ...]) -> str | None:
    """Why ``mod`` (its ``_module_key`` ``key``) does not survive print -> parse, or None: it
    must parse back structurally equal, the parsed module's functions (and attrs) hashing as
    the built one's (so the module hashes alike)."""
    from tilework.ir.structural import assert_structural_equal, structural_hash
    from tilework.text import parse, print_module

    text = print_module(mod)
    try:
        back = parse(text)
        assert_structural_equal(mod, back)
        # a module's hash is its attrs' and then each function's, in order: these equal, it is equal
        assert key[0] == structural_hash(IRModule({}, back.attrs)) and [f[1] for f in key[1]] == [structural_hash(back[name]) for name in mod], "equal modules hash differently"
    except Exception as e:
        return f"module does not round-trip through text ({e})\n--- text ---\n{text}"
    return None


@pytest.fixture
def isolated_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backends and extern functions registered during the test are gone after it (the docs'
    examples register theirs; a second run of one in the same process would register twice)."""
    from tilework.backend import base
    from tilework.runtime import extern

    for module, registry in ((base, "_BACKENDS"), (base, "_AVAILABLE"), (extern, "_EXTERNS"), (extern, "_CHECKS")):
        monkeypatch.setattr(module, registry, dict(getattr(module, registry)))


@pytest.fixture(autouse=True)
def roundtrip_built_executables(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every executable a test builds is saved and loaded back right away: the file must give
    the same bytecode, bit-identical constants, the same loop IR and kernel modules with the
    same function tables (so the loaded executable computes bit-identical outputs)."""
    import tilework.compiled
    import tilework.driver
    from tilework.runtime.executable import load_file

    original = tilework.driver.build
    count = [0]

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        exe = original(*args, **kwargs)
        count[0] += 1
        path = str(tmp_path_factory.mktemp("exe-roundtrip") / f"{count[0]}.tw")
        exe.save(path)
        back = load_file(path).executable
        problems = []
        if back.functions != exe.functions:
            problems.append("bytecode differs")
        mine = exe.constants
        if len(back.constants) != len(mine) or any(a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes() for a, b in zip(back.constants, mine)):
            problems.append("constants differ")
        if back.loop_ir() != exe.loop_ir():
            problems.append("loop IR differs")
        if [(m.target, dict(m.functions)) for m in back.modules] != [(m.target, dict(m.functions)) for m in exe.modules]:
            problems.append("kernel modules differ")
        if problems:
            pytest.fail(f"an executable built by the test does not survive save/load: {', '.join(problems)}", pytrace=False)
        return exe

    monkeypatch.setattr(tilework.driver, "build", recording_build)
    monkeypatch.setattr(tilework.compiled, "build", recording_build)
    yield
