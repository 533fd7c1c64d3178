/* tilework's quant backend: the float path (bf16 and f16 rows) on AVX2 (+ FMA, F16C),
 * for CPUs without AVX-512. Not a translation unit of its own: tilework/backend/quant.py's
 * source() splices it into quant_kernels.c at that file's #include of it, after the scalars, the
 * scratch helpers and the portable kernels, before the entry points.
 *
 * The weights are decoded 8 at a time as twq_decode32 decodes them (bf16: zero-extended and
 * shifted up 16 bits; f16: vcvtph2ps, exact) and multiplied in float32, so the results are
 * x @ dequantize(w).T up to float32 rounding: they differ from the portable kernels' by the
 * order of the sums. The k-quants take the integer path.
 * - GEMV (M <= TWQ_A2_GEMV_MAX_M, decoding): groups of 4 W rows (2 from 3 rows of x on) over the
 *   threads, each 8 weights decoded in a register once and multiplied with up to 4 rows of x
 *   (more rows take passes over the group, which is in L1 by then); the group TWQ_A2_AHEAD on
 *   is prefetched as the group is read. From 5 rows (TWQ_A2_ONCE, to TWQ_A2_ONCE_MAX_M) one W
 *   row at a time meets up to 8 of them instead, its weights decoded once for 8 FMAs that read
 *   x from L1, k in chunks that keep x there, more rows in a second pass (SmolLM2's bf16 GEMMs
 *   of a batch-8 decode step: 24.6 -> 20.3 ms; at 9 rows 40 -> 32 ms against the GEMM).
 * - GEMM (prefill): panels of 16 W rows decoded into a k-major float32 scratch (TWQ_A2_KC k at a
 *   time: 48 KiB, in L2; the next panel's rows prefetched meanwhile), and a 6 x 16
 *   register-blocked outer-product FMA kernel (12 ymm accumulators) runs the rows of x over it
 *   in balanced calls; panels, and chunks of x rows when there are too few panels, are spread
 *   over the threads.
 * The MR and NR loops carry '#pragma GCC unroll': GCC 12 otherwise keeps the accumulator arrays
 * in memory (it turns their zeroing into a memset before it unrolls), a store per FMA.
 */
#if defined(TWQ_AVX2) && defined(__FMA__) && defined(__F16C__)
#define TWQ_A2F 1

#ifndef TWQ_A2_GEMV_MAX_M
#define TWQ_A2_GEMV_MAX_M 8 /* measured, cold weights: the GEMV 1.2-1.4x faster at 4-8 rows, even at 9-12 */
#endif
#ifndef TWQ_A2_AHEAD
#define TWQ_A2_AHEAD 4 /* GEMV groups prefetched ahead */
#endif
#define TWQ_A2_MR 4    /* most x rows per GEMV pass */
#define TWQ_A2_PN 16   /* W rows per GEMM panel: two ymm of outputs */
#define TWQ_A2_PM 6    /* x rows per GEMM micro-kernel */
#ifndef TWQ_A2_KC
#define TWQ_A2_KC 768  /* most k per packed panel: 16 x 768 floats, 48 KiB, in L2 */
#endif

/* Weights k .. k+7 of a bf16 or f16 row, decoded as twq_decode32 does. */
TWQ_INLINE __m256 twq_a2_w8(int fmt, const uint8_t* row, int64_t k) {
    const __m128i h = _mm_loadu_si128((const __m128i*)(row + 2 * k));
    if (fmt == TWQ_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline float twq_a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- GEMV: rows n0 .. n0+NR of W against MR rows of x (row stride K); y row stride N -------- */
/* 8 weights at k of the group's rows against the pass's rows of x (twq_a2_gemv_tile's body) */
#define TWQ_A2_GEMV_STEP(k) \
    do { \
        __m256 xv[TWQ_A2_MR]; \
        _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) xv[r] = _mm256_loadu_ps(x + r * K + (k)); \
        _Pragma("GCC unroll 8") for (int c = 0; c < NR; ++c) { \
            const __m256 wv = twq_a2_w8(fmt, rows[c], (k)); \
            _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) acc[r][c] = _mm256_fmadd_ps(wv, xv[r], acc[r][c]); \
        } \
    } while (0)

TWQ_INLINE void twq_a2_gemv_tile(int fmt, int MR, int NR, const float* x, const uint8_t* w, int64_t rb,
                                 float* y, int64_t N, int64_t K, int64_t n0) {
    __m256 acc[TWQ_A2_MR][4];
    const uint8_t* rows[4];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) rows[c] = w + (n0 + c) * rb;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < NR; ++c) acc[r][c] = _mm256_setzero_ps();
    /* The group TWQ_A2_AHEAD groups on (contiguous rows; past the end is harmless), at the pace
     * the group is read (step bytes per 32 weights): the hardware prefetchers lose track of
     * several short row streams at once. */
    const char* ahead = (const char*)(rows[0] + TWQ_A2_AHEAD * NR * rb);
    const int64_t k32 = K / 32 * 32, k8 = K / 8 * 8, step = k32 ? (NR * rb + k32 / 32 - 1) / (k32 / 32) : 0;
    for (int64_t k = 0; k < k8; k += 8) { /* measured: a little faster than unrolled by 4 */
        if ((k & 31) == 0 && k < k32)
            for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + (k >> 5) * step + o, _MM_HINT_T0);
        TWQ_A2_GEMV_STEP(k);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < NR; ++c) {
            float v = twq_a2_hsum(acc[r][c]);
            for (int64_t k = k8; k < K; ++k) v += x[r * K + k] * twq_weight1(fmt, rows[c], k);
            y[r * N + n0 + c] = v;
        }
}

#define TWQ_A2_GEMV_FN(FMT, MR, NR) \
    static void twq_a2_gemv_##FMT##_##MR##_##NR(const float* x, const uint8_t* w, int64_t rb, float* y, int64_t N, int64_t K, int64_t n0) { \
        twq_a2_gemv_tile(FMT, MR, NR, x, w, rb, y, N, K, n0); \
    }
#define TWQ_A2_GEMV_NR(FMT, NR) TWQ_A2_GEMV_FN(FMT, 1, NR) TWQ_A2_GEMV_FN(FMT, 2, NR) TWQ_A2_GEMV_FN(FMT, 3, NR) TWQ_A2_GEMV_FN(FMT, 4, NR)
#define TWQ_A2_GEMV_FMT(FMT) TWQ_A2_GEMV_NR(FMT, 1) TWQ_A2_GEMV_NR(FMT, 2) TWQ_A2_GEMV_NR(FMT, 4)
TWQ_A2_GEMV_FMT(TWQ_BF16)
TWQ_A2_GEMV_FMT(TWQ_F16)

typedef void (*twq_a2_gemv_fn)(const float*, const uint8_t*, int64_t, float*, int64_t, int64_t, int64_t);
#define TWQ_A2_GEMV_ROW_NR(FMT, NR) {twq_a2_gemv_##FMT##_1_##NR, twq_a2_gemv_##FMT##_2_##NR, twq_a2_gemv_##FMT##_3_##NR, twq_a2_gemv_##FMT##_4_##NR}
#define TWQ_A2_GEMV_ROW(FMT) {TWQ_A2_GEMV_ROW_NR(FMT, 1), TWQ_A2_GEMV_ROW_NR(FMT, 2), TWQ_A2_GEMV_ROW_NR(FMT, 4)}
/* [fmt - TWQ_BF16: bf16, f16][NR 1, 2, 4][MR - 1] */
static const twq_a2_gemv_fn twq_a2_gemv_table[2][3][TWQ_A2_MR] = {TWQ_A2_GEMV_ROW(TWQ_BF16), TWQ_A2_GEMV_ROW(TWQ_F16)};

/* ---- GEMV, 5 to 12 rows of x: each W row decoded once per 8 of them ---------------------- */
/* The passes above decode each 8 weights once per pass of up to 4 rows: at 8 rows that is a
 * decode (two vector ops that queue on the FMA ports) per 4 FMAs, and the FMAs wait for them.
 * Here one W row at a time meets up to 8 rows of x: 8 accumulators, each 8 weights decoded once
 * for 8 FMAs that read x from L1 as their memory operand. k is cut in chunks (TWQ_A2_KC8) so
 * that the chunk of x stays in L1 while a block of W rows passes; later chunks add to y. 9 to
 * 12 rows take two passes over the block (4 to 6 rows each), the second finding it in L2. */
#ifndef TWQ_A2_ONCE
#define TWQ_A2_ONCE 1 /* 0: the passes above for M <= 8, the GEMM beyond (to A/B them) */
#endif
#ifndef TWQ_A2_ONCE_MAX_M
#define TWQ_A2_ONCE_MAX_M 12 /* more rows: the GEMM (measured: even at 10-12, slower at 16) */
#endif
#if TWQ_A2_ONCE_MAX_M > 16
#error "TWQ_A2_ONCE_MAX_M above 16: a pass could have fewer than 4 rows (twq_a2_gemv8_table)"
#endif
#define TWQ_A2_KC8 768  /* most k per chunk: 8 rows x 768 floats of x, 24 KiB */
#define TWQ_A2_NB8 16   /* W rows per block (a thread's unit of work) */
#ifndef TWQ_A2_AHEAD8
#define TWQ_A2_AHEAD8 4 /* W rows prefetched ahead */
#endif

/* The MR sums of W row `row` over k0 .. k1 with rows of x (stride K), as one vector (lane r:
 * row r; lanes past MR are 0). */
TWQ_INLINE __m256 twq_a2_row8(int fmt, int MR, const float* x, const uint8_t* row, const uint8_t* next, int64_t K,
                              int64_t k0, int64_t k1, int64_t step) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    const int64_t k8 = k0 + (k1 - k0) / 8 * 8;
    for (int64_t k = k0; k < k8; k += 8) {
        if ((k & 31) == 0) _mm_prefetch((const char*)next + (k >> 5) * step, _MM_HINT_T0); /* the next row's line at the pace this one is read */
        const __m256 wv = twq_a2_w8(fmt, row, k);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * K + k), acc[r]);
    }
    /* eight horizontal sums at once: pairs, quads, then the two 128-bit halves */
    const __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
    const __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
    const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
    if (k8 < k1) { /* K not a multiple of 8 */
        float t[8];
        _mm256_storeu_ps(t, s);
        for (int r = 0; r < MR; ++r)
            for (int64_t k = k8; k < k1; ++k) t[r] += x[r * K + k] * twq_weight1(fmt, row, k);
        s = _mm256_loadu_ps(t);
    }
    return s;
}

TWQ_INLINE void twq_a2_gemv8_block(int fmt, int MR, const float* x, const uint8_t* w, int64_t rb, float* y, int64_t N,
                                   int64_t K, int64_t n0, int64_t n1, int64_t kc) {
    const int64_t step = K >= 32 ? rb * 32 / K : rb; /* bytes of a row per 32 weights */
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t k1 = K - k0 < kc ? K : k0 + kc;
        for (int64_t n = n0; n < n1; ++n) {
            const uint8_t* row = w + n * rb;
            float t[8];
            _mm256_storeu_ps(t, twq_a2_row8(fmt, MR, x, row, row + TWQ_A2_AHEAD8 * rb, K, k0, k1, step));
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) y[r * N + n] = k0 ? y[r * N + n] + t[r] : t[r];
        }
    }
}

#define TWQ_A2_GEMV8_FN(FMT, MR) \
    static void twq_a2_gemv8_##FMT##_##MR(const float* x, const uint8_t* w, int64_t rb, float* y, int64_t N, int64_t K, int64_t n0, int64_t n1, int64_t kc) { \
        twq_a2_gemv8_block(FMT, MR, x, w, rb, y, N, K, n0, n1, kc); \
    }
#define TWQ_A2_GEMV8_FMT(FMT) TWQ_A2_GEMV8_FN(FMT, 4) TWQ_A2_GEMV8_FN(FMT, 5) TWQ_A2_GEMV8_FN(FMT, 6) TWQ_A2_GEMV8_FN(FMT, 7) TWQ_A2_GEMV8_FN(FMT, 8)
TWQ_A2_GEMV8_FMT(TWQ_BF16)
TWQ_A2_GEMV8_FMT(TWQ_F16)
typedef void (*twq_a2_gemv8_fn)(const float*, const uint8_t*, int64_t, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
#define TWQ_A2_GEMV8_ROW(FMT) {twq_a2_gemv8_##FMT##_4, twq_a2_gemv8_##FMT##_5, twq_a2_gemv8_##FMT##_6, twq_a2_gemv8_##FMT##_7, twq_a2_gemv8_##FMT##_8}
/* [fmt - TWQ_BF16][rows - 4] */
static const twq_a2_gemv8_fn twq_a2_gemv8_table[2][5] = {TWQ_A2_GEMV8_ROW(TWQ_BF16), TWQ_A2_GEMV8_ROW(TWQ_F16)};

static void twq_a2_gemv8(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int64_t chunks = (K + TWQ_A2_KC8 - 1) / TWQ_A2_KC8;
    const int64_t kc = ((K + chunks - 1) / chunks + 255) / 256 * 256; /* a multiple of 256 k (once whole k-quant super-blocks) */
    const int64_t blocks = (N + TWQ_A2_NB8 - 1) / TWQ_A2_NB8;
    const int64_t passes = (M + 7) / 8, mr = (M + passes - 1) / passes; /* 9 rows: 5 + 4 */
    const twq_a2_gemv8_fn* fns = twq_a2_gemv8_table[fmt - TWQ_BF16];
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t n0 = b * TWQ_A2_NB8, n1 = n0 + TWQ_A2_NB8 < N ? n0 + TWQ_A2_NB8 : N;
        for (int64_t m0 = 0; m0 < M; m0 += mr) { /* later passes find the block's rows in L2 */
            const int64_t rows = M - m0 < mr ? M - m0 : mr;
            fns[rows - 4](x + m0 * K, w, rb, y + m0 * N, N, K, n0, n1, kc);
        }
    }
}

/* Up to 2 rows of x: groups of 4 W rows (4 or 8 accumulators, enough to stream the weights at
 * the memory's pace); more rows: groups of 2, in passes of up to 4 rows (8 accumulators, 4 x
 * and a weight vector: 13 of the 16 ymm registers). */
static void twq_a2_gemv(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int want = M <= 2 ? 4 : 2;
    const int nr = N >= want ? want : 1;
    const int64_t passes = (M + TWQ_A2_MR - 1) / TWQ_A2_MR, mr_max = (M + passes - 1) / passes; /* balanced: 5 rows as 3 + 2 */
    const int64_t groups = (N + nr - 1) / nr;
    const twq_a2_gemv_fn* fns = twq_a2_gemv_table[fmt - TWQ_BF16][nr == 4 ? 2 : nr - 1];
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t g = 0; g < groups; ++g) {
        /* the last group of a ragged N overlaps the one before: the same values are written */
        const int64_t n0 = g * nr < N - nr ? g * nr : N - nr;
        for (int64_t m0 = 0; m0 < M; m0 += mr_max) {
            const int64_t mr = M - m0 < mr_max ? M - m0 : mr_max;
            fns[mr - 1](x + m0 * K, w, rb, y + m0 * N, N, K, n0);
        }
    }
}

/* ---- GEMM: panels of 16 decoded W rows, k-major, and a 6 x 16 outer-product micro-kernel ---- */

/* r[i] (row i, 8 floats) becomes column i. */
TWQ_INLINE void twq_a2_t8x8(__m256* r) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; ++i) r[i] = t[i];
}

/* Rows [n0, n0 + nr) (nr <= 16; the columns past them repeat the last row, their outputs are
 * never stored), weights [k0, k0 + kc), into the panel p[k][16]. */
TWQ_INLINE void twq_a2_pack(int fmt, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t k0, int64_t kc, int64_t K, float* p) {
    const uint8_t* rows[TWQ_A2_PN];
    for (int c = 0; c < TWQ_A2_PN; ++c) rows[c] = w + (n0 + (c < nr ? c : nr - 1)) * rb;
    const int64_t kc8 = kc / 8 * 8;
    for (int64_t kk = 0; kk < kc8; kk += 8) {
        if ((kk & 31) == 0) /* the same k of the next panel: weights come from memory */
            for (int c = 0; c < TWQ_A2_PN; ++c) _mm_prefetch((const char*)(rows[c] + TWQ_A2_PN * rb + (k0 + kk) * rb / K), _MM_HINT_T0);
        for (int h = 0; h < TWQ_A2_PN; h += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i) r[i] = twq_a2_w8(fmt, rows[h + i], k0 + kk);
            twq_a2_t8x8(r);
            for (int i = 0; i < 8; ++i) _mm256_store_ps(p + (kk + i) * TWQ_A2_PN + h, r[i]);
        }
    }
    for (int64_t kk = kc8; kk < kc; ++kk)
        for (int c = 0; c < TWQ_A2_PN; ++c) p[kk * TWQ_A2_PN + c] = twq_weight1(fmt, rows[c], k0 + kk);
}

#define TWQ_A2_PACK_FN(FMT) \
    static void twq_a2_pack_##FMT(const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t k0, int64_t kc, int64_t K, float* p) { \
        twq_a2_pack(FMT, w, rb, n0, nr, k0, kc, K, p); \
    }
TWQ_A2_PACK_FN(TWQ_BF16)
TWQ_A2_PACK_FN(TWQ_F16)
typedef void (*twq_a2_pack_fn)(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
static const twq_a2_pack_fn twq_a2_pack_table[2] = {twq_a2_pack_TWQ_BF16, twq_a2_pack_TWQ_F16}; /* [fmt - TWQ_BF16] */

/* y[0..nr) (+)= the 16 outputs in v0, v1; m0, m1: the lanes below nr (twq_a2_mask). Whole
 * panels store plainly: vmaskmovps to memory is microcoded on AMD (tens of cycles). */
TWQ_INLINE void twq_a2_store(float* y, __m256 v0, __m256 v1, int64_t nr, __m256i m0, __m256i m1, int add) {
    if (nr == TWQ_A2_PN) {
        _mm256_storeu_ps(y, add ? _mm256_add_ps(v0, _mm256_loadu_ps(y)) : v0);
        _mm256_storeu_ps(y + 8, add ? _mm256_add_ps(v1, _mm256_loadu_ps(y + 8)) : v1);
        return;
    }
    if (add) {
        v0 = _mm256_add_ps(v0, _mm256_maskload_ps(y, m0));
        v1 = _mm256_add_ps(v1, _mm256_maskload_ps(y + 8, m1));
    }
    _mm256_maskstore_ps(y, m0, v0);
    _mm256_maskstore_ps(y + 8, m1, v1);
}

static inline __m256i twq_a2_mask(int64_t n) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), iota);
}

/* y[r][0..nr) (+)= x[r][0..kc) @ p[kc][16] for MR rows. */
TWQ_INLINE void twq_a2_micro(int MR, const float* x, int64_t ldx, const float* p, int64_t kc, float* y, int64_t ldy, int64_t nr, int add) {
    const __m256i m0 = twq_a2_mask(nr), m1 = twq_a2_mask(nr - 8);
    __m256 a0[TWQ_A2_PM], a1[TWQ_A2_PM];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; ++k) {
        const __m256 b0 = _mm256_load_ps(p + TWQ_A2_PN * k), b1 = _mm256_load_ps(p + TWQ_A2_PN * k + 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m256 xr = _mm256_broadcast_ss(x + r * ldx + k);
            a0[r] = _mm256_fmadd_ps(xr, b0, a0[r]);
            a1[r] = _mm256_fmadd_ps(xr, b1, a1[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) twq_a2_store(y + r * ldy, a0[r], a1[r], nr, m0, m1, add);
}

#define TWQ_A2_MICRO_FN(MR) \
    static void twq_a2_micro_##MR(const float* x, int64_t ldx, const float* p, int64_t kc, float* y, int64_t ldy, int64_t nr, int add) { \
        twq_a2_micro(MR, x, ldx, p, kc, y, ldy, nr, add); \
    }
TWQ_A2_MICRO_FN(1) TWQ_A2_MICRO_FN(2) TWQ_A2_MICRO_FN(3) TWQ_A2_MICRO_FN(4) TWQ_A2_MICRO_FN(5) TWQ_A2_MICRO_FN(6)
typedef void (*twq_a2_micro_fn)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int);
static const twq_a2_micro_fn twq_a2_micro_table[TWQ_A2_PM] = {twq_a2_micro_1, twq_a2_micro_2, twq_a2_micro_3,
                                                              twq_a2_micro_4, twq_a2_micro_5, twq_a2_micro_6};

static int twq_a2_gemm(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int64_t nkb = (K + TWQ_A2_KC - 1) / TWQ_A2_KC;
    const int64_t kc = ((K + nkb - 1) / nkb + 7) / 8 * 8;
    const int64_t panels = (N + TWQ_A2_PN - 1) / TWQ_A2_PN, nth = twq_threads();
    int64_t ntm = 1; /* chunks of x rows per panel: enough tiles for the threads */
    while (panels * ntm < 2 * nth && M / (2 * ntm) >= TWQ_A2_PM) ntm *= 2;
    const int64_t mc = ((M + ntm - 1) / ntm + TWQ_A2_PM - 1) / TWQ_A2_PM * TWQ_A2_PM;
    const int64_t tiles = panels * ntm;
    const twq_a2_pack_fn pack = twq_a2_pack_table[fmt - TWQ_BF16];
    int failed = 0;
#pragma omp parallel
    {
        float* p = twq_alloc(kc * TWQ_A2_PN);
        if (p == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t n0 = (t / ntm) * TWQ_A2_PN, m0 = (t % ntm) * mc;
            const int64_t m1 = m0 + mc < M ? m0 + mc : M;
            if (p == NULL || m0 >= m1) continue;
            const int64_t nr = N - n0 < TWQ_A2_PN ? N - n0 : TWQ_A2_PN;
            for (int64_t k0 = 0; k0 < K; k0 += kc) {
                const int64_t kn = K - k0 < kc ? K - k0 : kc;
                pack(w, rb, n0, nr, k0, kn, K, p);
                /* balanced calls (9 rows as 5 + 4): 2 or 3 rows have too few accumulators to
                 * hide the FMA latency */
                const int64_t calls = (m1 - m0 + TWQ_A2_PM - 1) / TWQ_A2_PM;
                for (int64_t i = 0, m = m0; i < calls; ++i) {
                    const int64_t mr = (m1 - m + calls - i - 1) / (calls - i);
                    twq_a2_micro_table[mr - 1](x + m * K + k0, K, p, kn, y + m * N + n0, N, nr, k0 > 0);
                    m += mr;
                }
            }
        }
        twq_free(p);
    }
    return failed ? TWQ_ENOMEM : 0;
}

/* bf16 and f16 rows. */
static int twq_a2_run(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    if (TWQ_A2_ONCE && M >= 5 && M <= TWQ_A2_ONCE_MAX_M) {
        twq_a2_gemv8(fmt, x, w, y, M, N, K, rb);
        return 0;
    }
    if (M > TWQ_A2_GEMV_MAX_M) return twq_a2_gemm(fmt, x, w, y, M, N, K, rb);
    twq_a2_gemv(fmt, x, w, y, M, N, K, rb);
    return 0;
}
#endif
