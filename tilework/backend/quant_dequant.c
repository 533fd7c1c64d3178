/* The loaders' path (spliced into quant_kernels.c by quant.py): dequantization of whole rows,
 * and the interleaving of plain rows into the x16 layouts.
 *
 * tw_quant_dequantize(fmt, w, rows, K, out, bf16) decodes rows x K weights of fmt blocks (the
 * plain layouts: q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16 q4_k q6_k q5_k q3_k q2_k iq4_nl iq4_xs) into float32 rows, or with bf16 set into
 * bfloat16 bits (uint16, each float32 rounded to nearest even, a NaN kept a quiet NaN: the
 * prelude's tw_f2bf, tilework.op.quant.bf16_bits), the threads sharing the rows. Each float32 is
 * the one tilework.llm.quant's NumPy decoders give: the same products and sums in the same order,
 * none contracted into an FMA (q4_k's, q5_k's and q2_k's scale * q - offset rounds twice, as
 * NumPy's does; the other formats' products are exact: iq4_xs's d * (ls - 32) * value has at most
 * 11 + 6 + 7 significant bits). A 135M-weight model decodes in about a tenth of the time
 * NumPy takes (several passes over the float32 copy there, one here).
 */

#if defined(__GNUC__) && !defined(__clang__)
#define TWQ_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define TWQ_NO_CONTRACT
#endif

/* The twq_block[fmt] weights of the block at b, as float32. */
TWQ_NO_CONTRACT static void twq_dequant_block(int fmt, const uint8_t* b, float* out) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
    switch (fmt) {
    case TWQ_Q8_0: {
        const float d = twq_h2f(twq_u16(b));
        for (int l = 0; l < 32; ++l) out[l] = (float)(int8_t)b[2 + l] * d;
        return;
    }
    case TWQ_Q4_0: {
        const float d = twq_h2f(twq_u16(b));
        for (int l = 0; l < 16; ++l) {
            out[l] = d * (float)((b[2 + l] & 0xF) - 8);
            out[l + 16] = d * (float)((b[2 + l] >> 4) - 8);
        }
        return;
    }
    case TWQ_Q4_1: {
        const float d = twq_h2f(twq_u16(b)), m = twq_h2f(twq_u16(b + 2));
        for (int l = 0; l < 16; ++l) {
            out[l] = d * (float)(b[4 + l] & 0xF) + m;
            out[l + 16] = d * (float)(b[4 + l] >> 4) + m;
        }
        return;
    }
    case TWQ_Q5_0: case TWQ_Q5_1: { /* q = nibble | bit l of qh << 4; q5_0: d * (q - 16), q5_1: d * q + m */
        const int64_t head = twq_head(fmt);
        const float d = twq_h2f(twq_u16(b)), m = fmt == TWQ_Q5_1 ? twq_h2f(twq_u16(b + 2)) : 0.0f;
        const uint32_t qh = (uint32_t)twq_i32(b + head);
        for (int l = 0; l < 32; ++l) {
            const int nib = l < 16 ? b[head + 4 + l] & 0xF : b[head + 4 + l - 16] >> 4;
            const int q = nib | (int)((qh >> l) & 1u) << 4;
            out[l] = fmt == TWQ_Q5_0 ? d * (float)(q - 16) : d * (float)q + m;
        }
        return;
    }
    case TWQ_BF16: out[0] = twq_bf2f(twq_u16(b)); return;
    case TWQ_F16: out[0] = twq_h2f(twq_u16(b)); return;
    case TWQ_Q4_K: {
        const float d = twq_h2f(twq_u16(b)), dmin = twq_h2f(twq_u16(b + 2));
        for (int s = 0; s < 8; ++s) { /* sub-block s: chunk s / 2 of the nibbles, low for even s */
            int sc, mn;
            twq_k4_scale(b + 4, s, &sc, &mn);
            const float scale = d * (float)sc, offset = dmin * (float)mn;
            const uint8_t* qs = b + 16 + 32 * (s >> 1);
            const int shift = (s & 1) * 4;
            for (int l = 0; l < 32; ++l) {
                const float p = scale * (float)((qs[l] >> shift) & 0xF);
                out[32 * s + l] = p - offset;
            }
        }
        return;
    }
    case TWQ_Q5_K: { /* q4_k's, with bit s of qh[l] (bytes 16-47) the fifth bit of q */
        const float d = twq_h2f(twq_u16(b)), dmin = twq_h2f(twq_u16(b + 2));
        for (int s = 0; s < 8; ++s) {
            int sc, mn;
            twq_k4_scale(b + 4, s, &sc, &mn);
            const float scale = d * (float)sc, offset = dmin * (float)mn;
            const uint8_t* qs = b + 48 + 32 * (s >> 1);
            const int shift = (s & 1) * 4;
            for (int l = 0; l < 32; ++l) {
                const float p = scale * (float)(((qs[l] >> shift) & 0xF) | (((b[16 + l] >> s) & 1) << 4));
                out[32 * s + l] = p - offset;
            }
        }
        return;
    }
    case TWQ_Q3_K: {
        const float d = twq_h2f(twq_u16(b + 108));
        for (int s = 0; s < 8; ++s) { /* quarter t of half s / 4; hmask (bytes 0-31) bit s */
            const uint8_t* qs = b + 32 + 32 * (s >> 2);
            const int t = s & 3;
            for (int l = 0; l < 32; ++l) {
                const float scale = d * (float)twq_k3_scale(b + 96, 2 * s + (l >> 4));
                const int q = ((qs[l] >> (2 * t)) & 3) - (((b[l] >> s) & 1) ? 0 : 4);
                out[32 * s + l] = scale * (float)q;
            }
        }
        return;
    }
    case TWQ_Q2_K: {
        const float d = twq_h2f(twq_u16(b + 80)), dmin = twq_h2f(twq_u16(b + 82));
        for (int s = 0; s < 8; ++s) { /* quarter t of half s / 4; byte g of the scales: scale, min */
            const uint8_t* qs = b + 16 + 32 * (s >> 2);
            const int t = s & 3;
            for (int l = 0; l < 32; ++l) {
                const int g = 2 * s + (l >> 4);
                const float scale = d * (float)(b[g] & 0xF), offset = dmin * (float)(b[g] >> 4);
                const float p = scale * (float)((qs[l] >> (2 * t)) & 3);
                out[32 * s + l] = p - offset;
            }
        }
        return;
    }
    case TWQ_IQ4_NL: case TWQ_IQ4_XS: { /* d * value (iq4_xs: (d * (ls - 32)) * value per sub-block of 32) */
        const float d = twq_h2f(twq_u16(b));
        for (int s = 0; s < (fmt == TWQ_IQ4_XS ? 8 : 1); ++s) {
            const float dl = fmt == TWQ_IQ4_XS ? d * (float)(twq_iq4xs_ls(b, s) - 32) : d;
            const uint8_t* qs = b + twq_iq4_qs(fmt, s);
            for (int l = 0; l < 16; ++l) {
                out[32 * s + l] = dl * (float)twq_iq4_values[qs[l] & 0xF];
                out[32 * s + l + 16] = dl * (float)twq_iq4_values[qs[l] >> 4];
            }
        }
        return;
    }
    default: { /* TWQ_Q6_K */
        const float d = twq_h2f(twq_u16(b + 208));
        for (int s = 0; s < 8; ++s) { /* quarter t of half s / 4 */
            const int half = s >> 2, t = s & 3;
            const uint8_t* ql = b + 64 * half + 32 * (t & 1);
            const uint8_t* qh = b + 128 + 32 * half;
            for (int l = 0; l < 32; ++l) {
                const int nib = t >= 2 ? ql[l] >> 4 : ql[l] & 0xF;
                const int q = (nib | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
                out[32 * s + l] = d * (float)(int8_t)b[192 + 2 * s + (l >> 4)] * (float)q;
            }
        }
        return;
    }
    }
}

#define TWQ_DQ_MIN 65536 /* fewer weights than this decode on one thread */

int32_t tw_quant_dequantize(int32_t fmt, const uint8_t* w, int64_t rows, int64_t K, void* out, int32_t bf16) {
    if (fmt < 0 || fmt >= TWQ_NFMT) return TWQ_EFMT;
    if (rows < 0 || K < 0 || K % twq_block[fmt]) return TWQ_ESHAPE;
    if (rows == 0 || K == 0) return 0;
    if (w == NULL || out == NULL) return TWQ_ENULL;
    const int64_t bw = twq_block[fmt], nb = K / bw, nbytes = twq_nbytes[fmt];
    const int par = rows * K >= TWQ_DQ_MIN;
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = w + r * nb * nbytes;
        float blk[256];
        for (int64_t j = 0; j < nb; ++j) {
            if (!bf16) {
                twq_dequant_block(fmt, row + j * nbytes, (float*)out + r * K + j * bw);
                continue;
            }
            twq_dequant_block(fmt, row + j * nbytes, blk);
            uint16_t* o = (uint16_t*)out + r * K + j * bw;
            for (int64_t l = 0; l < bw; ++l) {
                uint32_t bits;
                memcpy(&bits, &blk[l], 4);
                o[l] = (bits & 0x7FFFFFFFu) > 0x7F800000u ? (uint16_t)((bits >> 16) | 0x40u) : (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
            }
        }
    }
    return 0;
}

/* tw_quant_interleave(fmt, src, n, rb, dst): n plain rows of rb bytes (n a multiple of 16) of
 * q4_0, q4_1, q5_0, q5_1, q8_0, a k-quant, iq4_nl, iq4_xs (fmt the plain code) or bf16 (TWQ_BF16: blocks of a pair of weights) in the
 * layout of the format's x16 twin (tilework.op.quant: per group of 16 rows and block, the
 * rows' d, then q4_1's and q5_1's m (q4_k's, q5_k's and q2_k's dmin, iq4_xs's scales_h), then the payload (the rest of the block, in
 * order; q6_k's and q3_k's d, q2_k's d and dmin are their last bytes, twq_head_at) in runs of 4 bytes, row by row), the threads sharing
 * the groups: the bytes of tilework.op.quant.interleave_rows, without its byte-gather. */
int32_t tw_quant_interleave(int32_t fmt, const uint8_t* src, int64_t n, int64_t rb, uint8_t* dst) {
    if (fmt != TWQ_Q4_0 && fmt != TWQ_Q4_1 && !twq_is_q5(fmt) && fmt != TWQ_Q8_0 && fmt != TWQ_BF16 && !twq_is_k(fmt) && !twq_is_iq4(fmt)) return TWQ_EFMT;
    const int64_t nbytes = fmt == TWQ_BF16 ? 4 : twq_nbytes[fmt], head = fmt == TWQ_BF16 ? 0 : twq_head(fmt);
    const int64_t at = fmt == TWQ_BF16 ? 0 : twq_head_at(fmt), pay = at ? 0 : head; /* the head's and the payload's bytes in a block */
    if (n < 0 || rb < 0 || n % 16 || rb % nbytes) return TWQ_ESHAPE;
    if (n == 0 || rb == 0) return 0;
    if (src == NULL || dst == NULL) return TWQ_ENULL;
    const int64_t nb = rb / nbytes, runs = (nbytes - head) / 4, groups = n / 16;
    const int par = n * rb >= (1 << 20);
    (void)par; /* used by OpenMP only */
#pragma omp parallel for schedule(static) if (par)
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* rows = src + g * 16 * rb;
        uint8_t* out = dst + g * 16 * rb;
        for (int64_t j = 0; j < nb; ++j) {
            uint8_t* o = out + j * 16 * nbytes;
            for (int r = 0; r < 16; ++r) {
                const uint8_t* b = rows + r * rb + j * nbytes;
                if (head) memcpy(o + 2 * r, b + at, 2);
                if (head == 4) memcpy(o + 32 + 2 * r, b + at + 2, 2);
                for (int64_t t = 0; t < runs; ++t) memcpy(o + 16 * head + 64 * t + 4 * r, b + pay + 4 * t, 4);
            }
        }
    }
    return 0;
}
