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
 * row (a row's result does not depend on the other rows of the call). The scratch is one
 * allocation for the routing and, where some expert has more than one row, one for the rows (the
 * integer path's quantized x: one for the call, not one per expert).
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
    if ((TWQ_WITH_INT8 || TWQ_WITH_KQUANT) && twq_is_i8(fmt)) return twq_i8_run(fmt, x16, x, xq, w, NULL, y, m, N, rb);
    if (!TWQ_WITH_BF16 && !TWQ_WITH_FLOAT) return TWQ_EFAMILY;
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
    int64_t mall = 1, mx = 0, my = 0; /* the most rows an expert runs, gathers from x, scatters to y */
    for (int64_t e = 0; e < E; ++e) {
        const int64_t np = start[e + 1] - start[e], m = twq_expert_rows(order + start[e], np, S, slots);
        mall = m > mall ? m : mall;
        if (m > 1 && m < xrows && m > mx) mx = m;
        if (m > 1 && !(np == P && m == P) && m > my) my = m;
    }
    float *xg = NULL, *yg = NULL, *xqs = NULL;
    twq_xq xq;
    memset(&xq, 0, sizeof xq);
    int rc = 0;
    if (twq_is_i8(fmt) && (xqs = twq_xq_alloc(&xq, mall, K)) == NULL) rc = TWQ_ENOMEM;
    if (rc == 0 && mx > 0 && (xg = twq_alloc(mx * K)) == NULL) rc = TWQ_ENOMEM;
    if (rc == 0 && my > 0 && (yg = twq_alloc(my * N)) == NULL) rc = TWQ_ENOMEM;
    for (int64_t e = 0; rc == 0 && e < E; ++e) {
        const int64_t *pe = order + start[e], np = start[e + 1] - start[e];
        if (np == 0) continue;
        const uint8_t* we = w + e * N * rb;
        const int64_t m = twq_expert_rows(pe, np, S, slots);
        if (m == 1) { /* one row of x (one pair, or one token's slots): in place */
            float* y0 = y + pe[0] * N;
            rc = twq_experts_product(fmt, x16, x + (S == 1 ? pe[0] / slots : pe[0]) * K, we, y0, 1, N, K, rb, &xq);
            for (int64_t i = 1; rc == 0 && i < np; ++i) memcpy(y + pe[i] * N, y0, (size_t)N * sizeof(float));
            continue;
        }
        const float* xe = x; /* all of x's rows, in order: x itself */
        if (m < xrows) {
            for (int64_t i = 0, r = -1, last = -1; i < np; ++i) {
                const int64_t row = S == 1 ? pe[i] / slots : pe[i];
                if (row == last) continue;
                last = row;
                memcpy(xg + ++r * K, x + row * K, (size_t)K * sizeof(float));
            }
            xe = xg;
        }
        float* ye = np == P && m == P ? y : yg; /* every pair, one row each, in order: y itself */
        rc = twq_experts_product(fmt, x16, xe, we, ye, m, N, K, rb, &xq);
        if (rc != 0 || ye == y) continue;
        for (int64_t i = 0, r = -1, last = -1; i < np; ++i) {
            const int64_t row = S == 1 ? pe[i] / slots : pe[i];
            if (row != last) {
                last = row;
                ++r;
            }
            memcpy(y + pe[i] * N, yg + r * N, (size_t)N * sizeof(float));
        }
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
TWQ_EXPERTS_ENTRY(q4_0, TWQ_Q4_0)
TWQ_EXPERTS_ENTRY(q4_1, TWQ_Q4_1)
TWQ_EXPERTS_ENTRY(q5_0, TWQ_Q5_0)
TWQ_EXPERTS_ENTRY(q5_1, TWQ_Q5_1)
TWQ_EXPERTS_ENTRY(q8_0, TWQ_Q8_0)
TWQ_EXPERTS_ENTRY(bf16, TWQ_BF16)
TWQ_EXPERTS_ENTRY(f16, TWQ_F16)
TWQ_EXPERTS_ENTRY(q4_k, TWQ_Q4_K)
TWQ_EXPERTS_ENTRY(q6_k, TWQ_Q6_K)
TWQ_EXPERTS_ENTRY(q5_k, TWQ_Q5_K)
TWQ_EXPERTS_ENTRY(q3_k, TWQ_Q3_K)
TWQ_EXPERTS_ENTRY(q2_k, TWQ_Q2_K)
TWQ_EXPERTS_ENTRY(iq4_nl, TWQ_IQ4_NL)
TWQ_EXPERTS_ENTRY(iq4_xs, TWQ_IQ4_XS)
TWQ_EXPERTS_ENTRY(q4_0x16, TWQ_Q4_0X16)
TWQ_EXPERTS_ENTRY(q4_1x16, TWQ_Q4_1X16)
TWQ_EXPERTS_ENTRY(q5_0x16, TWQ_Q5_0X16)
TWQ_EXPERTS_ENTRY(q5_1x16, TWQ_Q5_1X16)
TWQ_EXPERTS_ENTRY(q8_0x16, TWQ_Q8_0X16)
TWQ_EXPERTS_ENTRY(bf16x16, TWQ_BF16X16)
TWQ_EXPERTS_ENTRY(q4_kx16, TWQ_Q4_KX16)
TWQ_EXPERTS_ENTRY(q5_kx16, TWQ_Q5_KX16)
TWQ_EXPERTS_ENTRY(q6_kx16, TWQ_Q6_KX16)
TWQ_EXPERTS_ENTRY(q3_kx16, TWQ_Q3_KX16)
TWQ_EXPERTS_ENTRY(q2_kx16, TWQ_Q2_KX16)
TWQ_EXPERTS_ENTRY(iq4_nlx16, TWQ_IQ4_NLX16)
TWQ_EXPERTS_ENTRY(iq4_xsx16, TWQ_IQ4_XSX16)

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
