/* tilework's quant backend: y = x @ W.T with W kept in its GGUF block format.
 *
 * x is float32 [M, K] (row-major), w is uint8 [N, row_bytes] (the blocks of each output row,
 * as a GGUF file stores them), y is float32 [M, N].
 *
 * q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl (32-weight blocks) and the k-quants q4_k, q5_k, q6_k, q3_k,
 * q2_k and iq4_xs (256-weight super-blocks of 8 blocks of 32 4-, 5-, 6-, 3- or 2-bit weights) take
 * the integer path, as llama.cpp does.
 * Each row of x is quantized once per call to 8-bit blocks of 32: d = max|x| / 127,
 * q = rint(x * (127 / max|x|)) (a block whose max|x| is below 2^-100 gets q = 0; one with a NaN
 * or an infinity gets q = 0 and a non-finite d, so its outputs are NaN). Each output is then, block by block in order,
 *     acc = fma((float)isum, d_w * d_x, acc)       isum = sum(q_w * q_x) exactly, in int32
 *     acc = fma(m_w, d_x * sum(q_x), acc)          (q4_1, q5_1, q4_k, q5_k only: q_w is the nibble, m_w its min)
 * with q_w = nibble - 8 (q4_0), nibble (q4_1, q4_k), the 5-bit value - 16 (q5_0), the 5-bit value
 * (q5_1, q5_k: the nibble with its fifth bit from qh), the int8 (q8_0); q4_k's (q5_k's) d_w of block s of a
 * super-block is d * scale_s and its m_w = -(dmin * min_s), both exact in float32 (twq_k4_factors).
 * iq4_nl and iq4_xs are q8_0 whose int8 weights come from a lookup: q_w = twq_iq4_values[nibble]
 * (-127..113), the nibbles laid out as q4_0's (byte l: weight l low, weight l + 16 high), d_w
 * the block's d (iq4_nl) or, for sub-block s of an iq4_xs super-block, d * (ls_s - 32) with the
 * 6-bit ls_s of twq_iq4xs_ls (exact in float32: 11 significant bits times at most 32); no m.
 * Their isum is at most 32 * 127 * 127 = 516128 in magnitude (exact in int32 and as a float).
 * q6_k's, q3_k's and q2_k's blocks have a scale per 16 weights, so their update is instead
 *     acc = fma((float)isum, d_w * d_x, acc)       isum = sc0 * sum(q_w * q_x over weights 0-15)
 *                                                         + sc1 * sum(q_w * q_x over weights 16-31)
 *     acc = fma((float)msum, -(dmin * d_x), acc)   (q2_k only) msum = mn0 * sum(q_x over 0-15)
 *                                                                    + mn1 * sum(q_x over 16-31)
 * exactly in int32 (twq_k16_acc), d_w the super-block's d: q6_k's q_w the 6-bit value - 32, sc
 * its int8 scales (|isum| <= 2 * 128 * 16 * 32 * 127 < 2^24, so (float)isum is exact too);
 * q3_k's q_w the 2-bit field - 4 where its hmask bit is clear (-4..3), sc its 6-bit scales - 32
 * (|isum| <= 2 * 32 * 16 * 4 * 127 = 520192); q2_k's q_w the 2-bit field (0..3), sc and mn its
 * 4-bit scales and mins (|isum| <= 2 * 15 * 16 * 3 * 127 = 182880, |msum| <= 2 * 15 * 16 * 127
 * = 60960), dmin its super-block's (weights d * sc * q - dmin * mn). That sequence of float32
 * operations is the same on the GEMV and the GEMM, in the AVX-512 and the portable build, so
 * an output's bits do not depend on how many rows of x are in the call or on the build. It
 * differs from x @ dequantize(w).T by the rounding of x: at most sum over blocks b of
 * max|x_b| / 254 * sum(|w| over b) per output, plus float32 rounding (~1e-3 relative).
 * - GEMV (M <= TWQ_I8_GEMV_UPTO: decoding, short prompts): the rows of x quantized, then tiles of 16 W rows
 *   over the threads; each block of a tile is transposed in registers into 8 vectors of 16 rows
 *   x 4 weights and multiplied with every row of x by vpdpbusd (u8 weights x s8 activations;
 *   q5's fifth bits added to the nibbles from qh, twq_q5_high; q8_0's weights biased by 128; iq4's
 *   nibbles looked up by vpshufb as value + 128, 1..241, twq_iq4_lookup, the sum started at
 *   -128 * sum(q_x) as q8_0's); a residual (tw_qlinear_add_*) is added to each tile's
 *   outputs as the tile finishes them.
 * - GEMM (prefill): panels of 32 W rows are decoded that way once into a per-thread scratch
 *   (1280 bytes a block), and a 4 x 32 register-blocked kernel runs the rows of x over them.
 * Without AVX-512 VNNI (or with TW_QUANT_NO_VNNI) vpmaddubsw + vpmaddwd do the products
 * (q8_0 and iq4 through |w| and x with w's sign, which keeps the pair sums in int16: at most
 * 2 * 128 * 127 = 32512, where biased bytes would reach 2 * 241 * 127; twq_w_signed).
 * - q4_0x16, q4_1x16, q5_0x16, q5_1x16, q8_0x16, q4_kx16, q5_kx16, q6_kx16, q3_kx16, q2_kx16, iq4_nlx16, iq4_xsx16: the same blocks with the rows interleaved in
 *   groups of 16 (N a multiple of 16), laid out as the GEMV consumes them, so that no
 *   transposition is left to do at run time: for each group of 16 rows and block j, 16 * nbytes
 *   bytes: the 16 rows' fp16 d, then (q4_1, q5_1) their 16 m (q4_k, q5_k, q2_k: its super-blocks' dmin;
 *   iq4_xs: its 16 uint16 scales_h), then
 *   the payloads (16 nibble bytes (q4_0, q4_1, iq4_nl); q5's qh and 16 nibble bytes; 32 int8; q4_k's 12 bytes of
 *   scales and 128 of nibbles; q5_k's scales, 32 bytes of qh, nibbles; q6_k's 208 bytes before
 *   its d: 128 of low nibbles, 64 of high bit pairs, 16 scales; q3_k's 108 before its d: 32 of
 *   hmask, 64 of 2-bit fields, 12 of scales; q2_k's 80 before its d and dmin: 16 scale bytes, 64
 *   of 2-bit fields; iq4_xs's 4 bytes of scales_l and 128 of nibbles, 16 a sub-block) as vectors of 64 bytes, vector t holding bytes
 *   4t..4t+3 of row 0, then of row 1, ... of row 15 (q5: vector 0 is the 16 rows' qh). The results
 *   are the same bits as the plain format's (the same block sums in the same order).
 *
 * bf16 and f16 multiply in float32 with the weights
 * decoded exactly (no activation quantization; x @ dequantize(w).T up to float32 rounding), but
 * for bf16 where the CPU has
 * AVX-512 BF16 (TWQ_BF16DOT; define TW_QUANT_NO_BF16DOT to leave it out), on the GEMV and the
 * GEMM: there each row of x is rounded to bf16 once per call
 * (to nearest even) and vdpbf16ps multiplies pairs of k (products exact in float32, each pair
 * added to the float32 accumulator in turn; subnormal inputs and sums count as zero), twice
 * the float32 FMA's rate. That adds the rounding of x: per output at most
 * 2^-8 * sum(|x_k w_k|) on top of the float32 rounding (bf16_bound in quant.py).
 * - GEMV: parallel over groups of 4 W rows (2 beyond 4 rows of x); each 32-weight piece of the
 *   group's rows is decoded into registers and multiplied with up to 8 rows of x at a time.
 *   bf16 with TWQ_BF16DOT decodes nothing: a row's 64 bytes of a piece are the pairs vdpbf16ps
 *   takes (measured at 8 rows of x, SmolLM2's shapes: 1.6-2.7x with the weights in cache,
 *   decode at batch 8 1.12x (prompt 32) and 1.21x (prompt 512)).
 * - GEMM: panels of 32 W rows are decoded into a k-major float32 scratch (at most 1024 k at a
 *   time: 128 KiB, in L2; each row's weights TWQ_BPF pieces ahead prefetched: cold f16 weights
 *   at 16-32 rows of x 1.4x) and a 12 x 32 register-blocked outer-product FMA kernel runs over it;
 *   panels (and, when there are too few of them, chunks of x rows) are spread over the threads.
 *   bf16 with TWQ_BF16DOT packs panels of 32 W rows x pairs of k (a 32 x 16 transpose of 32-bit
 *   words per 32 k: no decoding, each row's weights TWQ_BPF lines ahead prefetched: cold
 *   weights are read 1.4-1.7x faster) and runs a 12 x 32 kernel of vdpbf16ps over them.
 * - bf16x16: bf16 rows interleaved in groups of 16 (N a multiple of 16, K even): for each group
 *   and pair t of k, 64 bytes, weights 2t and 2t+1 of row 0, then of row 1, ... of row 15: the
 *   16 lanes of a vector are the group's rows, so with TWQ_BF16DOT the GEMV takes one
 *   vdpbf16ps per pair and row of x (x's pair broadcast) and stores whole vectors of outputs
 *   (nothing decoded, no sum across lanes, one stream of weights), and the GEMM reads two
 *   groups as its panel (nothing packed per call). Each output is one chain over the pairs in
 *   order on both (the same bits up to TWQ_BKC k). Without TWQ_BF16DOT: twq_bf16x16_float,
 *   plain C over the lanes (x in float32, each output summed pair by pair).
 * Both paths have AVX-512 kernels (F + BW, F16C; VNNI where present) and portable ones (any
 * C99 compiler; define TW_QUANT_PORTABLE to force them). Without AVX-512 but with AVX2, FMA and
 * F16C, the float path (bf16, f16) runs the kernels of quant_float_avx2.c (TWQ_A2F:
 * a GEMV over groups of 4 or 2 W rows, a packed GEMM with a 6 x 16 micro-kernel; see that
 * file), which tilework's quant.py splices in at its #include below. With AVX2 the
 * portable integer path takes each block's dot products with a row of x in AVX2 (vpmaddubsw +
 * vpmaddwd: the same int32 sums, so the same bits; q8_0 and iq4 as |w| and x with w's sign); q8_0, q4_0, q4_1, q5_0, q5_1,
 * iq4_nl and iq4_xs (plain and x16, with FMA and F16C) run tiles of 8 W rows instead (twq_q5_tile: q5's pair sums widened by
 * halves, twq_q5_dot8), each block loaded (and its nibbles unpacked)
 * once for every row of x and the 8 rows' sums side by side in a vector (twq_q8_tile,
 * twq_q4_tile; iq4: twq_q8_tile on values looked up by vpshufb, twq_iq4_block8; q4 x16 at up to
 * 16 rows of x: the 16 rows of a group, twq_q4_x16_group). A q4
 * block's 8 products with a row of x add up in int16 (at most 8 * 2 * 15 * 127 = 30480) and
 * are widened once; there x comes with its 4-byte pieces broadcast ahead
 * (twq_broadcast_x), read as vpmaddubsw's memory operand.
 *
 * Entry points: tw_qlinear_<fmt>(x, w, y, M, N, K) for q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16 q4_k
 * q6_k q5_k q3_k q2_k iq4_nl iq4_xs q4_0x16 q4_1x16 q5_0x16 q5_1x16 q8_0x16 bf16x16 q4_kx16 q5_kx16 q6_kx16 q3_kx16 q2_kx16 iq4_nlx16 iq4_xsx16, and tw_qlinear_add_<fmt>(x, w, r, y,
 * M, N, K): y = x @ W.T + r; 0 on success, TWQ_E* for a bad argument. tw_qlinear_packed is the trampoline the Python
 * extern calls with NumPy array object addresses; tw_qexperts_<fmt> and tw_qexperts_packed
 * (quant_experts.c) run a mixture of experts' products with the same kernels; tw_quant_quantize_x exposes the quantization
 * of x to the tests; tw_quant_dequantize and tw_quant_interleave (quant_dequant.c) decode and
 * interleave whole rows for the loaders.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__) && !defined(TW_QUANT_PORTABLE)
#define TWQ_AVX512 1
#include <immintrin.h>
#if defined(__AVX512VNNI__) && !defined(TW_QUANT_NO_VNNI)
#define TWQ_VNNI 1
#endif
#if defined(__AVX512BF16__) && !defined(TW_QUANT_NO_BF16DOT)
#define TWQ_BF16DOT 1
#endif
#elif defined(__AVX2__) && !defined(TW_QUANT_PORTABLE)
#define TWQ_AVX2 1 /* the portable kernels, with the integer path's block dot products in AVX2 */
#include <immintrin.h>
#endif

enum { TWQ_Q4_0, TWQ_Q4_1, TWQ_Q5_0, TWQ_Q5_1, TWQ_Q8_0, TWQ_BF16, TWQ_F16, TWQ_Q4_K, TWQ_Q6_K, TWQ_Q5_K, TWQ_Q3_K, TWQ_Q2_K, TWQ_IQ4_NL, TWQ_IQ4_XS, TWQ_NFMT };
/* The interleaved layouts' codes (the entry points' fmt) follow the plain ones; twq_x16_base gives each its plain format. */
enum { TWQ_Q4_0X16 = TWQ_NFMT, TWQ_Q4_1X16, TWQ_Q5_0X16, TWQ_Q5_1X16, TWQ_Q8_0X16, TWQ_BF16X16, TWQ_Q4_KX16, TWQ_Q5_KX16, TWQ_Q6_KX16, TWQ_Q3_KX16, TWQ_Q2_KX16, TWQ_IQ4_NLX16,
       TWQ_IQ4_XSX16, TWQ_NCODES };
static const int twq_x16_base[TWQ_NCODES - TWQ_NFMT] = {TWQ_Q4_0, TWQ_Q4_1, TWQ_Q5_0, TWQ_Q5_1, TWQ_Q8_0, TWQ_BF16, TWQ_Q4_K, TWQ_Q5_K, TWQ_Q6_K, TWQ_Q3_K, TWQ_Q2_K, TWQ_IQ4_NL, TWQ_IQ4_XS};
static const int64_t twq_block[TWQ_NFMT] = {32, 32, 32, 32, 32, 1, 1, 256, 256, 256, 256, 256, 32, 256};
static const int64_t twq_nbytes[TWQ_NFMT] = {18, 20, 22, 24, 34, 2, 2, 144, 210, 176, 110, 84, 18, 136};

#define TWQ_ENULL 1  /* a null pointer */
#define TWQ_ESHAPE 2 /* a negative size, or K not a multiple of the block */
#define TWQ_EFMT 3   /* unknown format code */
#define TWQ_ENOMEM 4 /* scratch could not be allocated */
#define TWQ_EALIAS 5 /* the residual of a linear_add is its output */
#define TWQ_EFAMILY 6 /* a format whose path this build leaves out (TWQ_WITH_<FMT>) */

/* The linears' paths, one a format (its plain and x16 layouts), all unless the build leaves
 * some out: tilework.backend.quant builds the ones a model needs (the embedded SmolLM2's q4_1
 * and q8_0: 3.0 s of GCC's CPU where every integer format of 32-byte blocks took 6.9, and the
 * k-quants another 12.6; a Q4_K_M file's q4_k and q6_k 4.5). A path left out is code no entry
 * point reaches, which the compiler drops, and its formats' entry points return TWQ_EFAMILY.
 * Each TWQ_WITH_<FMT> is a literal 0 or 1 (TWQ_IF pastes it); the helpers are in every build. */
#ifndef TWQ_WITH_Q4_0
#define TWQ_WITH_Q4_0 1
#endif
#ifndef TWQ_WITH_Q4_1
#define TWQ_WITH_Q4_1 1
#endif
#ifndef TWQ_WITH_Q5_0
#define TWQ_WITH_Q5_0 1
#endif
#ifndef TWQ_WITH_Q5_1
#define TWQ_WITH_Q5_1 1
#endif
#ifndef TWQ_WITH_Q8_0
#define TWQ_WITH_Q8_0 1
#endif
#ifndef TWQ_WITH_Q4_K
#define TWQ_WITH_Q4_K 1
#endif
#ifndef TWQ_WITH_Q5_K
#define TWQ_WITH_Q5_K 1
#endif
#ifndef TWQ_WITH_Q6_K
#define TWQ_WITH_Q6_K 1
#endif
#ifndef TWQ_WITH_Q3_K
#define TWQ_WITH_Q3_K 1
#endif
#ifndef TWQ_WITH_Q2_K
#define TWQ_WITH_Q2_K 1
#endif
#ifndef TWQ_WITH_IQ4_NL
#define TWQ_WITH_IQ4_NL 1
#endif
#ifndef TWQ_WITH_IQ4_XS
#define TWQ_WITH_IQ4_XS 1
#endif
#ifndef TWQ_WITH_BF16
#define TWQ_WITH_BF16 1 /* bf16 and bf16x16 */
#endif
#ifndef TWQ_WITH_F16
#define TWQ_WITH_F16 1
#endif
/* any format of the integer path (its helpers: x's quantization, the scratch) */
#define TWQ_WITH_INT8 (TWQ_WITH_Q4_0 || TWQ_WITH_Q4_1 || TWQ_WITH_Q5_0 || TWQ_WITH_Q5_1 || TWQ_WITH_Q8_0 || TWQ_WITH_Q4_K || TWQ_WITH_Q5_K || \
                       TWQ_WITH_Q6_K || TWQ_WITH_Q3_K || TWQ_WITH_Q2_K || TWQ_WITH_IQ4_NL || TWQ_WITH_IQ4_XS)
/* TWQ_IF(Q4_1, ...): the kernel instantiations and table entries of a format's path, or nothing */
#define TWQ_IF(fmt, ...) TWQ_IF_(TWQ_WITH_##fmt, __VA_ARGS__)
#define TWQ_IF_(with, ...) TWQ_IF__(with, __VA_ARGS__)
#define TWQ_IF__(with, ...) TWQ_IF_##with(__VA_ARGS__)
#define TWQ_IF_1(...) __VA_ARGS__
#define TWQ_IF_0(...)

#ifndef TWQ_GEMV_MAX_M
#define TWQ_GEMV_MAX_M 8 /* float path, measured: from about 10 rows of x on, the packed GEMM is faster */
#endif
#ifndef TWQ_I8_GEMV_MAX_M
#define TWQ_I8_GEMV_MAX_M 8 /* integer path (<= 8), measured: the GEMV streams cold weights 1.5-3x faster */
#endif
#ifndef TWQ_I8_GEMV_UPTO
/* rows of x up to which the integer path runs the GEMV, in passes of at most TWQ_I8_GEMV_MAX_M
 * rows over each tile. Measured (matrices from memory, 2 threads, Zen 4): SmolLM2-135M's decode
 * step of 121 q4_1x16 and q8_0x16 matrices at 16 rows 8.2 ms where the GEMM took 11.5, at 32
 * 15.6 against 19.4, at 48 23.2 against 27.2, at 64 30.6 against 31.9, at 128 60.3 against
 * 58.8; q4_kx16 (1024 x 1024, 5632 x 1024) and q6_kx16 (1024 x 2816) at 12 and 16 rows
 * 1.14-1.62x, at 48 0.97-1.04x. */
#define TWQ_I8_GEMV_UPTO 32
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

static inline int32_t twq_i32(const void* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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

/* q3_K's 6-bit scale i (0..15) from its 12 packed bytes, less 32: low 4 bits in the nibbles of
 * bytes 0-7, top 2 in bits 2 * (i / 4) of byte 8 + i % 4. */
static inline int twq_k3_scale(const uint8_t* sc, int i) {
    return (((sc[i & 7] >> (4 * (i >> 3))) & 0xF) | (((sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3) << 4)) - 32;
}

/* The 32 weights of piece j of a bf16 or f16 row (weights 32j .. 32j+31), decoded exactly. */
TWQ_UNUSED static void twq_decode32(int fmt, const uint8_t* row, int64_t j, float* out) {
    const uint8_t* b = row + j * 64;
    for (int l = 0; l < 32; ++l) out[l] = fmt == TWQ_BF16 ? twq_bf2f(twq_u16(b + 2 * l)) : twq_h2f(twq_u16(b + 2 * l));
}

/* q5_0 and q5_1 are q4_0 and q4_1 with a fifth bit per weight: bit l of the little-endian
 * uint32 qh after the block's d (and m) is weight l's (q = nibble | bit << 4, 0..31), the 16
 * nibble bytes follow. The integer path takes them as q4's blocks of unsigned 5-bit weights:
 * q5_0's -16 through the start of the block's sum as q4_0's -8, q5_1's m as q4_1's. */
static inline int twq_is_q5(int fmt) { return fmt == TWQ_Q5_0 || fmt == TWQ_Q5_1; }
/* Whether weights are d * q + m (q4_1, q5_1): the block's m follows its d. */
static inline int twq_has_m(int fmt) { return fmt == TWQ_Q4_1 || fmt == TWQ_Q5_1; }
/* q4_k and q5_k: super-blocks of 8 blocks of 32 with 6-bit scales and mins (q5_k: q4_k's
 * nibbles with a fifth bit each, bit s of qh[l] for weight l of block s). */
static inline int twq_is_k45(int fmt) { return fmt == TWQ_Q4_K || fmt == TWQ_Q5_K; }
/* Whether the integer path adds m * d_x * sum(q_x) to each block's sum: q4_1's and q5_1's m,
 * q4_k's and q5_k's m = -dmin * min of the sub-block. */
static inline int twq_i8_m(int fmt) { return twq_has_m(fmt) || twq_is_k45(fmt); }
/* iq4_nl and iq4_xs: 4-bit indices into one table of 16 int8 values (twq_iq4_values). */
static inline int twq_is_iq4(int fmt) { return fmt == TWQ_IQ4_NL || fmt == TWQ_IQ4_XS; }
/* Whether the integer path's weights are int8 values rather than small unsigned fields: q8_0's
 * bytes and iq4's looked-up values. With VNNI they are biased by 128 for vpdpbusd (the start
 * of each block's sum takes 128 * sum(q_x) off); vpmaddubsw (no VNNI, AVX2) takes |w| and x
 * with w's sign instead, whose pair sums stay in int16 (2 * 128 * 127 = 32512 < 32768), where
 * the biased bytes' would not (2 * 255 * 127). */
static inline int twq_w_signed(int fmt) { return fmt == TWQ_Q8_0 || twq_is_iq4(fmt); }
/* A block's head (d, and m; q4_k's, q5_k's and q2_k's super-block: d, dmin; q6_k's, q3_k's: d)
 * and its payload, the rest: q5's qh and nibbles, q4's nibbles, q8_0's int8, q4_k's 12 bytes of
 * scales and 128 of nibbles (q5_k: the scales, 32 bytes of qh, the nibbles), q6_k's 128 bytes
 * of low nibbles, 64 of high bit pairs and 16 int8 scales, q3_k's 32 bytes of hmask, 64 of
 * 2-bit fields and 12 of scales, q2_k's 16 scale bytes and 64 of 2-bit fields (iq4_nl: d and its
 * nibbles; iq4_xs: d and scales_h, then scales_l and the nibbles). The head is the
 * block's first twq_head bytes, but q6_k's, q3_k's and q2_k's head is its last bytes
 * (twq_head_at: where the head sits); an x16 layout groups the head by 2 bytes and the payload
 * by 4, head first. */
static inline int64_t twq_head(int fmt) { return twq_has_m(fmt) || twq_is_k45(fmt) || fmt == TWQ_Q2_K || fmt == TWQ_IQ4_XS ? 4 : 2; }
static inline int64_t twq_head_at(int fmt) { return fmt == TWQ_Q6_K ? 208 : fmt == TWQ_Q3_K ? 108 : fmt == TWQ_Q2_K ? 80 : 0; }

/* Block j of row `lane` of an interleaved group, gathered back into the plain block layout. */
TWQ_UNUSED static void twq_block_of_x16(int fmt, const uint8_t* grp, int64_t lane, int64_t j, uint8_t* blk) {
    const int64_t nbytes = twq_nbytes[fmt], head = twq_head(fmt), at = twq_head_at(fmt), pay = at ? 0 : head;
    const uint8_t* b = grp + j * 16 * nbytes;
    memcpy(blk + at, b + 2 * lane, 2);
    if (head == 4) memcpy(blk + at + 2, b + 32 + 2 * lane, 2);
    for (int64_t t = 0; t < (nbytes - head) / 4; ++t) memcpy(blk + pay + 4 * t, b + 16 * head + 64 * t + 4 * lane, 4);
}

static inline int twq_is_k(int fmt) { return fmt == TWQ_Q4_K || fmt == TWQ_Q6_K || fmt == TWQ_Q5_K || fmt == TWQ_Q3_K || fmt == TWQ_Q2_K; }
/* q6_k, q3_k and q2_k: a scale per 16 weights, so the integer path sums each 32-weight block
 * as two halves (two chains of dot products) and combines them in int32 (twq_k16_acc). */
static inline int twq_is_k16(int fmt) { return fmt == TWQ_Q6_K || fmt == TWQ_Q3_K || fmt == TWQ_Q2_K; }
static inline int twq_is_i8(int fmt) { return fmt == TWQ_Q4_0 || fmt == TWQ_Q4_1 || twq_is_q5(fmt) || fmt == TWQ_Q8_0 || twq_is_k(fmt) || twq_is_iq4(fmt); }
/* The integer path's tables' index of a format (twq_is_i8). */
static inline int twq_i8_slot(int fmt) {
    return fmt == TWQ_Q4_K ? 5 : fmt == TWQ_Q5_K ? 6 : fmt == TWQ_Q6_K ? 7 : fmt == TWQ_Q3_K ? 8 : fmt == TWQ_Q2_K ? 9 : fmt == TWQ_IQ4_NL ? 10 : fmt == TWQ_IQ4_XS ? 11 : fmt;
}
#define TWQ_I8_SLOTS 12
/* Where a q4_k / q5_k super-block's nibbles start (after d, dmin, the scales, and q5_k's qh). */
static inline int64_t twq_k45_qs(int fmt) { return fmt == TWQ_Q5_K ? 48 : 16; }

/* q4_k's and q5_k's 32-weight sub-block s (0..7) as the integer path takes it from a
 * super-block's 6-bit scales and mins: d * scale (exact in float32: an 11-bit significand times
 * 6 bits) and m = -(dmin * min) (exact too), with its weights d * scale * q + m, q the nibbles
 * (q5_k: with their fifth bits). */
static inline void twq_k4_factors(const uint8_t* blk, int s, float* dw, float* mw) {
    int sc, mn;
    twq_k4_scale(blk + 4, s, &sc, &mn);
    *dw = twq_h2f(twq_u16(blk)) * (float)sc;
    *mw = -(twq_h2f(twq_u16(blk + 2)) * (float)mn);
}

/* The 16 values an iq4 nibble indexes (iq4_nl's and iq4_xs's weights are d * value, iq4_xs's d
 * per 32-weight sub-block d * (ls - 32)). */
static const int8_t twq_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* iq4_xs's 6-bit scale of sub-block s (0..7) of the super-block at blk (d, uint16 scales_h, 4
 * bytes scales_l, 128 of nibbles): its low 4 bits are nibble s % 2 of scales_l[s / 2], its top 2
 * bits 2s, 2s + 1 of scales_h. */
static inline int twq_iq4xs_ls(const uint8_t* blk, int s) { return ((blk[4 + s / 2] >> (4 * (s & 1))) & 0xF) | (((twq_u16(blk + 2) >> (2 * s)) & 3) << 4); }

/* Where sub-block s's 16 nibble bytes are in an iq4 block (iq4_nl: the block, 2 bytes after its
 * d; iq4_xs: the super-block, 8 bytes of head and scales, then 16 bytes a sub-block): byte l
 * holds weight l (low nibble) and weight l + 16 (high nibble), as q4_0's. */
static inline int64_t twq_iq4_qs(int fmt, int s) { return fmt == TWQ_IQ4_XS ? 8 + 16 * s : 2; }

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

/* y += r (r NULL: nothing), each output the float32 sum a separate add would make. */
static void twq_add(const float* r, float* y, int64_t n) {
    if (r != NULL)
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] + r[i];
}

static int twq_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* bf16x16 without AVX-512 BF16 (any build; the compiler vectorizes the 16 lanes, a group's
 * rows): x in float32, the weights decoded exactly, each output summed pair by pair in order
 * (acc + x[2t] w[2t] + x[2t+1] w[2t+1]); up to 4 rows of x per pass over a group. */
TWQ_UNUSED static void twq_bf16x16_float(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) {
    const int64_t gb = 32 * K; /* bytes per group of 16 rows */
    const int par = N * 2 * K >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t g = 0; g < N / 16; ++g) {
        const uint8_t* grp = w + g * gb;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            float acc[4][16];
            memset(acc, 0, sizeof acc);
            for (int64_t t = 0; t < K / 2; ++t) {
                const uint8_t* b = grp + 64 * t;
                float w0[16], w1[16];
                for (int l = 0; l < 16; ++l) {
                    w0[l] = twq_bf2f(twq_u16(b + 4 * l));
                    w1[l] = twq_bf2f(twq_u16(b + 4 * l + 2));
                }
                for (int64_t r = 0; r < mr; ++r) {
                    const float x0 = x[(m0 + r) * K + 2 * t], x1 = x[(m0 + r) * K + 2 * t + 1];
                    for (int l = 0; l < 16; ++l) acc[r][l] = acc[r][l] + x0 * w0[l] + x1 * w1[l];
                }
            }
            for (int64_t r = 0; r < mr; ++r) memcpy(y + (m0 + r) * N + 16 * g, acc[r], sizeof acc[r]);
        }
    }
}

/* ==== 8-bit activations (both builds) ========================================================= */

/* x quantized for the integer path; per block b of row r (index r * nb + b): d, cx = d * sum(q)
 * and corr = twq_corr_mul(fmt) * sum(q), the integer start of the block's dot products, and
 * corr16 = twq_corr_mul(fmt) * (the sum of its first 16 q): q6_k's and q3_k's two halves
 * (scales) start at corr16 and corr - corr16. q2_k's halves start at 0: its corr and corr16
 * are the sums themselves (twq_corr_mul 1), which its mins multiply (twq_k16_acc). */
typedef struct {
    int8_t* q; /* [M][K], the order of x */
    float* d;
    float* cx;
    int32_t* corr;
    int32_t* corr16;
    int64_t K, nb;
} twq_xq;

/* The dot products multiply unsigned weight bytes: q4_0's nibbles are q_w + 8 (q5_0's 5-bit
 * values q_w + 16, q6_k's 6-bit ones q_w + 32, q3_k's 3-bit ones q_w + 4), and q8_0's bytes (iq4's values) are biased to q_w + 128 (but for vpmaddubsw, see twq_dot); the start of each block's sum
 * takes the bias off. (The portable loop needs the bias too: GCC 12 with -march=native turns an
 * int8 x int8 dot-product loop into vpdpbusd, which reads one side as unsigned: wrong sums.)
 * q2_k's 1 keeps the plain sums of q_x (see twq_xq). */
static inline int32_t twq_corr_mul(int fmt) {
    if (fmt == TWQ_Q4_0) return -8;
    if (fmt == TWQ_Q5_0) return -16;
    if (fmt == TWQ_Q6_K) return -32;
    if (fmt == TWQ_Q3_K) return -4;
    if (fmt == TWQ_Q2_K) return 1;
#if !defined(TWQ_AVX512) || defined(TWQ_VNNI)
    if (twq_w_signed(fmt)) return -128;
#endif
    return 0;
}

#define TWQ_TINY 0x1p-100f /* blocks of x below this magnitude quantize to zero (127 / max stays finite) */

/* One block of 32: q and d as the file header states; *s = sum(q), *s16 = the sum of its first 16. */
static inline void twq_quant_block(const float* x, int8_t* q, float* d, int32_t* s, int32_t* s16) {
#ifdef TWQ_AVX512
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    if (_mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q)) amax = NAN;
#elif defined(TWQ_AVX2)
    __m256 v[4], m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[i]));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h))); /* the largest |x| (a max is exact in any order) */
    if (_mm256_movemask_ps(nan)) amax = NAN;
#else
    float amax = 0.0f;
    int nan = 0;
    for (int l = 0; l < 32; ++l) {
        float a = fabsf(x[l]);
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    if (nan) amax = NAN;
#endif
    *d = amax / 127.0f;
    if (!(amax <= 3.4028234663852886e38f)) { /* NaN or infinity: d is too, the products are NaN */
        memset(q, 0, 32);
        *s = *s16 = 0;
        return;
    }
    const float id = amax > TWQ_TINY ? 127.0f / amax : 0.0f;
#ifdef TWQ_AVX512
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(q1));
    *s16 = _mm512_reduce_add_epi32(q0);
    *s = *s16 + _mm512_reduce_add_epi32(q1);
#elif defined(TWQ_AVX2)
    __m256i q4[4]; /* rint under the default rounding mode, as rintf */
    for (int i = 0; i < 4; ++i) q4[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q4[0], q4[1]), _mm256_packs_epi32(q4[2], q4[3])); /* |q| <= 127: no saturation */
    _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i t0 = _mm256_add_epi32(q4[0], q4[1]), t = _mm256_add_epi32(t0, _mm256_add_epi32(q4[2], q4[3]));
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    __m128i u0 = _mm_add_epi32(_mm256_castsi256_si128(t0), _mm256_extracti128_si256(t0, 1));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
    u0 = _mm_add_epi32(u0, _mm_shuffle_epi32(u0, 0x4E));
    *s = _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1)));
    *s16 = _mm_cvtsi128_si32(_mm_add_epi32(u0, _mm_shuffle_epi32(u0, 0xB1)));
#else
    int32_t sum = 0, sum16 = 0;
    for (int l = 0; l < 32; ++l) {
        int32_t v = (int32_t)rintf(x[l] * id); /* |x * id| <= 127 (rounded up by at most 2 ulp) */
        q[l] = (int8_t)v;
        sum += v;
        sum16 += l < 16 ? v : 0;
    }
    *s = sum;
    *s16 = sum16;
#endif
}

#ifdef TWQ_AVX512
/* The horizontal step of twq_blocks16_max/_add at level 0-3: a's and b's halves (8, 4, 2, 1
 * lanes apart: level 0 the 256-bit halves, 1 the 128-bit lanes 0, 2 against 1, 3, 2 and 3 the
 * even and odd floats of each 128-bit lane) side by side, combined lane by lane. After levels
 * 0-3 over 16 vectors (neighbours paired at each) lane 4L + p holds the reduction of vector
 * L + 4p (L the 128-bit lane). */
#define TWQ_TREE_STEP(OP, a, b, level)                                                                                                   \
    ((level) == 0   ? OP(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE))                                         \
     : (level) == 1 ? OP(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD))                                         \
                    : OP(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD)))
#define TWQ_ADDI(a, b) _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))
/* v[0..15] reduced to one vector, lane i = v[i]'s max (a max is exact in any order). v is overwritten. */
TWQ_INLINE __m512 twq_blocks16_max(__m512* v) {
#pragma GCC unroll 4
    for (int n = 16, level = 0; n > 1; n /= 2, ++level)
#pragma GCC unroll 8
        for (int i = 0; i < n / 2; ++i) v[i] = TWQ_TREE_STEP(_mm512_max_ps, v[2 * i], v[2 * i + 1], level);
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), v[0]);
}
/* The same for int32 sums (exact in any order). */
TWQ_INLINE __m512i twq_blocks16_add(__m512* v) {
#pragma GCC unroll 4
    for (int n = 16, level = 0; n > 1; n /= 2, ++level)
#pragma GCC unroll 8
        for (int i = 0; i < n / 2; ++i) v[i] = TWQ_TREE_STEP(TWQ_ADDI, v[2 * i], v[2 * i + 1], level);
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), _mm512_castps_si512(v[0]));
}

/* 16 consecutive blocks of 32 at x (q, d, s, s16 as twq_quant_block gives each), the horizontal
 * max and sums of 16 blocks taken together (twq_blocks16_max, _add: 7 steps of 3 instructions
 * for 16 blocks, where a block's _mm512_reduce_* took 4 of its own, 12 for its max and two
 * sums) and d and 127 / max by one division each for the 16: measured on the Zen 4 machine
 * (1 thread), 8.4 -> 4.2 ns a block (8 x 576: 1.21 -> 0.60 us a call, 8 x 1536: 3.29 ->
 * 1.65), which the GEMV spends on one thread before its tiles start. 0 (nothing written)
 * where a block holds a NaN or an infinity: twq_quant_block then takes them one by one. */
TWQ_INLINE int twq_quant_blocks16(const float* x, int8_t* q, float* d, __m512i* s, __m512i* s16) {
    __m512 v[16];
    __mmask16 nan = 0;
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * i), v1 = _mm512_loadu_ps(x + 32 * i + 16);
        v[i] = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
        nan |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q);
    }
    const __m512 amax = twq_blocks16_max(v);
    if (nan || _mm512_cmp_ps_mask(amax, _mm512_set1_ps(3.4028234663852886e38f), _CMP_GT_OQ)) return 0;
    _mm512_storeu_ps(d, _mm512_div_ps(amax, _mm512_set1_ps(127.0f)));
    float id[16];
    _mm512_storeu_ps(id, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_set1_ps(TWQ_TINY), _CMP_GT_OQ), _mm512_set1_ps(127.0f), amax));
    __m512 h[16], t[16]; /* each block's two halves' int32 q: the first's, and the sum of both */
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
        const __m512 f = _mm512_set1_ps(id[i]);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * i), f));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * i + 16), f));
        _mm_storeu_si128((__m128i*)(q + 32 * i), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i*)(q + 32 * i + 16), _mm512_cvtepi32_epi8(q1));
        h[i] = _mm512_castsi512_ps(q0);
        t[i] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
    }
    *s16 = twq_blocks16_add(h);
    *s = twq_blocks16_add(t);
    return 1;
}
#undef TWQ_ADDI
#endif

static void twq_quantize(int fmt, const float* x, const twq_xq* xq, int64_t r0, int64_t r1) {
    const int32_t cm = twq_corr_mul(fmt);
    int64_t at = r0 * xq->nb; /* x's rows are K apart: block at of the rows is at x + 32 at */
    const int64_t end = r1 * xq->nb;
#ifdef TWQ_AVX512
    for (; at + 16 <= end; at += 16) {
        __m512i s, s16;
        if (!twq_quant_blocks16(x + 32 * at, xq->q + 32 * at, xq->d + at, &s, &s16)) break; /* a non-finite block: one by one from here */
        _mm512_storeu_ps(xq->cx + at, _mm512_mul_ps(_mm512_loadu_ps(xq->d + at), _mm512_cvtepi32_ps(s)));
        _mm512_storeu_si512((void*)(xq->corr + at), _mm512_mullo_epi32(_mm512_set1_epi32(cm), s));
        _mm512_storeu_si512((void*)(xq->corr16 + at), _mm512_mullo_epi32(_mm512_set1_epi32(cm), s16));
    }
#endif
    for (; at < end; ++at) {
        int32_t s, s16;
        twq_quant_block(x + 32 * at, xq->q + 32 * at, &xq->d[at], &s, &s16);
        xq->cx[at] = xq->d[at] * (float)s;
        xq->corr[at] = cm * s;
        xq->corr16[at] = cm * s16;
    }
}

/* The scratch for M rows (one allocation: q, then d, cx, corr, corr16); NULL when malloc fails. */
static float* twq_xq_alloc(twq_xq* xq, int64_t M, int64_t K) {
    const int64_t nb = K / 32, qf = (M * K + 63) / 64 * 16;
    float* base = twq_alloc(qf + 4 * M * nb);
    if (base == NULL) return NULL;
    xq->q = (int8_t*)base;
    xq->d = base + qf;
    xq->cx = xq->d + M * nb;
    xq->corr = (int32_t*)(xq->cx + M * nb);
    xq->corr16 = xq->corr + M * nb;
    xq->K = K;
    xq->nb = nb;
    return base;
}

/* ==== AVX-512 ================================================================================ */
#ifdef TWQ_AVX512

#define TWQ_AHEAD 4    /* GEMV groups of W rows prefetched ahead */
#define TWQ_PN 32      /* W rows per packed GEMM panel: two vectors of outputs */
#define TWQ_PM 12      /* x rows per GEMM micro-kernel: 24 accumulators */
#define TWQ_KC 1024    /* at most this many k per packed panel (32 x 1024 floats = 128 KiB, in L2) */
#ifndef TWQ_BPF
#define TWQ_BPF 4      /* pieces of each row prefetched ahead as a GEMM panel is packed */
#endif

/* The 32 weights of piece j of a bf16 or f16 row as two vectors (weights 0..15, 16..31). */
TWQ_INLINE void twq_dec(int fmt, const uint8_t* row, int64_t j, __m512* w0, __m512* w1) {
    const uint8_t* b = row + j * 64;
    if (fmt == TWQ_BF16) {
        *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)b)), 16));
        *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + 32))), 16));
        return;
    }
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(b + 32)));
}

/* ---- float GEMV: rows n0 .. n0+NR of W against MR rows of x (row stride K); y row stride N ---- */
TWQ_INLINE void twq_gemv_tile(int fmt, int MR, int NR, const float* x, const uint8_t* w, int64_t rb,
                              float* y, int64_t N, int64_t K, int64_t n0) {
    __m512 acc[TWQ_MR][TWQ_NR];
    const uint8_t* rows[TWQ_NR];
    for (int c = 0; c < NR; ++c) rows[c] = w + (n0 + c) * rb;
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
    const int64_t nj = K / 32;
    /* Software prefetch of the group TWQ_AHEAD groups on (rows are contiguous, and prefetching
     * past the end is harmless): the hardware prefetchers lose track of several interleaved
     * short row streams, and a big matrix then runs at half the memory bandwidth. */
    const char* ahead = (const char*)(rows[0] + TWQ_AHEAD * NR * rb);
    const int64_t step = nj ? (NR * rb + nj - 1) / nj : 0;
    for (int64_t j = 0; j < nj; ++j) {
        for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
        __m512 x0[TWQ_MR], x1[TWQ_MR];
        for (int r = 0; r < MR; ++r) {
            x0[r] = _mm512_loadu_ps(x + r * K + 32 * j);
            x1[r] = _mm512_loadu_ps(x + r * K + 32 * j + 16);
        }
        for (int c = 0; c < NR; ++c) {
            __m512 w0, w1;
            twq_dec(fmt, rows[c], j, &w0, &w1);
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(w1, x1[r], _mm512_fmadd_ps(w0, x0[r], acc[r][c]));
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
TWQ_GEMV_FMT(TWQ_BF16)
TWQ_GEMV_FMT(TWQ_F16)

typedef void (*twq_gemv_fn)(const float*, const uint8_t*, int64_t, float*, int64_t, int64_t, int64_t);
#define TWQ_GEMV_ROW_NR(FMT, NR) \
    {twq_gemv_##FMT##_1_##NR, twq_gemv_##FMT##_2_##NR, twq_gemv_##FMT##_3_##NR, twq_gemv_##FMT##_4_##NR, \
     twq_gemv_##FMT##_5_##NR, twq_gemv_##FMT##_6_##NR, twq_gemv_##FMT##_7_##NR, twq_gemv_##FMT##_8_##NR}
#define TWQ_GEMV_ROW(FMT) \
    {TWQ_GEMV_ROW_NR(FMT, 1), TWQ_GEMV_ROW_NR(FMT, 2), \
     {twq_gemv_##FMT##_1_4, twq_gemv_##FMT##_2_4, twq_gemv_##FMT##_3_4, twq_gemv_##FMT##_4_4, NULL, NULL, NULL, NULL}}
/* [fmt][NR 1, 2, 4][MR - 1]; the integer-path formats have none */
static const twq_gemv_fn twq_gemv_table[TWQ_NFMT][3][TWQ_MR] = {
    [TWQ_BF16] = TWQ_GEMV_ROW(TWQ_BF16), [TWQ_F16] = TWQ_GEMV_ROW(TWQ_F16)};

/* Up to 4 rows of x: groups of 4 W rows, one pass. More: groups of 2 W rows, passes of up to 8
 * rows of x (16 accumulators either way; a group's weights come from memory once). The W rows
 * a group takes (nr), the most rows of x a pass takes, and the groups. */
TWQ_INLINE void twq_gemv_plan(int64_t M, int64_t N, int* nr, int64_t* mr_max, int64_t* groups) {
    const int want = M <= 4 ? 4 : 2;
    *nr = N >= want ? want : 1;
    *mr_max = *nr == 4 ? 4 : TWQ_MR;
    *groups = (N + *nr - 1) / *nr;
}

/* The first W row of group g: the last group of a ragged N overlaps the one before (the same
 * values are written). */
TWQ_INLINE int64_t twq_group_n0(int64_t g, int nr, int64_t N) { return g * nr < N - nr ? g * nr : N - nr; }

static void twq_gemv(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    int nr;
    int64_t mr_max, groups;
    twq_gemv_plan(M, N, &nr, &mr_max, &groups);
    const twq_gemv_fn* fns = twq_gemv_table[fmt][nr == 4 ? 2 : nr - 1];
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t n0 = twq_group_n0(g, nr, N);
        for (int64_t m0 = 0; m0 < M; m0 += mr_max) {
            int64_t mr = M - m0 < mr_max ? M - m0 : mr_max;
            fns[mr - 1](x + m0 * K, w, rb, y + m0 * N, N, K, n0);
        }
    }
}

/* ---- float GEMM: panels of 32 decoded W rows, k-major, and a 12 x 32 outer-product micro-kernel ---- */

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
 * multiple of 32, into the panel p[k][32]. */
TWQ_INLINE void twq_pack(int fmt, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t k0, int64_t kc, int64_t K, float* p) {
    float tmp[TWQ_PN * 32] __attribute__((aligned(64)));
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
                _mm_prefetch((const char*)(row + 64 * (j + TWQ_BPF)), _MM_HINT_T0); /* the row's weights TWQ_BPF pieces ahead */
                twq_dec(fmt, row, j, &w0, &w1);
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
TWQ_PACK_FN(TWQ_BF16)
TWQ_PACK_FN(TWQ_F16)
typedef void (*twq_pack_fn)(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
/* [fmt]; the integer-path formats have none */
static const twq_pack_fn twq_pack_table[TWQ_NFMT] = {[TWQ_BF16] = twq_pack_TWQ_BF16, [TWQ_F16] = twq_pack_TWQ_F16};

/* y[r][0..32) (+)= a0[r], a1[r] for MR rows of a register tile; mk0/mk1 mask the valid outputs. */
TWQ_INLINE void twq_store_tile(int MR, __m512* a0, __m512* a1, float* y, int64_t ldy, __mmask16 mk0, __mmask16 mk1, int add) {
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

/* One function per row count 1 .. TWQ_PM of micro-kernel NAME (x of XT, the panel of PT) and
 * their table NAME##_table, indexed by rows - 1. */
#define TWQ_MICRO_ONE(NAME, XT, PT, MR) \
    static void NAME##_##MR(const XT* x, int64_t ldx, const PT* p, int64_t kc, float* y, int64_t ldy, __mmask16 m0, __mmask16 m1, int add) { \
        NAME(MR, x, ldx, p, kc, y, ldy, m0, m1, add); \
    }
#define TWQ_MICRO_TABLE(NAME, XT, PT) \
    TWQ_MICRO_ONE(NAME, XT, PT, 1) TWQ_MICRO_ONE(NAME, XT, PT, 2) TWQ_MICRO_ONE(NAME, XT, PT, 3) TWQ_MICRO_ONE(NAME, XT, PT, 4) \
    TWQ_MICRO_ONE(NAME, XT, PT, 5) TWQ_MICRO_ONE(NAME, XT, PT, 6) TWQ_MICRO_ONE(NAME, XT, PT, 7) TWQ_MICRO_ONE(NAME, XT, PT, 8) \
    TWQ_MICRO_ONE(NAME, XT, PT, 9) TWQ_MICRO_ONE(NAME, XT, PT, 10) TWQ_MICRO_ONE(NAME, XT, PT, 11) TWQ_MICRO_ONE(NAME, XT, PT, 12) \
    typedef void (*NAME##_fn)(const XT*, int64_t, const PT*, int64_t, float*, int64_t, __mmask16, __mmask16, int); \
    static const NAME##_fn NAME##_table[TWQ_PM] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6, \
                                                   NAME##_7, NAME##_8, NAME##_9, NAME##_10, NAME##_11, NAME##_12};

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
    twq_store_tile(MR, a0, a1, y, ldy, mk0, mk1, add);
}

TWQ_MICRO_TABLE(twq_micro, float, float)

/* (M x N tiles over the threads: panels, and chunks of x rows when there are too few panels.) */
static void twq_tiles(int64_t M, int64_t panels, int64_t pm, int64_t* ntm, int64_t* mc) {
    const int64_t nth = twq_threads();
    *ntm = 1;
    while (panels * *ntm < 2 * nth && M / (2 * *ntm) >= pm) *ntm *= 2;
    *mc = ((M + *ntm - 1) / *ntm + pm - 1) / pm * pm;
}

/* Tile t of a GEMM (panels x ntm chunks of mc rows): W rows [n0, n0 + nr), x rows [m0, m1),
 * and the masks of the tile's valid outputs. */
typedef struct {
    int64_t n0, nr, m0, m1;
    __mmask16 mk0, mk1;
} twq_tile;

TWQ_INLINE twq_tile twq_tile_at(int64_t t, int64_t ntm, int64_t mc, int64_t M, int64_t N) {
    twq_tile c;
    c.n0 = (t / ntm) * TWQ_PN;
    c.m0 = (t % ntm) * mc;
    c.m1 = c.m0 + mc < M ? c.m0 + mc : M;
    c.nr = N - c.n0 < TWQ_PN ? N - c.n0 : TWQ_PN;
    c.mk0 = (__mmask16)(c.nr >= 16 ? 0xFFFFu : (1u << c.nr) - 1u);
    c.mk1 = (__mmask16)(c.nr >= 32 ? 0xFFFFu : c.nr > 16 ? (1u << (c.nr - 16)) - 1u : 0u);
    return c;
}

static int twq_gemm(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int64_t nkb = (K + TWQ_KC - 1) / TWQ_KC;
    const int64_t kc = ((K + nkb - 1) / nkb + 255) / 256 * 256; /* a multiple of 256 k per panel (once whole k-quant super-blocks) */
    const int64_t panels = (N + TWQ_PN - 1) / TWQ_PN;
    int64_t ntm, mc;
    twq_tiles(M, panels, TWQ_PM, &ntm, &mc);
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
            const twq_tile c = twq_tile_at(t, ntm, mc, M, N);
            if (p == NULL || c.m0 >= c.m1) continue;
            for (int64_t k0 = 0; k0 < K; k0 += kc) {
                const int64_t kn = K - k0 < kc ? K - k0 : kc;
                twq_pack_table[fmt](w, rb, c.n0, c.nr, k0, kn, K, p);
                for (int64_t m = c.m0; m < c.m1; m += TWQ_PM) {
                    const int64_t mr = c.m1 - m < TWQ_PM ? c.m1 - m : TWQ_PM;
                    twq_micro_table[mr - 1](x + m * K + k0, K, p, kn, y + m * N + c.n0, N, c.mk0, c.mk1, k0 > 0);
                }
            }
        }
        twq_free(p);
    }
    return failed ? TWQ_ENOMEM : 0;
}

#ifdef TWQ_BF16DOT
/* ---- bf16 GEMM with AVX-512 BF16 dot products: x rounded to bf16, pairs of k per lane ---- */

#define TWQ_BKC 2048 /* at most this many k per bf16 panel (32 x 2048 bf16 = 128 KiB, in L2) */

/* x [M, K] float32 -> xb [M, kp] bf16 (round to nearest even; zeros from K to kp, kp a multiple
 * of 32), rows spread over the threads of the enclosing parallel region. */
TWQ_INLINE void twq_x_bf16(const float* x, int64_t M, int64_t K, uint16_t* xb, int64_t kp) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; ++r) {
        const float* xr = x + r * K;
        for (int64_t k = 0; k < kp; k += 32) {
            const int64_t n = K - k < 0 ? 0 : K - k;
            const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
            const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xFFFFu : n > 16 ? (1u << (n - 16)) - 1u : 0u);
            const __m512 lo = _mm512_maskz_loadu_ps(m0, xr + k), hi = _mm512_maskz_loadu_ps(m1, xr + k + 16);
            _mm512_store_si512((__m512i*)(xb + r * kp + k), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* GEMV tile: W rows n0 .. n0+NR against MR rows of xb (bf16, row stride kp, zeros from K on),
 * one vdpbf16ps per 32 weights of a row and row of x: a row's 64 bytes of a piece are already
 * the pairs (k, k + 1) the instruction takes, as are xb's, so nothing is decoded; the last
 * piece of a row is loaded masked (no byte past the row). Each output is its 16 lanes' sums
 * added up at the end, so a row of x gets the same bits whatever MR and NR. */
TWQ_INLINE void twq_gemv_bf16_tile(int MR, int NR, const uint16_t* xb, int64_t kp, const uint8_t* w, int64_t rb,
                                   float* y, int64_t N, int64_t K, int64_t n0) {
    __m512 acc[TWQ_MR][TWQ_NR];
    const uint8_t* rows[TWQ_NR];
    for (int c = 0; c < NR; ++c) rows[c] = w + (n0 + c) * rb;
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
    const char* ahead = (const char*)(rows[0] + TWQ_AHEAD * NR * rb); /* as twq_gemv_tile */
    const int64_t nj = K / 32, step = (NR * rb + kp / 32 - 1) / (kp / 32);
    for (int64_t j = 0; j < nj; ++j) {
        for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
        __m512bh xv[TWQ_MR];
        for (int r = 0; r < MR; ++r) xv[r] = (__m512bh)_mm512_load_si512((const __m512i*)(xb + r * kp + 32 * j));
        for (int c = 0; c < NR; ++c) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void*)(rows[c] + 64 * j));
            for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
        }
    }
    if (K % 32) { /* the last piece: K % 32 weights of each row, xb's zeros past them */
        const __mmask32 mk = (__mmask32)((1u << (K % 32)) - 1u);
        for (int c = 0; c < NR; ++c) {
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, rows[c] + 64 * nj);
            for (int r = 0; r < MR; ++r)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)_mm512_load_si512((const __m512i*)(xb + r * kp + 32 * nj)), wv);
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c) y[r * N + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

#define TWQ_GEMV_BF16_FN(MR, NR) \
    static void twq_gemv_bf16_##MR##_##NR(const uint16_t* xb, int64_t kp, const uint8_t* w, int64_t rb, float* y, int64_t N, int64_t K, int64_t n0) { \
        twq_gemv_bf16_tile(MR, NR, xb, kp, w, rb, y, N, K, n0); \
    }
#define TWQ_GEMV_BF16_NR(NR) \
    TWQ_GEMV_BF16_FN(1, NR) TWQ_GEMV_BF16_FN(2, NR) TWQ_GEMV_BF16_FN(3, NR) TWQ_GEMV_BF16_FN(4, NR) TWQ_GEMV_BF16_FN(5, NR) \
    TWQ_GEMV_BF16_FN(6, NR) TWQ_GEMV_BF16_FN(7, NR) TWQ_GEMV_BF16_FN(8, NR)
TWQ_GEMV_BF16_FN(1, 4) TWQ_GEMV_BF16_FN(2, 4) TWQ_GEMV_BF16_FN(3, 4) TWQ_GEMV_BF16_FN(4, 4) TWQ_GEMV_BF16_NR(2) TWQ_GEMV_BF16_NR(1)
typedef void (*twq_gemv_bf16_fn)(const uint16_t*, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t, int64_t);
#define TWQ_GEMV_BF16_ROW(NR) \
    {twq_gemv_bf16_1_##NR, twq_gemv_bf16_2_##NR, twq_gemv_bf16_3_##NR, twq_gemv_bf16_4_##NR, \
     twq_gemv_bf16_5_##NR, twq_gemv_bf16_6_##NR, twq_gemv_bf16_7_##NR, twq_gemv_bf16_8_##NR}
/* [NR 1, 2, 4][MR - 1] */
static const twq_gemv_bf16_fn twq_gemv_bf16_table[3][TWQ_MR] = {
    TWQ_GEMV_BF16_ROW(1), TWQ_GEMV_BF16_ROW(2), {twq_gemv_bf16_1_4, twq_gemv_bf16_2_4, twq_gemv_bf16_3_4, twq_gemv_bf16_4_4, NULL, NULL, NULL, NULL}};

#define TWQ_XAHEAD 2 /* bf16x16 groups prefetched ahead (a line a pair: as fast as they are read) */

/* bf16x16: rows of xb (bf16, row stride kp) against the group of 16 W rows at grp (gb bytes a
 * group): per pair t, the group's 64 bytes are one vector and each row of x adds its pair t,
 * broadcast, by one vdpbf16ps: each output one chain over the pairs in order, starting at zero
 * (the bits of twq_micro_bf16 up to TWQ_BKC k), the 16 outputs stored as a vector. */
TWQ_INLINE void twq_gemv_bf16x16_tile(int MR, const uint16_t* xb, int64_t kp, const uint8_t* grp, int64_t gb, float* y, int64_t N, int64_t K) {
    __m512 acc[TWQ_MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
    const char* ahead = (const char*)(grp + TWQ_XAHEAD * gb);
    for (int64_t t = 0; t < K / 2; ++t) {
        _mm_prefetch(ahead + 64 * t, _MM_HINT_T0);
        const __m512bh wv = (__m512bh)_mm512_loadu_si512((const void*)(grp + 64 * t));
        for (int r = 0; r < MR; ++r) {
            int32_t pair;
            memcpy(&pair, xb + r * kp + 2 * t, 4);
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(pair), wv);
        }
    }
    for (int r = 0; r < MR; ++r) _mm512_storeu_ps(y + r * N, acc[r]);
}

#define TWQ_GEMV_BF16X16_FN(MR) \
    static void twq_gemv_bf16x16_##MR(const uint16_t* xb, int64_t kp, const uint8_t* grp, int64_t gb, float* y, int64_t N, int64_t K) { \
        twq_gemv_bf16x16_tile(MR, xb, kp, grp, gb, y, N, K); \
    }
TWQ_GEMV_BF16X16_FN(1) TWQ_GEMV_BF16X16_FN(2) TWQ_GEMV_BF16X16_FN(3) TWQ_GEMV_BF16X16_FN(4)
TWQ_GEMV_BF16X16_FN(5) TWQ_GEMV_BF16X16_FN(6) TWQ_GEMV_BF16X16_FN(7) TWQ_GEMV_BF16X16_FN(8)
typedef void (*twq_gemv_bf16x16_fn)(const uint16_t*, int64_t, const uint8_t*, int64_t, float*, int64_t, int64_t);
static const twq_gemv_bf16x16_fn twq_gemv_bf16x16_table[TWQ_MR] = {twq_gemv_bf16x16_1, twq_gemv_bf16x16_2, twq_gemv_bf16x16_3, twq_gemv_bf16x16_4,
                                                                   twq_gemv_bf16x16_5, twq_gemv_bf16x16_6, twq_gemv_bf16x16_7, twq_gemv_bf16x16_8};

/* twq_gemv's grouping with x rounded to bf16 once per call (by the threads, before the groups);
 * bf16x16 weights (x16): the groups of 16 rows over the threads, every row of x a pass. */
static int twq_gemv_bf16(int x16, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    int nr;
    int64_t mr_max, groups;
    twq_gemv_plan(M, N, &nr, &mr_max, &groups);
    const int64_t kp = (K + 31) / 32 * 32;
    const twq_gemv_bf16_fn* fns = twq_gemv_bf16_table[nr == 4 ? 2 : nr - 1];
    uint16_t* xb = (uint16_t*)twq_alloc((M * kp + 1) / 2);
    if (xb == NULL) return TWQ_ENOMEM;
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel if (par)
    {
        twq_x_bf16(x, M, K, xb, kp); /* (a barrier at its end) */
        if (x16) {
#pragma omp for schedule(static)
            for (int64_t g = 0; g < N / 16; ++g) twq_gemv_bf16x16_table[M - 1](xb, kp, w + g * 16 * rb, 16 * rb, y + 16 * g, N, K);
        } else {
#pragma omp for schedule(static)
            for (int64_t g = 0; g < groups; ++g) {
                const int64_t n0 = twq_group_n0(g, nr, N);
                for (int64_t m0 = 0; m0 < M; m0 += mr_max) {
                    int64_t mr = M - m0 < mr_max ? M - m0 : mr_max;
                    fns[mr - 1](xb + m0 * kp, kp, w, rb, y + m0 * N, N, K, n0);
                }
            }
        }
    }
    twq_free((float*)xb);
    return 0;
}

/* Rows [n0, n0 + nr) (nr <= 32; zero columns past them), weights [k0, k0 + kc) with k0 and kc
 * multiples of 32 (zeros from K on), into the panel p[kc / 2][32] of 32-bit pairs (k, k + 1):
 * a row's 16 pairs of a piece are its 64 bytes there, so packing is a 32 x 16 transpose. */
TWQ_INLINE void twq_pack_bf16(const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t k0, int64_t kc, int64_t K, uint32_t* p) {
    float tmp[TWQ_PN * 16] __attribute__((aligned(64)));
    for (int64_t kk = 0; kk < kc; kk += 32) {
        const int64_t left = K - (k0 + kk); /* weights of the piece in the row, up to 32 */
        const uint64_t bits = left >= 32 ? ~0ull : left > 0 ? (1ull << left) - 1ull : 0ull;
        for (int64_t c = 0; c < TWQ_PN; ++c) {
            __m512i v = _mm512_setzero_si512();
            const uint8_t* at = w + (n0 + c) * rb + 2 * (k0 + kk);
            if (c < nr) {
                v = _mm512_maskz_loadu_epi16((__mmask32)bits, at);
                _mm_prefetch((const char*)(at + 64 * TWQ_BPF), _MM_HINT_T0);
            }
            _mm512_store_si512((__m512i*)(tmp + 16 * c), v);
        }
        float* q = (float*)p + kk / 2 * TWQ_PN;
        twq_transpose16(tmp, 16, q, TWQ_PN);
        twq_transpose16(tmp + 16 * 16, 16, q + 16, TWQ_PN);
    }
}

/* y[r][0..32) (+)= xb[r][0..kc) @ W for MR rows, by pairs of k: the pairs (k, k + 1) of W's 32
 * columns are 16 32-bit words at p0 + ps * k / 2 (columns 0..15) and at p1 + ps * k / 2 (16..31):
 * a packed panel (p1 = p0 + 16, ps = 32) or two bf16x16 groups (ps = 16). */
TWQ_INLINE void twq_micro_bf16(int MR, const uint16_t* xb, int64_t ldx, const uint32_t* p0, const uint32_t* p1, int64_t ps, int64_t kc,
                               float* y, int64_t ldy, __mmask16 mk0, __mmask16 mk1, int add) {
    __m512 a0[TWQ_PM], a1[TWQ_PM];
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k += 2) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void*)(p0 + ps * (k / 2)));
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void*)(p1 + ps * (k / 2)));
        for (int r = 0; r < MR; ++r) {
            int32_t pair;
            memcpy(&pair, xb + r * ldx + k, 4);
            const __m512bh xr = (__m512bh)_mm512_set1_epi32(pair);
            a0[r] = _mm512_dpbf16_ps(a0[r], xr, b0);
            a1[r] = _mm512_dpbf16_ps(a1[r], xr, b1);
        }
    }
    twq_store_tile(MR, a0, a1, y, ldy, mk0, mk1, add);
}

#define TWQ_MICRO_BF16_ONE(MR) \
    static void twq_micro_bf16_##MR(const uint16_t* x, int64_t ldx, const uint32_t* p0, const uint32_t* p1, int64_t ps, int64_t kc, float* y, \
                                    int64_t ldy, __mmask16 m0, __mmask16 m1, int add) { \
        twq_micro_bf16(MR, x, ldx, p0, p1, ps, kc, y, ldy, m0, m1, add); \
    }
TWQ_MICRO_BF16_ONE(1) TWQ_MICRO_BF16_ONE(2) TWQ_MICRO_BF16_ONE(3) TWQ_MICRO_BF16_ONE(4) TWQ_MICRO_BF16_ONE(5) TWQ_MICRO_BF16_ONE(6)
TWQ_MICRO_BF16_ONE(7) TWQ_MICRO_BF16_ONE(8) TWQ_MICRO_BF16_ONE(9) TWQ_MICRO_BF16_ONE(10) TWQ_MICRO_BF16_ONE(11) TWQ_MICRO_BF16_ONE(12)
typedef void (*twq_micro_bf16_fn)(const uint16_t*, int64_t, const uint32_t*, const uint32_t*, int64_t, int64_t, float*, int64_t, __mmask16, __mmask16, int);
static const twq_micro_bf16_fn twq_micro_bf16_table[TWQ_PM] = {twq_micro_bf16_1, twq_micro_bf16_2, twq_micro_bf16_3, twq_micro_bf16_4,
                                                               twq_micro_bf16_5, twq_micro_bf16_6, twq_micro_bf16_7, twq_micro_bf16_8,
                                                               twq_micro_bf16_9, twq_micro_bf16_10, twq_micro_bf16_11, twq_micro_bf16_12};

/* The bf16 GEMM of twq_gemm's shape, x rounded to bf16 once per call (kp: K up to a multiple
 * of 32, so a pair never straddles a panel and every piece is whole). bf16x16 weights (x16) are
 * read where they are: a panel's 32 rows are two groups. */
static int twq_gemm_bf16(int x16, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int64_t kp = (K + 31) / 32 * 32;
    const int64_t nkb = (kp + TWQ_BKC - 1) / TWQ_BKC;
    const int64_t kc = ((kp + nkb - 1) / nkb + 31) / 32 * 32;
    const int64_t panels = (N + TWQ_PN - 1) / TWQ_PN;
    int64_t ntm, mc;
    twq_tiles(M, panels, TWQ_PM, &ntm, &mc);
    const int64_t tiles = panels * ntm;
    uint16_t* xb = (uint16_t*)twq_alloc((M * kp + 1) / 2);
    if (xb == NULL) return TWQ_ENOMEM;
    int failed = 0;
#pragma omp parallel
    {
        uint32_t* p = x16 ? NULL : (uint32_t*)twq_alloc(kc / 2 * TWQ_PN);
        if (!x16 && p == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        twq_x_bf16(x, M, K, xb, kp); /* (a barrier at its end) */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            const twq_tile c = twq_tile_at(t, ntm, mc, M, N);
            if ((!x16 && p == NULL) || c.m0 >= c.m1) continue;
            for (int64_t k0 = 0; k0 < kp; k0 += kc) {
                int64_t kn = kp - k0 < kc ? kp - k0 : kc;
                const uint32_t *p0 = p, *p1 = p + 16;
                int64_t ps = 32;
                if (x16) { /* group n0 / 16 from pair k0 / 2 on, and the next group (or again) */
                    p0 = (const uint32_t*)(w + c.n0 * rb) + 8 * k0;
                    p1 = c.nr > 16 ? p0 + 4 * rb : p0;
                    ps = 16;
                    kn = K - k0 < kn ? K - k0 : kn; /* no pairs past K in a group */
                } else {
                    twq_pack_bf16(w, rb, c.n0, c.nr, k0, kn, K, p);
                }
                for (int64_t m = c.m0; m < c.m1; m += TWQ_PM) {
                    const int64_t mr = c.m1 - m < TWQ_PM ? c.m1 - m : TWQ_PM;
                    twq_micro_bf16_table[mr - 1](xb + m * kp + k0, kp, p0, p1, ps, kn, y + m * N + c.n0, N, c.mk0, c.mk1, k0 > 0);
                }
            }
        }
        twq_free((float*)p);
    }
    twq_free((float*)xb);
    return failed ? TWQ_ENOMEM : 0;
}

#endif /* TWQ_BF16DOT */

/* ---- integer path: 16 W rows x one block as 8 vectors of 16 rows x 4 weight bytes ---------- */

#ifndef TWQ_IAHEAD
/* GEMV tiles of 16 W rows prefetched ahead. 1, measured on the Zen 4 machine with cold weights
 * in two bandwidth phases (old and new in one process, in rounds): as fast as 2 at one row of
 * x, and at eight the 49152 x 576 q8_0x16 head 1.09-1.19x faster, the q4_1x16 matrices
 * 1.0-1.03x; without the software prefetch (0) q4_1x16 at eight rows is 1.23-1.33x slower. */
#define TWQ_IAHEAD 1
#endif
#define TWQ_IPM 4    /* x rows per integer GEMM micro-kernel (x 2 vectors of W rows) */
#define TWQ_IBLK 1280 /* bytes per block of a 32-row panel: 8 x 2 weight vectors, 2 d, 2 m vectors */

/* Rows 4a..4a+3's 16 bytes at off, one per 128-bit lane. */
TWQ_INLINE __m512i twq_ld4(const uint8_t* const* rows, int64_t off) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(rows[0] + off)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(rows[1] + off)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(rows[2] + off)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(rows[3] + off)), 3);
}

/* The 16 rows' dwords c = 0..nt-1 of their 16 bytes at off: t[c], lane i = row i's dword c. */
TWQ_INLINE void twq_t16x4(const uint8_t* const* rows, int64_t off, int nt, __m512i* t) {
    const __m512i ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i ib = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    const __m512i z0 = twq_ld4(rows, off), z1 = twq_ld4(rows + 4, off), z2 = twq_ld4(rows + 8, off), z3 = twq_ld4(rows + 12, off);
    const __m512i a = _mm512_permutex2var_epi32(z0, ia, z1), c = _mm512_permutex2var_epi32(z2, ia, z3);
    t[0] = _mm512_shuffle_i64x2(a, c, 0x44);
    if (nt == 1) return;
    const __m512i b = _mm512_permutex2var_epi32(z0, ib, z1), d = _mm512_permutex2var_epi32(z2, ib, z3);
    t[1] = _mm512_shuffle_i64x2(a, c, 0xEE);
    t[2] = _mm512_shuffle_i64x2(b, d, 0x44);
    t[3] = _mm512_shuffle_i64x2(b, d, 0xEE);
}

/* q5: W (the 16 rows' nibbles, twq_i8_decode's order) given their fifth bits, from qh (lane i =
 * row i's): W[t]'s byte k is weight 4t + k (t < 4) or 16 + 4(t - 4) + k, whose bit sits in qh's
 * byte (t & 3) / 2 + 2 (t / 4) at 4 (t & 1) + k; that byte is copied to the lane's 4 bytes, and
 * where the byte's own bit is set 16 is added. */
TWQ_INLINE void twq_q5_high(__m512i qh, __m512i* W) {
    const __m512i dw = _mm512_set_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808,
                                        0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0);
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int t = 0; t < 8; ++t) {
        const int src = (t & 3) / 2 + 2 * (t / 4);
        const __m512i bits = _mm512_shuffle_epi8(qh, _mm512_add_epi8(dw, _mm512_set1_epi8((char)src)));
        const __mmask64 set = _mm512_test_epi8_mask(bits, _mm512_set1_epi32((int)(0x08040201u << (4 * (t & 1)))));
        W[t] = _mm512_mask_add_epi8(W[t], set, W[t], sixteen);
    }
}

/* q4_k's sub-block s for 16 rows from their d and dmin and their scale bytes (S[0..2], lane i =
 * row i's bytes 0-3, 4-7, 8-11 of the 12): dw = d * scale, mw = -(dmin * min), twq_k4_factors' bits. */
TWQ_INLINE void twq_k4_factors_v(__m512 d, __m512 dmin, const __m512i* S, int s, __m512* dw, __m512* mw) {
    const __m128i at = _mm_cvtsi32_si128(8 * (s & 3)); /* the byte of each lane's 4 */
    const __m512i lo6 = _mm512_set1_epi32(63), lo4 = _mm512_set1_epi32(15), top2 = _mm512_set1_epi32(0x30);
    __m512i sc, mn;
    if (s < 4) {
        sc = _mm512_and_si512(_mm512_srl_epi32(S[0], at), lo6);
        mn = _mm512_and_si512(_mm512_srl_epi32(S[1], at), lo6);
    } else { /* low 4 bits in bytes 8-11 (scale: low nibble, min: high), the top 2 in bits 6-7 of bytes 0-3 (scale) and 4-7 (min) */
        const __m512i c = _mm512_srl_epi32(S[2], at);
        sc = _mm512_or_si512(_mm512_and_si512(c, lo4), _mm512_and_si512(_mm512_srli_epi32(_mm512_srl_epi32(S[0], at), 2), top2));
        mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), lo4), _mm512_and_si512(_mm512_srli_epi32(_mm512_srl_epi32(S[1], at), 2), top2));
    }
    *dw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    *mw = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn))), _mm512_set1_epi32((int)0x80000000u)));
}

/* The nibbles of q4_k's sub-block s from the 8 vectors W of its pair's 32 bytes (s even: the low ones). */
TWQ_INLINE void twq_k4_nibbles(__m512i* W, int s) {
    const __m512i lo = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 8; ++t) W[t] = _mm512_and_si512((s & 1) ? _mm512_srli_epi32(W[t], 4) : W[t], lo);
}

/* q5_k: the fifth bits of sub-block s added to its nibbles W from the 8 vectors H of the rows' qh
 * (vector t, lane i: row i's qh bytes 4t..4t+3, whose bit s belongs to weights 4t..4t+3). */
TWQ_INLINE void twq_k5_high(const __m512i* H, int s, __m512i* W) {
    const __m128i at = _mm_cvtsi32_si128(s);
    const __m512i one = _mm512_set1_epi8(1);
    for (int t = 0; t < 8; ++t) W[t] = _mm512_or_si512(W[t], _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(H[t], at), one), 4));
}

/* q4_k's or q5_k's 32-weight block j (sub-block j % 8 of super-block j / 8) of 16 plain rows, as twq_i8_decode gives a block. */
TWQ_INLINE void twq_k4_decode(int fmt, const uint8_t* const* rows, int64_t j, __m512i* W, __m512* dw, __m512* mw) {
    const int64_t o = (j >> 3) * twq_nbytes[fmt], qs = o + twq_k45_qs(fmt);
    const int s = (int)(j & 7);
    __m512i h, S[4]; /* S[3]: the bytes after the scales, unused */
    twq_t16x4(rows, o, 1, &h);
    twq_t16x4(rows, o + 4, 3, S);
    twq_k4_factors_v(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))), S, s, dw, mw);
    twq_t16x4(rows, qs + 32 * (s >> 1), 4, W);
    twq_t16x4(rows, qs + 16 + 32 * (s >> 1), 4, W + 4);
    twq_k4_nibbles(W, s);
    if (fmt == TWQ_Q5_K) {
        __m512i H[8];
        twq_t16x4(rows, o + 16, 4, H);
        twq_t16x4(rows, o + 32, 4, H + 4);
        twq_k5_high(H, s, W);
    }
}

/* q6_k's sub-block s (0..7) of 16 rows from the 8 vectors L of their 32 low-nibble bytes and H
 * of their 32 high-bit bytes (twq_i8_decode's order): into L, the 6-bit values q + 32 (the
 * nibble (s & 3) / 2 of L's bytes, the bit pair s & 3 of H's above it). */
TWQ_INLINE void twq_k6_bits(__m512i* L, const __m512i* H, int s) {
    const int t = s & 3;
    const __m512i lo = _mm512_set1_epi8(0x0F), hi = _mm512_set1_epi8(0x30);
    for (int i = 0; i < 8; ++i) {
        const __m512i n = t >= 2 ? _mm512_srli_epi32(L[i], 4) : L[i];
        const __m512i h = t < 2 ? _mm512_slli_epi32(H[i], 4 - 2 * t) : t == 2 ? H[i] : _mm512_srli_epi32(H[i], 2);
        L[i] = _mm512_ternarylogic_epi32(_mm512_and_si512(n, lo), h, hi, 0xF8); /* a | (b & c) */
    }
}

/* q6_k's sub-block s's two int8 scales, each row's 4 scale bytes 4 (s / 2) .. in S's lane: the
 * pair moved to the lane's top two bytes (scale 2s in byte 2, 2s + 1 in byte 3), as twq_k6_isum
 * takes them (the "mw" of a q6_k block, its bits an int32 vector). */
TWQ_INLINE __m512 twq_k6_scales(__m512i S, int s) { return _mm512_castsi512_ps(_mm512_slli_epi32(S, 16 - 16 * (s & 1))); }

/* q6_k's integer sum of a sub-block, sc0 * s + sc1 * u (s, u: its halves' sums; exact in int32:
 * at most 2 * 128 * 16 * 32 * 127 in magnitude), the scales from twq_k6_scales. */
TWQ_INLINE __m512i twq_k6_isum(__m512i s, __m512i u, __m512 sc) {
    const __m512i p = _mm512_castps_si512(sc);
    return _mm512_add_epi32(_mm512_mullo_epi32(s, _mm512_srai_epi32(_mm512_slli_epi32(p, 8), 24)), _mm512_mullo_epi32(u, _mm512_srai_epi32(p, 24)));
}

/* q6_k's 32-weight block j (sub-block j % 8 of super-block j / 8) of 16 plain rows: W as
 * twq_i8_decode gives a block, dw the rows' d, mw their scales (twq_k6_scales). Every load stays
 * inside the super-block (d is its last 2 bytes: read from byte 194). */
TWQ_INLINE void twq_k6_decode(const uint8_t* const* rows, int64_t j, __m512i* W, __m512* dw, __m512* mw) {
    const int64_t o = (j >> 3) * 210;
    const int s = (int)(j & 7), half = s >> 2;
    __m512i H[8], S[4], T[4];
    twq_t16x4(rows, o + 64 * half + 32 * (s & 1), 4, W);
    twq_t16x4(rows, o + 64 * half + 32 * (s & 1) + 16, 4, W + 4);
    twq_t16x4(rows, o + 128 + 32 * half, 4, H);
    twq_t16x4(rows, o + 144 + 32 * half, 4, H + 4);
    twq_k6_bits(W, H, s);
    twq_t16x4(rows, o + 192, (s >> 1) + 1, S);
    twq_t16x4(rows, o + 194, 4, T);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(T[3], 16)));
    *mw = twq_k6_scales(S[s >> 1], s);
}

/* iq4: the values of the nibbles in W (twq_i8_decode's order, each byte 0..15), looked up by
 * vpshufb in the 16 bytes of twq_iq4_values repeated in each 128-bit lane (the nibble is a byte
 * index there, its top bit clear): with VNNI value + 128 (1..241, vpdpbusd's unsigned side;
 * twq_corr_mul's -128 * sum(q_x) takes the bias off), without it the int8 value itself (twq_dot
 * takes |w| and x with w's sign, as q8_0's). */
TWQ_INLINE void twq_iq4_lookup(__m512i* W) {
    __m128i t = _mm_loadu_si128((const __m128i*)twq_iq4_values);
#ifdef TWQ_VNNI
    t = _mm_xor_si128(t, _mm_set1_epi8((char)0x80)); /* + 128 modulo 256: the value + 128 as an unsigned byte */
#endif
    const __m512i tab = _mm512_broadcast_i32x4(t);
    for (int i = 0; i < 8; ++i) W[i] = _mm512_shuffle_epi8(tab, W[i]);
}

/* iq4_xs's sub-block s for 16 rows: dw = d * (ls - 32) (twq_iq4xs_ls; exact in float32: an
 * 11-bit significand times at most 32), from the rows' d, scales_h (sh: lane i row i's in its
 * low 16 bits, the rest zero) and scales_l (sl: lane i row i's 4 bytes). */
TWQ_INLINE __m512 twq_iq4xs_dw(__m512 d, __m512i sh, __m512i sl, int s) {
    const __m512i lo = _mm512_and_si512(_mm512_srl_epi32(sl, _mm_cvtsi32_si128(4 * s)), _mm512_set1_epi32(15));
    const __m512i hi = _mm512_and_si512(_mm512_srl_epi32(sh, _mm_cvtsi32_si128(2 * s)), _mm512_set1_epi32(3));
    const __m512i ls = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
}

/* The low nibbles of W[0..3] into W[0..3] and their high nibbles into W[4..7] (a q4-style
 * block's weights 4t..4t+3 and 16 + 4t..16 + 4t + 3). */
TWQ_INLINE void twq_split_nibbles(__m512i* W) {
    const __m512i lo = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 4; ++t) {
        W[t + 4] = _mm512_and_si512(_mm512_srli_epi32(W[t], 4), lo);
        W[t] = _mm512_and_si512(W[t], lo);
    }
}

/* iq4_xs's 32-weight block j (sub-block j % 8 of super-block j / 8) of 16 plain rows: W as
 * twq_i8_decode gives a block (the looked-up values), dw the rows' d * (ls - 32). */
TWQ_INLINE void twq_iq4xs_decode(const uint8_t* const* rows, int64_t j, __m512i* W, __m512* dw) {
    const int64_t o = (j >> 3) * 136;
    const int s = (int)(j & 7);
    __m512i h[4]; /* lane i: row i's d and scales_h; its scales_l; (the rest unused) */
    twq_t16x4(rows, o, 2, h);
    *dw = twq_iq4xs_dw(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0])), _mm512_srli_epi32(h[0], 16), h[1], s);
    twq_t16x4(rows, o + twq_iq4_qs(TWQ_IQ4_XS, s), 4, W);
    twq_split_nibbles(W);
    twq_iq4_lookup(W);
}

/* q3_k's sub-block s (0..7) of 16 rows from the 8 vectors L of their 32 bytes of 2-bit fields
 * (those of half s / 4) and H of their 32 hmask bytes (twq_i8_decode's order): into L, the 3-bit
 * values q_w + 4 = field | hbit << 2 (0..7; q_w = field - 4 where the hmask bit is clear): bits
 * 2 (s & 3) of L's bytes, bit s of H's moved to bit 2. */
TWQ_INLINE void twq_k3_bits(__m512i* L, const __m512i* H, int s) {
    const __m128i at = _mm_cvtsi32_si128(2 * (s & 3));
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    for (int i = 0; i < 8; ++i) {
        const __m512i h = s >= 2 ? _mm512_srli_epi32(H[i], s - 2) : _mm512_slli_epi32(H[i], 2 - s); /* bit s of a byte at its bit 2 */
        L[i] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srl_epi32(L[i], at), three), h, four, 0xF8); /* a | (b & c) */
    }
}

/* q3_k's sub-block s's two scales (6-bit, less 32: -32..31) for 16 rows from two dwords of
 * their 12 scale bytes (lane i: row i's): scale g's low 4 bits are nibble g / 8 of byte g % 8,
 * its top 2 bits 2 (g / 4) of byte 8 + g % 4; for g = 2s, 2s + 1 that is bytes 2 (s & 1) and
 * 2 (s & 1) + 1 of dword (s & 3) / 2 (lo) and of dword 2 (hi). The pair, as int8, is moved to
 * the lane's top two bytes, as twq_k6_isum takes them (the "mw" of a q3_k block). */
TWQ_INLINE __m512 twq_k3_scales(__m512i lo, __m512i hi, int s) {
    const __m512i l4 = _mm512_and_si512(_mm512_srl_epi32(lo, _mm_cvtsi32_si128(4 * (s >> 2))), _mm512_set1_epi8(0x0F));
    const __m512i h2 = _mm512_and_si512(_mm512_srl_epi32(hi, _mm_cvtsi32_si128(2 * (s >> 1))), _mm512_set1_epi8(3));
    const __m512i v = _mm512_sub_epi8(_mm512_or_si512(l4, _mm512_slli_epi32(h2, 4)), _mm512_set1_epi8(32)); /* h2 << 4 stays in its byte */
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16 - 16 * (s & 1)));
}

/* q2_k's sub-block s of 16 rows: the 2-bit fields q_w (0..3), bits 2 (s & 3) of L's bytes (the
 * 32 bytes of half s / 4, twq_i8_decode's order), into L. */
TWQ_INLINE void twq_k2_bits(__m512i* L, int s) {
    const __m128i at = _mm_cvtsi32_si128(2 * (s & 3));
    for (int i = 0; i < 8; ++i) L[i] = _mm512_and_si512(_mm512_srl_epi32(L[i], at), _mm512_set1_epi8(3));
}

/* q2_k's "mw" of sub-block s for 16 rows: bits 0-15 of a lane the row's dmin (fp16 bits: dm's
 * low 16), bytes 2 and 3 its scale bytes 2s and 2s + 1 (each sc | mn << 4), found at bytes
 * 2 (s & 1) + 0, 1 of S (lane i: row i's dword (s / 2) of the 16 scale bytes); twq_k16_acc
 * takes them apart. */
TWQ_INLINE __m512 twq_k2_scales(__m512i S, __m512i dm, int s) {
    const __m512i pair = _mm512_slli_epi32(S, 16 - 16 * (s & 1));
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(pair, dm, _mm512_set1_epi32((int)0xFFFF0000u), 0xE4)); /* c ? a : b */
}

/* q3_k's 32-weight block j (sub-block j % 8 of super-block j / 8) of 16 plain rows: W as
 * twq_i8_decode gives a block (q_w + 4), dw the rows' d, mw their scales (twq_k3_scales). Every
 * load stays inside the 110-byte super-block (the scales read from byte 92, d from 94). */
TWQ_INLINE void twq_k3_decode(const uint8_t* const* rows, int64_t j, __m512i* W, __m512* dw, __m512* mw) {
    const int64_t o = (j >> 3) * 110;
    const int s = (int)(j & 7), half = s >> 2;
    __m512i H[8], S[4], T[4];
    twq_t16x4(rows, o + 32 + 32 * half, 4, W);
    twq_t16x4(rows, o + 48 + 32 * half, 4, W + 4);
    twq_t16x4(rows, o, 4, H);
    twq_t16x4(rows, o + 16, 4, H + 4);
    twq_k3_bits(W, H, s);
    twq_t16x4(rows, o + 92, 4, S); /* S[1..3]: scale bytes 0-3, 4-7, 8-11 */
    twq_t16x4(rows, o + 94, 4, T); /* T[3]: bytes 106-109, d in the top two */
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(T[3], 16)));
    *mw = twq_k3_scales(S[1 + ((s & 3) >> 1)], S[3], s);
}

/* q2_k's 32-weight block j of 16 plain rows: W (q_w), dw the rows' d, mw their dmin and scale
 * bytes (twq_k2_scales). Every load stays inside the 84-byte super-block (d, dmin read from 68). */
TWQ_INLINE void twq_k2_decode(const uint8_t* const* rows, int64_t j, __m512i* W, __m512* dw, __m512* mw) {
    const int64_t o = (j >> 3) * 84;
    const int s = (int)(j & 7), half = s >> 2;
    __m512i S[4], T[4];
    twq_t16x4(rows, o + 16 + 32 * half, 4, W);
    twq_t16x4(rows, o + 32 + 32 * half, 4, W + 4);
    twq_k2_bits(W, s);
    twq_t16x4(rows, o, (s >> 1) + 1, S);
    twq_t16x4(rows, o + 68, 4, T); /* T[3]: bytes 80-83, d and dmin */
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(T[3]));
    *mw = twq_k2_scales(S[s >> 1], _mm512_srli_epi32(T[3], 16), s);
}

/* Block j of 16 rows: W[t], lane i = row i's weights 4t..4t+3 of the block as bytes (unsigned:
 * nibbles (q5: with their fifth bits), q8_0 + 128, iq4's values + 128; signed q8_0 and iq4 values without VNNI), and the rows' d
 * (and q4_1's, q5_1's m). */
TWQ_INLINE void twq_i8_decode(int fmt, const uint8_t* const* rows, int64_t j, __m512i* W, __m512* dw, __m512* mw) {
    if (fmt == TWQ_IQ4_XS) {
        twq_iq4xs_decode(rows, j, W, dw);
        return;
    }
    if (twq_is_k45(fmt)) {
        twq_k4_decode(fmt, rows, j, W, dw, mw);
        return;
    }
    if (fmt == TWQ_Q6_K) {
        twq_k6_decode(rows, j, W, dw, mw);
        return;
    }
    if (fmt == TWQ_Q3_K) {
        twq_k3_decode(rows, j, W, dw, mw);
        return;
    }
    if (fmt == TWQ_Q2_K) {
        twq_k2_decode(rows, j, W, dw, mw);
        return;
    }
    const int64_t o = j * twq_nbytes[fmt];
    __m512i h;
    twq_t16x4(rows, o, 1, &h);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    if (twq_has_m(fmt)) *mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    if (fmt == TWQ_Q8_0) {
        twq_t16x4(rows, o + 2, 4, W);
        twq_t16x4(rows, o + 18, 4, W + 4);
#ifdef TWQ_VNNI
        for (int t = 0; t < 8; ++t) W[t] = _mm512_xor_si512(W[t], _mm512_set1_epi8((char)0x80));
#endif
        return;
    }
    const __m512i lo = _mm512_set1_epi8(0x0F);
    twq_t16x4(rows, o + twq_head(fmt) + (twq_is_q5(fmt) ? 4 : 0), 4, W);
    for (int t = 0; t < 4; ++t) {
        W[t + 4] = _mm512_and_si512(_mm512_srli_epi32(W[t], 4), lo);
        W[t] = _mm512_and_si512(W[t], lo);
    }
    if (twq_is_q5(fmt)) {
        __m512i qh;
        twq_t16x4(rows, o + twq_head(fmt), 1, &qh);
        twq_q5_high(qh, W);
    }
    if (fmt == TWQ_IQ4_NL) twq_iq4_lookup(W); /* q4_0's nibbles, looked up */
}

/* Block j of the interleaved group at grp (16 rows): W, dw, mw as twq_i8_decode gives them. */
TWQ_INLINE void twq_i8_decode_x16(int fmt, const uint8_t* grp, int64_t j, __m512i* W, __m512* dw, __m512* mw) {
    if (fmt == TWQ_IQ4_XS) { /* super-block j / 8: 16 d, 16 scales_h, then runs of 4 bytes: scales_l (run 0), sub-block s's nibbles (runs 1 + 4s .. 4 + 4s) */
        const uint8_t* k = grp + (j >> 3) * 16 * 136;
        const int s = (int)(j & 7);
        *dw = twq_iq4xs_dw(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)k)), _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(k + 32))),
                           _mm512_loadu_si512((const void*)(k + 64)), s);
        for (int t = 0; t < 4; ++t) W[t] = _mm512_loadu_si512((const void*)(k + 64 * (2 + 4 * s + t)));
        twq_split_nibbles(W);
        twq_iq4_lookup(W);
        return;
    }
    if (twq_is_k45(fmt)) { /* super-block j / 8: 16 d, 16 dmin, 3 vectors of scale bytes, (q5_k: 8 of qh,) 32 of nibble bytes (8 per pair of sub-blocks) */
        const uint8_t* k = grp + (j >> 3) * 16 * twq_nbytes[fmt];
        const int s = (int)(j & 7);
        const __m512i S[3] = {_mm512_loadu_si512((const void*)(k + 64)), _mm512_loadu_si512((const void*)(k + 128)), _mm512_loadu_si512((const void*)(k + 192))};
        twq_k4_factors_v(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)k)), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k + 32))), S, s, dw, mw);
        const uint8_t* qs = k + 64 + 16 * (twq_k45_qs(fmt) - 4);
        for (int t = 0; t < 8; ++t) W[t] = _mm512_loadu_si512((const void*)(qs + 64 * (8 * (s >> 1) + t)));
        twq_k4_nibbles(W, s);
        if (fmt == TWQ_Q5_K) {
            __m512i H[8];
            for (int t = 0; t < 8; ++t) H[t] = _mm512_loadu_si512((const void*)(k + 256 + 64 * t));
            twq_k5_high(H, s, W);
        }
        return;
    }
    if (fmt == TWQ_Q6_K) { /* super-block j / 8: 16 d, then runs of 4 bytes: low nibbles 0-31, high bits 32-47, scales 48-51 */
        const uint8_t* k = grp + (j >> 3) * 16 * 210 + 32;
        const int s = (int)(j & 7), half = s >> 2;
        __m512i H[8];
        for (int t = 0; t < 8; ++t) {
            W[t] = _mm512_loadu_si512((const void*)(k + 64 * (16 * half + 8 * (s & 1) + t)));
            H[t] = _mm512_loadu_si512((const void*)(k + 64 * (32 + 8 * half + t)));
        }
        twq_k6_bits(W, H, s);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k - 32)));
        *mw = twq_k6_scales(_mm512_loadu_si512((const void*)(k + 64 * (48 + (s >> 1)))), s);
        return;
    }
    if (fmt == TWQ_Q3_K) { /* super-block j / 8: 16 d, then runs of 4 bytes: hmask 0-7, 2-bit fields 8-23, scales 24-26 */
        const uint8_t* k = grp + (j >> 3) * 16 * 110 + 32;
        const int s = (int)(j & 7), half = s >> 2;
        __m512i H[8];
        for (int t = 0; t < 8; ++t) {
            W[t] = _mm512_loadu_si512((const void*)(k + 64 * (8 + 8 * half + t)));
            H[t] = _mm512_loadu_si512((const void*)(k + 64 * t));
        }
        twq_k3_bits(W, H, s);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k - 32)));
        *mw = twq_k3_scales(_mm512_loadu_si512((const void*)(k + 64 * (24 + ((s & 3) >> 1)))), _mm512_loadu_si512((const void*)(k + 64 * 26)), s);
        return;
    }
    if (fmt == TWQ_Q2_K) { /* super-block j / 8: 16 d, 16 dmin, then runs of 4 bytes: scales 0-3, 2-bit fields 4-19 */
        const uint8_t* k = grp + (j >> 3) * 16 * 84 + 64;
        const int s = (int)(j & 7), half = s >> 2;
        for (int t = 0; t < 8; ++t) W[t] = _mm512_loadu_si512((const void*)(k + 64 * (4 + 8 * half + t)));
        twq_k2_bits(W, s);
        *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k - 64)));
        *mw = twq_k2_scales(_mm512_loadu_si512((const void*)(k + 64 * (s >> 1))), _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(k - 32))), s);
        return;
    }
    const uint8_t* b = grp + j * 16 * twq_nbytes[fmt];
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
    b += 32;
    if (twq_has_m(fmt)) {
        *mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
        b += 32;
    }
    const __m512i qh = twq_is_q5(fmt) ? _mm512_loadu_si512((const void*)b) : _mm512_setzero_si512(); /* q5: the rows' qh, then the nibbles */
    if (twq_is_q5(fmt)) b += 64;
    if (fmt == TWQ_Q8_0) {
        for (int t = 0; t < 8; ++t) {
            W[t] = _mm512_loadu_si512((const void*)(b + 64 * t));
#ifdef TWQ_VNNI
            W[t] = _mm512_xor_si512(W[t], _mm512_set1_epi8((char)0x80));
#endif
        }
        return;
    }
    const __m512i lo = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 4; ++t) {
        const __m512i v = _mm512_loadu_si512((const void*)(b + 64 * t));
        W[t] = _mm512_and_si512(v, lo);
        W[t + 4] = _mm512_and_si512(_mm512_srli_epi32(v, 4), lo);
    }
    if (twq_is_q5(fmt)) twq_q5_high(qh, W);
    if (fmt == TWQ_IQ4_NL) twq_iq4_lookup(W); /* q4_0x16's nibbles, looked up */
}

/* s + the dot products of each lane's 4 weight bytes with x's 4 bytes (xb, broadcast). Without
 * VNNI vpmaddubsw's pair sums stay within int16: the unsigned weights are at most 63 (q6_k; q5's
 * 31, q3_k's 7, q2_k's 3), 2 * 63 * 127 = 16002; q8_0 below. */
TWQ_INLINE __m512i twq_dot(int fmt, __m512i s, __m512i w, __m512i xb) {
#ifdef TWQ_VNNI
    (void)fmt;
    return _mm512_dpbusd_epi32(s, w, xb);
#else
    if (twq_w_signed(fmt)) { /* |w| <= 128 and |x| <= 127 keep vpmaddubsw's pair sums in int16 */
        xb = _mm512_mask_sub_epi8(xb, _mm512_movepi8_mask(w), _mm512_setzero_si512(), xb);
        w = _mm512_abs_epi8(w);
    }
    return _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_maddubs_epi16(w, xb), _mm512_set1_epi16(1)));
#endif
}

TWQ_INLINE __m512i twq_i8_start(int fmt, const twq_xq* xq, int64_t at) {
    return twq_corr_mul(fmt) ? _mm512_set1_epi32(xq->corr[at]) : _mm512_setzero_si512();
}

/* The starts of a q6_k or q3_k block's two chains (its halves: weights 0-15 and 16-31), the -32
 * (-4) of q_w = (q_w + 32) - 32; q2_k's chains start at 0 (its q_w are the unsigned bytes). */
TWQ_INLINE __m512i twq_k16_start0(int fmt, const twq_xq* xq, int64_t at) {
    return fmt == TWQ_Q2_K ? _mm512_setzero_si512() : _mm512_set1_epi32(xq->corr16[at]);
}
TWQ_INLINE __m512i twq_k16_start1(int fmt, const twq_xq* xq, int64_t at) {
    return fmt == TWQ_Q2_K ? _mm512_setzero_si512() : _mm512_set1_epi32(xq->corr[at] - xq->corr16[at]);
}

/* The float update of a q6_k, q3_k or q2_k block (the file header's sequence) from its halves'
 * sums s and u and mw (twq_k6_scales, twq_k3_scales, twq_k2_scales): isum = sc0 * s + sc1 * u
 * in int32, acc = fma((float)isum, d_w * d_x, acc); for q2_k then msum = mn0 * S0 + mn1 * S1
 * (S0, S1: the halves' sums of q_x, |S| <= 16 * 127, and the mins 0..15 as int16 pairs: one
 * vpmaddwd, exact) and acc = fma((float)msum, -(dmin * d_x), acc). */
TWQ_INLINE __m512 twq_k16_acc(int fmt, __m512i s, __m512i u, __m512 dw, __m512 mw, const twq_xq* xq, int64_t at, __m512 acc) {
    const __m512 dx = _mm512_set1_ps(xq->d[at]);
    if (fmt != TWQ_Q2_K) return _mm512_fmadd_ps(_mm512_cvtepi32_ps(twq_k6_isum(s, u, mw)), _mm512_mul_ps(dw, dx), acc);
    const __m512i p = _mm512_castps_si512(mw), lo4 = _mm512_set1_epi32(15);
    const __m512i sc0 = _mm512_and_si512(_mm512_srli_epi32(p, 16), lo4), sc1 = _mm512_and_si512(_mm512_srli_epi32(p, 24), lo4);
    const __m512i mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(p, 20), lo4), _mm512_slli_epi32(_mm512_srli_epi32(p, 28), 16)); /* mn0, mn1 as int16 */
    const uint32_t s0 = (uint32_t)xq->corr16[at], s1 = (uint32_t)(xq->corr[at] - xq->corr16[at]);
    const __m512i msum = _mm512_madd_epi16(mn, _mm512_set1_epi32((int)((s0 & 0xFFFFu) | s1 << 16)));
    const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(s, sc0), _mm512_mullo_epi32(u, sc1));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc);
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p));
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), acc); /* fma(msum, -(dmin * d_x), acc): the same rounding */
}

/* The float update of one block (the sequence of the file header), shared by GEMV and GEMM. */
TWQ_INLINE __m512 twq_i8_acc(int fmt, __m512i isum, __m512 dw, __m512 mw, const twq_xq* xq, int64_t at, __m512 acc) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(xq->d[at])), acc);
    if (twq_i8_m(fmt)) acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(xq->cx[at]), acc);
    return acc;
}

/* Block j of rows r0 .. r0+MR of x against a decoded block of 16 W rows, into acc. Each row's
 * int32 sum is two chains of vpdpbusd (weight vectors 0-3 and 4-7), and the products run weight
 * vector by weight vector across the rows (t outer): 2 MR independent chains in flight, where
 * a loop over the rows kept one row's 8 in a row and its accumulator on the stack (measured at
 * 8 rows: 1.15-1.2x with the weights in cache). Integer sums are exact in any order: the same
 * int32, then the float update of twq_i8_acc: the same bits.
 * Where the time goes at 8 rows of x (the x16 GEMV, Zen 4): per block and row of x, 8 vpdpbusd
 * (64 products each: as few as 512 products allow), one vmulps (d_w * d_x) and one vfmadd
 * (q8_0) or two (q4_1: the m term): Zen 4 runs all of these on the same two FP pipes (a zmm
 * instruction one cycle of both), everything else elsewhere: measured in a loop, 12 vpdpbusd
 * take 12 cycles, with 4 vcvtdq2ps, vpaddd, vpandd, vpsrld, vpshufb, vpternlogd, vcvtph2ps
 * or 8 broadcast loads of x beside them 12-12.6, with 4 vmulps, vfmadd, vpmaddubsw, vpmaddwd
 * or vpermt2d 16. So a q4_1 block and row costs at least 11 cycles (q8_0 10), and q4_1x16 at
 * 8 rows with the weights in L2 ran 11.7 (960 x 576: 30 us a call at 3.58 GHz, 1.2 of them
 * quantizing x, 0.6 since twq_quant_blocks16): the nibbles' unpacking (already once per block
 * for all the rows of the pass), the two chains' vpaddd, the int32-to-float conversion and
 * the broadcasts are off those pipes, and the float update is the file header's exact
 * sequence, so more rows per pass, fewer shuffles or a cheaper conversion have nothing left
 * to gain; one chain of 8 per row from 5 rows on (no vpaddd, 8 registers fewer) measured
 * 0.89-0.96x at 8 rows (q8_0x16 0.91, the 960 x 576 q4_1x16 0.96). What 8 rows lost
 * against one was the weights' memory time on top of that (twq_x16_l2) and x's quantization
 * (twq_quant_blocks16). */
TWQ_INLINE void twq_i8_rows(int fmt, int MR, const twq_xq* xq, int64_t r0, int64_t j, const __m512i* W, __m512 dw, __m512 mw, __m512* acc) {
    const int64_t nb = xq->nb;
    const int8_t* q = xq->q + r0 * xq->K + 32 * j;
    __m512i s[TWQ_MR], u[TWQ_MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
        s[r] = twq_is_k16(fmt) ? twq_k16_start0(fmt, xq, (r0 + r) * nb + j) : twq_i8_start(fmt, xq, (r0 + r) * nb + j);
        u[r] = twq_is_k16(fmt) ? twq_k16_start1(fmt, xq, (r0 + r) * nb + j) : _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int t = 0; t < 4; ++t)
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            s[r] = twq_dot(fmt, s[r], W[t], _mm512_set1_epi32(twq_i32(q + r * xq->K + 4 * t)));
            u[r] = twq_dot(fmt, u[r], W[t + 4], _mm512_set1_epi32(twq_i32(q + r * xq->K + 4 * t + 16)));
        }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
        const int64_t at = (r0 + r) * nb + j;
        acc[r] = twq_is_k16(fmt) ? twq_k16_acc(fmt, s[r], u[r], dw, mw, xq, at, acc[r]) : twq_i8_acc(fmt, _mm512_add_epi32(s[r], u[r]), dw, mw, xq, at, acc[r]);
    }
}

/* Rows of x r0 .. r0+MR against W rows n0 .. n0+nr (nr <= 16). */
TWQ_INLINE void twq_i8_gemv_tile(int fmt, int MR, const twq_xq* xq, int64_t r0, const uint8_t* w, int64_t rb, int64_t n0,
                                 int64_t nr, float* y, int64_t N) {
    const int64_t nb = xq->nb;
    const uint8_t* rows[16];
    for (int i = 0; i < 16; ++i) rows[i] = w + (n0 + (i < nr ? i : nr - 1)) * rb;
    __m512 acc[TWQ_MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
    /* software prefetch of the tile TWQ_IAHEAD on, spread over the blocks (see twq_gemv_tile) */
    const char* ahead = (const char*)(w + (n0 + 16 * TWQ_IAHEAD) * rb);
    const int64_t step = (16 * rb + nb - 1) / nb;
    for (int64_t j = 0; j < nb; ++j) {
        for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
        __m512i W[8];
        __m512 dw, mw = _mm512_setzero_ps();
        twq_i8_decode(fmt, rows, j, W, &dw, &mw);
        twq_i8_rows(fmt, MR, xq, r0, j, W, dw, mw, acc);
    }
    const __mmask16 mk = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * N + n0, mk, acc[r]);
}

/* q6_kx16's GEMV at up to TWQ_K6_MR rows of x: a half super-block (blocks j0 .. j0+3,
 * sub-blocks 4h .. 4h+3 of its 16 rows) at a time. Sub-blocks 4h + p and 4h + 2 + p (p = 0, 1)
 * share their 8 vectors L of low-nibble bytes (the low and the high nibbles) and all four the 8
 * vectors H of high-bit bytes, so a half loads 24 vectors where block by block took 64 (with
 * the scales' and d's), and the bit pairs are masked once per pair: Hp = (H >> 2p) & 0x33 holds
 * pair p at bits 0-1 and pair 2 + p at bits 4-5, bits 2-3 and 6-7 clear, so each weight vector
 * (q + 32, twq_k6_bits' bytes) takes one shift and one vpternlogd (the nibble where 0x0F, the
 * pair above it: (L & 0x0F) | (Hp << 4 & 0xF0), (L >> 4 & 0x0F) | (Hp & 0xF0)) where it took
 * three or four. At one or two rows of x a pair's two sub-blocks run in one pass over L (4 MR
 * chains), beyond that one after the other. Without VNNI, vpmaddubsw's int16 pair sums of two
 * weight vectors are added before one vpmaddwd (at most 2 * 2 * 63 * 127 = 32004). The int32
 * sums are those of twq_k6_bits + twq_i8_rows (exact in any order), and the float updates run
 * block by block in order as twq_k16_acc's: the same bits. The next tile is prefetched into L2
 * (as twq_x16_l2), not L1: measured on the Zen 4 machine with the 49152 x 2048 head in DRAM at one
 * row of x, 2.9 ms against 7-9 ms with _MM_HINT_T0 (the half's 27 lines of the next tile
 * arriving as its own 27 are read, 54 KiB of tiles in a 32 KiB L1), where the block-by-block
 * kernel took 4.8-6 ms; with the weights in L3 (2048 x 5632) 0.19 ms against 0.31. Beyond
 * TWQ_K6_MR rows the block-by-block kernel (twq_i8_gemv_tile_x16), also prefetching into L2,
 * is faster with VNNI (at 8 rows 0.78 ms against 0.87 in L3), slower without. */
#ifndef TWQ_K6_MR
#ifdef TWQ_VNNI
#define TWQ_K6_MR 5
#else
#define TWQ_K6_MR 8
#endif
#endif

/* The dot products of one pass over a pair's 8 vectors L (lo: the low nibbles', hi: the high
 * nibbles' sub-block, chains sl, ul and sh, uh: each block's halves, the high one's x 64 bytes
 * on), prefetching lines pf .. pf + 64 (lines - 1) of the next tile on the way. */
TWQ_INLINE void twq_k6_dots(int MR, int lo, int hi, const __m512i* Hp, const uint8_t* L, const int8_t* q, int64_t K,
                            __m512i* sl, __m512i* ul, __m512i* sh, __m512i* uh, const char* pf, int lines) {
    const __m512i m0f = _mm512_set1_epi8(0x0F);
#ifndef TWQ_VNNI
    __m512i pl[TWQ_MR], ph[TWQ_MR]; /* the int16 pair sums of an even t */
#endif
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
        if (2 * t < lines) _mm_prefetch(pf + 128 * t, _MM_HINT_T1);
        if (2 * t + 1 < lines) _mm_prefetch(pf + 128 * t + 64, _MM_HINT_T1);
        const __m512i l = _mm512_loadu_si512((const void*)(L + 64 * t));
        const __m512i wl = lo ? _mm512_ternarylogic_epi32(l, _mm512_slli_epi32(Hp[t], 4), m0f, 0xE4) : l; /* c ? a : b */
        const __m512i wh = hi ? _mm512_ternarylogic_epi32(_mm512_srli_epi32(l, 4), Hp[t], m0f, 0xE4) : l;
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512i xb = _mm512_set1_epi32(twq_i32(q + r * K + 4 * t)); /* weights 4t..4t+3 of both blocks' 32 */
            const __m512i xh = hi ? _mm512_set1_epi32(twq_i32(q + r * K + 64 + 4 * t)) : xb; /* block j + 2 */
#ifdef TWQ_VNNI
            if (lo) {
                if (t < 4) sl[r] = _mm512_dpbusd_epi32(sl[r], wl, xb);
                else ul[r] = _mm512_dpbusd_epi32(ul[r], wl, xb);
            }
            if (hi) {
                if (t < 4) sh[r] = _mm512_dpbusd_epi32(sh[r], wh, xh);
                else uh[r] = _mm512_dpbusd_epi32(uh[r], wh, xh);
            }
#else /* vpmaddubsw's pair sums of vectors t and t + 1 (both halves' even t) added in int16: at most 2 * 2 * 63 * 127 = 32004 */
            const __m512i one = _mm512_set1_epi16(1);
            if (lo) {
                const __m512i pr = _mm512_maddubs_epi16(wl, xb);
                if ((t & 1) == 0) pl[r] = pr;
                else if (t < 4) sl[r] = _mm512_add_epi32(sl[r], _mm512_madd_epi16(_mm512_add_epi16(pl[r], pr), one));
                else ul[r] = _mm512_add_epi32(ul[r], _mm512_madd_epi16(_mm512_add_epi16(pl[r], pr), one));
            }
            if (hi) {
                const __m512i pr = _mm512_maddubs_epi16(wh, xh);
                if ((t & 1) == 0) ph[r] = pr;
                else if (t < 4) sh[r] = _mm512_add_epi32(sh[r], _mm512_madd_epi16(_mm512_add_epi16(ph[r], pr), one));
                else uh[r] = _mm512_add_epi32(uh[r], _mm512_madd_epi16(_mm512_add_epi16(ph[r], pr), one));
            }
#endif
        }
    }
}

/* sc0 * s + sc1 * u (twq_k6_isum) with the scales bytes 2p, 2p + 1 of S's lanes. */
TWQ_INLINE __m512i twq_k6_isum_at(__m512i s, __m512i u, __m512i S, int p) {
    const __m512i sc0 = _mm512_srai_epi32(_mm512_slli_epi32(S, 24 - 16 * p), 24), sc1 = _mm512_srai_epi32(_mm512_slli_epi32(S, 16 - 16 * p), 24);
    return _mm512_add_epi32(_mm512_mullo_epi32(s, sc0), _mm512_mullo_epi32(u, sc1));
}

TWQ_INLINE void twq_k6_gemv_tile_x16(int MR, const twq_xq* xq, int64_t r0, const uint8_t* grp, int64_t rb, float* y, int64_t N, int64_t n0) {
    const int64_t nb = xq->nb, K = xq->K;
    const int joint = MR <= 2; /* a pair's two sub-blocks in one pass (4 MR chains) */
    __m512 acc[TWQ_MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
    const char* ahead = (const char*)(grp + 16 * TWQ_IAHEAD * rb);
    const __m512i m33 = _mm512_set1_epi8(0x33);
    for (int64_t j0 = 0; j0 < nb; j0 += 4) {
        const uint8_t* k = grp + (j0 >> 3) * 16 * 210 + 32;
        const int h = (int)((j0 >> 2) & 1);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k - 32)));
        const __m512i S0 = _mm512_loadu_si512((const void*)(k + 64 * (48 + 2 * h))), S1 = _mm512_loadu_si512((const void*)(k + 64 * (49 + 2 * h)));
        __m512i is[4][TWQ_MR];
#pragma GCC unroll 2
        for (int p = 0; p < 2; ++p) {
            __m512i Hp[8];
            for (int t = 0; t < 8; ++t) {
                const __m512i v = _mm512_loadu_si512((const void*)(k + 64 * (32 + 8 * h + t)));
                Hp[t] = _mm512_and_si512(p ? _mm512_srli_epi32(v, 2) : v, m33);
            }
            const uint8_t* L = k + 64 * (16 * h + 8 * p);
            const int8_t* q = xq->q + r0 * K + 32 * (j0 + p);
            __m512i sl[TWQ_MR], ul[TWQ_MR], sh[TWQ_MR], uh[TWQ_MR];
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                const int64_t a0 = (r0 + r) * nb + j0 + p, a2 = a0 + 2;
                sl[r] = _mm512_set1_epi32(xq->corr16[a0]);
                ul[r] = _mm512_set1_epi32(xq->corr[a0] - xq->corr16[a0]);
                sh[r] = _mm512_set1_epi32(xq->corr16[a2]);
                uh[r] = _mm512_set1_epi32(xq->corr[a2] - xq->corr16[a2]);
            }
            /* the same half of the tile TWQ_IAHEAD on prefetched over the passes: its 1680 bytes in 27 lines */
            const char* pf = ahead + j0 * 420 + 1024 * p;
            if (joint) {
                twq_k6_dots(MR, 1, 1, Hp, L, q, K, sl, ul, sh, uh, pf, p ? 11 : 16);
            } else {
                twq_k6_dots(MR, 1, 0, Hp, L, q, K, sl, ul, sh, uh, pf, 8);
                twq_k6_dots(MR, 0, 1, Hp, L, q, K, sl, ul, sh, uh, pf + 512, p ? 3 : 8);
            }
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                is[p][r] = twq_k6_isum_at(sl[r], ul[r], S0, p);
                is[2 + p][r] = twq_k6_isum_at(sh[r], uh[r], S1, p);
            }
        }
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b)
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[b][r]), _mm512_mul_ps(dw, _mm512_set1_ps(xq->d[(r0 + r) * nb + j0 + b])), acc[r]);
    }
    for (int r = 0; r < MR; ++r) _mm512_storeu_ps(y + (r0 + r) * N + n0, acc[r]);
}

/* Whether the x16 GEMV at MR rows of x prefetches the next tile into L2 (_MM_HINT_T1) rather
 * than L1: the k-quants and iq4 always, the others from two rows of x on. Measured on the Zen 4
 * machine (1 thread, old and new in one process in rounds, min), one row of x, the 49152 x 2048
 * head from DRAM: q4_kx16 2.61 -> 1.87 ms, q5_kx16 5.69 -> 4.41, q3_kx16 3.04 -> 2.70, iq4_nlx16
 * 2.19 -> 1.79, iq4_xsx16 2.08 -> 1.62, q2_kx16 1.92 either way; at eight rows 1.0-1.1x;
 * 2048 x 5632 (in L3) 1.0-1.15x. q8_0x16 and q4_1x16 read 0.95x as fast at one row (49152 x
 * 2048, 49152 x 576), so one row keeps L1. From two rows of x on they too are faster with L2
 * (TWQ_X16_L2_MR), measured on SmolLM2's shapes with the weights cold (cycling copies over 96
 * MiB; 1 thread, old and new in one process in rounds, min; Zen 4): on 4 KiB pages, as the LLM
 * keeps q's interleaved blocks, q4_1x16 at 2 rows 1.13-1.28x, 3-4 rows 1.0-1.33x, 8 rows
 * 1.08-1.19x (960 x 576 39.5 -> 36.7 us, 3072 x 576 117.5 -> 107.4, 576 x 1536 65.9 -> 55.2),
 * the 49152 x 576 q8_0x16 head at 3-8 rows 1.12-1.32x (8 rows 2052 -> 1558 us), at 2 rows
 * 0.84-1.04x; q4_0x16, q5_0x16 and q5_1x16 at 2-8 rows 0.99-1.5x. On 2 MiB pages (the head
 * is: NumPy advises huge pages from 4 MiB on) the L1 prefetch does better at two rows
 * (q4_1x16 0.90-0.98x with L2, the head 0.94x) and mostly at three (0.94-0.97x at K = 576,
 * 1.31x at 576 x 1536, the head 1.15x); at four 0.97-1.66x, at eight 1.06-1.26x. A single
 * T0 prefetch a block or two ahead in the tile on top of this, or the first tile of each
 * thread's share prefetched whole, measured no faster; two tiles ahead (TWQ_IAHEAD 2) the same. */
#ifndef TWQ_X16_L2_MR
#define TWQ_X16_L2_MR 2
#endif
static inline int twq_x16_l2(int fmt, int MR) { return twq_is_k(fmt) || twq_is_iq4(fmt) || MR >= TWQ_X16_L2_MR; }

/* Rows of x r0 .. r0+MR against the interleaved group of W rows n0 .. n0+16 (n0 % 16 == 0). */
TWQ_INLINE void twq_i8_gemv_tile_x16(int fmt, int MR, const twq_xq* xq, int64_t r0, const uint8_t* w, int64_t rb, int64_t n0,
                                     int64_t nr, float* y, int64_t N) {
    (void)nr;
    const int64_t nb = xq->nb, bb = 16 * rb / nb; /* a block's bytes in the group */
    const uint8_t* grp = w + n0 * rb;
    if (fmt == TWQ_Q6_K && MR <= TWQ_K6_MR) {
        twq_k6_gemv_tile_x16(MR, xq, r0, grp, rb, y, N, n0);
        return;
    }
    __m512 acc[TWQ_MR];
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
    const char* ahead = (const char*)(grp + 16 * TWQ_IAHEAD * rb);
    for (int64_t j = 0; j < nb; ++j) {
        for (int64_t o = 0; o < bb; o += 64) {
            if (twq_x16_l2(fmt, MR)) _mm_prefetch(ahead + j * bb + o, _MM_HINT_T1);
            else _mm_prefetch(ahead + j * bb + o, _MM_HINT_T0);
        }
        __m512i W[8];
        __m512 dw, mw = _mm512_setzero_ps();
        twq_i8_decode_x16(fmt, grp, j, W, &dw, &mw);
        twq_i8_rows(fmt, MR, xq, r0, j, W, dw, mw, acc);
    }
    for (int r = 0; r < MR; ++r) _mm512_storeu_ps(y + (r0 + r) * N + n0, acc[r]);
}

#define TWQ_I8_GEMV_FN(FMT, MR) \
    static void twq_i8_gemv_##FMT##_##MR(const twq_xq* xq, int64_t r0, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, float* y, int64_t N) { \
        twq_i8_gemv_tile(FMT, MR, xq, r0, w, rb, n0, nr, y, N); \
    } \
    static void twq_i8_gemv_x16_##FMT##_##MR(const twq_xq* xq, int64_t r0, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, float* y, int64_t N) { \
        twq_i8_gemv_tile_x16(FMT, MR, xq, r0, w, rb, n0, nr, y, N); \
    }
#define TWQ_I8_GEMV_FMT(FMT) \
    TWQ_I8_GEMV_FN(FMT, 1) TWQ_I8_GEMV_FN(FMT, 2) TWQ_I8_GEMV_FN(FMT, 3) TWQ_I8_GEMV_FN(FMT, 4) \
    TWQ_I8_GEMV_FN(FMT, 5) TWQ_I8_GEMV_FN(FMT, 6) TWQ_I8_GEMV_FN(FMT, 7) TWQ_I8_GEMV_FN(FMT, 8)
TWQ_IF(Q4_0, TWQ_I8_GEMV_FMT(TWQ_Q4_0))
TWQ_IF(Q4_1, TWQ_I8_GEMV_FMT(TWQ_Q4_1))
TWQ_IF(Q5_0, TWQ_I8_GEMV_FMT(TWQ_Q5_0))
TWQ_IF(Q5_1, TWQ_I8_GEMV_FMT(TWQ_Q5_1))
TWQ_IF(Q8_0, TWQ_I8_GEMV_FMT(TWQ_Q8_0))
TWQ_IF(Q4_K, TWQ_I8_GEMV_FMT(TWQ_Q4_K))
TWQ_IF(Q5_K, TWQ_I8_GEMV_FMT(TWQ_Q5_K))
TWQ_IF(Q6_K, TWQ_I8_GEMV_FMT(TWQ_Q6_K))
TWQ_IF(Q3_K, TWQ_I8_GEMV_FMT(TWQ_Q3_K))
TWQ_IF(Q2_K, TWQ_I8_GEMV_FMT(TWQ_Q2_K))
TWQ_IF(IQ4_NL, TWQ_I8_GEMV_FMT(TWQ_IQ4_NL))
TWQ_IF(IQ4_XS, TWQ_I8_GEMV_FMT(TWQ_IQ4_XS))
typedef void (*twq_i8_gemv_fn)(const twq_xq*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, float*, int64_t);
#define TWQ_I8_GEMV_ROW(P, FMT) \
    {P##FMT##_1, P##FMT##_2, P##FMT##_3, P##FMT##_4, P##FMT##_5, P##FMT##_6, P##FMT##_7, P##FMT##_8}
/* [x16][twq_i8_slot(fmt)][M - 1] */
static const twq_i8_gemv_fn twq_i8_gemv_table[2][TWQ_I8_SLOTS][8] = { /* by slot (twq_i8_slot); a path left out: no entries */
    {TWQ_IF(Q4_0, [0] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q4_0),) TWQ_IF(Q4_1, [1] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q4_1),)
     TWQ_IF(Q5_0, [2] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q5_0),) TWQ_IF(Q5_1, [3] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q5_1),)
     TWQ_IF(Q8_0, [4] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q8_0),) TWQ_IF(Q4_K, [5] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q4_K),)
     TWQ_IF(Q5_K, [6] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q5_K),) TWQ_IF(Q6_K, [7] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q6_K),)
     TWQ_IF(Q3_K, [8] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q3_K),) TWQ_IF(Q2_K, [9] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_Q2_K),)
     TWQ_IF(IQ4_NL, [10] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_IQ4_NL),) TWQ_IF(IQ4_XS, [11] = TWQ_I8_GEMV_ROW(twq_i8_gemv_, TWQ_IQ4_XS),)},
    {TWQ_IF(Q4_0, [0] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q4_0),) TWQ_IF(Q4_1, [1] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q4_1),)
     TWQ_IF(Q5_0, [2] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q5_0),) TWQ_IF(Q5_1, [3] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q5_1),)
     TWQ_IF(Q8_0, [4] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q8_0),) TWQ_IF(Q4_K, [5] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q4_K),)
     TWQ_IF(Q5_K, [6] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q5_K),) TWQ_IF(Q6_K, [7] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q6_K),)
     TWQ_IF(Q3_K, [8] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q3_K),) TWQ_IF(Q2_K, [9] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_Q2_K),)
     TWQ_IF(IQ4_NL, [10] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_IQ4_NL),) TWQ_IF(IQ4_XS, [11] = TWQ_I8_GEMV_ROW(twq_i8_gemv_x16_, TWQ_IQ4_XS),)}};

/* x's rows quantized, then tiles of 16 W rows over the threads, each adding the residual r (or
 * NULL) into its outputs as it finishes them. (Quantizing inside the parallel region, the rows
 * shared by the threads, measured 0.97-1.02x at M = 8 and 1.02-1.1x slower at M = 1: the barrier
 * after it costs what the serial prologue did.) Beyond TWQ_I8_GEMV_MAX_M rows (up to
 * TWQ_I8_GEMV_UPTO) a tile runs the rows in passes of as many rows each (at most
 * TWQ_I8_GEMV_MAX_M): the tile's weights come from memory once, the later passes read them from
 * L1 (each decodes them again). */
static void twq_i8_gemv(int fmt, int x16, const float* x, const twq_xq* xq, const uint8_t* w, const float* r, float* y, int64_t M, int64_t N, int64_t rb) {
    const int64_t tiles = (N + 15) / 16;
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    const int64_t passes = (M + TWQ_I8_GEMV_MAX_M - 1) / TWQ_I8_GEMV_MAX_M, mp = (M + passes - 1) / passes;
    const twq_i8_gemv_fn* fns = twq_i8_gemv_table[x16][twq_i8_slot(fmt)];
    (void)par; /* used by OpenMP only */
    twq_quantize(fmt, x, xq, 0, M);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t g = 0; g < tiles; ++g) {
        const int64_t n0 = 16 * g, nr = N - n0 < 16 ? N - n0 : 16;
        for (int64_t m0 = 0; m0 < M; m0 += mp) fns[(M - m0 < mp ? M - m0 : mp) - 1](xq, m0, w, rb, n0, nr, y, N);
        for (int64_t m = 0; r != NULL && m < M; ++m) twq_add(r + m * N + n0, y + m * N + n0, nr);
    }
}

/* Decode rows [n0, n0 + nr) (nr <= 32; past them the last row again) into a panel: per block,
 * W[t] of rows 0..15 and 16..31 (t = 0..7), then their d, then their m (q6_k, q3_k, q2_k: their "mw",
 * twq_k6_scales & co.) (TWQ_IBLK bytes). */
TWQ_INLINE void twq_i8_pack(int fmt, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t nb, uint8_t* p) {
    for (int v = 0; v < 2; ++v) {
        const uint8_t* rows[16];
        for (int i = 0; i < 16; ++i) rows[i] = w + (n0 + (16 * v + i < nr ? 16 * v + i : nr - 1)) * rb;
        for (int64_t j = 0; j < nb; ++j) {
            __m512i W[8];
            __m512 dw, mw = _mm512_setzero_ps();
            uint8_t* pj = p + j * TWQ_IBLK;
            twq_i8_decode(fmt, rows, j, W, &dw, &mw);
            for (int t = 0; t < 8; ++t) _mm512_store_si512((__m512i*)(pj + (2 * t + v) * 64), W[t]);
            _mm512_store_ps((float*)(pj + 1024 + 64 * v), dw);
            _mm512_store_ps((float*)(pj + 1152 + 64 * v), mw);
        }
    }
}

/* twq_i8_pack from the interleaved layout (n0 % 16 == 0; a missing second group repeats the first). */
TWQ_INLINE void twq_i8_pack_x16(int fmt, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t nb, uint8_t* p) {
    for (int v = 0; v < 2; ++v) {
        const uint8_t* grp = w + (n0 + (16 * v < nr ? 16 * v : 0)) * rb;
        for (int64_t j = 0; j < nb; ++j) {
            __m512i W[8];
            __m512 dw, mw = _mm512_setzero_ps();
            uint8_t* pj = p + j * TWQ_IBLK;
            twq_i8_decode_x16(fmt, grp, j, W, &dw, &mw);
            for (int t = 0; t < 8; ++t) _mm512_store_si512((__m512i*)(pj + (2 * t + v) * 64), W[t]);
            _mm512_store_ps((float*)(pj + 1024 + 64 * v), dw);
            _mm512_store_ps((float*)(pj + 1152 + 64 * v), mw);
        }
    }
}

/* Rows r0 .. r0+MR of x against a packed panel of 32 W rows (n0 ..; mk0/mk1 mask the valid ones). */
TWQ_INLINE void twq_i8_micro(int fmt, int MR, const twq_xq* xq, int64_t r0, const uint8_t* p, float* y, int64_t N, int64_t n0,
                             __mmask16 mk0, __mmask16 mk1) {
    const int64_t nb = xq->nb;
    __m512 acc[TWQ_IPM][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
        const uint8_t* pj = p + j * TWQ_IBLK;
        __m512i s[TWQ_IPM][2], h[TWQ_IPM][2]; /* q6_k, q3_k, q2_k: h the first halves' sums */
        for (int r = 0; r < MR; ++r) s[r][0] = s[r][1] = twq_is_k16(fmt) ? twq_k16_start0(fmt, xq, (r0 + r) * nb + j) : twq_i8_start(fmt, xq, (r0 + r) * nb + j);
        for (int t = 0; t < 8; ++t) {
            if (twq_is_k16(fmt) && t == 4)
                for (int r = 0; r < MR; ++r) {
                    h[r][0] = s[r][0];
                    h[r][1] = s[r][1];
                    s[r][0] = s[r][1] = twq_k16_start1(fmt, xq, (r0 + r) * nb + j);
                }
            const __m512i w0 = _mm512_load_si512((const __m512i*)(pj + 128 * t)), w1 = _mm512_load_si512((const __m512i*)(pj + 128 * t + 64));
            for (int r = 0; r < MR; ++r) {
                const __m512i xb = _mm512_set1_epi32(twq_i32(xq->q + (r0 + r) * xq->K + 32 * j + 4 * t));
                s[r][0] = twq_dot(fmt, s[r][0], w0, xb);
                s[r][1] = twq_dot(fmt, s[r][1], w1, xb);
            }
        }
        const float* f = (const float*)(pj + 1024);
        const __m512 d0 = _mm512_load_ps(f), d1 = _mm512_load_ps(f + 16), m0 = _mm512_load_ps(f + 32), m1 = _mm512_load_ps(f + 48);
        for (int r = 0; r < MR; ++r) {
            const int64_t at = (r0 + r) * nb + j;
            if (twq_is_k16(fmt)) {
                acc[r][0] = twq_k16_acc(fmt, h[r][0], s[r][0], d0, m0, xq, at, acc[r][0]);
                acc[r][1] = twq_k16_acc(fmt, h[r][1], s[r][1], d1, m1, xq, at, acc[r][1]);
            } else {
                acc[r][0] = twq_i8_acc(fmt, s[r][0], d0, m0, xq, at, acc[r][0]);
                acc[r][1] = twq_i8_acc(fmt, s[r][1], d1, m1, xq, at, acc[r][1]);
            }
        }
    }
    for (int r = 0; r < MR; ++r) {
        _mm512_mask_storeu_ps(y + (r0 + r) * N + n0, mk0, acc[r][0]);
        _mm512_mask_storeu_ps(y + (r0 + r) * N + n0 + 16, mk1, acc[r][1]);
    }
}

#define TWQ_I8_MICRO_FN(FMT, MR) \
    static void twq_i8_micro_##FMT##_##MR(const twq_xq* xq, int64_t r0, const uint8_t* p, float* y, int64_t N, int64_t n0, __mmask16 m0, __mmask16 m1) { \
        twq_i8_micro(FMT, MR, xq, r0, p, y, N, n0, m0, m1); \
    }
#define TWQ_I8_MICRO_FMT(FMT) TWQ_I8_MICRO_FN(FMT, 1) TWQ_I8_MICRO_FN(FMT, 2) TWQ_I8_MICRO_FN(FMT, 3) TWQ_I8_MICRO_FN(FMT, 4)
TWQ_IF(Q4_0, TWQ_I8_MICRO_FMT(TWQ_Q4_0))
TWQ_IF(Q4_1, TWQ_I8_MICRO_FMT(TWQ_Q4_1))
TWQ_IF(Q5_0, TWQ_I8_MICRO_FMT(TWQ_Q5_0))
TWQ_IF(Q5_1, TWQ_I8_MICRO_FMT(TWQ_Q5_1))
TWQ_IF(Q8_0, TWQ_I8_MICRO_FMT(TWQ_Q8_0))
TWQ_IF(Q4_K, TWQ_I8_MICRO_FMT(TWQ_Q4_K))
TWQ_IF(Q5_K, TWQ_I8_MICRO_FMT(TWQ_Q5_K))
TWQ_IF(Q6_K, TWQ_I8_MICRO_FMT(TWQ_Q6_K))
TWQ_IF(Q3_K, TWQ_I8_MICRO_FMT(TWQ_Q3_K))
TWQ_IF(Q2_K, TWQ_I8_MICRO_FMT(TWQ_Q2_K))
TWQ_IF(IQ4_NL, TWQ_I8_MICRO_FMT(TWQ_IQ4_NL))
TWQ_IF(IQ4_XS, TWQ_I8_MICRO_FMT(TWQ_IQ4_XS))
typedef void (*twq_i8_micro_fn)(const twq_xq*, int64_t, const uint8_t*, float*, int64_t, int64_t, __mmask16, __mmask16);
#define TWQ_I8_MICRO_ROW(FMT) {twq_i8_micro_##FMT##_1, twq_i8_micro_##FMT##_2, twq_i8_micro_##FMT##_3, twq_i8_micro_##FMT##_4}
static const twq_i8_micro_fn twq_i8_micro_table[TWQ_I8_SLOTS][TWQ_IPM] = {
    TWQ_IF(Q4_0, [0] = TWQ_I8_MICRO_ROW(TWQ_Q4_0),) TWQ_IF(Q4_1, [1] = TWQ_I8_MICRO_ROW(TWQ_Q4_1),)
    TWQ_IF(Q5_0, [2] = TWQ_I8_MICRO_ROW(TWQ_Q5_0),) TWQ_IF(Q5_1, [3] = TWQ_I8_MICRO_ROW(TWQ_Q5_1),)
    TWQ_IF(Q8_0, [4] = TWQ_I8_MICRO_ROW(TWQ_Q8_0),) TWQ_IF(Q4_K, [5] = TWQ_I8_MICRO_ROW(TWQ_Q4_K),)
    TWQ_IF(Q5_K, [6] = TWQ_I8_MICRO_ROW(TWQ_Q5_K),) TWQ_IF(Q6_K, [7] = TWQ_I8_MICRO_ROW(TWQ_Q6_K),)
    TWQ_IF(Q3_K, [8] = TWQ_I8_MICRO_ROW(TWQ_Q3_K),) TWQ_IF(Q2_K, [9] = TWQ_I8_MICRO_ROW(TWQ_Q2_K),)
    TWQ_IF(IQ4_NL, [10] = TWQ_I8_MICRO_ROW(TWQ_IQ4_NL),) TWQ_IF(IQ4_XS, [11] = TWQ_I8_MICRO_ROW(TWQ_IQ4_XS),)};

#define TWQ_I8_PACK_FN(FMT) \
    static void twq_i8_pack_##FMT(const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t nb, uint8_t* p) { twq_i8_pack(FMT, w, rb, n0, nr, nb, p); } \
    static void twq_i8_pack_x16_##FMT(const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t nb, uint8_t* p) { twq_i8_pack_x16(FMT, w, rb, n0, nr, nb, p); }
TWQ_IF(Q4_0, TWQ_I8_PACK_FN(TWQ_Q4_0))
TWQ_IF(Q4_1, TWQ_I8_PACK_FN(TWQ_Q4_1))
TWQ_IF(Q5_0, TWQ_I8_PACK_FN(TWQ_Q5_0))
TWQ_IF(Q5_1, TWQ_I8_PACK_FN(TWQ_Q5_1))
TWQ_IF(Q8_0, TWQ_I8_PACK_FN(TWQ_Q8_0))
TWQ_IF(Q4_K, TWQ_I8_PACK_FN(TWQ_Q4_K))
TWQ_IF(Q5_K, TWQ_I8_PACK_FN(TWQ_Q5_K))
TWQ_IF(Q6_K, TWQ_I8_PACK_FN(TWQ_Q6_K))
TWQ_IF(Q3_K, TWQ_I8_PACK_FN(TWQ_Q3_K))
TWQ_IF(Q2_K, TWQ_I8_PACK_FN(TWQ_Q2_K))
TWQ_IF(IQ4_NL, TWQ_I8_PACK_FN(TWQ_IQ4_NL))
TWQ_IF(IQ4_XS, TWQ_I8_PACK_FN(TWQ_IQ4_XS))
typedef void (*twq_i8_pack_fn)(const uint8_t*, int64_t, int64_t, int64_t, int64_t, uint8_t*);
static const twq_i8_pack_fn twq_i8_pack_table[2][TWQ_I8_SLOTS] = {
    {TWQ_IF(Q4_0, [0] = twq_i8_pack_TWQ_Q4_0,) TWQ_IF(Q4_1, [1] = twq_i8_pack_TWQ_Q4_1,)
     TWQ_IF(Q5_0, [2] = twq_i8_pack_TWQ_Q5_0,) TWQ_IF(Q5_1, [3] = twq_i8_pack_TWQ_Q5_1,)
     TWQ_IF(Q8_0, [4] = twq_i8_pack_TWQ_Q8_0,) TWQ_IF(Q4_K, [5] = twq_i8_pack_TWQ_Q4_K,)
     TWQ_IF(Q5_K, [6] = twq_i8_pack_TWQ_Q5_K,) TWQ_IF(Q6_K, [7] = twq_i8_pack_TWQ_Q6_K,)
     TWQ_IF(Q3_K, [8] = twq_i8_pack_TWQ_Q3_K,) TWQ_IF(Q2_K, [9] = twq_i8_pack_TWQ_Q2_K,)
     TWQ_IF(IQ4_NL, [10] = twq_i8_pack_TWQ_IQ4_NL,) TWQ_IF(IQ4_XS, [11] = twq_i8_pack_TWQ_IQ4_XS,)},
    {TWQ_IF(Q4_0, [0] = twq_i8_pack_x16_TWQ_Q4_0,) TWQ_IF(Q4_1, [1] = twq_i8_pack_x16_TWQ_Q4_1,)
     TWQ_IF(Q5_0, [2] = twq_i8_pack_x16_TWQ_Q5_0,) TWQ_IF(Q5_1, [3] = twq_i8_pack_x16_TWQ_Q5_1,)
     TWQ_IF(Q8_0, [4] = twq_i8_pack_x16_TWQ_Q8_0,) TWQ_IF(Q4_K, [5] = twq_i8_pack_x16_TWQ_Q4_K,)
     TWQ_IF(Q5_K, [6] = twq_i8_pack_x16_TWQ_Q5_K,) TWQ_IF(Q6_K, [7] = twq_i8_pack_x16_TWQ_Q6_K,)
     TWQ_IF(Q3_K, [8] = twq_i8_pack_x16_TWQ_Q3_K,) TWQ_IF(Q2_K, [9] = twq_i8_pack_x16_TWQ_Q2_K,)
     TWQ_IF(IQ4_NL, [10] = twq_i8_pack_x16_TWQ_IQ4_NL,) TWQ_IF(IQ4_XS, [11] = twq_i8_pack_x16_TWQ_IQ4_XS,)}};

/* Quantizes x (the threads share the rows), then panels of 32 W rows as twq_gemm. */
static int twq_i8_gemm(int fmt, int x16, const float* x, const twq_xq* xq, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t rb) {
    const int64_t panels = (N + 31) / 32;
    int64_t ntm, mc;
    twq_tiles(M, panels, TWQ_IPM, &ntm, &mc);
    const int64_t tiles = panels * ntm;
    int failed = 0;
#pragma omp parallel
    {
        uint8_t* p = (uint8_t*)twq_alloc(xq->nb * TWQ_IBLK / 4);
        if (p == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; ++r) twq_quantize(fmt, x, xq, r, r + 1);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t n0 = (t / ntm) * 32, m0 = (t % ntm) * mc;
            const int64_t m1 = m0 + mc < M ? m0 + mc : M;
            if (p == NULL || m0 >= m1) continue;
            const int64_t nr = N - n0 < 32 ? N - n0 : 32;
            const __mmask16 mk0 = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
            const __mmask16 mk1 = (__mmask16)(nr >= 32 ? 0xFFFFu : nr > 16 ? (1u << (nr - 16)) - 1u : 0u);
            twq_i8_pack_table[x16][twq_i8_slot(fmt)](w, rb, n0, nr, xq->nb, p);
            for (int64_t m = m0; m < m1; m += TWQ_IPM) {
                const int64_t mr = m1 - m < TWQ_IPM ? m1 - m : TWQ_IPM;
                twq_i8_micro_table[twq_i8_slot(fmt)][mr - 1](xq, m, p, y, N, n0, mk0, mk1);
            }
        }
        twq_free((float*)p);
    }
    return failed ? TWQ_ENOMEM : 0;
}

/* y = x @ W.T (+ r, where not NULL). */
static int twq_i8_run(int fmt, int x16, const float* x, const twq_xq* xq, const uint8_t* w, const float* res, float* y, int64_t M, int64_t N, int64_t rb) {
    if (M <= TWQ_I8_GEMV_UPTO) {
        twq_i8_gemv(fmt, x16, x, xq, w, res, y, M, N, rb);
        return 0;
    }
    const int rc = twq_i8_gemm(fmt, x16, x, xq, w, y, M, N, rb);
    if (rc == 0) twq_add(res, y, M * N);
    return rc;
}

#else /* ==== portable ========================================================================= */

static void twq_gemv(int fmt, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    const int par = N * rb >= TWQ_PAR_MIN_BYTES;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t n = 0; n < N; ++n) {
        const uint8_t* row = w + n * rb;
        float acc[TWQ_GEMV_MAX_M], buf[32];
        for (int64_t m = 0; m < M; ++m) acc[m] = 0.0f;
        const int64_t nj = K / 32;
        for (int64_t j = 0; j < nj; ++j) {
            twq_decode32(fmt, row, j, buf);
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
                for (int64_t j = 0; j < K / 32; ++j) twq_decode32(fmt, row, j, out + 32 * j);
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

#ifdef TWQ_AVX2
static inline int32_t twq_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
#endif

#if defined(TWQ_AVX2) && defined(__FMA__) && defined(__F16C__)
#define TWQ_AVX2_Q8 1
#define TWQ_Q8_AHEAD 4 /* tiles of 8 W rows the prefetch runs ahead */
/* Lane i: the sum of p[i]'s 8 int32 (exact: any order of an int32 sum that fits). */
static inline __m256i twq_sum8(const __m256i* p) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The 8 x 8 dwords of r transposed: on return r[t] lane i = dword t of r[i] as given. */
static inline void twq_t8x8(__m256i* r) {
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; ++h) {
            b[i + 2 * h] = _mm256_unpacklo_epi64(a[i + h], a[i + 2 + h]);
            b[i + 2 * h + 1] = _mm256_unpackhi_epi64(a[i + h], a[i + 2 + h]);
        }
    for (int t = 0; t < 4; ++t) {
        r[t] = _mm256_permute2x128_si256(b[t], b[t + 4], 0x20);
        r[t + 4] = _mm256_permute2x128_si256(b[t], b[t + 4], 0x31);
    }
}

/* The rn rows of a tile's outputs acc (8 lanes, nr of them valid) into y (row stride N). */
static inline void twq_store8(const __m256* acc, int64_t rn, int64_t nr, float* y, int64_t N) {
    for (int64_t r = 0; r < rn; ++r) {
        if (nr == 8) {
            _mm256_storeu_ps(y + r * N, acc[r]);
            continue;
        }
        float v[8];
        _mm256_storeu_ps(v, acc[r]);
        for (int64_t i = 0; i < nr; ++i) y[r * N + i] = v[i];
    }
}

/* Where the 8 weight rows n0 .. n0 + nr - 1 of a tile are (past nr: the last one again), their
 * x16 group and the tile's half of it, and the prefetch stream of the next tiles, spread over
 * the nb blocks (twq_q8_tile and twq_q4_tile). */
typedef struct {
    const uint8_t* rows[8];
    const uint8_t* grp;
    int64_t half, step;
    const char* ahead;
} twq_tile;

static twq_tile twq_tile_at(const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, int64_t nb) {
    twq_tile t;
    for (int i = 0; i < 8; ++i) t.rows[i] = w + (n0 + (i < nr ? i : nr - 1)) * rb;
    t.grp = w + (n0 - n0 % 16) * rb;
    t.half = n0 % 16 / 8;
    t.ahead = (const char*)(w + (n0 + 8 * TWQ_Q8_AHEAD) * rb);
    t.step = (8 * rb + nb - 1) / nb;
    return t;
}

/* iq4's values in both 128-bit lanes, for vpshufb (a nibble is a byte index there, its top bit clear). */
TWQ_INLINE __m256i twq_iq4_table8(void) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)twq_iq4_values)); }

/* Block j of a tile's 8 iq4_nl / iq4_xs rows as twq_q8_tile takes q8_0's: the int8 values the
 * nibbles index (vpshufb), plain rows' in weight order (ws[i]: row i's 32), an x16 group half's
 * as its vectors (ws[u] lane i: row i's values 4u..4u+3; the nibble runs' low nibbles are u < 4,
 * their high ones u + 4); and the rows' d (iq4_xs: the sub-block's d * (ls - 32), exact). */
static inline __m256 twq_iq4_block8(int fmt, int x16, const twq_tile* t, int64_t j, __m256i* ws) {
    const __m256i low = _mm256_set1_epi8(0x0F), tab = twq_iq4_table8();
    const int xs = fmt == TWQ_IQ4_XS, s = (int)(j & 7);
    const int64_t nbytes = twq_nbytes[fmt], at = xs ? j >> 3 : j;
    if (x16) { /* per (super-)block: 16 d, (iq4_xs: 16 scales_h, the scales_l run,) the nibble runs */
        const uint8_t* b = t->grp + at * 16 * nbytes;
        const int64_t half = t->half;
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16 * half)));
        if (xs) {
            const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(b + 32 + 16 * half)));
            const __m256i sl = _mm256_loadu_si256((const __m256i*)(b + 64 + 32 * half));
            const __m256i lo = _mm256_and_si256(_mm256_srl_epi32(sl, _mm_cvtsi32_si128(4 * s)), _mm256_set1_epi32(15));
            const __m256i hi = _mm256_and_si256(_mm256_srl_epi32(sh, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi32(3));
            dw = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32))));
        }
        const uint8_t* qs = xs ? b + 64 * (2 + 4 * s) : b + 32; /* iq4_xs: runs 1 + 4s .. after the 64 bytes of head */
        for (int u = 0; u < 4; ++u) {
            const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 64 * u + 32 * half));
            ws[u] = _mm256_shuffle_epi8(tab, _mm256_and_si256(v, low));
            ws[u + 4] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        }
        return dw;
    }
    float d[8];
    for (int i = 0; i < 8; ++i) {
        const uint8_t* b = t->rows[i] + at * nbytes;
        d[i] = twq_h2f(twq_u16(b)); /* the value _mm256_cvtph_ps gives: both exact */
        if (xs) d[i] = d[i] * (float)(twq_iq4xs_ls(b, s) - 32);
        const __m128i v = _mm_loadu_si128((const __m128i*)(b + twq_iq4_qs(fmt, s)));
        ws[i] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), low));
    }
    return _mm256_loadu_ps(d);
}

/* q8_0 with AVX2: all rows of x against the 8 W rows n0 .. n0+8 (nr valid; past them the last
 * again). Each block of the 8 rows is loaded once (plain rows transposed by twq_t8x8) into the
 * interleaved form, vector t lane i = weights 4t..4t+3 of row i, with |w| for vpmaddubsw's
 * unsigned side, and serves every row of x: 8 steps of x's 4 bytes broadcast, with w's sign,
 * give the 8 rows' dot products side by side, and the float update of the file header runs
 * for the 8 outputs at once: the same int32 sums and, lane by lane, the same float operations
 * as the loop's, so the same bits (one row of x against plain rows skips the transpose and
 * sums each W row's vector across). The next tiles are prefetched, spread over the blocks.
 * iq4_nl and iq4_xs (fmt) run the same with their blocks' values looked up (twq_iq4_block8). */
static void twq_q8_tile(int fmt, int x16, const twq_xq* xq, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, float* y, int64_t M, int64_t N) {
    const int64_t nb = xq->nb, nbytes = twq_nbytes[TWQ_Q8_0];
    const __m256i ones = _mm256_set1_epi16(1);
    const twq_tile t = twq_tile_at(w, rb, n0, nr, nb);
    const uint8_t* const* rows = t.rows;
    const uint8_t* grp = t.grp;
    const int64_t half = t.half, step = t.step;
    const char* ahead = t.ahead;
    for (int64_t r0 = 0; r0 < M; r0 += 16) {
        const int64_t rn = M - r0 < 16 ? M - r0 : 16;
        __m256 acc[16];
        for (int64_t r = 0; r < rn; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nb; ++j) {
            if (r0 == 0)
                for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
            __m256i ws[8], wa[8]; /* w (its sign) and |w| */
            __m256 dw;
            if (x16 && fmt != TWQ_Q8_0) {
                dw = twq_iq4_block8(fmt, 1, &t, j, ws);
            } else if (x16) {
                const uint8_t* b = grp + j * 16 * nbytes;
                dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16 * half)));
                for (int t = 0; t < 8; ++t) ws[t] = _mm256_loadu_si256((const __m256i*)(b + 32 + 64 * t + 32 * half));
            } else {
                if (fmt != TWQ_Q8_0) {
                    dw = twq_iq4_block8(fmt, 0, &t, j, ws);
                } else {
                    uint16_t h[8];
                    for (int i = 0; i < 8; ++i) {
                        h[i] = twq_u16(rows[i] + j * nbytes);
                        ws[i] = _mm256_loadu_si256((const __m256i*)(rows[i] + j * nbytes + 2));
                    }
                    dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)h));
                }
                if (M == 1) { /* one row of x: a vector a W row, summed across (cheaper than the transpose) */
                    const __m256i qv = _mm256_loadu_si256((const __m256i*)(xq->q + 32 * j));
                    __m256i p[8];
                    for (int i = 0; i < 8; ++i) p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws[i]), _mm256_sign_epi8(qv, ws[i])), ones);
                    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(twq_sum8(p)), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[j])), acc[0]);
                    continue;
                }
                twq_t8x8(ws);
            }
            for (int t = 0; t < 8; ++t) wa[t] = _mm256_abs_epi8(ws[t]);
            for (int64_t r = 0; r < rn; ++r) {
                const int64_t at = (r0 + r) * nb + j;
                const int8_t* q = xq->q + (r0 + r) * xq->K + 32 * j;
                __m256i s = _mm256_setzero_si256();
                for (int t = 0; t < 8; ++t) {
                    const __m256i xb = _mm256_sign_epi8(_mm256_set1_epi32(twq_i32(q + 4 * t)), ws[t]);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[t], xb), ones));
                }
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[at])), acc[r]);
            }
        }
        twq_store8(acc, rn, nr, y + r0 * N + n0, N);
    }
}

/* The int32 sums of one row of x (q: its block's 32 bytes) with 8 W rows: wq[t] lane i = the
 * nibbles of row i's weights 4t..4t+3 (vpmaddubsw's unsigned side, x's 4 bytes broadcast the
 * signed one). The 8 pair sums of an int16 lane stay within 8 * 2 * 15 * 127 = 30480, so they
 * are added as int16 and widened once: the same int32 sums as one vpmaddwd a product. */
TWQ_INLINE __m256i twq_q4_dot8(const __m256i* wq, const int8_t* q) {
    __m256i p[8];
    for (int t = 0; t < 8; ++t) p[t] = _mm256_maddubs_epi16(wq[t], _mm256_set1_epi32(twq_i32(q + 4 * t)));
    const __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                                       _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

/* The nibbles of half h (8 rows) of an x16 q4 block b as twq_q4_dot8 takes them: the low
 * nibbles of payload vector t, then the high ones. */
TWQ_INLINE void twq_q4_x16_unpack(const uint8_t* b, int64_t head, int64_t h, __m256i* wq) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 16 * head + 64 * t + 32 * h));
        wq[t] = _mm256_and_si256(v, low);
        wq[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
}

#define TWQ_XB_MAX_M 16                /* most rows of x broadcast ahead (twq_q4_x16_group) */
#define TWQ_XB_MAX_BYTES (128 << 10)   /* and most bytes: measured, 16 x 576 (72 KiB) gains, 16 x 1536 (192 KiB) loses */

/* Each 4 bytes of x's quantized rows broadcast to a whole vector: xb[(r * nb + j) * 8 + t] =
 * bytes 4t..4t+3 of row r's block j in every lane, read by twq_q4_dotx as a memory operand of
 * vpmaddubsw (a broadcast per product costs a vector operation). */
static void twq_broadcast_x(const twq_xq* xq, __m256i* xb, int64_t r) {
    for (int64_t i = 0; i < xq->K / 4; ++i) xb[r * (xq->K / 4) + i] = _mm256_set1_epi32(twq_i32(xq->q + r * xq->K + 4 * i));
}

#define TWQ_KEEP(v) __asm__("" : "+x"(v)) /* v as computed: GCC would turn a tree of adds into a chain */

/* twq_q4_dot8 with x broadcast ahead (xb: the block's 8 vectors, twq_broadcast_x). */
TWQ_INLINE __m256i twq_q4_dotx(const __m256i* wq, const __m256i* xb) {
    __m256i p[8];
    for (int t = 0; t < 8; ++t) p[t] = _mm256_maddubs_epi16(wq[t], xb[t]);
    __m256i a = _mm256_add_epi16(p[0], p[1]), b = _mm256_add_epi16(p[2], p[3]), c = _mm256_add_epi16(p[4], p[5]), d = _mm256_add_epi16(p[6], p[7]);
    TWQ_KEEP(a); TWQ_KEEP(b); TWQ_KEEP(c); TWQ_KEEP(d);
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(a, b), _mm256_add_epi16(c, d)), _mm256_set1_epi16(1));
}

/* q4_0 / q4_1 x16, M <= TWQ_XB_MAX_M rows of x: the 16 W rows of the group at grp (y: the
 * column of their first output). Each half's block is unpacked once for all rows of x, which
 * come broadcast ahead (xb); each output lane runs the loop's sequence (isum with corr, fma by
 * d_w * d_x, q4_1: fma(m_w, cx)): the same bits. (q4_1's corr is 0: its add is left out.) The
 * next groups are prefetched, spread over the blocks. Inlined with constant fmt and M (M = 1
 * keeps its two accumulators in registers: two chains of float updates). */
TWQ_INLINE void twq_q4_x16_body(int fmt, const twq_xq* xq, const __m256i* xb, const uint8_t* grp, const char* ahead, int64_t step, float* y, int64_t M, int64_t N) {
    const int64_t nb = xq->nb, nbytes = twq_nbytes[fmt], head = fmt == TWQ_Q4_1 ? 4 : 2;
    __m256 acc[2][TWQ_XB_MAX_M];
    for (int64_t r = 0; r < M; ++r) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
        for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
        const uint8_t* b = grp + j * 16 * nbytes;
        for (int h = 0; h < 2; ++h) {
            __m256i wq[8];
            twq_q4_x16_unpack(b, head, h, wq);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16 * h)));
            const __m256 mw = fmt == TWQ_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 32 + 16 * h))) : _mm256_setzero_ps();
            for (int64_t r = 0; r < M; ++r) {
                const int64_t at = r * nb + j;
                __m256i s = twq_q4_dotx(wq, xb + 8 * at);
                if (fmt != TWQ_Q4_1) s = _mm256_add_epi32(s, _mm256_set1_epi32(xq->corr[at]));
                acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[at])), acc[h][r]);
                if (fmt == TWQ_Q4_1) acc[h][r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->cx[at]), acc[h][r]);
            }
        }
    }
    for (int64_t r = 0; r < M; ++r) {
        _mm256_storeu_ps(y + r * N, acc[0][r]);
        _mm256_storeu_ps(y + r * N + 8, acc[1][r]);
    }
}

static void twq_q4_x16_group(int fmt, const twq_xq* xq, const __m256i* xb, const uint8_t* grp, const char* ahead, int64_t step, float* y, int64_t M, int64_t N) {
    if (fmt == TWQ_Q4_1 && M == 1) twq_q4_x16_body(TWQ_Q4_1, xq, xb, grp, ahead, step, y, 1, N);
    else if (fmt == TWQ_Q4_1) twq_q4_x16_body(TWQ_Q4_1, xq, xb, grp, ahead, step, y, M, N);
    else if (M == 1) twq_q4_x16_body(TWQ_Q4_0, xq, xb, grp, ahead, step, y, 1, N);
    else twq_q4_x16_body(TWQ_Q4_0, xq, xb, grp, ahead, step, y, M, N);
}

/* q4_0 / q4_1 with AVX2: twq_q8_tile's scheme. Each block of the 8 W rows is unpacked once
 * (mask and shift) into twq_q4_dot8's form (x16: twq_q4_x16_unpack; plain rows: each row's 32
 * nibbles in order, transposed by twq_t8x8) and serves every row of x. With the block's corr
 * (q4_0: -8 * sum(q)) the 8 lanes hold the loop's int32 sums, and the float update (q4_1: then
 * fma(m_w, cx)) runs lane by lane as the loop's: the same bits. (x16 rows and few rows of x
 * run twq_q4_x16_group instead: see twq_i8_run.) */
static void twq_q4_tile(int fmt, int x16, const twq_xq* xq, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, float* y, int64_t M, int64_t N) {
    const int64_t nb = xq->nb, nbytes = twq_nbytes[fmt], head = fmt == TWQ_Q4_1 ? 4 : 2;
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
    const twq_tile t = twq_tile_at(w, rb, n0, nr, nb);
    const uint8_t* const* rows = t.rows;
    const uint8_t* grp = t.grp;
    const int64_t half = t.half, step = t.step;
    const char* ahead = t.ahead;
    for (int64_t r0 = 0; r0 < M; r0 += 16) {
        const int64_t rn = M - r0 < 16 ? M - r0 : 16;
        __m256 acc[16];
        for (int64_t r = 0; r < rn; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nb; ++j) {
            if (r0 == 0)
                for (int64_t o = 0; o < step; o += 64) _mm_prefetch(ahead + j * step + o, _MM_HINT_T0);
            __m256i wq[8];
            __m256 dw, mw = _mm256_setzero_ps();
            if (x16) {
                const uint8_t* b = grp + j * 16 * nbytes;
                dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16 * half)));
                if (fmt == TWQ_Q4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 32 + 16 * half)));
                twq_q4_x16_unpack(b, head, half, wq);
            } else {
                uint16_t h[8], hm[8];
                for (int i = 0; i < 8; ++i) {
                    const uint8_t* b = rows[i] + j * nbytes;
                    h[i] = twq_u16(b);
                    hm[i] = fmt == TWQ_Q4_1 ? twq_u16(b + 2) : 0;
                    const __m128i v = _mm_loadu_si128((const __m128i*)(b + head));
                    wq[i] = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), low);
                }
                dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)h));
                if (fmt == TWQ_Q4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)hm));
                if (M == 1) { /* one row of x: a vector a W row, summed across (cheaper than the transpose) */
                    const __m256i qv = _mm256_loadu_si256((const __m256i*)(xq->q + 32 * j));
                    __m256i p[8];
                    for (int i = 0; i < 8; ++i) p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[i], qv), ones);
                    const __m256i s = _mm256_add_epi32(twq_sum8(p), _mm256_set1_epi32(xq->corr[j]));
                    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[j])), acc[0]);
                    if (fmt == TWQ_Q4_1) acc[0] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->cx[j]), acc[0]);
                    continue;
                }
                twq_t8x8(wq);
            }
            for (int64_t r = 0; r < rn; ++r) {
                const int64_t at = (r0 + r) * nb + j;
                const __m256i s = _mm256_add_epi32(twq_q4_dot8(wq, xq->q + (r0 + r) * xq->K + 32 * j), _mm256_set1_epi32(xq->corr[at]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[at])), acc[r]);
                if (fmt == TWQ_Q4_1) acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->cx[at]), acc[r]);
            }
        }
        twq_store8(acc, rn, nr, y + r0 * N + n0, N);
    }
}

/* q5 with AVX2: a block's 8 pair sums per int16 lane could reach 8 * 2 * 31 * 127 = 62992, past
 * int16, so twq_q4_dot8's sum is taken as two halves of 4 (31496 at most), widened apart: the
 * same int32 sums. */
TWQ_INLINE __m256i twq_q5_dot8(const __m256i* wq, const int8_t* q) {
    __m256i p[8];
    for (int t = 0; t < 8; ++t) p[t] = _mm256_maddubs_epi16(wq[t], _mm256_set1_epi32(twq_i32(q + 4 * t)));
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i a = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
    const __m256i b = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
    return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
}

/* Byte l: 16 where bit l of qh is set, else 0 (one q5 row's fifth bits, in weight order). */
TWQ_INLINE __m256i twq_q5_bits32(uint32_t qh) {
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

/* The fifth bits added to 8 rows' nibbles in twq_q4_dot8's form (wq[t] lane i: row i's weights
 * 4t..4t+3 in block order), from qh (lane i: row i's): as twq_q5_high, in 256-bit vectors. */
TWQ_INLINE void twq_q5_high8(__m256i qh, __m256i* wq) {
    const __m256i dw = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
    for (int t = 0; t < 8; ++t) {
        const __m256i bits = _mm256_shuffle_epi8(qh, _mm256_add_epi8(dw, _mm256_set1_epi8((char)((t & 3) / 2 + 2 * (t / 4)))));
        const __m256i mask = _mm256_set1_epi32((int)(0x08040201u << (4 * (t & 1))));
        wq[t] = _mm256_or_si256(wq[t], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask), _mm256_set1_epi8(16)));
    }
}

/* q5_0 / q5_1 with AVX2: twq_q4_tile with each block's fifth bits added to its nibbles (plain
 * rows: twq_q5_bits32 a row, before the transpose; x16: the half's qh vector, twq_q5_high8),
 * the 5-bit values unsigned (q5_0's -16 in corr) and twq_q5_dot8's sums: the loop's bits. */
static void twq_q5_tile(int fmt, int x16, const twq_xq* xq, const uint8_t* w, int64_t rb, int64_t n0, int64_t nr, float* y, int64_t M, int64_t N) {
    const int64_t nb = xq->nb, nbytes = twq_nbytes[fmt], head = twq_head(fmt);
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
    const twq_tile t = twq_tile_at(w, rb, n0, nr, nb);
    const uint8_t* const* rows = t.rows;
    const int64_t half = t.half, step = t.step;
    for (int64_t r0 = 0; r0 < M; r0 += 16) {
        const int64_t rn = M - r0 < 16 ? M - r0 : 16;
        __m256 acc[16];
        for (int64_t r = 0; r < rn; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nb; ++j) {
            if (r0 == 0)
                for (int64_t o = 0; o < step; o += 64) _mm_prefetch(t.ahead + j * step + o, _MM_HINT_T0);
            __m256i wq[8];
            __m256 dw, mw = _mm256_setzero_ps();
            if (x16) { /* per block: 16 d, (16 m), then 64-byte runs: the rows' qh, the nibbles */
                const uint8_t* b = t.grp + j * 16 * nbytes;
                dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16 * half)));
                if (twq_has_m(fmt)) mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 32 + 16 * half)));
                twq_q4_x16_unpack(b + 64, head, half, wq);
                twq_q5_high8(_mm256_loadu_si256((const __m256i*)(b + 16 * head + 32 * half)), wq);
            } else {
                uint16_t h[8], hm[8];
                for (int i = 0; i < 8; ++i) {
                    const uint8_t* b = rows[i] + j * nbytes;
                    h[i] = twq_u16(b);
                    hm[i] = twq_has_m(fmt) ? twq_u16(b + 2) : 0;
                    const __m128i v = _mm_loadu_si128((const __m128i*)(b + head + 4));
                    wq[i] = _mm256_or_si256(_mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), low),
                                            twq_q5_bits32((uint32_t)twq_i32(b + head)));
                }
                dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)h));
                if (twq_has_m(fmt)) mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)hm));
                if (M == 1) { /* one row of x: a vector a W row, summed across (cheaper than the transpose) */
                    const __m256i qv = _mm256_loadu_si256((const __m256i*)(xq->q + 32 * j));
                    __m256i p[8];
                    for (int i = 0; i < 8; ++i) p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[i], qv), ones);
                    const __m256i s = _mm256_add_epi32(twq_sum8(p), _mm256_set1_epi32(xq->corr[j]));
                    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[j])), acc[0]);
                    if (twq_has_m(fmt)) acc[0] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->cx[j]), acc[0]);
                    continue;
                }
                twq_t8x8(wq);
            }
            for (int64_t r = 0; r < rn; ++r) {
                const int64_t at = (r0 + r) * nb + j;
                const __m256i s = _mm256_add_epi32(twq_q5_dot8(wq, xq->q + (r0 + r) * xq->K + 32 * j), _mm256_set1_epi32(xq->corr[at]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[at])), acc[r]);
                if (twq_has_m(fmt)) acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->cx[at]), acc[r]);
            }
        }
        twq_store8(acc, rn, nr, y + r0 * N + n0, N);
    }
}
#endif

/* The integer path in plain C: every output, block by block, the sequence of the file header;
 * each block is decoded once for up to 64 rows of x. With AVX2 a block's dot product with a row
 * is vpmaddubsw + vpmaddwd and a sum across (the pair sums fit int16: 15 * 127 * 2 for the
 * nibbles, 128 * 127 * 2 for q8_0's |w|), the same int32 as the loop's. */
static int twq_i8_run(int fmt, int x16, const float* x, const twq_xq* xq, const uint8_t* w, const float* res, float* y, int64_t M, int64_t N, int64_t rb) {
    const int64_t nb = xq->nb;
    const int par = N * rb >= TWQ_PAR_MIN_BYTES || M > 1;
    (void)par; /* used by OpenMP only */
#ifdef TWQ_AVX2_Q8
    __m256i* xb = NULL; /* x broadcast for twq_q4_x16_group */
    if (x16 && (fmt == TWQ_Q4_0 || fmt == TWQ_Q4_1) && M <= TWQ_XB_MAX_M && 8 * M * xq->K <= TWQ_XB_MAX_BYTES) {
        xb = (__m256i*)twq_alloc(2 * M * xq->K);
        if (xb == NULL) return TWQ_ENOMEM;
    }
#endif
#pragma omp parallel if (par)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; ++r) {
            twq_quantize(fmt, x, xq, r, r + 1);
#ifdef TWQ_AVX2_Q8
            if (xb != NULL) twq_broadcast_x(xq, xb, r);
#endif
        }
#ifdef TWQ_AVX2_Q8
        if (twq_w_signed(fmt)) { /* q8_0, iq4_nl, iq4_xs */
#pragma omp for schedule(static)
            for (int64_t t = 0; t < (N + 7) / 8; ++t) twq_q8_tile(fmt, x16, xq, w, rb, 8 * t, N - 8 * t < 8 ? N - 8 * t : 8, y, M, N);
        } else if (xb != NULL) {
            const int64_t step = (16 * rb + nb - 1) / nb; /* the next groups' bytes, spread over the blocks */
#pragma omp for schedule(static)
            for (int64_t g = 0; g < N / 16; ++g) twq_q4_x16_group(fmt, xq, xb, w + 16 * g * rb, (const char*)(w + 16 * (g + 2) * rb), step, y + 16 * g, M, N);
        } else if (fmt == TWQ_Q4_0 || fmt == TWQ_Q4_1) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < (N + 7) / 8; ++t) twq_q4_tile(fmt, x16, xq, w, rb, 8 * t, N - 8 * t < 8 ? N - 8 * t : 8, y, M, N);
        } else if (twq_is_q5(fmt)) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < (N + 7) / 8; ++t) twq_q5_tile(fmt, x16, xq, w, rb, 8 * t, N - 8 * t < 8 ? N - 8 * t : 8, y, M, N);
        } else
#endif
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const uint8_t* row = w + n * rb;
            const uint8_t* grp = w + (n - n % 16) * rb; /* x16: the row's group, and its lane */
            const int64_t lane = n % 16;
            for (int64_t r0 = 0; r0 < M; r0 += 64) {
                const int64_t rn = M - r0 < 64 ? M - r0 : 64;
                float acc[64];
                uint8_t wq[32]; /* unsigned: nibbles, q8_0 + 128 (see twq_corr_mul), q6_k's q + 32, q3_k's q + 4, q2_k's q, iq4's values + 128 */
                for (int64_t r = 0; r < rn; ++r) acc[r] = 0.0f;
                for (int64_t j = 0; j < nb; ++j) {
                    uint8_t blk[210]; /* the block (the k-quants, iq4_xs: super-block) as the plain format stores it */
                    const int64_t at_j = twq_is_k(fmt) || fmt == TWQ_IQ4_XS ? j >> 3 : j;
                    int32_t sc0 = 0, sc1 = 0, mn0 = 0, mn1 = 0; /* q6_k, q3_k, q2_k: the sub-block's scales (q2_k: and mins) */
                    float dmin = 0.0f; /* q2_k */
                    const uint8_t* b = row + at_j * twq_nbytes[fmt];
                    if (x16) {
                        twq_block_of_x16(fmt, grp, lane, at_j, blk);
                        b = blk;
                    }
                    float dw = twq_h2f(twq_u16(b)), mw = twq_has_m(fmt) ? twq_h2f(twq_u16(b + 2)) : 0.0f;
                    if (twq_is_k45(fmt)) { /* sub-block j % 8: its pair's 32 bytes, low or high nibbles (q5_k: bit s of qh[l] the fifth) */
                        const int s = (int)(j & 7);
                        twq_k4_factors(b, s, &dw, &mw);
                        for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)((b[twq_k45_qs(fmt) + 32 * (s >> 1) + l] >> (4 * (s & 1))) & 0xF);
                        if (fmt == TWQ_Q5_K)
                            for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)(wq[l] | ((b[16 + l] >> s) & 1) << 4);
                    } else if (fmt == TWQ_Q6_K) { /* sub-block j % 8 (the layout of tilework.llm.quant) */
                        const int s = (int)(j & 7), t = s & 3;
                        const uint8_t *ql = b + 64 * (s >> 2) + 32 * (t & 1), *qh = b + 128 + 32 * (s >> 2);
                        dw = twq_h2f(twq_u16(b + 208));
                        sc0 = (int8_t)b[192 + 2 * s];
                        sc1 = (int8_t)b[193 + 2 * s];
                        for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)(((ql[l] >> (4 * (t >> 1))) & 0xF) | ((qh[l] >> (2 * t)) & 3) << 4);
                    } else if (fmt == TWQ_Q3_K) { /* sub-block j % 8: bits 2t of the 2-bit fields of half s / 4, bit s of hmask above them */
                        const int s = (int)(j & 7), t = s & 3;
                        const uint8_t* qs = b + 32 + 32 * (s >> 2);
                        dw = twq_h2f(twq_u16(b + 108));
                        sc0 = twq_k3_scale(b + 96, 2 * s);
                        sc1 = twq_k3_scale(b + 96, 2 * s + 1);
                        for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)(((qs[l] >> (2 * t)) & 3) | ((b[l] >> s) & 1) << 2);
                    } else if (fmt == TWQ_Q2_K) { /* sub-block j % 8: bits 2t of the 2-bit fields of half s / 4; scale bytes 2s, 2s + 1 */
                        const int s = (int)(j & 7), t = s & 3;
                        const uint8_t* qs = b + 16 + 32 * (s >> 2);
                        dw = twq_h2f(twq_u16(b + 80));
                        dmin = twq_h2f(twq_u16(b + 82));
                        sc0 = b[2 * s] & 0xF;
                        sc1 = b[2 * s + 1] & 0xF;
                        mn0 = b[2 * s] >> 4;
                        mn1 = b[2 * s + 1] >> 4;
                        for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)((qs[l] >> (2 * t)) & 3);
                    } else if (fmt == TWQ_Q8_0) {
                        for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)(b[2 + l] ^ 0x80);
                    } else if (twq_is_iq4(fmt)) { /* the nibbles' values + 128 (as q8_0's bytes); iq4_xs: sub-block j % 8, d * (ls - 32) exact */
                        const int s = (int)(j & 7);
                        const uint8_t* nib = b + twq_iq4_qs(fmt, s);
                        if (fmt == TWQ_IQ4_XS) dw = dw * (float)(twq_iq4xs_ls(b, s) - 32);
                        for (int l = 0; l < 16; ++l) {
                            wq[l] = (uint8_t)(twq_iq4_values[nib[l] & 0xF] ^ 0x80);
                            wq[l + 16] = (uint8_t)(twq_iq4_values[nib[l] >> 4] ^ 0x80);
                        }
                    } else {
                        const uint8_t* nib = b + twq_head(fmt) + (twq_is_q5(fmt) ? 4 : 0);
                        for (int h = 0; h < 16; h += 8) { /* 8 bytes at a time in a uint64_t */
                            uint64_t v, lo, hi;
                            memcpy(&v, nib + h, 8);
                            lo = v & 0x0F0F0F0F0F0F0F0Full;
                            hi = (v >> 4) & 0x0F0F0F0F0F0F0F0Full;
                            memcpy(wq + h, &lo, 8);
                            memcpy(wq + 16 + h, &hi, 8);
                        }
                        if (twq_is_q5(fmt)) { /* the fifth bits (the 5-bit values stay unsigned) */
                            const uint32_t qh = (uint32_t)twq_i32(b + twq_head(fmt));
                            for (int l = 0; l < 32; ++l) wq[l] = (uint8_t)(wq[l] | ((qh >> l) & 1u) << 4);
                        }
                    }
#ifdef TWQ_AVX2
                    /* q4: the nibbles, unsigned; q8_0 (iq4: the values, wq's bytes less the bias):
                     * |w| and, per row, x with w's sign (no bias: the sum is corr + sum((w + 128) q)
                     * = sum(w q) itself, exactly) */
                    const __m256i ws = fmt == TWQ_Q8_0 ? _mm256_loadu_si256((const __m256i*)(b + 2))
                                       : twq_is_iq4(fmt) ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)wq), _mm256_set1_epi8((char)0x80))
                                                         : _mm256_setzero_si256();
                    const __m256i wv = twq_w_signed(fmt) ? _mm256_abs_epi8(ws) : _mm256_loadu_si256((const __m256i*)wq);
#endif
                    for (int64_t r = 0; r < rn; ++r) {
                        const int64_t at = (r0 + r) * nb + j;
                        const int8_t* q = xq->q + (r0 + r) * xq->K + 32 * j;
                        /* q6_k, q3_k: the halves' chains start at corr16 and corr - corr16; q2_k's at 0 */
                        const int32_t k16_0 = fmt == TWQ_Q2_K ? 0 : xq->corr16[at], k16_1 = fmt == TWQ_Q2_K ? 0 : xq->corr[at] - xq->corr16[at];
#ifdef TWQ_AVX2
                        __m256i qv = _mm256_loadu_si256((const __m256i*)q);
                        if (twq_w_signed(fmt)) qv = _mm256_sign_epi8(qv, ws);
                        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, qv), _mm256_set1_epi16(1)); /* lanes 0-3: weights 0-15 */
                        int32_t isum;
                        if (twq_is_k16(fmt)) {
                            const __m256i lo = _mm256_blend_epi32(p, _mm256_setzero_si256(), 0xF0); /* the halves apart: [lo, 0] and [0, hi] */
                            isum = sc0 * (k16_0 + twq_hsum_i32(lo)) + sc1 * (k16_1 + twq_hsum_i32(_mm256_sub_epi32(p, lo)));
                        } else
                            isum = (twq_w_signed(fmt) ? 0 : xq->corr[at]) + twq_hsum_i32(p);
#else
                        int32_t isum = xq->corr[at];
                        if (twq_is_k16(fmt)) { /* the halves' sums, each times its scale */
                            int32_t s0 = k16_0, s1 = k16_1;
                            for (int l = 0; l < 16; ++l) s0 += wq[l] * q[l];
                            for (int l = 16; l < 32; ++l) s1 += wq[l] * q[l];
                            isum = sc0 * s0 + sc1 * s1;
                        } else
                            for (int l = 0; l < 32; ++l) isum += wq[l] * q[l];
#endif
                        acc[r] = fmaf((float)isum, dw * xq->d[at], acc[r]);
                        if (twq_i8_m(fmt)) acc[r] = fmaf(mw, xq->cx[at], acc[r]);
                        if (fmt == TWQ_Q2_K) /* the mins: corr16, corr are the halves' sums of q_x here */
                            acc[r] = fmaf((float)(mn0 * xq->corr16[at] + mn1 * (xq->corr[at] - xq->corr16[at])), -(dmin * xq->d[at]), acc[r]);
                    }
                }
                for (int64_t r = 0; r < rn; ++r) y[(r0 + r) * N + n] = acc[r];
            }
        }
    }
#ifdef TWQ_AVX2_Q8
    twq_free((float*)xb);
#endif
    twq_add(res, y, M * N);
    return 0;
}

#endif /* TWQ_AVX512 */

#include "quant_float_avx2.c" /* the float path on AVX2 without AVX-512 (TWQ_A2F); spliced in by quant.py */
#include "quant_dequant.c"     /* the loaders' path: whole rows decoded (float32, bfloat16) or interleaved */

/* ==== entry points ========================================================================== */

/* Whether this build holds the path of fmt (a plain format's code: bf16x16's is bf16's). */
static inline int twq_in_build(int fmt) {
    static const int with[TWQ_NFMT] = {TWQ_WITH_Q4_0, TWQ_WITH_Q4_1, TWQ_WITH_Q5_0, TWQ_WITH_Q5_1, TWQ_WITH_Q8_0, TWQ_WITH_BF16, TWQ_WITH_F16,
                                       TWQ_WITH_Q4_K, TWQ_WITH_Q6_K, TWQ_WITH_Q5_K, TWQ_WITH_Q3_K, TWQ_WITH_Q2_K, TWQ_WITH_IQ4_NL, TWQ_WITH_IQ4_XS};
    return with[fmt];
}

/* The float formats (not the integer path): y = x @ W.T. twq_run has refused a format whose
 * path the build leaves out; the constant tests here let the compiler drop that path. */
static int twq_float_run(int fmt, int x16, const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t rb) {
    if (x16) { /* bf16x16, the one interleaved float format */
        if (!TWQ_WITH_BF16) return TWQ_EFAMILY;
#ifdef TWQ_BF16DOT
        return M <= TWQ_GEMV_MAX_M ? twq_gemv_bf16(1, x, w, y, M, N, K, rb) : twq_gemm_bf16(1, x, w, y, M, N, K, rb);
#else
        twq_bf16x16_float(x, w, y, M, N, K);
        return 0;
#endif
    }
#ifdef TWQ_A2F
    return twq_a2_run(fmt, x, w, y, M, N, K, rb);
#endif
#ifdef TWQ_BF16DOT
    if (fmt == TWQ_BF16) {
        if (!TWQ_WITH_BF16) return TWQ_EFAMILY;
        return M <= TWQ_GEMV_MAX_M ? twq_gemv_bf16(0, x, w, y, M, N, K, rb) : twq_gemm_bf16(0, x, w, y, M, N, K, rb);
    }
    if (!TWQ_WITH_F16) return TWQ_EFAMILY; /* the generic kernels below run the float path's formats alone */
#endif
    if (M <= TWQ_GEMV_MAX_M) {
        twq_gemv(fmt, x, w, y, M, N, K, rb);
        return 0;
    }
    return twq_gemm(fmt, x, w, y, M, N, K, rb);
}

/* y = x @ W.T (+ r, r [M, N] or NULL). */
static int twq_run(int fmt, const float* x, const uint8_t* w, const float* r, float* y, int64_t M, int64_t N, int64_t K) {
    if (fmt < 0 || fmt >= TWQ_NCODES) return TWQ_EFMT;
    const int x16 = fmt >= TWQ_NFMT;
    if (x16) fmt = twq_x16_base[fmt - TWQ_NFMT];
    if (!twq_in_build(fmt)) return TWQ_EFAMILY;
    if (M < 0 || N < 0 || K < 0 || K % twq_block[fmt] != 0 || (x16 && N % 16 != 0) || (x16 && fmt == TWQ_BF16 && K % 2 != 0)) return TWQ_ESHAPE;
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        if (y == NULL) return TWQ_ENULL;
        memset(y, 0, (size_t)(M * N) * sizeof(float));
        twq_add(r, y, M * N);
        return 0;
    }
    if (x == NULL || w == NULL || y == NULL) return TWQ_ENULL;
    const int64_t rb = K / twq_block[fmt] * twq_nbytes[fmt];
    if (TWQ_WITH_INT8 && twq_is_i8(fmt)) { /* the constants let the compiler drop a path left out */
        twq_xq xq;
        float* scratch = twq_xq_alloc(&xq, M, K);
        if (scratch == NULL) return TWQ_ENOMEM;
        int rc = twq_i8_run(fmt, x16, x, &xq, w, r, y, M, N, rb);
        twq_free(scratch);
        return rc;
    }
    if (!TWQ_WITH_BF16 && !TWQ_WITH_F16) return TWQ_EFAMILY;
    const int rc = twq_float_run(fmt, x16, x, w, y, M, N, K, rb);
    if (rc == 0) twq_add(r, y, M * N);
    return rc;
}

/* Every format code and its name: one entry point of each kind a format (TWQ_EACH_FORMAT(X)). */
#define TWQ_EACH_FORMAT(X) \
    X(q4_0, TWQ_Q4_0) \
    X(q4_1, TWQ_Q4_1) \
    X(q5_0, TWQ_Q5_0) \
    X(q5_1, TWQ_Q5_1) \
    X(q8_0, TWQ_Q8_0) \
    X(bf16, TWQ_BF16) \
    X(f16, TWQ_F16) \
    X(q4_k, TWQ_Q4_K) \
    X(q6_k, TWQ_Q6_K) \
    X(q5_k, TWQ_Q5_K) \
    X(q3_k, TWQ_Q3_K) \
    X(q2_k, TWQ_Q2_K) \
    X(q4_0x16, TWQ_Q4_0X16) \
    X(q4_1x16, TWQ_Q4_1X16) \
    X(q5_0x16, TWQ_Q5_0X16) \
    X(q5_1x16, TWQ_Q5_1X16) \
    X(q8_0x16, TWQ_Q8_0X16) \
    X(bf16x16, TWQ_BF16X16) \
    X(q4_kx16, TWQ_Q4_KX16) \
    X(q5_kx16, TWQ_Q5_KX16) \
    X(q6_kx16, TWQ_Q6_KX16) \
    X(iq4_nl, TWQ_IQ4_NL) \
    X(iq4_xs, TWQ_IQ4_XS) \
    X(q3_kx16, TWQ_Q3_KX16) \
    X(q2_kx16, TWQ_Q2_KX16) \
    X(iq4_nlx16, TWQ_IQ4_NLX16) \
    X(iq4_xsx16, TWQ_IQ4_XSX16)

#define TWQ_ENTRY(NAME, CODE) \
    int32_t tw_qlinear_##NAME(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K) { return twq_run(CODE, x, w, NULL, y, M, N, K); }
TWQ_EACH_FORMAT(TWQ_ENTRY)

/* y = x @ W.T + r (r [M, N], not y): the product, then the residual added to each output (the
 * float32 sum a separate add would make, so the same bits). */
static int twq_run_add(int fmt, const float* x, const uint8_t* w, const float* r, float* y, int64_t M, int64_t N, int64_t K) {
    if (r == NULL && M > 0 && N > 0) return TWQ_ENULL;
    if (r == y && M > 0 && N > 0) return TWQ_EALIAS;
    return twq_run(fmt, x, w, r, y, M, N, K);
}

#define TWQ_ADD_ENTRY(NAME, CODE) \
    int32_t tw_qlinear_add_##NAME(const float* x, const uint8_t* w, const float* r, float* y, int64_t M, int64_t N, int64_t K) { \
        return twq_run_add(CODE, x, w, r, y, M, N, K); \
    }
TWQ_EACH_FORMAT(TWQ_ADD_ENTRY)

/* The Python extern's trampoline: a[] = {fmt (the enum above), x, w, y (NumPy array object
 * addresses), M, N, K, data offset, r (a residual to add, or 0)}; each array's data pointer is
 * read at byte offset a[7] of its object (the offset is verified on live arrays by the
 * caller). One pointer argument keeps the ctypes call cheap. */
int32_t tw_qlinear_packed(const int64_t* a) {
    if (a == NULL) return TWQ_ENULL;
    const char *xo = (const char*)(intptr_t)a[1], *wo = (const char*)(intptr_t)a[2], *yo = (const char*)(intptr_t)a[3];
    const char* ro = (const char*)(intptr_t)a[8];
    if (xo == NULL || wo == NULL || yo == NULL) return TWQ_ENULL;
    const int64_t off = a[7];
    const float* x = *(const float* const*)(xo + off);
    const uint8_t* w = *(const uint8_t* const*)(wo + off);
    float* y = *(float* const*)(yo + off);
    if (ro != NULL) return twq_run_add((int)a[0], x, w, *(const float* const*)(ro + off), y, a[4], a[5], a[6]);
    return twq_run((int)a[0], x, w, NULL, y, a[4], a[5], a[6]);
}

#include "quant_experts.c" /* expert_linear: tw_qexperts_<fmt>, the experts' rows run by the kernels above; spliced in by quant.py */

/* ==== helpers for the benchmark and the tests =============================================== */

/* x [M, K] (K a multiple of 32) quantized as the integer path does (twq_quantize's blocks: 16
 * at a time, the rest one by one): q [M, K] int8, and per block d [M, K/32] and sum(q) s [M, K/32]. */
int32_t tw_quant_quantize_x(const float* x, int64_t M, int64_t K, int8_t* q, float* d, int32_t* s) {
    if (M < 0 || K < 0 || K % 32) return TWQ_ESHAPE;
    if (M > 0 && K > 0 && (x == NULL || q == NULL || d == NULL || s == NULL)) return TWQ_ENULL;
    int64_t at = 0; /* the blocks in order, as twq_quantize takes them */
#ifdef TWQ_AVX512
    for (__m512i v, v16; at + 16 <= M * (K / 32) && twq_quant_blocks16(x + 32 * at, q + 32 * at, d + at, &v, &v16); at += 16)
        _mm512_storeu_si512((void*)(s + at), v);
#endif
    for (int32_t s16; at < M * (K / 32); ++at) twq_quant_block(x + 32 * at, q + 32 * at, d + at, s + at, &s16);
    return 0;
}

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
#elif defined(TWQ_A2F)
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < 4096; i += 32) {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(q + i));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(q + i + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(q + i + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(q + i + 24));
        }
        total += twq_a2_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
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

/* The paths this build holds, a bit each in the order of tilework.backend.quant.FAMILIES. */
int32_t tw_quant_families(void) {
    const int with[] = {TWQ_WITH_Q4_0, TWQ_WITH_Q4_1, TWQ_WITH_Q5_0, TWQ_WITH_Q5_1, TWQ_WITH_Q8_0, TWQ_WITH_Q4_K, TWQ_WITH_Q5_K,
                        TWQ_WITH_Q6_K, TWQ_WITH_Q3_K, TWQ_WITH_Q2_K, TWQ_WITH_IQ4_NL, TWQ_WITH_IQ4_XS, TWQ_WITH_BF16, TWQ_WITH_F16};
    int32_t bits = 0;
    for (int i = 0; i < (int)(sizeof with / sizeof with[0]); ++i) bits |= with[i] << i;
    return bits;
}

/* 1 when the integer dot products use AVX-512 VNNI. */
int32_t tw_quant_vnni(void) {
#ifdef TWQ_VNNI
    return 1;
#else
    return 0;
#endif
}

/* 1 when the bf16 GEMM uses AVX-512 BF16 dot products (x rounded to bf16). */
int32_t tw_quant_bf16dot(void) {
#ifdef TWQ_BF16DOT
    return 1;
#else
    return 0;
#endif
}
