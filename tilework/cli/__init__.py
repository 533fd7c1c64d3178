"""The ``tilework`` command line.

    tilework demo                      build, print, parse back and verify a symbolic model
    tilework build IR_FILE -o OUT.tw   compile a module in the text format to an executable
    tilework build MODEL.pt2 -o OUT.tw [--dim seq=input_ids.1<=512] [--backends blas,torch,codegen] [--precision bf16]
                                       compile a torch.export program (torch.export.save)
    tilework build MODEL.onnx -o OUT.tw [--dim seq<=512]
                                       compile an ONNX model (--dim bounds a dim_param)
    tilework build ... --placement auto [--budget S] [--bucket n=1,32,256] [--pin matmul=blas]
                                       choose each part's backend by measuring (docs/placement.md)
    tilework explain OUT.tw            what was compiled, and the placement table
    tilework cache stats|clear         the placement cost cache
    tilework run OUT.tw --input x=x.npy ... [--output DIR] [--function main] [--trust-native]
    tilework generate "PROMPT" [--max-tokens N] [--precision q|bf16|fp32] [--model PATH.gguf]
                                       stream an LLM's completion (default: SmolLM2-135M-Instruct)
    tilework chat [--model PATH.gguf]  an interactive chat (history kept in the KV cache)
    tilework serve [MODEL.gguf] [--host 127.0.0.1] [--port 8000]
                                       an OpenAI-compatible server with continuous batching
    tilework export MODEL -o DIR [--backends codegen,blas] [--build make|cmake]
                                       the model as a standalone C library (docs/export.md)
    tilework --version

Every command has ``--help``. User mistakes (a missing file, bad IR, a wrong input) end with an
``error: ...`` message naming the file, argument or line and exit status 2, never a traceback
(``--debug`` shows it); ``cli.failure`` is the one place that decides (docs/errors.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Sequence

from tilework.cli import failure, inputs
from tilework.errors import TileworkError

DEBUG_HELP = "on an error, show the full traceback (for reporting a bug)"


def _parser() -> argparse.ArgumentParser:
    from tilework import __version__

    p = argparse.ArgumentParser(prog="tilework", description="A compiler for ML models whose shapes change at run time.")
    p.add_argument("--version", action="version", version=f"tilework {__version__}")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="build, print, parse back and verify a 2-layer transformer block with symbolic batch and seq")
    d.add_argument("--layers", type=int, default=2, help="number of transformer layers (default 2)")
    d.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    d.add_argument("--quiet", action="store_true", help="do not print the IR")
    d.add_argument("--run", action="store_true", help="also compile the block once and run it at several shapes against NumPy")

    b = sub.add_parser("build", help="compile a module in the text format, a torch.export program (.pt2) or an ONNX model (.onnx) to an executable file", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_DIM_HELP)
    b.add_argument("ir_file", help="a module in tilework's text format (print(mod) writes it), a .pt2 file written by torch.export.save, or an .onnx model")
    b.add_argument("-o", "--output", required=True, help="the executable to write (e.g. out.tw)")
    b.add_argument("--dim", action="append", default=[], metavar="SPEC", help="(.pt2 and .onnx) name a dynamic dim and/or narrow its bounds, e.g. seq=input_ids.1<=512 (.pt2) or seq<=512 (.onnx: a dim_param, INPUT.AXIS or a generated name such as x_dim0); repeat for each dim (see below)")
    b.add_argument("--backends", metavar="LIST", help="backends in priority order, e.g. blas,torch,codegen: each op goes to the first that can run it, the rest to tilework's kernels (see docs/backends.md)")
    b.add_argument("--target", default="cpu", help="the kernel target: cpu (C + OpenMP, default) or interp (the NumPy reference interpreter: slow, needs no compiler)")
    b.add_argument("--pipeline", choices=("default", "O0"), default="default", help="the pass pipeline: default, or O0 (no graph passes, fusion or memory planning)")
    b.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="(.pt2, .onnx) bf16: linear weights stored as bfloat16, products accumulated in float32 (activations rounded to bf16 in the GEMMs, and the attention's products in bf16, where the CPU has AVX-512 BF16; tilework.compile's precision)")
    from tilework.cli import placement

    placement.add_build_args(b)

    r = sub.add_parser("run", help="run a function of an executable on .npy inputs")
    r.add_argument("executable", help="a file written by `tilework build`, Executable.save or CompiledModel.save (whose stored weights are passed: --input names only the model's inputs)")
    r.add_argument("--function", default="main", help="the function to run (default main)")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input by parameter name; repeat for each")
    r.add_argument("--output", metavar="DIR", help="write outputs as DIR/output0.npy, ... (default: print a summary)")
    r.add_argument("--trust-native", action="store_true", help="use the native kernel code stored in the file instead of rebuilding the kernels from its loop IR (for machines without a C compiler; runs code from the file: only for files you trust)")

    from tilework.cli import export, llm

    llm.add_parsers(sub)
    export.add_parser(sub)
    placement.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    _debug_flag_everywhere(parser)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return failure.guarded(_dispatch, args, debug=args.debug)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return _demo(args)
    if args.command == "build":
        return _build(args)
    if args.command in ("generate", "chat", "perplexity", "serve"):
        from tilework.cli import llm

        return llm.run(args)
    if args.command == "export":
        from tilework.cli import export

        return export.run(args)
    if args.command in ("explain", "cache"):
        from tilework.cli import placement

        return placement.run(args)
    return _run(args)


def _debug_flag_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after any subcommand too (``tilework build m.onnx --debug``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                if not any("--debug" in a.option_strings for a in sp._actions):
                    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


def _demo(args: argparse.Namespace) -> int:
    from tilework.ir import sym
    from tilework.ir.graph import GraphFunc
    from tilework.ir.info import TensorInfo
    from tilework.ir.structural import structural_equal
    from tilework.ir.verify import verify
    from tilework.models.reference import TransformerConfig, transformer_block
    from tilework.text import parse
    from tilework.text.printer import print_info

    if args.hidden % 4 or args.layers < 1:
        raise TileworkError("--hidden must be a multiple of 4 (4 heads) and --layers at least 1")
    batch, seq = sym.SymVar("batch", 1), sym.SymVar("seq", 1, 4096)
    cfg = TransformerConfig(layers=args.layers, hidden=args.hidden, heads=4, ffn=4 * args.hidden)
    t0 = time.perf_counter()
    mod = transformer_block(cfg, batch, seq)
    t1 = time.perf_counter()
    text = str(mod)
    if not args.quiet:
        print(text)
    back = parse(text)
    verify(back)
    verify(mod)
    t2 = time.perf_counter()
    same = structural_equal(back, mod)
    main_fn = mod["main"]
    assert isinstance(main_fn, GraphFunc)
    ret = main_fn.ret_info
    expected = TensorInfo((batch, seq, args.hidden), "float32")
    n_bindings = sum(len(block.bindings) for block in main_fn.body.blocks)
    print(f"built {cfg.layers}-layer transformer block: {n_bindings} bindings in {1e3 * (t1 - t0):.1f} ms")
    print(f"printed, parsed back and verified in {1e3 * (t2 - t1):.1f} ms; round trip structurally equal: {same}")
    print(f"output struct info: {print_info(ret)}")
    ok = same and ret == expected
    if args.run:
        ok = _demo_run(mod, cfg) and ok
    print("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


DEMO_SHAPES = ((1, 1), (1, 7), (2, 128), (4, 513))


def _demo_run(mod: Any, cfg: Any, shapes: tuple[tuple[int, int], ...] = DEMO_SHAPES) -> bool:
    """Compile ``mod`` once and compare it with the NumPy reference at each (batch, seq)."""
    import numpy as np

    import tilework
    from tilework.models.numpy_ref import transformer_block_ref
    from tilework.models.reference import random_weights

    t0 = time.perf_counter()
    exe = tilework.build(mod, target="cpu")
    vm = tilework.VM(exe)
    print(f"compiled once in {time.perf_counter() - t0:.2f} s ({exe.stats()['kernels']} kernels)")
    params = mod["main"].params[1:]
    weights = random_weights(list(params))
    rng = np.random.default_rng(1)
    ok = True
    for batch, seq in shapes:
        x = rng.standard_normal((batch, seq, cfg.hidden)).astype(np.float32)
        t = time.perf_counter()
        out = vm["main"](x, *weights)
        dt = time.perf_counter() - t
        ref = transformer_block_ref(x, weights, cfg)
        err = float(np.max(np.abs(out - ref)))
        good = err < 1e-3
        ok = ok and good
        print(f"  (batch, seq) = ({batch}, {seq}): {1e3 * dt:.2f} ms, max abs diff vs NumPy {err:.2e} {'ok' if good else 'MISMATCH'}")
    return ok


_DIM_HELP = """\
--dim SPEC (for .pt2 programs), one per dynamic dim:
  [NAME=]REF[<=HI]   REF>=LO   LO<=REF<=HI
REF names a dynamic dim of the program: INPUT.AXIS (input_ids.1), a torch symbol (s53) or a
NAME given by another --dim. NAME renames it (it names the sym var in the compiled module and in
error messages). Bounds may only narrow the range the program was exported for: a wider range
was never checked by torch.export and is refused. Examples:
  tilework build bert.pt2 -o bert.tw --dim batch=input_ids.0<=16 --dim seq=input_ids.1<=512
  tilework build llama.pt2 -o llama.tw --dim s53<=256
The weights become constants of the executable: `tilework run OUT.tw --input NAME=FILE.npy ...`
takes only the program's inputs.
"""


def placement_build_options(args: argparse.Namespace) -> dict[str, Any]:
    from tilework.cli import placement

    return placement.build_options(args)


def _build(args: argparse.Namespace) -> int:
    import tilework

    inputs.check_output(args.ir_file, args.output)
    inputs.backends_arg(args.backends)
    if args.ir_file.endswith(".pt2"):
        return _build_pt2(args)
    if args.ir_file.endswith(".onnx"):
        return _build_onnx(args)
    if args.dim:
        raise TileworkError("--dim applies to .pt2 and .onnx models only; a module in the text format declares its dims itself")
    if getattr(args, "precision", "fp32") != "fp32":
        raise TileworkError("--precision bf16 applies to .pt2 and .onnx models only (compiled through tilework.compile)")
    mod = inputs.read_text_module(args.ir_file)
    t0 = time.perf_counter()
    exe = tilework.build(mod, target=args.target, backends=args.backends, pipeline=args.pipeline, **placement_build_options(args))
    exe.save(args.output)
    stats = exe.stats()
    via = f" with backends {','.join(exe.meta['backends'])}" if exe.meta.get("backends") else ""
    if exe.meta.get("placement"):
        via = f" with automatic placement ({len(exe.meta['placement']['buckets'])} bucket(s); tilework explain {args.output})"
    print(f"built {args.output}{via}: {stats['functions']} function(s), {stats['kernels']} kernel(s), {stats['instructions']} instructions in {time.perf_counter() - t0:.2f} s")
    return 0


def _build_pt2(args: argparse.Namespace) -> int:
    """Compile a ``torch.export.save`` file with its weights as constants."""
    names, bounds = inputs.pt2_dims(args.dim)
    t0 = time.perf_counter()
    return _build_compiled(inputs.load_pt2(args.ir_file), args, t0, names, bounds)


def _build_compiled(model: Any, args: argparse.Namespace, t0: float, names: Any, bounds: Any) -> int:
    """``model`` through ``tilework.compile`` (weights as constants, ``--precision`` applied),
    saved to ``args.output``."""
    from tilework.compiled import compile as compile_model

    opts = placement_build_options(args)
    precision = getattr(args, "precision", "fp32")
    cm = compile_model(model, backends=args.backends, dim_names=names, dim_bounds=bounds, weights="constants", opt_level=0 if args.pipeline == "O0" else 1, target=args.target, placement=opts.get("placement"), precision=precision, runtime="vm", **(opts.get("placement_options") or {}))  # saved, not run: no native graph code to build
    cm.save(args.output)
    stats = cm.executable.stats()
    dims = ", ".join(f"{n} in [{lo}, {'inf' if hi is None else hi}] ({at})" for n, (lo, hi, at) in cm.report["dims"].items()) or "none"
    how = "" if precision == "fp32" else f", precision {precision} ({cm.report['precision'].get('linears', 0)} linear(s))"
    print(f"built {args.output}: {stats['kernels']} kernel(s), {stats['instructions']} instructions, dynamic dims: {dims}{how}, in {time.perf_counter() - t0:.2f} s")
    return 0


def _build_onnx(args: argparse.Namespace) -> int:
    """Compile an ONNX model through ``tilework.compile`` like a .pt2 program (so the file
    keeps its signature and compile report for ``tilework explain``); ``--dim NAME<=HI`` bounds
    a ``dim_param``."""
    if not os.path.exists(args.ir_file):
        raise TileworkError(f"no such file: {args.ir_file}")
    bounds = inputs.onnx_dim_bounds(args.dim)
    with inputs.as_dim_option():
        return _build_compiled(args.ir_file, args, time.perf_counter(), None, bounds)


def _load_npy(name: str, path: str) -> Any:
    """The array of a ``--input NAME=FILE.npy``; never unpickles."""
    import numpy as np

    with open(path, "rb") as fh:
        if fh.read(6) != b"\x93NUMPY":
            raise TileworkError(f"--input {name}={path}: not a .npy file (numpy.save writes them; it does not start with the .npy header)")
        fh.seek(0)
        try:
            return np.lib.format.read_array(fh, allow_pickle=False)
        except ValueError as e:
            if "allow_pickle" in str(e):
                raise TileworkError(f"--input {name}={path}: the array holds Python objects, which tilework never unpickles; save a numeric array") from None
            raise TileworkError(f"--input {name}={path}: a damaged .npy file ({e})") from None
        except Exception as e:  # untrusted input: a damaged header raises what numpy's reader meets
            raise TileworkError(f"--input {name}={path}: a damaged .npy file ({type(e).__name__}: {e})") from None


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    import tilework

    from tilework.compiled import is_compiled_model
    from tilework.runtime.executable import load_file

    loaded = load_file(args.executable, trust_native=args.trust_native)
    exe = loaded.executable
    vm = tilework.VM(exe)
    if args.function not in exe.functions:
        raise TileworkError(f"no function {args.function!r} in {args.executable} (it has: {', '.join(exe.functions)})")
    params = exe.functions[args.function].params
    stored: list[np.ndarray] = []  # a compiled model's weights, main's trailing parameters (cm.save)
    if is_compiled_model(loaded) and args.function == "main":
        stored = loaded.arrays.get("weights", [])
        if len(stored) > len(params):
            raise TileworkError(f"{args.executable}: {len(stored)} stored weights for the {len(params)} parameters of main")
        params = params[: len(params) - len(stored)]
    given: dict[str, np.ndarray] = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise TileworkError(f"--input expects NAME=FILE.npy, got {item!r}")
        if name not in params:
            raise TileworkError(f"{args.function} has no parameter {name!r} (its parameters: {', '.join(params)})")
        if name in given:
            raise TileworkError(f"--input {name}= is given twice")
        given[name] = _load_npy(name, path)
    missing = [p for p in params if p not in given]
    if missing:
        raise TileworkError(f"missing --input for parameter(s) {', '.join(missing)} of {args.function}")
    out = vm[args.function](*[given[p] for p in params], *stored)
    outs = list(out) if isinstance(out, tuple) else [out]
    if args.output:
        from tilework.runtime.atomic import write_atomic

        os.makedirs(args.output, exist_ok=True)
        for i, o in enumerate(outs):
            a = np.asarray(o)
            write_atomic(os.path.join(args.output, f"output{i}.npy"), lambda fh: np.lib.format.write_array(fh, a, allow_pickle=False))  # a full disk names the file
        print(f"wrote {len(outs)} output(s) to {args.output}")
    else:
        for i, o in enumerate(outs):
            a = np.asarray(o)
            what = "empty" if a.size == 0 else f"mean {float(a.astype(np.float64).mean()):.6g}"
            print(f"output{i}: shape {tuple(a.shape)} dtype {a.dtype} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
