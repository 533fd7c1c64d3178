"""``tilework.compile``: from a model to a callable compiled once for every shape.

    cm = tilework.compile(model, example_args=(ids,), dynamic_shapes=({1: Dim("seq", max=512)},))
    out = cm(ids)                  # called like the model: torch in -> torch out, NumPy -> NumPy
    cm.save("m.tw"); cm = CompiledModel.load("m.tw")
    print(cm.explain())

**Frontends** are a registry (``tilework.frontend.registry``): ``compile`` asks each registered
frontend, in order, whether it accepts the model, and the first that does imports it. Built in,
registered here: ``irmodule`` (an IRModule, compiled as it is), ``torch.export`` (an
ExportedProgram) and ``torch`` (a ``torch.nn.Module``, exported with ``torch.export.export``;
the names of its ``Dim``s name the sym vars), ``tilework.nn`` (a ``tilework.nn.Module``;
``example_args`` is the spec of its ``forward``) and ``onnx`` (a ``ModelProto`` or a path).

**Weights** are trailing params of ``main`` by default and the CompiledModel passes them itself
(``weights="constants"`` instead bakes them into the module as constants). They are the model's
at compile time: each is copied once (a torch model's are read as views and copied where they
are kept as they are; laid out, they are new arrays), so a later in-place change of the model
does not reach the compiled model. They are kept side by side in one mapping of 2 MiB pages
(``tilework.runtime.pages.hold_all``), compiled or loaded: a call at a few rows
streams every weight, and with the weights in 4 KiB pages of their own that is a TLB miss every
4 KiB and a stop for the hardware prefetchers at every page (all-MiniLM-L6-v2's 91 MB, 2 threads,
the 2-core Zen 4, same process alternating, back to back: (1, 8) 2.12-2.40 -> 1.96-2.21 ms, (1,
32) 4.82-5.35 -> 4.72-4.93 ms, (1, 128) and (8, 128) within the noise). **The saved file**
is an executable file (``tilework.load`` reads it as a plain ``Executable``; the format is
``docs/executable-format.md``) that also holds the signature and the compile report, the
weights (raw arrays, when they are params) and the optimized module in the text format (unless
weight constants make it large). ``CompiledModel.load`` restores a callable.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Mapping, Sequence

import numpy as np

from tilework.backend import quant as quant_backend
from tilework.driver import build, pipeline_name
from tilework.errors import BuildError, TileworkError, UnsupportedError
from tilework.frontend.registry import CompileOptions, Imported, Signature, frontends, import_irmodule, import_model, register_frontend
from tilework.ir.graph import Constant, GraphFunc
from tilework.ir.info import TensorInfo, TupleInfo
from tilework.ir.module import IRModule
from tilework.ir.visitor import ExprVisitor
from tilework.nn.module import register_compiler
from tilework.runtime import pages
from tilework.runtime.executable import load_file
from tilework.runtime.tensor import is_torch_tensor, to_torch_tree
from tilework.transform.pipeline import Pipeline, stages
from tilework.transform.layout_weights import LayoutWeights, lay_out_weights
from tilework.transform.fold_batch_norm import fold_batch_norm
from tilework.transform.bf16_weights import BF16_BOUND, Bf16Weights, bf16_params, convert_weights, weight_error

KIND = "tilework.compiled_model"


def is_compiled_model(loaded: Any) -> bool:
    """Whether a file read by ``load_file`` was written by ``CompiledModel.save`` (its
    executable's ``main`` then takes the stored weights, ``loaded.arrays["weights"]``, last)."""
    return bool(loaded.extra.get("kind") == KIND)
_WEIGHT_CONSTANT_LIMIT = 1 << 20  # bytes of constants above which the module text is not saved
PRECISIONS = ("fp32", "bf16")
RUNTIMES = ("auto", "vm", "native")


def compile(
    model: Any,
    example_args: Any = None,
    dynamic_shapes: Any = None,
    backends: Any = None,
    placement: Any = None,
    *,
    dim_names: Mapping[str, str] | None = None,
    dim_bounds: Mapping[str, tuple[int | None, int | None]] | None = None,
    weights: str = "inputs",
    passes: Sequence[Any] | None = None,
    opt_level: int = 1,
    target: str = "cpu",
    budget_s: float | None = None,
    buckets: Mapping[str, Sequence[int]] | None = None,
    pins: Mapping[str, str] | None = None,
    placement_options: Mapping[str, Any] | None = None,
    precision: str = "fp32",
    runtime: str = "auto",
) -> "CompiledModel":
    """Compile ``model`` (a ``torch.nn.Module``, an ``ExportedProgram``, an ``IRModule``, or
    what another registered frontend accepts) once for every shape of its dynamic dims.

    ``example_args``: a tuple of positional inputs, a dict of keyword inputs, or a
    ``(args, kwargs)`` pair (torch modules only). ``dynamic_shapes`` as for
    ``torch.export.export``. ``dim_names``/``dim_bounds`` rename and narrow dynamic dims (keys:
    ``INPUT.AXIS``, a torch symbol or a dim's name; bounds ``(lo, hi)``). ``weights``:
    ``"inputs"`` (trailing params, passed by the CompiledModel) or ``"constants"``. ``passes``
    replaces the pipeline's graph stage and leaves out its kernel stage (``[]``: lowering
    only). ``backends``: names in priority order (``["blas",
    "torch", "codegen"]`` or ``"blas,torch,codegen"``; see ``tilework.backend``): each op runs on
    the first backend that can run it, the rest on tilework's kernels. ``placement="auto"``
    chooses the backend of every part instead, by measuring candidates on this machine per
    shape bucket (``tilework.collage``, ``docs/placement.md``; over ``backends`` when given,
    else every available backend): ``budget_s`` bounds the search, ``buckets`` gives the
    points per dim (``{"seq": [8, 64, 256]}``), ``pins`` fixes ops or vars to a backend
    (``{"attention": "torch"}``), ``placement_options`` passes the search's other options
(``refine``, ``max_size``, ``progress``, ``cost_model``; ``tilework.collage.place``); a
``PlacementPlan`` or a saved plan's path reuses a plan.
    ``opt_level=0`` compiles without graph passes, views,
    fusion or memory planning (for comparisons). ``target``: the kernel target (``cpu``, or
    ``interp``, the NumPy reference interpreter). ``precision="bf16"``: float32 linear weights
    are stored as bfloat16 and multiplied with float32 sums by the ``quant`` backend (from 9
    rows on, where the CPU has AVX-512 BF16, the activations rounded to bf16 for its dot
    products; ``tilework.transform.bf16_weights``: each output within
    ``BF16_BOUND * sum|x * w|`` of float32, about ``2**-7``), and there the attention too
    multiplies in bfloat16 (q, k, v and the probabilities rounded, float32 sums: ``vdpbf16ps``);
    ``CompiledModel.check_precision`` measures the error against a float32 model.
    ``runtime``: ``"native"`` runs ``main`` as native graph code (``tilework.export.native``:
    the bytecode translated to C and compiled once, calling the same kernels: the same bits,
    without the interpreter's few microseconds per instruction; not for models with torch,
    onnxruntime or blas regions); ``"vm"`` on the Python VM; ``"auto"`` (the default) natively
    where it can, else on the VM (``CompiledModel.runtime_note`` says why).
    ``CompiledModel.runtime`` switches it later."""
    if weights not in ("inputs", "constants"):
        raise UnsupportedError(f"weights must be 'inputs' or 'constants', got {weights!r}")
    if precision not in PRECISIONS:
        raise UnsupportedError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if runtime not in RUNTIMES:
        raise UnsupportedError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    searching = {k: v for k, v in (("budget_s", budget_s), ("buckets", buckets), ("pins", pins), ("placement_options", placement_options)) if v is not None}
    if searching and placement != "auto":
        raise UnsupportedError(f"{', '.join(searching)} need(s) placement='auto' (they steer the search), got placement={placement!r}")
    if searching:  # before the import: a mistake in them should not wait for it
        from tilework.collage.place import check_options

        check_options(budget_s=budget_s, buckets=buckets, pins=pins)
    options = CompileOptions(example_args, dynamic_shapes, dim_names, dim_bounds, weights)
    t0 = time.perf_counter()
    imported = import_model(model, options)
    t1 = time.perf_counter()
    name = pipeline_name(opt_level)
    staged = stages(name, graph=passes, kernel=[] if passes is not None else None)
    graph_passes, kernel_passes = staged["graph"], staged["kernel"]
    module, model_weights = imported.module, imported.weights
    if graph_passes and passes is None and weights == "inputs":  # batch norms folded into the weight params' values
        module, model_weights = fold_batch_norm(module, model_weights)
    optimized = Pipeline(graph_passes)(module) if graph_passes else module
    build_backends = backends
    precision_report: dict[str, Any] = {"mode": precision}
    if precision == "bf16":
        # bf16x16 where the quant library multiplies with AVX-512 BF16 (its GEMV and GEMM read
        # that layout unpacked; elsewhere the plain rows' kernels are the faster ones), and the
        # attention's products in bf16 there (elsewhere they would only round)
        bf16dot = quant_backend.bf16dot_available()
        to_bf16 = Bf16Weights(params=weights == "inputs", groups=bf16dot, attention=bf16dot)
        optimized, model_weights, precision_report, build_backends = _to_bf16(to_bf16, optimized, model_weights, backends)
        graph_passes = [*graph_passes, to_bf16]
    layout_weights = None  # weights laid out for our kernels, once (packed by exe.meta's weight_layout below)
    if graph_passes and passes is None and backends is None and placement is None:
        layout = LayoutWeights(params=weights == "inputs")
        optimized = layout(optimized)
        graph_passes = [*graph_passes, layout]
    elif graph_passes and passes is None:  # after offload: what other backends run keeps its weights as given
        layout_weights = "params" if weights == "inputs" else "constants"
    t2 = time.perf_counter()
    search_options = {"budget_s": budget_s, "buckets": buckets, "pins": pins, **dict(placement_options or {})}
    exe = build(optimized, target, pipeline=name, passes=[], post_legalize_passes=kernel_passes, backends=build_backends, placement=placement, placement_options=search_options, layout_weights=layout_weights)
    if weights == "inputs":
        model_weights = lay_out_weights(exe.meta.get("weight_layout") or {}, model_weights)
    model_weights = list(model_weights)
    # into one arena of 2 MiB pages: each a copy of its own there; without an arena, those
    # that view the model's memory (a torch model's tensors) are copied
    if not pages.hold_all(model_weights) and imported.borrowed:
        model_weights = _owned(model_weights, imported.weights)
    t3 = time.perf_counter()
    lowering = [*(["layout_weights"] if layout_weights else []), *(p.name for stage in ("legalize", "kernel", "schedule", "lowering") for p in staged[stage])]
    report = {
        "source": imported.source,
        "passes": {"graph": [p.name for p in graph_passes], "lowering": lowering},
        "seconds": {"import": round(t1 - t0, 3), "optimize": round(t2 - t1, 3), "build": round(t3 - t2, 3), "total": round(t3 - t0, 3)},
        "build": {k: v for k, v in exe.meta.items() if k not in ("target", "placement")},
        "dims": {v.name: [v.lo, v.hi, where] for v, where in imported.dims.items()},
        "graph": _graph_summary(optimized),
        "weights": {"count": len(imported.weights), "bytes": int(sum(w.nbytes for w in imported.weights)), "as": weights},
        "precision": precision_report,
    }
    return CompiledModel(optimized, exe, model_weights, imported.signature, report, runtime=runtime)


class CompiledModel:
    """A compiled model: call it like the original. See the module docstring."""

    def __init__(self, module: IRModule | None, executable: Any, weights: list[np.ndarray], signature: Signature, report: dict[str, Any], *, module_text: str | None = None, runtime: str = "vm") -> None:
        from tilework.runtime.vm import VM

        self._module = module
        self._module_text = module_text  # parsed on first use of .module
        self.executable = executable
        self.weights = weights
        self.signature = signature
        self.report = report
        self._vm = VM(executable)
        self._bound: tuple[list[np.ndarray], Any] | None = None  # (weights, main with them bound)
        self._runtime = "vm"
        self.runtime_note = ""  # why "auto" chose the VM, where it did
        self.runtime = runtime

    @property
    def runtime(self) -> str:
        """``"vm"`` or ``"native"``: what runs ``main`` (see ``tilework.compile``). Setting it to
        ``"native"`` builds the native code now (an ``ExportError`` naming what cannot run
        natively); ``"auto"`` builds it where it can run and chooses the VM otherwise, saying why
        in ``runtime_note`` and ``explain``."""
        return self._runtime

    @runtime.setter
    def runtime(self, value: str) -> None:
        if value not in RUNTIMES:
            raise UnsupportedError(f"runtime must be one of {', '.join(RUNTIMES)}, got {value!r}")
        self._bound = None
        self.runtime_note = ""
        if value == "auto":
            why = self._not_native()
            if why is None:
                try:
                    self._runtime = "native"
                    self._main()
                    return
                except BuildError as e:  # ExportError among them: what the C translation refuses
                    why = str(e)
            self._runtime, self.runtime_note = "vm", why
            return
        if value == "native" and getattr(self.executable, "untrusted", False):
            raise UnsupportedError("runtime='native' runs the kernels of a file unchecked: load it with trust_native=True if you trust it (or keep runtime='vm')")
        self._runtime = value
        if value == "native":
            self._main()

    def _not_native(self) -> str | None:
        """Why ``main`` should not run as native graph code by default (None: it can): an
        executable read from a file runs on the VM, whose calls check each kernel's arguments
        against its loop IR, unless the file was trusted; the C runtime returns tensors only, as
        a flat tuple."""
        if getattr(self.executable, "untrusted", False):
            return "read from a file: its kernel calls are checked on the VM; load it with trust_native=True for native code"
        fn = self.module.get("main") if self.module is not None else None
        if not isinstance(fn, GraphFunc):
            return "main's result types are unknown (no module)"
        ret = fn.ret_info
        leaves = ret.fields if isinstance(ret, TupleInfo) else (ret,)
        if not all(isinstance(x, TensorInfo) for x in leaves):
            return "main returns values other than tensors (the native runtime returns tensors only, as a flat tuple)"
        return None

    def _main(self) -> Any:
        """``main`` with the weights bound, on the runtime chosen (made again when the weights
        list was replaced)."""
        bound = self._bound
        if bound is None or bound[0] is not self.weights:  # the weights are converted once, not per call
            if self._runtime == "native":
                from tilework.export.native import NativeModel

                t = time.perf_counter()
                main = NativeModel(self.executable, bind={"main": self.weights}).bind("main")
                self.report.setdefault("seconds", {})["native"] = round(time.perf_counter() - t, 3)
            else:
                main = self._vm.bind("main", *self.weights)
            bound = self._bound = (self.weights, main)
        return bound[1]

    @property
    def module(self) -> IRModule | None:
        """The optimized module (None when it was not saved with the model)."""
        if self._module is None and self._module_text is not None:
            from tilework.text import parse

            self._module = parse(self._module_text)
        return self._module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.signature.bind(args, kwargs)
        out = self._main()(*inputs)
        return self.signature.unflatten(to_torch_tree(out) if any(is_torch_tensor(a) for a in inputs) else out)

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: str) -> None:
        """One file; see the module docstring for what it holds."""
        texts = {}
        if self.module is not None and _constant_bytes(self.module) <= _WEIGHT_CONSTANT_LIMIT:
            texts["module"] = str(self.module)
        extra = {"kind": KIND, "signature": self.signature.to_json(), "report": self.report}
        self.executable.save(path, extra=extra, arrays={"weights": self.weights}, texts=texts)

    @staticmethod
    def load(path: str, trust_native: bool = False, runtime: str = "auto") -> "CompiledModel":
        """A CompiledModel saved with ``save``; nothing runs from the file (see
        ``tilework.load``) and nothing is recompiled when the kernel cache is warm. ``runtime``
        as in ``tilework.compile``; but a file's kernel calls are checked on the VM, so
        ``"auto"`` runs it there and ``"native"`` is refused unless ``trust_native``."""
        loaded = load_file(path, trust_native=trust_native)
        extra = loaded.extra
        if not is_compiled_model(loaded):
            raise TileworkError(f"{path!r} is a plain executable, not a compiled model; load it with tilework.load")
        sig = extra.get("signature")
        if not isinstance(sig, dict) or not isinstance(sig.get("inputs"), list) or not isinstance(extra.get("report"), dict):
            raise TileworkError(f"{path!r}: malformed compiled-model metadata")
        signature = Signature(sig["inputs"], sig.get("in_spec"), sig.get("out_spec"))
        weights = list(loaded.arrays.get("weights", []))
        pages.hold_all(weights)
        return CompiledModel(None, loaded.executable, weights, signature, extra["report"], module_text=loaded.texts.get("module"), runtime=runtime)

    def export_c(self, out_dir: str, *, force: bool = False) -> Any:
        """Write the model as a standalone C library into ``out_dir`` (no Python at run time;
        ``docs/export.md``): the kernels, ``main`` as straight-line C, the weights in
        ``model.twb``, a header, CMakeLists.txt and a Makefile. Its inputs are the flattened
        inputs of the model (``self.signature``). Returns a ``tilework.export.ExportResult``.
        Files of ``out_dir`` that a tilework export did not write are not replaced unless
        ``force`` (``tilework.export.export_c``)."""
        from tilework.export import export_c

        return export_c(self.executable, out_dir, bind={"main": self.weights}, force=force)

    # -- the account ------------------------------------------------------------------------

    def explain(self) -> str:
        """What was compiled and how: inputs with their symbolic dims and bounds, outputs,
        weights, the ops of the graph, kernels, passes and times."""
        r = self.report
        lines = ["tilework compiled model", f"  source: {r['source']}"]
        fn = self.module.get("main") if self.module is not None else None
        fn = fn if isinstance(fn, GraphFunc) else None
        lines.append("  inputs:")
        params = list(getattr(fn, "params", ()))
        idx = 0
        for spec in self.signature.inputs:
            if not spec["tensor"]:
                lines.append(f"    {spec['name']:<20} fixed to {spec['value']!r} at compile time")
                continue
            lines.append(f"    {spec['name']:<20} {_info_text(params[idx].info) if idx < len(params) else 'tensor'}")
            idx += 1
        dims = r.get("dims", {})
        if dims:
            lines.append("  dynamic dims:")
            for name, (lo, hi, where) in dims.items():
                rng = f"{lo} <= {name}" + (f" <= {hi}" if hi is not None else "  (no upper bound)")
                lines.append(f"    {name:<12} {rng:<28} first seen at {where}")
        else:
            lines.append("  dynamic dims: none (every shape is static)")
        if fn is not None:
            lines.append(f"  outputs: {_info_text(fn.ret_info)}")
        w = r["weights"]
        where = "trailing params of main, passed by the compiled model" if w["as"] == "inputs" else "constants inside the executable"
        lines.append(f"  weights: {w['count']} tensor(s), {w['bytes'] / 1e6:.1f} MB, as {where}")
        lines.extend(_precision_lines(r.get("precision", {"mode": "fp32"})))
        g = r["graph"]
        ops = ", ".join(f"{name} x{n}" for name, n in g["ops"])
        lines.append(f"  graph: {g['bindings']} bindings, {g['op_calls']} op calls ({len(g['ops'])} distinct ops): {ops}")
        stats = self.executable.stats()
        lines.append(f"  executable: {stats['kernels']} kernel(s), {stats['instructions']} VM instructions, {stats['constants']} constant(s)")
        lines.append("  runtime: native graph code (the bytecode compiled to C)" if self._runtime == "native" else "  runtime: the Python VM" + (f"; {self.runtime_note}" if self.runtime_note else ""))
        chosen = r.get("build", {}).get("backends")
        plan = self.placement
        if plan is not None:
            lines.append("  backends: placed automatically per shape bucket (the table below)")
        else:
            lines.append(f"  backends: {', '.join(chosen)} (by priority; the rest on tilework's C kernels)" if chosen else "  backends: tilework C kernels for every op")
        graph_passes = ", ".join(r["passes"]["graph"]) or "none"
        lines.append(f"  passes: graph: {graph_passes}; lowering: {', '.join(r['passes']['lowering'])}")
        s, b = r["seconds"], r.get("build", {})
        parts = [f"import {s['import']:.2f} s", f"graph passes {s['optimize']:.2f} s", f"build {s['build']:.2f} s"]
        if "passes_s" in b and "codegen_s" in b:
            parts[-1] += f" = lowering {float(b['passes_s']):.2f} s + C kernels {float(b['codegen_s']):.2f} s"
        if b.get("kernel_cache_hit") is not None:
            parts.append("kernels from the cache" if b["kernel_cache_hit"] else "kernels compiled now")
        if "native" in s:
            parts.append(f"then native graph code {s['native']:.2f} s")
        lines.append(f"  compile time: {s['total']:.2f} s ({', '.join(parts)})")
        if plan is not None:
            lines.extend("  " + line for line in plan.table().splitlines())
        return "\n".join(lines)

    def check_precision(self, reference: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Run this model and ``reference`` (the float32 model: a CompiledModel or any
        callable) on the same inputs and measure the difference of their outputs: ``max_abs``,
        and ``max_rel`` (``max_abs`` over the largest ``|reference|``). Kept in the report;
        ``explain`` shows the latest measurement."""
        ours = _flat_arrays(self(*args, **kwargs))
        ref = _flat_arrays(reference(*args, **kwargs))
        if len(ours) != len(ref) or any(a.shape != b.shape for a, b in zip(ours, ref)):
            raise TileworkError(f"check_precision: the reference's outputs {[b.shape for b in ref]} do not match this model's {[a.shape for a in ours]}")
        max_abs = max((float(np.max(np.abs(a - b))) for a, b in zip(ours, ref) if a.size), default=0.0)
        scale = max((float(np.max(np.abs(b))) for b in ref if b.size), default=0.0)
        max_rel = max_abs / scale if scale else 0.0
        shapes = ", ".join(str(tuple(a.shape)) for a in _flat_arrays([*args, *kwargs.values()]))
        self.report.setdefault("precision", {"mode": "fp32"})["measured"] = {"max_abs": max_abs, "max_rel": max_rel, "inputs": shapes}
        return {"max_abs": max_abs, "max_rel": max_rel}

    @property
    def placement(self) -> Any:
        """The ``tilework.collage.PlacementPlan`` the model was compiled with (None: no
        automatic placement); ``cm.placement.save(path)`` keeps it apart."""
        data = self.executable.meta.get("placement")
        if data is None:
            return None
        from tilework.collage.place import PlacementPlan

        return PlacementPlan.from_dict(data)

    def __repr__(self) -> str:
        names = ", ".join(i["name"] for i in self.signature.inputs)
        return f"CompiledModel({names}) from {self.report['source']}"


# -- helpers ---------------------------------------------------------------------------------------


def _owned(weights: Sequence[np.ndarray], borrowed: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``weights`` with a copy of each one whose memory may be that of a ``borrowed`` array
    (a view of the user's model): the others are new arrays that compile made (laid out,
    folded, converted), which it owns already."""
    try:
        from numpy.lib.array_utils import byte_bounds
    except ImportError:  # NumPy < 2.0 (pyproject takes 1.24 on)
        from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

    merged: list[list[int]] = []  # the borrowed memory as disjoint [lo, hi) byte ranges
    for lo, hi in sorted(byte_bounds(np.asarray(b)) for b in borrowed if b.size):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    starts = [lo for lo, _ in merged]

    def shared(w: np.ndarray) -> bool:
        if not np.asarray(w).size:
            return False
        lo, hi = byte_bounds(np.asarray(w))
        i = bisect.bisect_left(starts, hi) - 1  # the last range that starts below hi
        return i >= 0 and merged[i][1] > lo

    return [np.array(w, copy=True) if shared(w) else w for w in weights]


def _to_bf16(to_bf16: Bf16Weights, mod: IRModule, weights: list[np.ndarray], backends: Any) -> tuple[IRModule, list[np.ndarray], dict[str, Any], Any]:
    """``mod`` with its float32 linear weights in bf16 (the pass ``to_bf16``), the weights to
    pass, the precision report and the backends to build with (``quant`` first)."""
    before = mod
    mod = to_bf16(mod)
    main = mod.get("main")
    converted = bf16_params(main) if isinstance(main, GraphFunc) else ()
    first = int(main.attrs.get("num_inputs", len(main.params))) if isinstance(main, GraphFunc) else 0
    err = max((weight_error(weights[i - first]) for i in converted), default=None)
    linears = sum(n for op, n in _graph_summary(mod)["ops"] if op == "quant_linear") - sum(n for op, n in _graph_summary(before)["ops"] if op == "quant_linear")
    attention = _bf16_attention_calls(mod)
    report: dict[str, Any] = {"mode": "bf16", "linears": linears, "attention": attention, "weight_max_rel_err": err, "bound_rel": BF16_BOUND}
    names = backends.split(",") if isinstance(backends, str) else list(backends or ["codegen"])
    if linears and "quant" not in names:
        names = ["quant", *names]
    return mod, convert_weights(mod, weights), report, (names if linears or backends is not None else None)


def _precision_lines(p: dict[str, Any]) -> list[str]:
    if p.get("mode", "fp32") == "fp32":
        lines = ["  precision: fp32"]
    else:
        err = p.get("weight_max_rel_err")
        measured_w = f"; weights rounded by at most {err:.2e} relative (measured)" if err is not None else ""
        lines = [
            f"  precision: bf16 weights for {p['linears']} linear(s), fp32 accumulation (quant backend;"
            f" activations rounded to bf16 for AVX-512 BF16 dot products where the CPU has them){measured_w}",
            f"    bound per output: |y - y_fp32| <= {p['bound_rel']:.2e} * sum_k |x_k * w_k| (+ fp32 rounding)",
        ]
        if p.get("attention"):
            lines.append(f"    attention: bf16 products (q, k, v and probabilities rounded to bf16, fp32 sums) in {p['attention']} call(s)")
    m = p.get("measured")
    if m is not None:
        lines.append(f"    measured against fp32 on inputs {m['inputs']}: max abs error {m['max_abs']:.3e}, {m['max_rel']:.3e} of the largest output")
    return lines


def _flat_arrays(out: Any) -> list[np.ndarray]:
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in _flat_arrays(o)]
    if isinstance(out, dict):
        return [a for o in out.values() for a in _flat_arrays(o)]
    if is_torch_tensor(out):
        return [out.detach().cpu().float().numpy()]
    return [] if out is None else [np.asarray(out, dtype=np.float64)]


def _info_text(info: Any) -> str:
    from tilework.text.printer import print_info

    return print_info(info)


def _bf16_attention_calls(mod: IRModule) -> int:
    """The ``attention`` calls of ``mod`` with bfloat16 products."""
    from tilework.ir.graph import Binding, Call, OpRef, bindings_of

    calls = (b.value for _, func in mod.graph_funcs() for b in bindings_of(func) if isinstance(b, Binding) and isinstance(b.value, Call))
    return sum(1 for c in calls if isinstance(c.callee, OpRef) and c.callee.name == "attention" and c.attrs.get("bf16"))


def _graph_summary(mod: IRModule) -> dict[str, Any]:
    from collections import Counter

    from tilework.ir.graph import Binding, Call, OpRef, bindings_of

    ops: Counter[str] = Counter()
    bindings = 0
    for _, func in mod.graph_funcs():
        for b in bindings_of(func):
            bindings += 1
            if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef):
                ops[b.value.callee.name] += 1
    return {"bindings": bindings, "op_calls": sum(ops.values()), "ops": ops.most_common()}


class _ConstantBytes(ExprVisitor):
    def __init__(self) -> None:
        self.total = 0

    def visit_constant(self, e: Constant) -> None:
        self.total += int(e.data.nbytes)


def _constant_bytes(mod: IRModule) -> int:
    count = _ConstantBytes()
    for _, func in mod.graph_funcs():
        count.visit(func.body)
    return count.total


def _register_builtins() -> None:
    """The built-in frontends, in the order ``compile`` asks them."""
    from tilework.frontend.onnx.compile import register as register_onnx
    from tilework.frontend.torch.compile import register as register_torch
    from tilework.nn.export import register as register_nn

    register_frontend("irmodule", lambda m: isinstance(m, IRModule), import_irmodule)
    register_torch()
    register_nn()
    register_onnx()


_register_builtins()
register_compiler(compile)  # Module.compile of tilework.nn


__all__ = ["compile", "CompiledModel", "Signature", "Imported", "CompileOptions", "register_frontend", "frontends"]
