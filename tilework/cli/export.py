"""``tilework export MODEL -o DIR``: a model as a standalone C library (``docs/export.md``).

MODEL is a module in the text format, a ``.pt2`` (torch.export.save), an ``.onnx`` model, an
executable or compiled model (``.tw``), or an LLM (``.gguf`` file or transformers checkpoint
directory, ``--llm`` for the latter): compiled (``--dim``, ``--backends`` as for ``tilework
build``) and exported. ``--build make|cmake`` also builds the library and the programs.
Files of DIR that a tilework export did not write are never replaced without ``--force``;
``--precision`` and ``--kv-dtype`` apply to LLMs only and are refused for another model.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from tilework.cli import inputs
from tilework.cli.llm import KV_DTYPE_CHOICES, KV_DTYPE_HELP
from tilework.errors import TileworkError


def add_parser(sub: Any) -> None:
    e = sub.add_parser(
        "export",
        help="export a model as a standalone C library (kernels, straight-line C for the graph, weights file, header, CMake and make)",
        description="Write a C library that runs the model with no Python: DIR/model.c, kernels.c, tw_runtime.c, tw_model.h, model.twb (weights), CMakeLists.txt, Makefile and tw_run.c (runs a function on .npy files), and DIR/.tilework-export listing them: a later export replaces those files, and refuses to replace any other (or one changed since) unless --force. See docs/export.md.",
    )
    e.add_argument("model", help="a .txt module, .pt2 program, .onnx model, .tw executable or compiled model, or a .gguf LLM")
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="the directory to write (created if needed)")
    e.add_argument("--dim", action="append", default=[], metavar="SPEC", help="(.pt2 and .onnx) name or bound a dynamic dim, as for `tilework build`")
    e.add_argument("--backends", metavar="LIST", help="backends in priority order; those whose calls export: codegen (always), blas, quant (torch and onnxruntime regions cannot be exported)")
    e.add_argument("--llm", action="store_true", help="MODEL is an LLM (a .gguf file is taken as one anyway): export its prefill and decode with tw_generate.c")
    e.add_argument("--precision", choices=("q", "bf16", "fp32"), help="(LLMs only) the weights' format: the file's quantized blocks (q, default), bf16 or fp32; for another model in bf16, `tilework build MODEL --precision bf16 -o m.tw`, then export m.tw")
    e.add_argument("--kv-dtype", choices=KV_DTYPE_CHOICES, help=f"(LLMs only) {KV_DTYPE_HELP}; tw_generate allocates the cache in it")
    e.add_argument("--build", choices=("make", "cmake"), help="also build the export with make or cmake")
    e.add_argument("--force", action="store_true", help="replace files in DIR that a tilework export did not write (or that changed since); without it they are refused, by name (DIR/.tilework-export lists what the last export wrote)")


def run(args: argparse.Namespace) -> int:
    from tilework.export import build_export

    t0 = time.perf_counter()
    path = args.model
    if not os.path.exists(path):
        raise TileworkError(f"no such file: {path}")
    llm = args.llm or path.endswith(".gguf")
    _check_options(args, llm)
    if llm:
        from tilework.export.llm import export_gguf

        result = export_gguf(path, args.output, precision=args.precision or "q", kv_dtype=args.kv_dtype, progress=lambda msg: print(msg, file=sys.stderr, flush=True), force=args.force)
    else:
        result = _export_model(args)
    where = ""
    if args.build:
        print(f"building with {args.build} (the kernels compile with -O3: a minute for a large model)", file=sys.stderr, flush=True)
        where = f"; built with {args.build} in {build_export(args.output, args.build)}"
    funcs = ", ".join(f"{n}({', '.join(p)})" for n, p in result.functions.items())
    print(f"exported {funcs} to {result.out_dir} ({', '.join(result.sources)}, weights {result.weights.name}) in {time.perf_counter() - t0:.2f} s{where}")
    return 0


def _check_options(args: argparse.Namespace, llm: bool) -> None:
    """What can be refused before compiling: options that do not apply to the model, a bad
    --backends, an output directory that would overwrite the input or a user's files."""
    from tilework.export.aot import ALL_FILES, LLM_FILES, RUNTIME_FILES
    from tilework.export.manifest import check_overwrite

    if not llm and args.precision is not None:
        hint = "; for bf16 weights of another model: `tilework build MODEL --precision bf16 -o m.tw`, then `tilework export m.tw` (docs/export.md)" if args.precision == "bf16" else ""
        raise TileworkError(f"--precision applies to LLMs only (a .gguf file, or a checkpoint directory with --llm){hint}")
    if not llm and args.kv_dtype is not None:
        raise TileworkError("--kv-dtype applies to LLMs only (a .gguf file, or a checkpoint directory with --llm): it is the dtype of the decoder's KV cache")
    inputs.backends_arg(args.backends)
    inputs.check_export_dir(args.model, args.output, ALL_FILES)
    if os.path.isdir(args.output):  # the files every export writes; the rest is checked when they are known
        always = ("kernels.c", "model.c", *RUNTIME_FILES, *(LLM_FILES + ("llm_config.h",) if llm else ()), "CMakeLists.txt", "Makefile", "model.twb")
        check_overwrite(Path(args.output), always, force=args.force)


def _export_model(args: argparse.Namespace) -> Any:
    import tilework
    from tilework.export import export_c

    path = args.model
    if path.endswith(".tw"):
        if args.dim or args.backends:
            raise TileworkError("--dim and --backends apply when compiling; a .tw file is compiled already")
        from tilework.compiled import is_compiled_model
        from tilework.runtime.executable import load_file

        loaded = load_file(path)
        weights = loaded.arrays.get("weights", [])
        bind = {"main": weights} if is_compiled_model(loaded) and weights else None
        return export_c(loaded.executable, args.output, bind=bind, force=args.force)
    if path.endswith(".pt2"):
        return _pt2(args).export_c(args.output, force=args.force)
    if path.endswith(".onnx"):
        from tilework.frontend.onnx import from_onnx

        with inputs.as_dim_option():
            mod = from_onnx(path, dim_bounds=inputs.onnx_dim_bounds(args.dim))
    else:
        if args.dim:
            raise TileworkError("--dim applies to .pt2 and .onnx models only; a module in the text format declares its dims itself")
        mod = inputs.read_text_module(path)
    exe = tilework.build(mod, backends=args.backends)
    return export_c(exe, args.output, force=args.force)


def _pt2(args: argparse.Namespace) -> Any:
    from tilework.compiled import compile as compile_model

    names, bounds = inputs.pt2_dims(args.dim)
    ep = inputs.load_pt2(args.model)
    return compile_model(ep, backends=args.backends, dim_names=names, dim_bounds=bounds, weights="constants", runtime="vm")  # exported, not run here


__all__ = ["add_parser", "run"]
