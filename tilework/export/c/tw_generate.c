/* tilework export: greedy generation with an exported Llama-family decoder, from C.
 *
 *     tw_generate model.twb N_NEW TOKEN_ID... [--logits OUT.npy]
 *
 * Runs `prefill` on the prompt's token ids (its `rows` the last one), then `decode` N_NEW times, each on the argmax of
 * the last logits (the first maximum), and prints the N_NEW generated ids on one line
 * (tokenization stays outside). The KV cache is one sequence in a pool of pages that holds
 * the prompt and the new tokens: k [layers, pages, kv_heads, head_dim / w + TW_LLM_KV_SCALES,
 * page, w] and v [layers, pages, page / w, kv_heads, head_dim, w], in pairs of w =
 * TW_LLM_KV_PAIR (2 for bfloat16, 4 for int8, else 1; of the dtype the decoder was compiled
 * for: TW_LLM_KV_CODE and TW_LLM_KV_BITS, float32, a 16-bit float or int8, whose scales are
 * the row TW_LLM_KV_SCALES adds), the page table [1, pages] = 0, 1, ...,
 * kv_len [1] the tokens already in the cache. --logits writes every step's logits as
 * float32 [N_NEW + 1, vocab]. Timings go to stderr. A token id outside [0, vocab) or an
 * argument that is not an integer is refused (exit 2): the decoder's embedding would clamp it
 * to a row of the table (a wrong token, silently). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm_config.h"
#include "tw_model.h"
#include "tw_npy.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int32_t argmax(const float* x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* `text` as an integer in [lo, hi) (1), or a message naming `what` and the range `within` (0). */
static int parse_int(const char* text, long lo, long hi, const char* what, const char* within, long* out) {
    char* end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0') {
        fprintf(stderr, "error: %s '%s' is not an integer\n", what, text);
        return 0;
    }
    if (errno == ERANGE || value < lo || value >= hi) {
        fprintf(stderr, "error: %s %s is outside %s [%ld, %ld)\n", what, text, within, lo, hi);
        return 0;
    }
    *out = value;
    return 1;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: tw_generate WEIGHTS.twb N_NEW TOKEN_ID... [--logits OUT.npy]\n");
        return 2;
    }
    const char* logits_path = NULL;
    long value;
    if (!parse_int(argv[2], 0, TW_LLM_CONTEXT, "N_NEW", "the context", &value)) return 2;
    int n_new = (int)value;
    int32_t* prompt = (int32_t*)malloc(sizeof(int32_t) * (size_t)argc);
    int64_t n_prompt = 0;
    for (int i = 3; i < argc; ++i) {
        if (strcmp(argv[i], "--logits") == 0 && i + 1 < argc) logits_path = argv[++i];
        else if (parse_int(argv[i], 0, TW_LLM_VOCAB, "token id", "the vocabulary", &value)) prompt[n_prompt++] = (int32_t)value;
        else return 2;
    }
    if (n_prompt < 1 || n_new < 0 || n_prompt + n_new > TW_LLM_CONTEXT) {
        fprintf(stderr, "error: need 1 to %d prompt and new tokens in all\n", TW_LLM_CONTEXT);
        return 2;
    }
    tw_model* m = tw_model_create(argv[1]);
    if (m == NULL) {
        fprintf(stderr, "error: %s\n", tw_model_error(NULL));
        return 1;
    }
    int64_t pages = (n_prompt + n_new + TW_LLM_PAGE - 1) / TW_LLM_PAGE;
    int64_t s_k[6] = {TW_LLM_LAYERS, pages, TW_LLM_KV_HEADS, TW_LLM_HEAD_DIM / TW_LLM_KV_PAIR + TW_LLM_KV_SCALES, TW_LLM_PAGE, TW_LLM_KV_PAIR};
    int64_t s_v[6] = {TW_LLM_LAYERS, pages, TW_LLM_PAGE / TW_LLM_KV_PAIR, TW_LLM_KV_HEADS, TW_LLM_HEAD_DIM, TW_LLM_KV_PAIR};
    int64_t k_len = 1, v_len = 1;
    for (int i = 0; i < 6; ++i) {
        k_len *= s_k[i];
        v_len *= s_v[i];
    }
    void* k = calloc((size_t)k_len, TW_LLM_KV_BITS / 8);
    void* v = calloc((size_t)v_len, TW_LLM_KV_BITS / 8);
    int32_t* table = (int32_t*)malloc(sizeof(int32_t) * (size_t)pages);
    float* all_logits = (float*)malloc(sizeof(float) * (size_t)(n_new + 1) * TW_LLM_VOCAB);
    int32_t* out = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n_new + 1));
    if (k == NULL || v == NULL || table == NULL || all_logits == NULL || out == NULL) {
        fprintf(stderr, "error: out of memory for the KV cache\n");
        return 1;
    }
    for (int64_t i = 0; i < pages; ++i) table[i] = (int32_t)i;
    int32_t kv_len = 0;
    int64_t s_tokens[2] = {1, n_prompt}, s_one[1] = {1}, s_table[2] = {1, pages};
    tw_dtype i32 = {TW_DTYPE_INT, 32, 1}, f32 = {TW_DTYPE_FLOAT, 32, 1}, kv_dt = {TW_LLM_KV_CODE, TW_LLM_KV_BITS, 1};
    tw_tensor in[5] = {
        {prompt, 2, i32, s_tokens}, {&kv_len, 1, i32, s_one}, {table, 2, i32, s_table}, {k, 6, kv_dt, s_k}, {v, 6, kv_dt, s_v},
    };
    int32_t last_row = (int32_t)n_prompt - 1; /* prefill's rows: the logits after the prompt's last token */
    tw_tensor prefill_in[6] = {in[0], {&last_row, 1, i32, s_one}, in[1], in[2], in[3], in[4]};
    tw_tensor logits;
    double t0 = now_ms();
    if (tw_model_run(m, "prefill", prefill_in, 6, &logits, 1) != 1) {
        fprintf(stderr, "error: %s\n", tw_model_error(m));
        return 1;
    }
    memcpy(all_logits, logits.data, sizeof(float) * TW_LLM_VOCAB);
    double t1 = now_ms();
    kv_len += (int32_t)n_prompt;
    int32_t token;
    in[0].ndim = 1;
    in[0].shape = s_one;
    in[0].data = &token;
    for (int step = 0; step < n_new; ++step) {
        token = argmax(all_logits + (size_t)step * TW_LLM_VOCAB, TW_LLM_VOCAB);
        out[step] = token;
        if (tw_model_run(m, "decode", in, 5, &logits, 1) != 1) {
            fprintf(stderr, "error: %s\n", tw_model_error(m));
            return 1;
        }
        memcpy(all_logits + (size_t)(step + 1) * TW_LLM_VOCAB, logits.data, sizeof(float) * TW_LLM_VOCAB);
        kv_len += 1;
    }
    double t2 = now_ms();
    for (int i = 0; i < n_new; ++i) printf(i ? " %d" : "%d", out[i]);
    printf("\n");
    fprintf(stderr, "prefill %.3f ms (%lld tokens), decode %.3f ms/token (%d tokens)\n", t1 - t0, (long long)n_prompt, n_new ? (t2 - t1) / n_new : 0.0, n_new);
    if (logits_path != NULL) {
        int64_t s_all[2] = {n_new + 1, TW_LLM_VOCAB};
        tw_tensor all = {all_logits, 2, f32, s_all};
        if (write_npy(logits_path, &all)) return 2;
    }
    tw_model_free(m);
    free(k);
    free(v);
    free(table);
    free(all_logits);
    free(out);
    free(prompt);
    return 0;
}
