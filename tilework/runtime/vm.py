"""The register VM.

Loading an executable resolves every call once: builtins, kernels, externs and VM functions
become direct Python callables, and each ``call`` instruction becomes one small generated
function of the register file (``lambda r: f(r[3], K0, r[5])``), so that running an
instruction costs one Python call plus the callee's own work: no dictionary look-ups, no
argument decoding per call.

``vm["main"](*args)`` takes NumPy arrays or torch tensors (zero-copy on the CPU) and returns
NumPy arrays, or torch tensors when it was given torch tensors.

Threads: a VM may be called from many threads at once. The steps of a call are bound to one
``Memory`` (its planned arenas and pool), so each concurrent call needs its own: a call takes
the VM's own memory when no other call holds it (a non-blocking lock: the single-threaded path
pays one lock and allocates nothing) and otherwise a spare set of steps bound to a memory of
its own, made on first need and kept for later concurrent calls.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import numpy as np

from tilework.errors import BuildError, RuntimeCheckError, TileworkError
from tilework.runtime import builtins as B
from tilework.runtime import team
from tilework.runtime.bytecode import Instr, VMFunction
from tilework.runtime.executable import Executable
from tilework.runtime.extern import lookup_extern, lookup_extern_check
from tilework.runtime.memory import Memory
from tilework.runtime.tensor import as_array, is_torch_tensor, to_torch_tree

Step = tuple[int, Any, Any]
CALL, RET, GOTO, IF = 0, 1, 2, 3


class _Loaded:
    """A VM function with its instructions resolved into steps."""

    __slots__ = ("fn", "steps", "invoke")
    CHECKED = False  # errors of the steps become RuntimeCheckErrors naming the instruction

    def __init__(self, fn: VMFunction) -> None:
        self.fn = fn
        self.steps: list[Step] = []
        self.invoke: Callable[..., Any] = self._run

    def _run(self, *args: Any) -> Any:
        regs: list[Any] = [None] * self.fn.num_regs
        regs[: len(args)] = args
        steps = self.steps
        pc = 0
        try:  # free until something raises
            while True:
                kind, a, b = steps[pc]
                if kind == CALL:
                    a(regs)
                    pc += 1
                elif kind == RET:
                    return regs[a]
                elif kind == GOTO:
                    pc = a
                else:
                    pc = pc + 1 if regs[a] else b
        except Exception as e:  # a RecursionError too (a function that calls itself)
            if not self.CHECKED or isinstance(e, TileworkError):
                raise
            ins = self.fn.code[pc]
            what = f"call of {ins[2][0]} {ins[2][1]!r}" if ins[0] == "call" else ins[0]
            raise RuntimeCheckError(f"{self.fn.name}: instruction {pc} ({what}) of the loaded executable failed: {type(e).__name__}: {e}") from None


class _Checked(_Loaded):
    """A VM function of an executable read from a file (``Executable.untrusted``): the same
    steps (its kernel and library calls checked), and an error that is not a ``TileworkError``
    (a builtin handed values of the wrong kind by changed bytecode) becomes a
    ``RuntimeCheckError`` naming the function and the instruction."""

    __slots__ = ()
    CHECKED = True


class _Bound:
    """The functions of an executable resolved against one ``Memory``: what one call runs.
    ``variants`` holds the functions of ``VM.bind`` (their bound arguments' checks done once),
    by (name, the bound params with their checked shapes and dtypes), made on first use. A
    variant's call of another graph function that passes it bound params (a dispatching
    ``main`` handing its weights to the copy for the shape bucket) calls a variant of that
    function too: its static checks of those params are left out where they expect exactly
    the shape and dtype the bound value was checked against."""

    __slots__ = ("vm", "memory", "funcs", "kernels", "variants", "bound")

    def __init__(self, vm: "VM", memory: Memory) -> None:
        self.vm = vm
        self.memory = memory
        self.kernels = vm.exe.kernel_callables(private=True)  # argument buffers of this set's own
        # every function exists before any is resolved: a function's calls of others find them
        self.funcs = {name: self.new(f) for name, f in vm.exe.functions.items()}
        for loaded in self.funcs.values():
            self.resolve(loaded)
        self.variants: dict[tuple[str, str], _Loaded] = {}
        self.bound: dict[tuple[str, int], _Loaded] = {}  # variant() by (name, lead): every bound call looks it up

    def new(self, fn: VMFunction) -> _Loaded:
        return (_Checked if self.vm.exe.untrusted else _Loaded)(fn)

    def resolve(self, loaded: _Loaded) -> _Loaded:
        loaded.steps = [self.vm._resolve(self, loaded.fn, ins) for ins in loaded.fn.code]
        return loaded

    def load(self, fn: VMFunction) -> _Loaded:
        return self.resolve(self.new(fn))

    def variant(self, name: str, lead: int) -> _Loaded:
        """Function ``name`` for callers that bind its params from ``lead`` on (``VM.bind``
        checked them against the function's own static checks)."""
        loaded = self.bound.get((name, lead))
        if loaded is None:
            fn = self.funcs[name].fn
            loaded = self.bound[(name, lead)] = self.checked_variant(name, {r: e for r, e in static_expectations(fn).items() if r >= lead})
        return loaded

    def checked_variant(self, name: str, known: Mapping[int, tuple[Any, str]]) -> _Loaded:
        """Function ``name`` without its static checks of the params in ``known`` (param ->
        (shape, dtype) its value was checked to have) that expect just that."""
        fn = self.funcs[name].fn
        drop = {r for r, e in static_expectations(fn).items() if known.get(r) == e}
        if not drop:
            return self.funcs[name]
        key = (name, repr(sorted((r, known[r]) for r in drop)))  # repr: a file's immediates need not hash
        loaded = self.variants.get(key)
        if loaded is None:
            loaded = self.variants[key] = self.new(without_bound_checks(fn, drop)[0])  # in place before resolving: a call of itself finds it
            written = _written(fn)  # a param register the function reuses no longer holds the checked value
            checked = {r: known[r] for r in drop if r not in written}
            loaded.steps = [self.vm._resolve(self, loaded.fn, ins, checked) for ins in loaded.fn.code]
        return loaded


class VM:
    """Runs the functions of an ``Executable``. Each VM owns its memory (planned arenas, the
    pooled allocator, counters: ``memory_stats()``); ``track_live`` also follows the live bytes
    of fresh tensors (for measurements). Calls from several threads at once each run on memory
    of their own (see the module docstring); ``memory`` is the one a call takes first."""

    def __init__(self, exe: Executable, *, track_live: bool = False) -> None:
        self.exe = exe
        self.track_live = track_live
        self.memory = Memory(track_live=track_live)
        self._own = _Bound(self, self.memory)
        self._funcs = self._own.funcs
        self._lock = threading.Lock()  # held by the call that runs on ``_own``
        self._spares: list[_Bound] = []  # for calls made while ``_own`` is busy

    def _callee(self, bound: _Bound, fn: VMFunction, kind: str, name: str, passed: Mapping[int, tuple[Any, str]] | None = None) -> Callable[..., Any]:
        """``passed``: for a graph function, its params that receive checked bound values."""
        if kind == "builtin":
            f = B.BUILTINS.get(name)
        elif kind == "kernel":
            f = bound.kernels.get(name)
        elif kind == "func":
            target = bound.funcs.get(name)
            if target is not None and passed:
                target = bound.checked_variant(name, passed)
            f = None if target is None else (lambda *a, _t=target: _t.invoke(*a))
        else:
            f = lookup_extern(name)
            check = lookup_extern_check(name) if self.exe.untrusted else None
            if f is not None and check is not None:
                f = _checked_extern(name, f, check)
        if f is None:
            raise BuildError(f"{fn.name}: the executable calls {kind} {name!r}, which is not available here")
        return f

    def _resolve(self, bound: _Bound, fn: VMFunction, ins: tuple[Any, ...], checked: Mapping[int, tuple[Any, str]] | None = None) -> Step:
        """``checked``: ``fn``'s params whose registers hold values checked (shape, dtype) before
        the call (a bound variant's); a graph function they are passed to gets them as checked."""
        op = ins[0]
        if op == "ret":
            return (RET, ins[1], None)
        if op == "goto":
            return (GOTO, ins[1], None)
        if op == "if":
            return (IF, ins[1], ins[2])
        _, dst, (kind, name), args = ins
        args = list(args)
        try:
            if kind == "builtin" and name in B.BIND:
                callee, args = B.BIND[name](bound.memory, args)
                return (CALL, _make_step(dst, callee, args, self.exe.constants), None)
            passed = None
            if kind == "func" and checked:
                passed = {i: checked[v] for i, (tag, v) in enumerate(args) if tag == "r" and v in checked}
            callee = self._callee(bound, fn, kind, name, passed)
            if kind == "builtin" and name in B.PREPARE:
                args = B.PREPARE[name](args)
            return (CALL, _make_step(dst, callee, args, self.exe.constants), None)
        except (ValueError, TypeError, KeyError, IndexError) as e:  # a file's malformed immediates
            raise BuildError(f"{fn.name}: the executable's call of {kind} {name!r} has malformed arguments {args!r}: {e}") from None

    def _run(self, name: str, args: Sequence[Any], lead: int | None = None) -> Any:
        """Run function ``name`` on ``args`` (arrays, in full), on the VM's own memory when it
        is free, else on a spare; ``lead``: the params from ``lead`` on are bound ones (``bind``),
        already checked."""
        lock = self._lock
        held = team.enter()
        try:
            if lock.acquire(False):
                try:
                    own = self._own
                    return (own.funcs[name] if lead is None else own.variant(name, lead)).invoke(*args)
                except BaseException:
                    self.memory.reclaim()  # the failed call's pooled blocks go back to the pool
                    raise
                finally:
                    lock.release()
            return self._run_spare(name, args, lead)
        finally:
            team.leave(held)

    def _run_spare(self, name: str, args: Sequence[Any], lead: int | None) -> Any:
        """``_run`` on a spare ``_Bound`` (the VM's own memory is in use by another thread)."""
        try:
            bound = self._spares.pop()
        except IndexError:
            bound = _Bound(self, Memory(track_live=self.track_live))
        try:
            return (bound.funcs[name] if lead is None else bound.variant(name, lead)).invoke(*args)
        except BaseException:
            bound.memory.reclaim()
            raise
        finally:
            self._spares.append(bound)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        loaded = self._funcs.get(name)
        if loaded is None:
            raise KeyError(f"no function {name!r} in the executable (it has: {', '.join(self._funcs)})")
        params = loaded.fn.params
        run = self._run

        def call(*args: Any) -> Any:
            if len(args) != len(params):
                hint = f"; {self.exe.call_hint}" if self.exe.call_hint else ""
                raise RuntimeCheckError(f"{name} takes {len(params)} argument(s) ({', '.join(params)}), got {len(args)}{hint}")
            torch_in = any(is_torch_tensor(a) for a in args)
            out = run(name, [as_array(a) for a in args])
            return to_torch_tree(out) if torch_in else out

        call.__name__ = name
        return call

    def bind(self, name: str, *trailing: Any) -> Callable[..., Any]:
        """Function ``name`` with its last parameters fixed to ``trailing`` (converted once):
        what a caller that passes the same weights at every call uses (an LLM step takes
        hundreds of them). The result takes the leading parameters, NumPy in, NumPy out. The
        bound values' static shapes and dtypes are checked here, once (an LLM's or a BERT's
        weights: ~0.1 ms a call otherwise), not at every call; they are held as views of the
        VM's own, so that no caller can reshape them afterwards."""
        loaded = self._funcs.get(name)
        if loaded is None:
            raise KeyError(f"no function {name!r} in the executable (it has: {', '.join(self._funcs)})")
        params = loaded.fn.params
        if len(trailing) > len(params):
            raise RuntimeCheckError(f"{name} takes {len(params)} argument(s), {len(trailing)} were bound")
        # views of our own: nobody else can change their shape or dtype after the check below
        fixed = [a.view() if isinstance(a, np.ndarray) else a for a in map(as_array, trailing)]
        lead = len(params) - len(fixed)
        for ins in without_bound_checks(loaded.fn, lead)[1]:  # the bound params' checks, once, here
            _, _, (_, builtin), args = ins
            B.BUILTINS[builtin](*[fixed[v - lead] if tag == "r" else v for tag, v in args])
        run = self._run

        def call(*args: Any) -> Any:
            if len(args) != lead:
                raise RuntimeCheckError(f"{name} takes {lead} argument(s) ({', '.join(params[:lead])}) besides the bound ones, got {len(args)}")
            return run(name, [*[as_array(a) for a in args], *fixed], lead)

        call.__name__ = name
        return call

    def invoke(self, name: str, *args: Any) -> Any:
        return self[name](*args)

    def memory_stats(self) -> dict[str, int]:
        """The allocator's counters (see ``tilework.runtime.memory.Memory.stats``)."""
        return self.memory.stats()


def _prologue_static_checks(fn: VMFunction) -> Iterator[tuple[int, list[int], list[Any]]]:
    """The well-formed ``vm_check_static_tensors`` of ``fn``'s prologue (before any jump, its
    registers not yet written): (pc, registers, [shapes, dtypes, labels, where])."""
    written: set[int] = set()
    for pc, ins in enumerate(fn.code):
        if ins[0] != "call":
            return
        _, dst, (kind, builtin), args = ins
        if kind == "builtin" and builtin == "vm_check_static_tensors":
            n = len(args) - 4
            regs = [v for _, v in args[:n]]
            extras = [v for _, v in args[n:]]  # shapes, dtypes, labels, where (a file's: checked)
            well_formed = n >= 0 and all(isinstance(e, tuple) and len(e) == n for e in extras[:3]) and isinstance(extras[3:] and extras[3], str)
            if well_formed and all(tag == "r" for tag, _ in args[:n]) and all(tag == "i" for tag, _ in args[n:]) and not written.intersection(regs):
                yield pc, regs, extras
        written.add(dst)


def static_expectations(fn: VMFunction) -> dict[int, tuple[Any, str]]:
    """Param register -> (shape, dtype) that ``fn``'s prologue checks it against statically."""
    nparams = len(fn.params)
    out: dict[int, tuple[Any, str]] = {}
    for _, regs, extras in _prologue_static_checks(fn):
        for i, r in enumerate(regs):
            if r < nparams:
                out.setdefault(r, (extras[0][i], extras[1][i]))
    return out


def _written(fn: VMFunction) -> set[int]:
    """The registers ``fn``'s instructions write (a param's register may be reused)."""
    return {ins[1] for ins in fn.code if ins[0] == "call"}


def without_bound_checks(fn: VMFunction, bound: int | Collection[int]) -> tuple[VMFunction, list[Instr]]:
    """``fn`` for callers that fix its params ``bound`` (an int: from that one on, as
    ``VM.bind`` fixes them), and the checks that were taken out of it, to run once on the bound
    values: a ``vm_check_static_tensors`` of the prologue (before any jump, its registers not
    yet written) keeps only the other params, or becomes a jump to the next instruction when
    none is left."""
    nparams = len(fn.params)
    fixed = set(range(bound, nparams)) if isinstance(bound, int) else set(bound)
    code = list(fn.code)
    taken: list[Instr] = []
    for pc, regs, extras in _prologue_static_checks(fn):
        dst = fn.code[pc][1]
        keep = [i for i, r in enumerate(regs) if r not in fixed]
        drop = [i for i, r in enumerate(regs) if r in fixed]
        if drop:
            taken.append(_static_check(dst, "vm_check_static_tensors", [regs[i] for i in drop], [tuple(e[i] for i in drop) for e in extras[:3]], extras[3]))
            keep_args = [tuple(e[i] for i in keep) for e in extras[:3]]
            code[pc] = _static_check(dst, "vm_check_static_tensors", [regs[i] for i in keep], keep_args, extras[3]) if keep else ("goto", pc + 1)
    return VMFunction(fn.name, fn.params, fn.num_regs, tuple(code)), taken


def _static_check(dst: int, builtin: str, regs: list[int], extras: list[tuple[Any, ...]], where: str) -> Instr:
    args = tuple([*(("r", r) for r in regs), *(("i", e) for e in extras), ("i", where)])
    return ("call", dst, ("builtin", builtin), args)


def _checked_extern(name: str, f: Callable[..., Any], check: Callable[..., None]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        check(name, *args)
        return f(*args)

    return call


def _make_step(dst: int, callee: Callable[..., Any], args: Sequence[tuple[str, Any]], constants: Sequence[Any]) -> Callable[[list[Any]], None]:
    """``lambda r: r[dst] = callee(args...)`` generated once per instruction."""
    env: dict[str, Any] = {"f": callee}
    parts = []
    for i, (kind, value) in enumerate(args):
        if kind == "r":
            parts.append(f"r[{int(value)}]")
        else:
            env[f"k{i}"] = constants[value] if kind == "c" else value
            parts.append(f"k{i}")
    src = f"def step(r):\n    r[{int(dst)}] = f({', '.join(parts)})\n"
    exec(compile(src, "<vm-step>", "exec"), env)  # noqa: S102 - generated from ints only
    step: Callable[[list[Any]], None] = env["step"]
    return step
