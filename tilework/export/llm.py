"""Export of the LLM decoder (``tilework.llm``): ``prefill`` and ``decode`` over the paged KV
cache as a C library, with the weights bound and ``tw_generate.c``, a greedy generation loop
over token ids in C.

``export_decoder(config, tensors, out_dir)`` prepares the weights (``tilework.llm.compile
.prepare_weights``: ``precision="q"`` keeps the file's quantized blocks, whose matrix
multiplies then run on ``quant_kernels.c``, shipped into the export), compiles the decoder (or
takes it from the compiled-model cache) and exports it with the weights as the trailing
parameters of both functions, stored once. The KV cache's dtype is the engine's for the
precision (``tilework.llm.compile.KV_DTYPE_OF``) unless ``kv_dtype`` names one; ``llm_config.h``
gives it to ``tw_generate.c`` (``TW_LLM_KV_CODE``/``TW_LLM_KV_BITS``, DLPack's type code and
bits, and an int8 pool's rows of scales). ``export_gguf(path, out_dir)`` does it for a GGUF file (the default model when ``path``
is None).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from tilework.export.aot import ExportResult, export_c
from tilework.errors import TileworkError
from tilework.llm.compile import KV_DTYPE_OF, compiled_decoder, prepare_weights
from tilework.llm.config import LlmConfig
from tilework.llm.kv_cache import KV_DTYPES, PAGE
from tilework.llm.quant import QuantTensor
from tilework.ir.dtype import DTYPE_TABLE
from tilework.op.paged_attention import SCALE_ROWS, pair_width


def export_decoder(
    config: LlmConfig,
    tensors: Mapping[str, QuantTensor],
    out_dir: str | os.PathLike[str],
    *,
    precision: str = "q",
    max_batch: int = 1,
    kv_dtype: str | None = None,
    use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
) -> ExportResult:
    """See the module docstring. ``max_batch`` bounds the batch of the compiled functions (the
    C example runs one sequence); ``progress`` gets a line per stage; ``force`` as for ``export_c``."""
    kv_dtype = kv_dtype or KV_DTYPE_OF.get(precision, "float32")
    if kv_dtype not in KV_DTYPES:
        raise TileworkError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    formats, weights = prepare_weights(config, tensors, precision)
    exe = compiled_decoder(config, formats, max_batch=max_batch, kv_dtype=kv_dtype, use_cache=use_cache, progress=progress)
    if progress is not None:
        progress("writing the C library and the weights file")
    shapes = {"layers": config.layers, "kv_heads": config.kv_heads, "head_dim": config.head_dim, "page": PAGE, "vocab": config.vocab, "context": config.context_length}
    shapes |= {"kv_code": _DLPACK_CODE[kv_dtype], "kv_bits": DTYPE_TABLE[kv_dtype].itemsize * 8, "kv_pair": pair_width(kv_dtype), "kv_scales": SCALE_ROWS.get(kv_dtype, 0)}
    return export_c(exe, out_dir, bind={"prefill": weights, "decode": weights}, llm=shapes, force=force)


_DLPACK_CODE = {"float32": 2, "float16": 2, "bfloat16": 4, "int8": 0}


def export_gguf(path: str | None, out_dir: str | os.PathLike[str], *, precision: str = "q", kv_dtype: str | None = None, progress: Callable[[str], None] | None = None, force: bool = False) -> ExportResult:
    """Export the decoder of a GGUF file or a transformers checkpoint (the embedded default
    model when ``path`` is None)."""
    from tilework.llm.engine import default_model_path
    from tilework.llm.weights import load_weights

    config, tensors = load_weights(path or default_model_path())
    return export_decoder(config, tensors, out_dir, precision=precision, kv_dtype=kv_dtype, progress=progress, force=force)


__all__ = ["export_decoder", "export_gguf"]
