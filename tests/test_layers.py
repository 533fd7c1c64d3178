"""The layer contract: imports point down, and no module imports itself back through others.

``LAYERS`` is the order of ``docs/architecture.md``, lowest first; a package may import its own
band and the bands below it. Every import statement counts, at module level or inside a
function (a deferred import is still a dependency); only imports under ``if TYPE_CHECKING:``
are free. The checker reads the sources with ``ast``; the tests below also show that it
catches an upward import and a cycle when one is added.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Iterator, Mapping

ROOT = Path(__file__).resolve().parent.parent / "tilework"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("ir",),
    ("te",),
    ("op",),
    ("pattern", "schedule", "text"),
    ("transform",),
    ("runtime",),
    ("codegen",),
    ("backend", "collage"),
    ("frontend", "nn", "models", "llm", "serve", "export"),
    ("compiled", "driver"),
    ("cli", "__init__", "__main__"),
)
BAND = {name: i for i, band in enumerate(LAYERS) for name in band}


def package_sources(root: Path = ROOT) -> dict[str, str]:
    """``module name -> source`` of every module of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
            PACKAGES.add(".".join(parts))
        out[".".join(parts)] = path.read_text()
    return out


PACKAGES: set[str] = set()  # modules that are packages (their relative imports resolve inside)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


@functools.lru_cache(maxsize=None)
def imports_of(module: str, source: str, modules: frozenset[str]) -> tuple[tuple[str, int], ...]:
    """``(imported tilework module, line)`` for each import in ``source``."""
    return tuple(_imports(module, source, modules))


def _imports(module: str, source: str, modules: frozenset[str]) -> Iterator[tuple[str, int]]:
    tree = ast.parse(source)
    is_package = module in PACKAGES
    skip = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tilework" or alias.name.startswith("tilework."):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if not (base == "tilework" or base.startswith("tilework.")):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in modules else base), node.lineno


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def check_layers(sources: Mapping[str, str]) -> list[str]:
    """Every violation of the contract in ``sources`` (module name -> source), as text."""
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in sources}
    known = frozenset(sources)
    for module, source in sources.items():
        src_layer = layer_of(module)
        if src_layer not in BAND:
            problems.append(f"{module}: package {src_layer!r} has no place in LAYERS (add it to docs/architecture.md and this test)")
            continue
        for target, line in imports_of(module, source, known):
            dst_layer = layer_of(target) if target != "tilework" else "__init__"
            if dst_layer in BAND and BAND[dst_layer] > BAND[src_layer]:
                problems.append(f"{module}:{line} imports {target}: {src_layer} may not import {dst_layer} (a higher layer)")
            if target in graph and target != module:
                graph[module].add(target)
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down_and_there_are_no_cycles() -> None:
    problems = check_layers(package_sources())
    assert not problems, "the layer contract is broken:\n  " + "\n  ".join(problems)


def test_the_checker_catches_an_upward_import() -> None:
    sources = package_sources()
    sources["tilework.ir.sym"] += "\n\ndef _late():\n    from tilework.runtime.vm import VM\n    return VM\n"
    problems = check_layers(sources)
    assert any("tilework.ir.sym" in p and "ir may not import runtime" in p for p in problems), problems


def test_the_checker_catches_a_cycle_and_ignores_type_only_imports() -> None:
    sources = package_sources()
    sources["tilework.ir.info"] += "\nfrom tilework.ir import module as _m\n"
    assert any(p.startswith("import cycle:") and "tilework.ir.info" in p for p in check_layers(sources))
    typed = package_sources()
    typed["tilework.ir.sym"] += "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tilework.compiled import CompiledModel\n"
    assert check_layers(typed) == []


def test_every_package_has_a_place() -> None:
    packages = {layer_of(m) for m in package_sources()}
    assert packages <= set(BAND), f"packages without a layer: {sorted(packages - set(BAND))}"
