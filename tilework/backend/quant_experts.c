/* tilework's quant backend: a mixture of experts' products (the op expert_linear), spliced into
 * quant_kernels.c after its entry points by tilework/backend/quant.py (source()).
 *
 * x is float32 [T, S, K] with S == 1 (one input for every slot) or S == slots, ids [T, slots]
 * (int32 or int64: ids_bytes 4 or 8), w the E experts' [N, K] matrices stacked as rows of the
 * format's blocks (expert e's rows e * N .. e * N + N - 1; an interleaved format's groups of 16
 * rows never straddle two experts: N % 16 == 0), y float32 [T, slots, N]:
 *     y[t, s] = x[t, S == 1 ? 0 : s] @ W_e.T,  e = ids[t, s], negative from the end (e + E), then
 *     clamped to [0, E) (as take reads an index: a bad id never reads outside w).
 * The pairs (t, s) are sorted by expert (a counting sort; each expert's pairs in token order);
 * each expert with pairs runs the linears' own kernels (twq_i8_run, twq_float_run: the GEMV up to
 * 8 rows, the GEMM beyond) on its rows of x gathered into a scratch, and its rows of y are
 * scattered back. An expert with one row reads it from x and writes y in place (decoding: nothing
 * copied), and one holding all of x's rows in order reads x itself. With S == 1 a token routed to
 * one expert by two slots is one row. So every output has the bits tw_qlinear_<fmt> gives that
 * row (a row's result does not depend on the other rows of the call). The scratch is a few
 * allocations a call, none an expert (the integer path's quantized x: one for the call).
 * With AVX-512, the integer path's experts of at most 8 rows (all of them when decoding) run as
 * one GEMV (twq_experts_gemv): x quantized once, one parallel loop over all those experts' tiles
 * of twq_i8_gemv's tile kernels: one fork and join a call instead of one an expert; the experts
 * of more rows (prefill) run their GEMMs one by one. bf16x16 with AVX-512 BF16 the same way (x
 * rounded to bf16 once, twq_gemv_bf16's tile kernels); the other float formats expert by expert.
 *
 * Entry points: tw_qexperts_<fmt>(x, w, ids, ids_bytes, y, T, S, slots, E, N, K) for every
 * format of tw_qlinear_<fmt>; tw_qexperts_packed, the Python extern's trampoline. 0 on success,
 * TWQ_E* for a bad argument (TWQ_EEXPERTS: S neither 1 nor slots, no experts, ids_bytes not 4
 * or 8). */

#define TWQ_EEXPERTS 7 /* expert_linear: x's dim 1 neither 1 nor the slots, no experts, or ids neither int32 nor int64 */

/* The expert of pair p, as the header says. */
static inline int64_t twq_expert_of(const void* ids, int64_t ids_bytes, int64_t p, int64_t E) {
    int64_t e = ids_bytes == 8 ? ((const int64_t*)ids)[p] : (int64_t)((const int32_t*)ids)[p];
    if (e < 0) e += E;
    return e < 0 ? 0 : e >= E ? E - 1 : e;
}

/* y = x @ W.T on m rows, as twq_run runs it (fmt the plain format), with the caller's quantized-x
 * scratch (the integer path; room for m rows). */
static int twq_experts_product(int fmt, int x16, const float* x, const uint8_t* w, float* y, int64_t m, int64_t N, int64_t K, int64_t rb, twq_xq* xq) {
    if (TWQ_WITH_INT8 && twq_is_i8(fmt)) return twq_i8_run(fmt, x16, x, xq, w, NULL, y, m, N, rb);
    if (!TWQ_WITH_BF16 && !TWQ_WITH_F16) return TWQ_EFAMILY;
    return twq_float_run(fmt, x16, x, w, y, m, N, K, rb);
}

/* The rows of x of an expert's pairs pe[0 .. np): one per pair, but with S == 1 one per token. */
static inline int64_t twq_expert_rows(const int64_t* pe, int64_t np, int64_t S, int64_t slots) {
    if (S != 1) return np;
    int64_t m = 0;
    for (int64_t i = 0, last = -1; i < np; ++i)
        if (pe[i] / slots != last) {
            last = pe[i] / slots;
            ++m;
        }
    return m;
}

/* The row of x of pair p. */
static inline int64_t twq_expert_xrow(int64_t p, int64_t S, int64_t slots) { return S == 1 ? p / slots : p; }

/* y's rows of an expert's pairs pe[0 .. np) from its m rows of results ym (row by row, as
 * twq_expert_rows counts them); with m == 1 ym is the first pair's row, copied to the others. */
static void twq_expert_scatter(const int64_t* pe, int64_t np, int64_t m, const float* ym, float* y, int64_t S, int64_t slots, int64_t N) {
    for (int64_t i = 0, r = -1, last = -1; i < np; ++i) {
        const int64_t row = twq_expert_xrow(pe[i], S, slots);
        if (row != last) {
            last = row;
            ++r;
        }
        if (ym + r * N != y + pe[i] * N) memcpy(y + pe[i] * N, ym + (m == 1 ? 0 : r) * N, (size_t)N * sizeof(float));
    }
}

#ifdef TWQ_AVX512
/* Quantized rows r .. of xq as a twq_xq of their own (pointers into xq's scratch). */
static twq_xq twq_xq_rows(const twq_xq* xq, int64_t r) {
    twq_xq v = *xq;
    v.q += r * xq->K;
    v.d += r * xq->nb;
    v.cx += r * xq->nb;
    v.corr += r * xq->nb;
    v.corr16 += r * xq->nb;
    return v;
}

/* Row r of xq copied to row i of to (the same quantization: a row's fields depend on it alone). */
static void twq_xq_copy_row(const twq_xq* to, int64_t i, const twq_xq* xq, int64_t r) {
    const int64_t nb = xq->nb;
    memcpy(to->q + i * xq->K, xq->q + r * xq->K, (size_t)xq->K);
    memcpy(to->d + i * nb, xq->d + r * nb, (size_t)nb * sizeof(float));
    memcpy(to->cx + i * nb, xq->cx + r * nb, (size_t)nb * sizeof(float));
    memcpy(to->corr + i * nb, xq->corr + r * nb, (size_t)nb * sizeof(int32_t));
    memcpy(to->corr16 + i * nb, xq->corr16 + r * nb, (size_t)nb * sizeof(int32_t));
}

typedef struct {
    twq_xq xq;          /* integer path: the expert's rows of x, quantized */
    const uint16_t* xb; /* bf16x16: its rows of x rounded to bf16 (row stride kp) */
    const uint8_t* w;   /* its rows of W */
    float* y;           /* its m rows of results (N each) */
    int64_t m;
} twq_expert_gemv;

/* The routed experts of at most gmax rows (one pass of the GEMV's kernels: TWQ_I8_GEMV_MAX_M, for
 * bf16 TWQ_GEMV_MAX_M; at most 8, their tables), ``small`` of them, the rows of those with
 * several ``gathered``, on the integer path or bf16x16's with AVX-512 BF16 (``bf16``): x's rows
 * quantized (rounded to bf16) once, with S == 1 a token's row serving all its experts; each
 * expert's rows gathered (copied) where it has several; then one parallel loop over those
 * experts' tiles of 16 W rows, the tile kernels of twq_i8_gemv (twq_gemv_bf16's): so their bits.
 * One fork and join a call, not one an expert (at 2 threads on a loaded machine each join may
 * wait out a time slice). An expert of one row writes y in place. */
static int twq_experts_gemv(int fmt, int x16, int bf16, const float* x, const uint8_t* w, float* y, const int64_t* start, const int64_t* order, int64_t S, int64_t slots, int64_t E, int64_t N,
                            int64_t K, int64_t rb, int64_t xrows, int64_t gmax, int64_t small, int64_t gathered) {
    const int64_t kp = (K + 31) / 32 * 32; /* bf16x16: x's row stride */
    twq_xq xa, xg;
    memset(&xa, 0, sizeof xa);
    memset(&xg, 0, sizeof xg);
    float *xas = NULL, *xgs = NULL;
    if (bf16) {
        xas = twq_alloc((xrows * kp + 1) / 2);
        xgs = gathered ? twq_alloc((gathered * kp + 1) / 2) : NULL;
    } else {
        xas = twq_xq_alloc(&xa, xrows, K);
        xgs = gathered ? twq_xq_alloc(&xg, gathered, K) : NULL;
    }
    float* yg = gathered ? twq_alloc(gathered * N) : NULL;
    twq_expert_gemv* g = (twq_expert_gemv*)malloc((size_t)small * sizeof(twq_expert_gemv));
    int rc = xas == NULL || g == NULL || (gathered && (xgs == NULL || yg == NULL)) ? TWQ_ENOMEM : 0;
    if (rc == 0) {
#ifdef TWQ_BF16DOT
        if (bf16) twq_x_bf16(x, xrows, K, (uint16_t*)xas, kp); /* outside a parallel region: this thread's */
#endif
        if (!bf16) twq_quantize(fmt, x, &xa, 0, xrows);
        int64_t n = 0, at = 0;
        for (int64_t e = 0; e < E; ++e) {
            const int64_t *pe = order + start[e], np = start[e + 1] - start[e];
            const int64_t m = twq_expert_rows(pe, np, S, slots);
            if (np == 0 || m > gmax) continue;
            twq_expert_gemv* ge = g + n++;
            ge->w = w + e * N * rb;
            ge->m = m;
            if (m == 1) {
                const int64_t row = twq_expert_xrow(pe[0], S, slots);
                if (bf16) ge->xb = (const uint16_t*)xas + row * kp;
                else ge->xq = twq_xq_rows(&xa, row);
                ge->y = y + pe[0] * N;
                continue;
            }
            if (bf16) ge->xb = (const uint16_t*)xgs + at * kp;
            else ge->xq = twq_xq_rows(&xg, at);
            ge->y = yg + at * N;
            for (int64_t i = 0, r = 0, last = -1; i < np; ++i) {
                const int64_t row = twq_expert_xrow(pe[i], S, slots);
                if (row == last) continue;
                last = row;
                if (bf16) memcpy((uint16_t*)xgs + (at + r++) * kp, (const uint16_t*)xas + row * kp, (size_t)kp * sizeof(uint16_t));
                else twq_xq_copy_row(&ge->xq, r++, &xa, row);
            }
            at += m;
        }
        const int64_t tiles = (N + 15) / 16, slot = twq_i8_slot(fmt);
        const int par = small * N * rb >= TWQ_PAR_MIN_BYTES;
        (void)par; /* used by OpenMP only */
        (void)slot;
#pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < small * tiles; ++i) {
            const twq_expert_gemv* ge = g + i / tiles;
            const int64_t n0 = 16 * (i % tiles), nr = N - n0 < 16 ? N - n0 : 16;
#ifdef TWQ_BF16DOT
            if (bf16) {
                twq_gemv_bf16x16_table[ge->m - 1](ge->xb, kp, ge->w + n0 * rb, 16 * rb, ge->y + n0, N, K);
                continue;
            }
#endif
            twq_i8_gemv_table[x16][slot][ge->m - 1](&ge->xq, 0, ge->w, rb, n0, nr, ge->y, N);
        }
        n = 0;
        for (int64_t e = 0; e < E; ++e) {
            const int64_t *pe = order + start[e], np = start[e + 1] - start[e];
            const int64_t m = twq_expert_rows(pe, np, S, slots);
            if (np > 0 && m <= gmax) twq_expert_scatter(pe, np, m, g[n++].y, y, S, slots, N);
        }
    }
    free(g);
    twq_free(yg);
    twq_free(xgs);
    twq_free(xas);
    return rc;
}
#endif

static int twq_experts(int fmt, const float* x, const uint8_t* w, const void* ids, int64_t ids_bytes, float* y, int64_t T, int64_t S, int64_t slots, int64_t E, int64_t N, int64_t K) {
    if (fmt < 0 || fmt >= TWQ_NCODES) return TWQ_EFMT;
    const int x16 = fmt >= TWQ_NFMT;
    if (x16) fmt = twq_x16_base[fmt - TWQ_NFMT];
    if (!twq_in_build(fmt)) return TWQ_EFAMILY;
    if (T < 0 || S < 0 || slots < 0 || E < 0 || N < 0 || K < 0 || K % twq_block[fmt] != 0 || (x16 && N % 16 != 0) || (x16 && fmt == TWQ_BF16 && K % 2 != 0)) return TWQ_ESHAPE;
    if ((S != 1 && S != slots) || E == 0 || (ids_bytes != 4 && ids_bytes != 8)) return TWQ_EEXPERTS;
    const int64_t P = T * slots; /* the pairs (t, s), p = t * slots + s: y's rows */
    if (P == 0 || N == 0) return 0;
    if (y == NULL) return TWQ_ENULL;
    if (K == 0) {
        memset(y, 0, (size_t)(P * N) * sizeof(float));
        return 0;
    }
    if (x == NULL || w == NULL || ids == NULL) return TWQ_ENULL;
    const int64_t rb = K / twq_block[fmt] * twq_nbytes[fmt], xrows = S == 1 ? T : P;
    int64_t* start = (int64_t*)malloc((size_t)(2 * E + 1 + P) * sizeof(int64_t)); /* start[E + 1], next[E], order[P] */
    if (start == NULL) return TWQ_ENOMEM;
    int64_t *next = start + E + 1, *order = next + E;
    memset(start, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t p = 0; p < P; ++p) ++start[twq_expert_of(ids, ids_bytes, p, E) + 1];
    for (int64_t e = 0; e < E; ++e) {
        start[e + 1] += start[e];
        next[e] = start[e];
    }
    for (int64_t p = 0; p < P; ++p) order[next[twq_expert_of(ids, ids_bytes, p, E)]++] = p;
#ifdef TWQ_BF16DOT
    const int bf16 = x16 && fmt == TWQ_BF16; /* bf16x16 with vdpbf16ps: twq_experts_gemv runs it too */
#else
    const int bf16 = 0;
#endif
    const int64_t gmax = bf16 ? TWQ_GEMV_MAX_M : TWQ_I8_GEMV_MAX_M; /* the most rows one pass of the GEMV takes (more: twq_run, an expert at a time) */
    int64_t mall = 1, mx = 0, my = 0, small = 0, gathered = 0; /* the most rows an expert runs, gathers from x, scatters to y; twq_experts_gemv's experts and rows */
    for (int64_t e = 0; e < E; ++e) {
        const int64_t np = start[e + 1] - start[e], m = twq_expert_rows(order + start[e], np, S, slots);
        small += np > 0 && m <= gmax;
        gathered += m > 1 && m <= gmax ? m : 0;
        mall = m > mall ? m : mall;
        if (m > 1 && m < xrows && m > mx) mx = m;
        if (m > 1 && !(np == P && m == P) && m > my) my = m;
    }
    int rc = 0, fused = 0; /* whether twq_experts_gemv ran the experts of at most gmax rows */
#ifdef TWQ_AVX512
    if ((twq_is_i8(fmt) || bf16) && small > 0) {
        rc = twq_experts_gemv(fmt, x16, bf16, x, w, y, start, order, S, slots, E, N, K, rb, xrows, gmax, small, gathered);
        fused = 1;
    }
    if (fused && (rc != 0 || mall <= gmax)) { /* nothing left for the loop below */
        free(start);
        return rc;
    }
#endif
    float *xg = NULL, *yg = NULL, *xqs = NULL;
    twq_xq xq;
    memset(&xq, 0, sizeof xq);
    if (twq_is_i8(fmt) && (xqs = twq_xq_alloc(&xq, mall, K)) == NULL) rc = TWQ_ENOMEM;
    if (rc == 0 && mx > 0 && (xg = twq_alloc(mx * K)) == NULL) rc = TWQ_ENOMEM;
    if (rc == 0 && my > 0 && (yg = twq_alloc(my * N)) == NULL) rc = TWQ_ENOMEM;
    for (int64_t e = 0; rc == 0 && e < E; ++e) { /* each expert alone: the GEMV, or the GEMM for many rows */
        const int64_t *pe = order + start[e], np = start[e + 1] - start[e];
        if (np == 0) continue;
        const int64_t m = twq_expert_rows(pe, np, S, slots);
        if (fused && m <= gmax) continue;
        const float* xe = x + (m == 1 ? twq_expert_xrow(pe[0], S, slots) * K : 0); /* one row, or all of x's rows in order: in place */
        if (m > 1 && m < xrows) {
            for (int64_t i = 0, r = 0, last = -1; i < np; ++i) {
                const int64_t row = twq_expert_xrow(pe[i], S, slots);
                if (row == last) continue;
                last = row;
                memcpy(xg + r++ * K, x + row * K, (size_t)K * sizeof(float));
            }
            xe = xg;
        }
        float* ye = m == 1 ? y + pe[0] * N : np == P && m == P ? y : yg; /* one row, or every pair in order: in place */
        rc = twq_experts_product(fmt, x16, xe, w + e * N * rb, ye, m, N, K, rb, &xq);
        if (rc == 0) twq_expert_scatter(pe, np, m, ye, y, S, slots, N);
    }
    twq_free(yg);
    twq_free(xg);
    twq_free(xqs);
    free(start);
    return rc;
}

#define TWQ_EXPERTS_ENTRY(NAME, CODE) \
    int32_t tw_qexperts_##NAME(const float* x, const uint8_t* w, const void* ids, int64_t ids_bytes, float* y, int64_t T, int64_t S, int64_t slots, int64_t E, int64_t N, int64_t K) { \
        return twq_experts(CODE, x, w, ids, ids_bytes, y, T, S, slots, E, N, K); \
    }
TWQ_EACH_FORMAT(TWQ_EXPERTS_ENTRY)

/* The Python extern's trampoline: a[] = {fmt (the enum), x, w, ids, y (NumPy array object
 * addresses), T, S, slots, E, N, K, data offset, ids' item size}; each array's data pointer is
 * read at byte offset a[11] of its object, as tw_qlinear_packed does. */
int32_t tw_qexperts_packed(const int64_t* a) {
    if (a == NULL) return TWQ_ENULL;
    const char *xo = (const char*)(intptr_t)a[1], *wo = (const char*)(intptr_t)a[2], *io = (const char*)(intptr_t)a[3], *yo = (const char*)(intptr_t)a[4];
    if (xo == NULL || wo == NULL || io == NULL || yo == NULL) return TWQ_ENULL;
    const int64_t off = a[11];
    return twq_experts((int)a[0], *(const float* const*)(xo + off), *(const uint8_t* const*)(wo + off), *(const void* const*)(io + off), a[12], *(float* const*)(yo + off), a[5], a[6], a[7], a[8],
                       a[9], a[10]);
}
