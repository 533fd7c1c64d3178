/* The passes of tilework.llm.sampling over a whole vocabulary: the draw of Sampler.sample (the
 * weights of the kept scores and one index drawn with probability proportional to them, in
 * three passes over float32 scores: their maximum; the weights exp(s - max) written in place,
 * with their sums per block; the cumulative search in one block), where NumPy made eight (max,
 * subtract, exp, the float64 block sums, their cumulative sum, a search, the block's
 * cumulative sum, a search); and top-p's weights and their sum (see sampling.py).
 *
 * Compiled by tilework.codegen.c.toolchain after the kernels' prelude (tw_exp_f: float32 exp
 * within 1 ulp, inlined and vectorized). The sums are float64: a block's in vector lanes, the
 * blocks' in order. */

#define TWS_BLOCK 1024 /* scores per block: the search adds one block's weights one by one */

static float tws_max(const float* restrict s, int64_t n) {
    float top = -INFINITY;
#pragma omp simd reduction(max : top)
    for (int64_t i = 0; i < n; ++i) top = s[i] > top ? s[i] : top;
    return top;
}

#if defined(__SSE__)
#include <xmmintrin.h>
/* Results below float32's normal range (2^-126) flushed to 0 while a pass of exp runs (MXCSR's
 * flush-to-zero bit, the caller's mode put back after): a subnormal product takes a slow path
 * on x86 (scores spread far below the top one, as a low temperature makes them, drew at half
 * the speed), and no float64 sum of weights from 1 up can tell such a weight from 0. */
#define TWS_FTZ_BEGIN const unsigned int tws_csr = _mm_getcsr(); _mm_setcsr(tws_csr | 0x8000u);
#define TWS_FTZ_END _mm_setcsr(tws_csr);
#else
#define TWS_FTZ_BEGIN
#define TWS_FTZ_END
#endif

/* w[i] = exp(s[i] - top) for i in [lo, hi), and their float64 sum (w may be s) */
static double tws_exp(const float* s, float* w, int64_t lo, int64_t hi, float top) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = lo; i < hi; ++i) {
        const float e = tw_exp_f(s[i] - top);
        w[i] = e;
        sum += (double)e;
    }
    return sum;
}

/* w[0..n) = exp(s - max s) (top-p's weights: the largest is 1); returns their float64 sum, 0
 * when n < 1 or no score is above -inf. */
double tw_sample_weights(const float* restrict s, float* restrict w, int64_t n) {
    const float top = n > 0 ? tws_max(s, n) : -INFINITY;
    if (!(top > -INFINITY)) return 0.0;
    TWS_FTZ_BEGIN
    const double sum = tws_exp(s, w, 0, n, top);
    TWS_FTZ_END
    return sum;
}

/* Replace w[0..n) by exp(w - max w) and return the index i with cum(i - 1) <= u * total <
 * cum(i), cum the running float64 sum of the weights (u uniform in [0, 1): an index drawn with
 * probability proportional to its weight); a zero weight is never returned. -1 when n < 1 or
 * no weight is positive (every score -inf or NaN: the caller has excluded both). */
int64_t tw_sample_draw(float* w, int64_t n, double u) {
    const float top = n > 0 ? tws_max(w, n) : -INFINITY;
    if (!(top > -INFINITY)) return -1;
    const int64_t blocks = (n + TWS_BLOCK - 1) / TWS_BLOCK;
    double sums[blocks]; /* (vocabularies of 262144 ids: 2 KB) */
    double total = 0.0;
    TWS_FTZ_BEGIN
    for (int64_t b = 0; b < blocks; ++b) {
        sums[b] = tws_exp(w, w, b * TWS_BLOCK, b * TWS_BLOCK + TWS_BLOCK < n ? b * TWS_BLOCK + TWS_BLOCK : n, top);
        total += sums[b];
    }
    TWS_FTZ_END
    const double target = u * total;
    double below = 0.0; /* the weights of the blocks before b */
    int64_t b = 0;
    while (b < blocks - 1 && below + sums[b] <= target) below += sums[b++];
    const int64_t lo = b * TWS_BLOCK, hi = lo + TWS_BLOCK < n ? lo + TWS_BLOCK : n;
    int64_t i = lo;
    double run = below;
    for (; i < hi; ++i) {
        run += (double)w[i];
        if (run > target) break;
    }
    if (i < n && w[i] > 0.0f) return i;
    /* rounding put the target past the block's last weight: the last positive weight before */
    for (i = i < n ? i : n - 1; i >= 0; --i)
        if (w[i] > 0.0f) return i;
    return -1;
}
