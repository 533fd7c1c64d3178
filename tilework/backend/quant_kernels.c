/* tilework's quant backend: y = x @ W.T with W kept in its GGUF block format.
 *
 * x is float32 [M, K] (row-major), w is uint8 [N, row_bytes] (the blocks of each output row,
 * as a GGUF file stores them), y is float32 [M, N]. Every result is a float32 dot product of x
 * with the exactly decoded weights (no activation quantization), so it agrees with
 * x @ dequantize(w).T up to float32 rounding.
 *
 * Two kernels per format:
 * - GEMV (M <= TWQ_GEMV_MAX_M, decoding): parallel over groups of 4 W rows (2 beyond 4 rows of
 *   x); each 32-weight piece of the group's rows is decoded into registers and multiplied with
 *   up to 8 rows of x at a time (a group's weights come from memory once; further passes over
 *   x re-decode them from L1). The 4-bit formats decode through a 16-entry table per block.
 * - GEMM (prefill): panels of 32 W rows are decoded into a k-major float32 scratch (at most
 *   1024 k at a time: 128 KiB, in L2) and a 12 x 32 register-blocked outer-product FMA kernel
 *   runs over it; panels (and, when there are too few of them, chunks of x rows) are spread
 *   over the threads.
 * Both have an AVX-512 path (F + BW; F16C) and a portable one (any C99 compiler; define
 * TW_QUANT_PORTABLE to force it).
 *
 * Entry points: tw_qlinear_<fmt>(x, w, y, M, N, K) for q4_0 q4_1 q8_0 bf16 f16 q4_k q6_k;
 * 0 on success, TWQ_E* for a bad argument. tw_qlinear_packed is the trampoline the Python
 * extern calls with NumPy array object addresses.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__) && !defined(TW_QUANT_PORTABLE)
#define TWQ_AVX512 1
#include <immintrin.h>
#endif

enum { TWQ_Q4_0, TWQ_Q4_1, TWQ_Q8_0, TWQ_BF16, TWQ_F16, TWQ_Q4_K, TWQ_Q6_K, TWQ_NFMT };
static const int64_t twq_block[TWQ_NFMT] = {32, 32, 32, 1, 1, 256, 256};
static const int64_t twq_nbytes[TWQ_NFMT] = {18, 20, 34, 2, 2, 144, 210};

#define TWQ_ENULL 1  /* a null pointer */
#define TWQ_ESHAPE 2 /* a negative size, or K not a multiple of the block */
#define TWQ_EFMT 3   /* unknown format code */
#define TWQ_ENOMEM 4 /* scratch could not be allocated */

#ifndef TWQ_GEMV_MAX_M
#define TWQ_GEMV_MAX_M 8 /* measured: from about 10 rows of x on, the packed GEMM is faster */
#endif
#define TWQ_NR 4 /* most W rows per GEMV group: 4 for up to 4 rows of x, 2 beyond */
#define TWQ_MR 8 /* most x rows per GEMV pass */
#define TWQ_PAR_MIN_BYTES (48 << 10)  /* less weight data than this runs on one thread */

#if defined(__GNUC__)
#define TWQ_INLINE static inline __attribute__((always_inline))
#define TWQ_UNUSED __attribute__((unused))
#else
#define TWQ_INLINE static inline
#define TWQ_UNUSED
#endif

/* ---- scalars ------------------------------------------------------------------------------ */

static inline uint16_t twq_u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline float twq_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float twq_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return twq_bits(sign | 0x7f800000u | (m << 13));
    if (e != 0) return twq_bits(sign | ((e + 112u) << 23) | (m << 13));
    float f = (float)m * 5.9604644775390625e-08f; /* subnormal: m * 2^-24, exact */
    return sign ? -f : f;
}

static inline float twq_bf2f(uint16_t h) { return twq_bits((uint32_t)h << 16); }

/* q4_K's 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes. */
static inline void twq_k4_scale(const uint8_t* sc, int s, int* scale, int* min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
        *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}

/* Per super-block factors of a k-quant row: q4_k: 8 (d * scale) then 8 (dmin * min);
 * q6_k: 16 (d * scale), one per 16 weights. */
static inline void twq_kscales(int fmt, const uint8_t* blk, float* kq) {
    if (fmt == TWQ_Q4_K) {
        float d = twq_h2f(twq_u16(blk)), dmin = twq_h2f(twq_u16(blk + 2));
        for (int s = 0; s < 8; ++s) {
            int sc, mn;
            twq_k4_scale(blk + 4, s, &sc, &mn);
            kq[s] = d * (float)sc;
            kq[8 + s] = dmin * (float)mn;
        }
    } else {
        float d = twq_h2f(twq_u16(blk + 208));
        for (int g = 0; g < 16; ++g) kq[g] = d * (float)(int8_t)blk[192 + g];
    }
}

/* The 32 weights of piece j of a row (weights 32j .. 32j+31), decoded exactly. For k-quants
 * kq holds the factors of the piece's super-block (twq_kscales). */
TWQ_UNUSED static void twq_decode32(int fmt, const uint8_t* row, int64_t j, const float* kq, float* out) {
    switch (fmt) {
    case TWQ_Q4_0: case TWQ_Q4_1: {
        const uint8_t* b = row + j * twq_nbytes[fmt];
        float d = twq_h2f(twq_u16(b));
        if (fmt == TWQ_Q4_0) {
            for (int l = 0; l < 16; ++l) {
                out[l] = d * (float)((b[2 + l] & 0xF) - 8);
                out[l + 16] = d * (float)((b[2 + l] >> 4) - 8);
            }
        } else {
            float m = twq_h2f(twq_u16(b + 2));
            for (int l = 0; l < 16; ++l) {
                out[l] = d * (float)(b[4 + l] & 0xF) + m;
                out[l + 16] = d * (float)(b[4 + l] >> 4) + m;
            }
        }
        return;
    }
    case TWQ_Q8_0: {
        const uint8_t* b = row + j * 34;
        float d = twq_h2f(twq_u16(b));
        for (int l = 0; l < 32; ++l) out[l] = d * (float)(int8_t)b[2 + l];
        return;
    }
    case TWQ_BF16: case TWQ_F16: {
        const uint8_t* b = row + j * 64;
        for (int l = 0; l < 32; ++l) out[l] = fmt == TWQ_BF16 ? twq_bf2f(twq_u16(b + 2 * l)) : twq_h2f(twq_u16(b + 2 * l));
        return;
    }
    case TWQ_Q4_K: {
        const uint8_t* qs = row + (j >> 3) * 144 + 16;
        int s = (int)(j & 7), shift = (s & 1) * 4;
        for (int l = 0; l < 32; ++l) out[l] = kq[s] * (float)((qs[32 * (s >> 1) + l] >> shift) & 0xF) - kq[8 + s];
        return;
    }
    default: { /* TWQ_Q6_K */
        const uint8_t* b = row + (j >> 3) * 210;
        int s = (int)(j & 7), half = s >> 2, t = s & 3;
        const uint8_t* ql = b + 64 * half + 32 * (t & 1);
        const uint8_t* qh = b + 128 + 32 * half;
        for (int l = 0; l < 32; ++l) {
            int nib = t >= 2 ? ql[l] >> 4 : ql[l] & 0xF;
            int q = (nib | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
            out[l] = kq[2 * s + (l >> 4)] * (float)q;
        }
        return;
    }
    }
}

static inline int twq_is_k(int fmt) { return fmt == TWQ_Q4_K || fmt == TWQ_Q6_K; }

/* Weight k of a row, for the K % 32 tail of bf16/f16 rows. */
static inline float twq_weight1(int fmt, const uint8_t* row, int64_t k) {
    uint16_t h = twq_u16(row + 2 * k);
    return fmt == TWQ_BF16 ? twq_bf2f(h) : twq_h2f(h);
}

/* 64-byte aligned scratch from plain malloc (C99): the original pointer sits just below. */
static float* twq_alloc(int64_t nfloats) {
    char* raw = (char*)malloc((size_t)nfloats * sizeof(float) + 64 + sizeof(void*));
    if (raw == NULL) return NULL;
    uintptr_t at = ((uintptr_t)(raw + sizeof(void*)) + 63u) & ~(uintptr_t)63u;
    ((void**)at)[-1] = raw;
    return (float*)at;
}

static void twq_free(float* p) {
    if (p != NULL) free(((void**)p)[-1]);
}

static int twq_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ==== AVX-512 ================================================================================ */
#ifdef TWQ_AVX512

#define TWQ_CHUNK 64   /* pieces whose factors a GEMV group converts ahead of use */
#define TWQ_AHEAD 4    /* GEMV groups of W rows prefetched ahead */
#define TWQ_PN 32      /* W rows per packed GEMM panel: two vectors of outputs */
#define TWQ_PM 12      /* x rows per GEMM micro-kernel: 24 accumulators */
#define TWQ_KC 1024    /* at most this many k per packed panel (32 x 1024 floats = 128 KiB, in L2) */

TWQ_INLINE __m512i twq_u8x16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }

/* Floats of per-piece factors: q4_0, q8_0: d; q4_1: d, m; q4_k: d * scale, -dmin * min;
 * q6_k: d * scale of each 16-weight half; none for bf16, f16. */
TWQ_INLINE int twq_nf(int fmt) { return fmt == TWQ_BF16 || fmt == TWQ_F16 ? 0 : fmt == TWQ_Q4_0 || fmt == TWQ_Q8_0 ? 1 : 2; }

/* The factors of pieces [j0, j1) of a row, converted once so that the decoder only broadcasts
 * them from memory (a load, no vector ALU work). (Gathering the scales of 16 blocks and
 * converting them together is slower here: vpgatherdd costs more than 16 scalar conversions.) */
TWQ_INLINE void twq_factors(int fmt, const uint8_t* row, int64_t j0, int64_t j1, float* f) {
    switch (fmt) {
    case TWQ_Q4_0: case TWQ_Q8_0:
        for (int64_t j = j0; j < j1; ++j) f[j - j0] = _cvtsh_ss(twq_u16(row + j * twq_nbytes[fmt]));
        return;
    case TWQ_Q4_1:
        for (int64_t j = j0; j < j1; ++j) {
            int32_t dm;
            memcpy(&dm, row + j * 20, 4);
            _mm_storel_pi((__m64*)(f + 2 * (j - j0)), _mm_cvtph_ps(_mm_cvtsi32_si128(dm)));
        }
        return;
    case TWQ_Q4_K: case TWQ_Q6_K: {
        float kq[16];
        for (int64_t j = j0; j < j1; ++j) {
            if (j == j0 || (j & 7) == 0) twq_kscales(fmt, row + (j >> 3) * twq_nbytes[fmt], kq);
            int s = (int)(j & 7);
            float* o = f + 2 * (j - j0);
            if (fmt == TWQ_Q4_K) {
                o[0] = kq[s];
                o[1] = -kq[8 + s];
            } else {
                o[0] = kq[2 * s];
                o[1] = kq[2 * s + 1];
            }
        }
        return;
    }
    default:
        return;
    }
}

/* The 32 weights of piece j as two vectors (weights 0..15, 16..31); f: the piece's factors.
 * 4-bit formats look their values up in a 16-entry table built per piece (vpermps reads only the
 * low 4 bits of each index, so the low nibble needs no mask). */
TWQ_INLINE void twq_dec(int fmt, const uint8_t* row, int64_t j, const float* f, __m512* w0, __m512* w1) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    switch (fmt) {
    case TWQ_Q4_0: {
        const __m512 iota8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
        __m512 lut = _mm512_mul_ps(iota8, _mm512_set1_ps(f[0]));
        __m512i q = twq_u8x16(row + j * 18 + 2);
        *w0 = _mm512_permutexvar_ps(q, lut);
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
        return;
    }
    case TWQ_Q4_1: {
        __m512 lut = _mm512_fmadd_ps(iota, _mm512_set1_ps(f[0]), _mm512_set1_ps(f[1]));
        __m512i q = twq_u8x16(row + j * 20 + 4);
        *w0 = _mm512_permutexvar_ps(q, lut);
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
        return;
    }
    case TWQ_Q8_0: {
        const uint8_t* b = row + j * 34 + 2;
        __m512 d = _mm512_set1_ps(f[0]);
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)b))), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 16)))), d);
        return;
    }
    case TWQ_BF16: {
        const uint8_t* b = row + j * 64;
        *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)b)), 16));
        *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + 32))), 16));
        return;
    }
    case TWQ_F16: {
        const uint8_t* b = row + j * 64;
        *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
        *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 32)));
        return;
    }
    case TWQ_Q4_K: {
        int s = (int)(j & 7);
        const uint8_t* qs = row + (j >> 3) * 144 + 16 + 32 * (s >> 1);
        __m512 lut = _mm512_fmadd_ps(iota, _mm512_set1_ps(f[0]), _mm512_set1_ps(f[1]));
        __m512i q0 = twq_u8x16(qs), q1 = twq_u8x16(qs + 16);
        if (s & 1) {
            q0 = _mm512_srli_epi32(q0, 4);
            q1 = _mm512_srli_epi32(q1, 4);
        }
        *w0 = _mm512_permutexvar_ps(q0, lut);
        *w1 = _mm512_permutexvar_ps(q1, lut);
        return;
    }
    default: { /* TWQ_Q6_K */
        const uint8_t* b = row + (j >> 3) * 210;
        int s = (int)(j & 7), half = s >> 2, t = s & 3;
        const uint8_t* ql = b + 64 * half + 32 * (t & 1);
        const uint8_t* qh = b + 128 + 32 * half;
        const __m512i lo4 = _mm512_set1_epi32(0xF), three = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
        __m512i l0 = twq_u8x16(ql), l1 = twq_u8x16(ql + 16);
        if (t >= 2) {
            l0 = _mm512_srli_epi32(l0, 4);
            l1 = _mm512_srli_epi32(l1, 4);
        } else {
            l0 = _mm512_and_si512(l0, lo4);
            l1 = _mm512_and_si512(l1, lo4);
        }
        __m128i sh = _mm_cvtsi32_si128(2 * t);
        __m512i h0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(twq_u8x16(qh), sh), three), 4);
        __m512i h1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(twq_u8x16(qh + 16), sh), three), 4);
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(l0, h0), bias)), _mm512_set1_ps(f[0]));
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(l1, h1), bias)), _mm512_set1_ps(f[1]));
        return;
    }
    }
}

/* ---- GEMV: rows n0 .. n0+NR of W against MR rows of x (row stride K); y row stride N ---- */
TWQ_INLINE void twq_gemv_tile(int fmt, int MR, int NR, const float* x, const uint8_t* w, int64_t rb,
                              float* y, int64_t N, int64_t K, int64_t n0) {
    __m512 acc[TWQ_MR][TWQ_NR];
    float f[TWQ_NR][2 * TWQ_CHUNK];
    const uint8_t* rows[TWQ_NR];
    const int nf = twq_nf(fmt);
    for (int c = 0; c < NR; ++c) rows[c] = w + (n0 + c) * rb;
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t nj = K / 32;
    /* Software prefetch of the group TWQ_AHEAD groups on (rows are contiguous, and prefetching
     * past the end is harmless): the hardware prefetchers lose track of several interleaved
     * short row streams, and a big matrix then runs at half the memory bandwidth. */
    const char* ahead = (const char*)(rows[0] + TWQ_AHEAD * NR * rb);
    const int64_t step = nj ? (NR * rb + nj - 1) / nj : 0;
    for (int64_t j0 = 0; j0 < nj; j0 += TWQ_CHUNK) {
        const int64_t j1 = j0 + TWQ_CHUNK < nj ? j0 + TWQ_CHUNK : nj;
        if (nf)
            for (int c = 0; c < NR; ++c) twq_factors(fmt, rows[c], j0, j1, f[c]);
        for (int64_t j = j0; j < j1; ++j) {
            for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
            __m512 x0[TWQ_MR], x1[TWQ_MR];
            for (int r = 0; r < MR; ++r) {
                x0[r] = _mm512_loadu_ps(x + r * K + 32 * j);
                x1[r] = _mm512_loadu_ps(x + r * K + 32 * j + 16);
            }
            for (int c = 0; c < NR; ++c) {
                __m512 w0, w1;
                if (fmt == TWQ_Q8_0 && MR == 1) { /* one row of x: scale the block's dot product, not its weights */
                    const uint8_t* b = rows[c] + j * 34 + 2;
                    w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)b)));
                    w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 16))));
                    __m512 t = _mm512_fmadd_ps(w1, x1[0], _mm512_mul_ps(w0, x0[0]));
                    acc[0][c] = _mm512_fmadd_ps(t, _mm512_set1_ps(f[c][j - j0]), acc[0][c]);
                    continue;
                }
                twq_dec(fmt, rows[c], j, f[c] + nf * (j - j0), &w0, &w1);
                for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(w1, x1[r], _mm512_fmadd_ps(w0, x0[r], acc[r][c]));
            }
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) {
            float v = _mm512_reduce_add_ps(acc[r][c]);
            for (int64_t k = 32 * nj; k < K; ++k) v += x[r * K + k] * twq_weight1(fmt, rows[c], k);
            y[r * N + n0 + c] = v;
        }
}

#define TWQ_GEMV_FN(FMT, MR, NR) \
    static void twq_gemv_##FMT##_##MR##_##NR(const float* x, const uint8_t* w, int64_t rb, float* y, int64_t N, int64_t K, int64_t n0) { \
        twq_gemv_tile(FMT, MR, NR, x, w, rb, y, N, K, n0); \
    }
#define TWQ_GEMV_NR(FMT, NR) \
    TWQ_GEMV_FN(FMT, 1, NR) TWQ_GEMV_FN(FMT, 2, NR) TWQ_GEMV_FN(FMT, 3, NR) TWQ_GEMV_FN(FMT, 4, NR) TWQ_GEMV_FN(FMT, 5, NR) \
    TWQ_GEMV_FN(FMT, 6, NR) TWQ_GEMV_FN(FMT, 7, NR) TWQ_GEMV_FN(FMT, 8, NR)
#define TWQ_GEMV_FMT(FMT) \
    TWQ_GEMV_FN(FMT, 1, 4) TWQ_GEMV_FN(FMT, 2, 4) TWQ_GEMV_FN(FMT, 3, 4) TWQ_GEMV_FN(FMT, 4, 4) TWQ_GEMV_NR(FMT, 2) TWQ_GEMV_NR(FMT, 1)
TWQ_GEMV_FMT(TWQ_Q4_0)
TWQ_GEMV_FMT(TWQ_Q4_1)
TWQ_GEMV_FMT(TWQ_Q8_0)
TWQ_GEMV_FMT(TWQ_BF16)
TWQ_GEMV_FMT(TWQ_F16)
TWQ_GEMV_FMT(TWQ_Q4_K)
TWQ_GEMV_FMT(TWQ_Q6_K)

typedef void (*twq_gemv_fn)(const float*, const uint8_t*, int64_t, float*, int64_t, int64_t, int64_t);
#define TWQ_GEMV_ROW_NR(FMT, NR) \
    {twq_gemv_##FMT##_1_##NR, twq_gemv_##FMT##_2_##NR, twq_gemv_##FMT##_3_##NR, twq_gemv_##FMT##_4_##NR, \
     twq_gemv_##FMT##_5_##NR, twq_gemv_##FMT##_6_##NR, twq_gemv_##FMT##_7_##NR, twq_gemv_##FMT##_8_##NR}
#define TWQ_GEMV_ROW(FMT) \
    {TWQ_GEMV_ROW_NR(FMT, 1), TWQ_GEMV_ROW_NR(FMT, 2), \
     {twq_gemv_##FMT##_1_4, twq_gemv_##FMT##_2_4, twq_gemv_##FMT##_3_4, twq_gemv_##FMT##_4_4, NULL, NULL, NULL, NULL}}
/* [fmt][NR 1, 2, 4][MR - 1] */
static const twq_gemv_fn twq_gemv_table[TWQ_NFMT][3][TWQ_MR] = {
    TWQ_GEMV_ROW(TWQ_Q4_0), TWQ_GEMV_ROW(TWQ_Q4_1), TWQ_GEMV_ROW(TWQ_Q8_0), TWQ_GEMV_ROW(TWQ_BF16),
    TWQ_GEMV_ROW(TWQ_F16), TWQ_GEMV_ROW(TWQ_Q4_K), TWQ_GEMV_ROW(TWQ_Q6_K)};

/* Up to 4 rows of x: groups of 4 W rows, one pass. More: groups of 2 W rows, passes of up to 8
 * rows of x (16 accumulators either way; a group's weights come from memory once). */
static void twq_gemv(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int want = M <= 4 ? 4 : 2;
    const int nr = N >= want ? want : 1;
    const int64_t mr_max = nr == 4 ? 4 : TWQ_MR;
    const int64_t groups = (N + nr - 1) / nr;
    const twq_gemv_fn* fns = twq_gemv_table[fmt][nr == 4 ? 2 : nr - 1];
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t g = 0; g < groups; ++g) {
        /* the last group of a ragged N overlaps the one before: the same values are written */
        int64_t n0 = g * nr < N - nr ? g * nr : N - nr;
        for (int64_t m0 = 0; m0 < M; m0 += mr_max) {
            int64_t mr = M - m0 < mr_max ? M - m0 : mr_max;
            fns[mr - 1](x + m0 * K, w, rb, y + m0 * N, N, K, n0);
        }
    }
}

/* ---- GEMM: panels of 32 decoded W rows, k-major, and a 12 x 32 outer-product micro-kernel ---- */

/* dst[k * ds + c] = src[c * ss + k] for a 16 x 16 block. */
TWQ_INLINE void twq_transpose16(const float* src, int64_t ss, float* dst, int64_t ds) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(src + i * ss);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
    }
    for (int i = 0; i < 16; ++i) _mm512_store_ps(dst + i * ds, r[i]);
}

/* Decode rows [n0, n0 + nr) (nr <= 32; zero columns past them), weights [k0, k0 + kc) with k0 a
 * multiple of 32 (of 256 for k-quants), into the panel p[k][32]. */
TWQ_INLINE void twq_pack(int fmt, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t k0, int64_t kc, int64_t K, float* p) {
    float tmp[TWQ_PN * 32] __attribute__((aligned(64)));
    float f[2];
    for (int64_t kk = 0; kk < kc; kk += 32) {
        const int64_t j = (k0 + kk) / 32;
        for (int64_t c = 0; c < TWQ_PN; ++c) {
            float* t = tmp + 32 * c;
            if (c >= nr) {
                _mm512_store_ps(t, _mm512_setzero_ps());
                _mm512_store_ps(t + 16, _mm512_setzero_ps());
                continue;
            }
            const uint8_t* row = w + (n0 + c) * rb;
            if (k0 + kk + 32 <= K) {
                __m512 w0, w1;
                twq_factors(fmt, row, j, j + 1, f);
                twq_dec(fmt, row, j, f, &w0, &w1);
                _mm512_store_ps(t, w0);
                _mm512_store_ps(t + 16, w1);
            } else {
                for (int64_t l = 0; l < 32; ++l) t[l] = k0 + kk + l < K ? twq_weight1(fmt, row, k0 + kk + l) : 0.0f;
            }
        }
        float* q = p + kk * TWQ_PN;
        twq_transpose16(tmp, 32, q, TWQ_PN);
        twq_transpose16(tmp + 16, 32, q + 16 * TWQ_PN, TWQ_PN);
        twq_transpose16(tmp + 16 * 32, 32, q + 16, TWQ_PN);
        twq_transpose16(tmp + 16 * 32 + 16, 32, q + 16 * TWQ_PN + 16, TWQ_PN);
    }
}

#define TWQ_PACK_FN(FMT) \
    static void twq_pack_##FMT(const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t k0, int64_t kc, int64_t K, float* p) { \
        twq_pack(FMT, w, rb, n0, nr, k0, kc, K, p); \
    }
TWQ_PACK_FN(TWQ_Q4_0)
TWQ_PACK_FN(TWQ_Q4_1)
TWQ_PACK_FN(TWQ_Q8_0)
TWQ_PACK_FN(TWQ_BF16)
TWQ_PACK_FN(TWQ_F16)
TWQ_PACK_FN(TWQ_Q4_K)
TWQ_PACK_FN(TWQ_Q6_K)
typedef void (*twq_pack_fn)(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
static const twq_pack_fn twq_pack_table[TWQ_NFMT] = {twq_pack_TWQ_Q4_0, twq_pack_TWQ_Q4_1, twq_pack_TWQ_Q8_0, twq_pack_TWQ_BF16,
                                                     twq_pack_TWQ_F16, twq_pack_TWQ_Q4_K, twq_pack_TWQ_Q6_K};

/* y[r][0..32) (+)= x[r][0..kc) @ p[kc][32] for MR rows; mk0/mk1 mask the valid outputs. */
TWQ_INLINE void twq_micro(int MR, const float* x, int64_t ldx, const float* p, int64_t kc, float* y, int64_t ldy,
                          __mmask16 mk0, __mmask16 mk1, int add) {
    __m512 a0[TWQ_PM], a1[TWQ_PM];
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; ++k) {
        const __m512 b0 = _mm512_load_ps(p + TWQ_PN * k), b1 = _mm512_load_ps(p + TWQ_PN * k + 16);
        for (int r = 0; r < MR; ++r) {
            const __m512 xr = _mm512_set1_ps(x[r * ldx + k]);
            a0[r] = _mm512_fmadd_ps(xr, b0, a0[r]);
            a1[r] = _mm512_fmadd_ps(xr, b1, a1[r]);
        }
    }
    for (int r = 0; r < MR; ++r) {
        float* yr = y + r * ldy;
        if (add) {
            a0[r] = _mm512_add_ps(a0[r], _mm512_maskz_loadu_ps(mk0, yr));
            a1[r] = _mm512_add_ps(a1[r], _mm512_maskz_loadu_ps(mk1, yr + 16));
        }
        _mm512_mask_storeu_ps(yr, mk0, a0[r]);
        _mm512_mask_storeu_ps(yr + 16, mk1, a1[r]);
    }
}

#define TWQ_MICRO_FN(MR) \
    static void twq_micro_##MR(const float* x, int64_t ldx, const float* p, int64_t kc, float* y, int64_t ldy, __mmask16 m0, __mmask16 m1, int add) { \
        twq_micro(MR, x, ldx, p, kc, y, ldy, m0, m1, add); \
    }
TWQ_MICRO_FN(1) TWQ_MICRO_FN(2) TWQ_MICRO_FN(3) TWQ_MICRO_FN(4) TWQ_MICRO_FN(5) TWQ_MICRO_FN(6)
TWQ_MICRO_FN(7) TWQ_MICRO_FN(8) TWQ_MICRO_FN(9) TWQ_MICRO_FN(10) TWQ_MICRO_FN(11) TWQ_MICRO_FN(12)
typedef void (*twq_micro_fn)(const float*, int64_t, const float*, int64_t, float*, int64_t, __mmask16, __mmask16, int);
static const twq_micro_fn twq_micro_table[TWQ_PM] = {twq_micro_1, twq_micro_2, twq_micro_3, twq_micro_4, twq_micro_5, twq_micro_6,
                                                     twq_micro_7, twq_micro_8, twq_micro_9, twq_micro_10, twq_micro_11, twq_micro_12};

static int twq_gemm(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int64_t nkb = (K + TWQ_KC - 1) / TWQ_KC;
    const int64_t kc = ((K + nkb - 1) / nkb + 255) / 256 * 256; /* whole super-blocks per panel */
    const int64_t panels = (N + TWQ_PN - 1) / TWQ_PN;
    const int64_t nth = twq_threads();
    int64_t ntm = 1; /* too few panels for the threads: split the rows of x as well */
    while (panels * ntm < 2 * nth && M / (2 * ntm) >= TWQ_PM) ntm *= 2;
    const int64_t mc = ((M + ntm - 1) / ntm + TWQ_PM - 1) / TWQ_PM * TWQ_PM;
    const int64_t tiles = panels * ntm;
    int failed = 0;
#pragma omp parallel
    {
        float* p = twq_alloc(kc * TWQ_PN);
        if (p == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t n0 = (t / ntm) * TWQ_PN, m0 = (t % ntm) * mc;
            const int64_t m1 = m0 + mc < M ? m0 + mc : M;
            if (p == NULL || m0 >= m1) continue;
            const int64_t nr = N - n0 < TWQ_PN ? N - n0 : TWQ_PN;
            const __mmask16 mk0 = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
            const __mmask16 mk1 = (__mmask16)(nr >= 32 ? 0xFFFFu : nr > 16 ? (1u << (nr - 16)) - 1u : 0u);
            for (int64_t k0 = 0; k0 < K; k0 += kc) {
                const int64_t kn = K - k0 < kc ? K - k0 : kc;
                twq_pack_table[fmt](w, rb, n0, nr, k0, kn, K, p);
                for (int64_t m = m0; m < m1; m += TWQ_PM) {
                    const int64_t mr = m1 - m < TWQ_PM ? m1 - m : TWQ_PM;
                    twq_micro_table[mr - 1](x + m * K + k0, K, p, kn, y + m * N + n0, N, mk0, mk1, k0 > 0);
                }
            }
        }
        twq_free(p);
    }
    return failed ? TWQ_ENOMEM : 0;
}

#else /* ==== portable ========================================================================= */

static void twq_gemv(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t n = 0; n < N; ++n) {
        const uint8_t* row = w + n * rb;
        float acc[TWQ_GEMV_MAX_M], kq[16], buf[32];
        for (int64_t m = 0; m < M; ++m) acc[m] = 0.0f;
        const int64_t nj = K / 32;
        for (int64_t j = 0; j < nj; ++j) {
            if (twq_is_k(fmt) && (j & 7) == 0) twq_kscales(fmt, row + (j >> 3) * twq_nbytes[fmt], kq);
            twq_decode32(fmt, row, j, kq, buf);
            for (int64_t m = 0; m < M; ++m) {
                const float* xr = x + m * K + 32 * j;
                float v = 0.0f;
                for (int l = 0; l < 32; ++l) v += xr[l] * buf[l];
                acc[m] += v;
            }
        }
        for (int64_t k = 32 * nj; k < K; ++k) {
            float wk = twq_weight1(fmt, row, k);
            for (int64_t m = 0; m < M; ++m) acc[m] += x[m * K + k] * wk;
        }
        for (int64_t m = 0; m < M; ++m) y[m * N + n] = acc[m];
    }
}

#define TWQ_TILE_ROWS 16 /* W rows decoded per tile */

/* Each tile of W rows is decoded once into a float scratch, then every row of x is dotted with it. */
static int twq_gemm(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int64_t tiles = (N + TWQ_TILE_ROWS - 1) / TWQ_TILE_ROWS;
    int failed = 0;
#pragma omp parallel
    {
        float* s = twq_alloc(TWQ_TILE_ROWS * K);
        float kq[16];
        if (s == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            if (s == NULL) continue;
            const int64_t n0 = t * TWQ_TILE_ROWS, nr = N - n0 < TWQ_TILE_ROWS ? N - n0 : TWQ_TILE_ROWS;
            for (int64_t c = 0; c < nr; ++c) {
                const uint8_t* row = w + (n0 + c) * rb;
                float* out = s + c * K;
                for (int64_t j = 0; j < K / 32; ++j) {
                    if (twq_is_k(fmt) && (j & 7) == 0) twq_kscales(fmt, row + (j >> 3) * twq_nbytes[fmt], kq);
                    twq_decode32(fmt, row, j, kq, out + 32 * j);
                }
                for (int64_t k = K / 32 * 32; k < K; ++k) out[k] = twq_weight1(fmt, row, k);
            }
            for (int64_t m = 0; m < M; ++m) {
                const float* xr = x + m * K;
                for (int64_t c = 0; c < nr; ++c) {
                    const float* sr = s + c * K;
                    float v = 0.0f;
                    for (int64_t k = 0; k < K; ++k) v += xr[k] * sr[k];
                    y[m * N + n0 + c] = v;
                }
            }
        }
        twq_free(s);
    }
    return failed ? TWQ_ENOMEM : 0;
}

#endif /* TWQ_AVX512 */

/* ==== entry points ========================================================================== */

static int twq_run(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) {
    if (fmt < 0 || fmt >= TWQ_NFMT) return TWQ_EFMT;
    if (M < 0 || N < 0 || K < 0 || K % twq_block[fmt] != 0) return TWQ_ESHAPE;
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        if (y == NULL) return TWQ_ENULL;
        memset(y, 0, (size_t)(M * N) * sizeof(float));
        return 0;
    }
    if (x == NULL || w == NULL || y == NULL) return TWQ_ENULL;
    const int64_t rb = K / twq_block[fmt] * twq_nbytes[fmt];
    if (M <= TWQ_GEMV_MAX_M) {
        twq_gemv(fmt, x, w, y, M, N, K, rb);
        return 0;
    }
    return twq_gemm(fmt, x, w, y, M, N, K, rb);
}

int32_t tw_qlinear_q4_0(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_Q4_0, x, w, y, M, N, K); }
int32_t tw_qlinear_q4_1(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_Q4_1, x, w, y, M, N, K); }
int32_t tw_qlinear_q8_0(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_Q8_0, x, w, y, M, N, K); }
int32_t tw_qlinear_bf16(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_BF16, x, w, y, M, N, K); }
int32_t tw_qlinear_f16(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_F16, x, w, y, M, N, K); }
int32_t tw_qlinear_q4_k(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_Q4_K, x, w, y, M, N, K); }
int32_t tw_qlinear_q6_k(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(TWQ_Q6_K, x, w, y, M, N, K); }

/* The Python extern's trampoline: a[] = {fmt (the enum above), x, w, y (NumPy array object
 * addresses), M, N, K, data offset}; each array's data pointer is read at byte offset a[7] of
 * its object (the offset is verified on live arrays by the caller). One pointer argument keeps
 * the ctypes call cheap. */
int32_t tw_qlinear_packed(const int64_t* a) {
    if (a == NULL) return TWQ_ENULL;
    const char *xo = (const char*)(intptr_t)a[1], *wo = (const char*)(intptr_t)a[2], *yo = (const char*)(intptr_t)a[3];
    if (xo == NULL || wo == NULL || yo == NULL) return TWQ_ENULL;
    const int64_t off = a[7];
    const float* x = *(const float* const*)(xo + off);
    const uint8_t* w = *(const uint8_t* const*)(wo + off);
    float* y = *(float* const*)(yo + off);
    return twq_run((int)a[0], x, w, y, a[4], a[5], a[6]);
}

/* ==== helpers for the benchmark and the tests =============================================== */

/* Sum of the first n / 4096 * 4096 floats, read with all threads: the memory read-bandwidth
 * probe of the benchmark. */
double tw_quant_read_sum(const float* p, int64_t n) {
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t b = 0; b < n / 4096; ++b) {
        const float* q = p + b * 4096;
#ifdef TWQ_AVX512
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < 4096; i += 64) {
            a0 = _mm512_add_ps(a0, _mm512_loadu_ps(q + i));
            a1 = _mm512_add_ps(a1, _mm512_loadu_ps(q + i + 16));
            a2 = _mm512_add_ps(a2, _mm512_loadu_ps(q + i + 32));
            a3 = _mm512_add_ps(a3, _mm512_loadu_ps(q + i + 48));
        }
        total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#else
        float s = 0.0f;
        for (int i = 0; i < 4096; ++i) s += q[i];
        total += s;
#endif
    }
    return total;
}

int32_t tw_quant_max_threads(void) { return twq_threads(); }

void tw_quant_set_threads(int32_t n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* 1 when the AVX-512 kernels were compiled in, 0 for the portable ones. */
int32_t tw_quant_simd(void) {
#ifdef TWQ_AVX512
    return 1;
#else
    return 0;
#endif
}
