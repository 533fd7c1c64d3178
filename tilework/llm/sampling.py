"""Choosing the next token from logits, and stopping on stop strings.

The logits go through the processors in transformers' order, with transformers' semantics, so a
distribution here equals the one ``generate`` samples from:

1. repetition penalty (``RepetitionPenaltyLogitsProcessor``): for every token id present in the
   prompt or the output, a positive logit is divided by the penalty and a negative one multiplied;
   then OpenAI's frequency and presence penalties (off by default; transformers has none): a
   token generated ``c`` times so far (the output only, not the prompt) loses
   ``c * frequency_penalty + (c > 0) * presence_penalty`` from its logit, as OpenAI's API
   documents them and vLLM applies them;
2. temperature (``TemperatureLogitsWarper``): logits / temperature;
3. top-k (``TopKLogitsWarper``): logits below the k-th largest become -inf (ties with it stay);
4. top-p (``TopPLogitsWarper``): sorting ascending, tokens whose cumulative probability is
   <= 1 - top_p become -inf (the most likely token always stays); computed on the top tokens
   only (see :func:`_apply_top_p`);
5. a draw from softmax of what is left, with a numpy ``Generator`` seeded once per sequence.

Temperature 0 is greedy: argmax after the penalties (transformers' ``do_sample=False``,
which runs no warper). Logits stay float32 like transformers'; top-p masses and the draw are
float64.

Every positive temperature and penalty works, with no overflow. The penalty is applied in
float64 and its results held within float32's range (a tiny penalty gives a seen token the
largest float32 score, so several such tokens tie). A temperature so small that logits /
temperature would overflow float32 (or below float32's normal range) samples from the limit
of the distribution as the temperature goes to 0: the most likely tokens, tied or alone; a
temperature above float32's range divides in float64 (every finite score becomes 0: uniform).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from tilework.codegen.c import toolchain
from tilework.codegen.c.module import _DATA_OFFSET  # noqa: F401  (sets the OpenMP environment before libgomp loads)
from tilework.codegen.c.prelude import PRELUDE
from tilework.codegen.cache import load_shared_object
from tilework.errors import TileworkError
from tilework.llm.grammar import Grammar

__all__ = ["SamplingParams", "SamplingParamsError", "Sampler", "StopChecker", "StopStream"]

_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)


class SamplingParamsError(TileworkError, ValueError):
    """A sampling parameter is out of range; the message names the field and the value."""

    def __init__(self, name: str, value: object, requirement: str) -> None:
        super().__init__(f"sampling parameter {name}={value!r} is invalid: it must be {requirement}")
        self.field = name
        self.value = value


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens and when to stop; every neutral value switches its step off.

    ``temperature`` 0 is greedy; ``top_k`` 0, ``top_p`` 1.0 and ``repetition_penalty`` 1.0 are off;
    ``max_tokens`` bounds the generated tokens; ``stop`` strings end the text (a single string is
    taken as a one-element list); ``seed`` None draws from fresh OS entropy;
    ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]; 0 is off) lower the
    logits of tokens already generated (negative values raise them). ``grammar`` (a
    ``tilework.llm.grammar.Grammar``; None is off) is what the text must be: JSON, JSON that
    fits a schema, a regular expression or a Lark grammar; tokens it does not allow next are
    removed before any other step. ``logit_bias`` (OpenAI's: token id -> a bias in [-100, 100],
    given as a mapping or pairs, stored as sorted pairs) is added to those tokens' logits before
    the penalties: -100 all but bans a token, 100 all but forces it. ``min_tokens`` (vLLM's and
    llama.cpp's extension) keeps the end-of-sequence tokens from being sampled until that many
    tokens are generated, ``ignore_eos`` always (the text then ends at ``max_tokens``, a stop
    string or the context: a fixed length, as benchmarks want).

    ``LLM.generate`` on a list of prompts seeds prompt ``i`` with ``seed + i``: equal prompts
    in one call sample differently, and prompt ``i`` of a batch repeats alone with
    ``seed + i`` (not ``seed``).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    stop: Sequence[str] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    grammar: Grammar | None = None
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] = ()
    min_tokens: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingParamsError("temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise SamplingParamsError("top_k", self.top_k, "an integer >= 0 (0 means off)")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise SamplingParamsError("top_p", self.top_p, "a number in (0, 1] (1 means off)")
        if not _is_real(self.repetition_penalty) or not (
            math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0
        ):
            raise SamplingParamsError(
                "repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 means off)"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2 <= value <= 2:
                raise SamplingParamsError(name, value, "a number in [-2, 2] (0 means off)")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise SamplingParamsError("max_tokens", self.max_tokens, "an integer >= 1")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingParamsError("min_tokens", self.min_tokens, f"an integer in [0, max_tokens={self.max_tokens}]")
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise SamplingParamsError("ignore_eos", self.ignore_eos, "True or False")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise SamplingParamsError("seed", self.seed, "None or an integer >= 0")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, Iterable):
            raise SamplingParamsError("stop", self.stop, "a list of non-empty strings")
        stop = tuple(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise SamplingParamsError("stop", self.stop, "a list of non-empty strings")
        object.__setattr__(self, "stop", stop)  # stored as a tuple, so the params stay hashable
        try:
            pairs = list(self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias)
            bias: tuple[tuple[int, float], ...] | None = tuple(sorted((int(t), float(b)) for t, b in pairs if _is_int(t) and t >= 0 and _is_real(b) and -100 <= b <= 100))
        except (TypeError, ValueError):
            pairs, bias = [], None
        if bias is None or len(bias) != len(pairs) or len({t for t, _ in bias}) != len(bias):
            raise SamplingParamsError("logit_bias", self.logit_bias, "token id -> a number in [-100, 100] (ids >= 0, each once)")
        object.__setattr__(self, "logit_bias", bias)
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise SamplingParamsError("grammar", self.grammar, "None or a tilework.llm.grammar.Grammar (Grammar.json(), .json_schema(...), .regex(...), .lark(...))")

    @property
    def bias(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as it is stored: (token id, bias) pairs by id."""
        return self.logit_bias  # type: ignore[return-value]  # (normalized in __post_init__)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Picks one token per call for one sequence; the same seed gives the same tokens."""

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        if not _is_int(vocab_size) or vocab_size < 1:
            raise SamplingParamsError("vocab_size", vocab_size, "an integer >= 1")
        self.params = params
        self.vocab_size = int(vocab_size)
        self.rng = np.random.default_rng(params.seed)
        bias = params.bias
        if bias and bias[-1][0] >= self.vocab_size:
            raise SamplingParamsError("logit_bias", f"token id {bias[-1][0]}", f"ids within the vocabulary, [0, {self.vocab_size})")
        self._bias_ids = np.array([t for t, _ in bias], np.int64)
        self._bias = np.array([b for _, b in bias], np.float32)

    def _check(self, logits: np.ndarray) -> np.ndarray:
        array = np.asarray(logits)
        if array.shape != (self.vocab_size,):
            raise SamplingParamsError("logits", f"array of shape {array.shape}", f"of shape ({self.vocab_size},)")
        return array.astype(np.float32, copy=False)

    def _ids(self, tokens: Sequence[int] | np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The distinct ids of ``tokens`` (ascending) and how often each occurs, checked."""
        ids, counts = np.unique(np.asarray(tokens, dtype=np.int64), return_counts=True)
        if ids.size and (ids[0] < 0 or ids[-1] >= self.vocab_size):
            raise SamplingParamsError(name, f"token id {int(ids[0] if ids[0] < 0 else ids[-1])}", f"within [0, {self.vocab_size})")
        return ids, counts

    def penalize(self, logits: np.ndarray, history: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray = (), owned: bool = False) -> np.ndarray:
        """Logits after the repetition penalty over ``history`` (prompt and output) and the
        frequency and presence penalties over ``output`` (a new array; with ``owned``, the
        caller's own float32 ``logits``, changed in place)."""
        scores = self._repeat(logits, history, owned)
        p = self.params
        if (p.frequency_penalty or p.presence_penalty) and len(output):
            ids, counts = self._ids(output, "output")
            seen = scores[ids].astype(np.float64)
            new = seen - (counts * float(p.frequency_penalty) + float(p.presence_penalty))
            scores[ids] = np.where(np.isinf(seen), seen, np.clip(new, -_F32_MAX, _F32_MAX))  # within float32; -inf stays
        return scores

    def _repeat(self, logits: np.ndarray, history: Sequence[int] | np.ndarray, owned: bool = False) -> np.ndarray:
        scores = self._check(logits) if owned else np.array(self._check(logits), dtype=np.float32, copy=True)
        if self._bias.size:  # OpenAI's logit_bias, on the model's logits
            scores[self._bias_ids] += self._bias
        penalty = self.params.repetition_penalty
        if penalty == 1.0 or len(history) == 0:
            return scores
        ids, _ = self._ids(history, "history")
        seen = scores[ids]
        if _F32_TINY <= penalty <= _F32_MAX and float(np.abs(seen).max()) * max(penalty, 1 / penalty) < _F32_MAX / 2:
            scores[ids] = np.where(seen < 0, seen * np.float32(penalty), seen / np.float32(penalty))
            return scores
        # a penalty outside float32's range, or results that would overflow it: float64 (the same
        # numbers where they fit: one rounding, to float32), held within float32's range
        factor = float(np.float32(penalty)) if _F32_TINY <= penalty <= _F32_MAX else float(penalty)
        wide = seen.astype(np.float64)
        new = np.where(wide < 0, wide * factor, wide / factor)
        scores[ids] = np.where(np.isinf(wide), wide, np.clip(new, -_F32_MAX, _F32_MAX))
        return scores

    def kept(self, logits: np.ndarray, history: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray = (), owned: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """The logits after the penalty and the temperature (a new array), and the ascending ids
        of the tokens top-k and top-p leave, never a -inf or NaN one (None: every token stays).
        :meth:`process` and :meth:`sample` both take the tokens from here; sampling draws from
        the kept ones without writing -inf over the rest of the vocabulary (a pass less over
        it at every step, and none sorted beyond the nucleus's candidates)."""
        scores = self.penalize(logits, history, output, owned)
        p = self.params
        if p.greedy:
            return scores, None
        lowest = scores.min() if scores.size else None  # NaN where a NaN is
        keep, masked = None, False
        if lowest is not None and not lowest > -np.inf:  # a -inf or a NaN among them
            finite = scores > -np.inf
            held = scores.size - np.count_nonzero(finite)
            if lowest == -np.inf and (4 * held < 3 * scores.size if p.top_k == 0 else 16 * held < scores.size):
                # -inf and no NaN (an end of sequence held back, a grammar's mask), on few enough
                # tokens (a list of the others costs more than the draw from a quarter on; top-k's
                # partition slows down on many equal values): they stay in place, weight 0 in the
                # draw and never above a top-k or top-p cut, so no list of the others is made
                # (49151 ids where one token is held back cost 6x the sampling itself)
                masked = True
                lowest = np.where(finite, scores, np.inf).min()  # (a min with where= is 10x slower on a scattered mask)
            else:
                keep = np.flatnonzero(finite)
        t = float(p.temperature)
        if t != 1.0:
            values = scores if keep is None else scores[keep]
            if values.size:
                top, low = float(values.max()), float(values.min() if keep is not None or lowest is None else lowest)
                if t < _F32_TINY or max(top, -low) / t > _F32_MAX / 2:
                    # logits / t overflows: the limit as t -> 0, the most likely token(s)
                    return scores, _ids(np.flatnonzero(values == top), keep)
            if t > _F32_MAX:
                scores = (scores.astype(np.float64) / t).astype(np.float32)
            else:
                np.divide(scores, np.float32(t), out=scores)
        if p.top_k > 0:
            keep = _top_k(scores, keep, p.top_k)
        if p.top_p < 1.0:
            keep = _top_p(scores, keep, p.top_p)
        if masked and keep is not None:  # (a cut that reached the -inf ones: fewer tokens than k, or rounding)
            keep = keep[scores[keep] > -np.inf]
        return scores, keep

    def process(self, logits: np.ndarray, history: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray = ()) -> np.ndarray:
        """Logits after every processor: penalties, temperature, top-k, top-p (removed tokens are -inf)."""
        scores, keep = self.kept(logits, history, output)
        if keep is None:
            return scores
        out = np.full(scores.size, -np.inf, dtype=np.float32)
        out[keep] = scores[keep]
        return out

    def probs(self, logits: np.ndarray, history: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray = ()) -> np.ndarray:
        """The distribution :meth:`sample` draws from (float64; one-hot when greedy)."""
        scores = self.process(logits, history, output)
        if self.params.greedy:
            out = np.zeros(scores.size, dtype=np.float64)
            out[int(np.argmax(scores))] = 1.0
            return out
        weights = np.exp(scores - scores.max()).astype(np.float64)
        return weights / weights.sum()

    def sample(self, logits: np.ndarray, history: Sequence[int] | np.ndarray = (), output: Sequence[int] | np.ndarray = (), owned: bool = False) -> int:
        """The next token id; ``history`` is every id of the sequence so far (prompt and output),
        ``output`` the generated ones (for the frequency and presence penalties); ``owned``: the
        ``logits`` are the caller's own float32 copy, used in place (no copy of them is made)."""
        scores, keep = self.kept(logits, history, output, owned)
        if self.params.greedy:
            return int(np.argmax(scores))
        weights = np.ascontiguousarray(scores if keep is None else scores[keep])  # (our own array: turned into the weights in place; none kept: _draw refuses it)
        i = _draw(weights, self.rng.random())
        return i if keep is None else int(keep[i])


_CANDIDATE = 1e-4  # top-p: weight (of the largest) from which a token is a first-round candidate
_SUBSAMPLE = 16  # top-k: every 16th value gives a lower bound of the k-th largest


def _draw(scores: np.ndarray, u: float) -> int:
    """Turn ``scores`` (float32, C-contiguous, no NaN) into the weights ``exp(scores - max)``
    (0 below float32's normal range, 1.2e-38) in place and return the index whose
    cumulative weight interval holds ``u * sum(weights)``: a draw with probability
    proportional to the weights, for ``u`` uniform in [0, 1); never an index of weight 0.

    One C function (``sampling_draw.c``: three passes over the scores, float64 sums, the
    cumulative search in one block of 1024), where NumPy's max, subtract, exp, block sums and
    searches made eight passes and three arrays: a temperature draw over SmolLM2's logits
    148 -> 57 us on a Zen 3 (whose NumPy exp of 49152 float32 took 124 us)."""
    if scores.dtype != np.float32 or not scores.flags.c_contiguous or not scores.flags.writeable:
        raise TypeError(f"_draw takes a writable C-contiguous float32 array, got {scores.dtype} {scores.flags}")
    i = int(_library().tw_sample_draw(scores.ctypes.data, scores.size, u))
    if i < 0:
        raise SamplingParamsError("logits", "all -inf or NaN", "finite for at least one token")
    return i


def _weights(scores: np.ndarray) -> tuple[np.ndarray, float]:
    """``exp(scores - max)`` (float32; the largest is 1; 0 below 1.2e-38, as ``_draw``'s) and
    its float64 sum, in one C pass after the maximum's (``sampling_draw.c``), where NumPy made a
    float64 copy of the weights to sum them: with ``_draw``, a top-p 0.9 draw over SmolLM2's
    logits 750 -> 140 us on a Zen 3 (in a VM, where each fresh array's pages fault in)."""
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    out = np.empty_like(scores)
    total = float(_library().tw_sample_weights(scores.ctypes.data, out.ctypes.data, scores.size))
    return out, total


@functools.cache
def _library() -> ctypes.CDLL:
    """``sampling_draw.c`` after the kernels' prelude (for ``tw_exp_f``), compiled once into the
    kernel cache like the kernels."""
    built = toolchain.compile_source(PRELUDE + resources.files("tilework.llm").joinpath("sampling_draw.c").read_text())
    lib = load_shared_object(built.path, built.data)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.tw_sample_draw.argtypes = [p, i64, ctypes.c_double]
    lib.tw_sample_draw.restype = i64
    lib.tw_sample_weights.argtypes = [p, p, i64]
    lib.tw_sample_weights.restype = ctypes.c_double
    return lib


def _ids(local: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """Positions among the kept tokens as token ids."""
    return local if keep is None else keep[local]


def _top_k(scores: np.ndarray, keep: np.ndarray | None, k: int) -> np.ndarray | None:
    """The kept tokens whose score is at least the k-th largest (ties with it stay), as
    transformers' ``TopKLogitsWarper``. The k-th largest of every 16th score is at most the
    k-th largest of all (its k scores are among them), so the exact order statistic is found
    among the scores at or above it: a partition of hundreds instead of the vocabulary."""
    values = scores if keep is None else scores[keep]
    n = values.size
    if k >= n:
        return keep
    sub = values[::_SUBSAMPLE]
    if sub.size >= 4 * k:
        bound = np.partition(sub, sub.size - k)[sub.size - k]
        above = values[values >= bound]
        kth = np.partition(above, above.size - k)[above.size - k]
    else:
        kth = np.partition(values, n - k)[n - k]
    return _ids(np.flatnonzero(values >= kth), keep)


def _top_p(scores: np.ndarray, keep: np.ndarray | None, top_p: float) -> np.ndarray | None:
    """The kept tokens in the nucleus of mass ``top_p``, ascending.

    transformers sorts all logits ascending and removes a token when the cumulative probability up
    to it is <= 1 - top_p; equivalently a token stays when the mass of the tokens ranked above it
    is < top_p. Only the top tokens can stay, so only they are sorted: the ``m`` most likely
    (``m`` grows until they hold ``top_p`` of the mass), instead of the whole vocabulary.
    Masses are float64, so a token exactly on the boundary may fall differently than in
    transformers' float32 sum.
    """
    values = scores if keep is None else scores[keep]
    if values.size == 0:
        return keep
    raw, total = _weights(values)  # float32 (the largest is 1), masses in float64
    n = values.size
    # A model's distribution is peaked: the tokens of weight >= _CANDIDATE (the largest's is 1)
    # usually hold top_p of the mass. Every other token ranks below all of them, so when they
    # do, the nucleus is among them, and only their weights are normalized (each weight's
    # division is its own: the same numbers as normalizing all).
    cand = np.flatnonzero(raw >= np.float32(_CANDIDATE))
    weights = raw[cand].astype(np.float64) / total
    if cand.size < n and weights.sum() >= top_p:
        order = np.argsort(-values[cand], kind="stable")
        top, w = cand[order], weights[order]
    else:  # a flat distribution: the ``m`` most likely, ``m`` growing until they hold top_p
        weights = raw.astype(np.float64) / total
        m = min(n, 128)
        while True:
            top = np.argpartition(values, n - m)[n - m :] if m < n else np.arange(n)
            top = top[np.argsort(-values[top], kind="stable")]
            w = weights[top]
            if w.sum() >= top_p or m == n:
                break
            m = min(n, m * 8)
    mass = np.cumsum(w)
    return _ids(np.sort(top[mass - w < top_p]), keep)


class StopChecker:
    """Finds stop strings in generated text, including ones split across tokens.

    :meth:`find` gives where to cut (the start of the earliest stop string). :meth:`holdback`
    says how many trailing characters may still grow into a stop string, so a streaming printer
    must not show them yet.
    """

    __slots__ = ("stop",)

    def __init__(self, stop: Iterable[str]) -> None:
        strings = tuple(stop)
        if not all(isinstance(s, str) and s for s in strings):
            raise SamplingParamsError("stop", list(strings), "a list of non-empty strings")
        self.stop: tuple[str, ...] = strings

    @property
    def longest(self) -> int:
        return max((len(s) for s in self.stop), default=0)

    def find(self, text: str, start: int = 0) -> int | None:
        """Where to cut ``text``: the earliest index at which a stop string begins, or None.

        Only stop strings that end after ``start`` are looked for: pass the length the text had
        at the previous check to look at the new characters only.
        """
        lo = max(0, start - self.longest + 1)
        hits = [i for i in (text.find(s, lo) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


class StopStream:
    """Streams generated text pieces, holding back what may turn into a stop string.

    ``push(piece)`` returns the text that is safe to show and whether generation must stop;
    after a stop, :attr:`text` is the output cut before the stop string. ``finish()`` returns
    the text held back when generation ends for another reason (eos, max_tokens).
    """

    def __init__(self, checker: StopChecker) -> None:
        self.checker = checker
        self.text = ""
        self.stopped = False
        self._shown = 0

    def push(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        before = len(self.text)
        self.text += piece
        cut = self.checker.find(self.text, start=before)
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True
            safe = len(self.text)
        else:
            safe = len(self.text) - self.checker.holdback(self.text)
        out = self.text[self._shown : safe]
        self._shown = max(self._shown, safe)
        return out, self.stopped

    def finish(self) -> str:
        out = self.text[self._shown :]
        self._shown = len(self.text)
        return out
