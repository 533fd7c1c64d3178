/* tilework export: reading and writing .npy files (C-order; the dtypes of tw_model.h) for
 * the example programs. Header-only. */
#ifndef TILEWORK_NPY_H
#define TILEWORK_NPY_H
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tw_model.h"

typedef struct {
    const char* descr;
    uint8_t code, bits;
} npy_type;

static const npy_type NPY_TYPES[] = {
    {"<f4", 2, 32}, {"<f8", 2, 64}, {"<f2", 2, 16}, {"<i8", 0, 64}, {"<i4", 0, 32}, {"<i2", 0, 16},
    {"|i1", 0, 8},  {"|u1", 1, 8},  {"|b1", 6, 8},  {"<u2", 4, 16}, /* bfloat16 is written as <u2 bits */
};

static inline int tw_npy_die(const char* fmt, const char* a) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 2;
}

/* "cannot write PATH: No such file or directory" (errno as the failed call left it) */
static inline int tw_npy_die_errno(const char* what, const char* path) {
    fprintf(stderr, "error: %s %s: %s\n", what, path, strerror(errno));
    return 2;
}

static inline size_t itemsize(tw_dtype d) { return d.bits / 8; }

static inline int read_npy(const char* path, tw_tensor* t) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) return tw_npy_die_errno("cannot open", path);
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fclose(f);
        return tw_npy_die("%s is not a .npy file", path);
    }
    size_t hlen = pre[8] | (size_t)pre[9] << 8;
    if (pre[6] >= 2) {
        unsigned char more[2];
        if (fread(more, 1, 2, f) != 2) { fclose(f); return tw_npy_die("%s: truncated header", path); }
        hlen |= (size_t)more[0] << 16 | (size_t)more[1] << 24;
    }
    char* h = (char*)calloc(hlen + 1, 1);
    if (h == NULL || fread(h, 1, hlen, f) != hlen) { fclose(f); free(h); return tw_npy_die("%s: truncated header", path); }
    const char* d = strstr(h, "'descr': '");
    const char* fo = strstr(h, "'fortran_order': ");
    const char* sh = strstr(h, "'shape': (");
    if (d == NULL || fo == NULL || sh == NULL || strncmp(fo + 17, "False", 5) != 0) { fclose(f); free(h); return tw_npy_die("%s: unsupported header (C-order arrays only)", path); }
    d += 10;
    int found = 0;
    for (size_t i = 0; i < sizeof NPY_TYPES / sizeof NPY_TYPES[0]; ++i) {
        if (strncmp(d, NPY_TYPES[i].descr, 3) == 0 && d[3] == '\'') {
            t->dtype.code = NPY_TYPES[i].code;
            t->dtype.bits = NPY_TYPES[i].bits;
            t->dtype.lanes = 1;
            found = 1;
        }
    }
    if (!found) { fclose(f); free(h); return tw_npy_die("%s: unsupported dtype", path); }
    t->shape = (int64_t*)calloc(16, sizeof(int64_t));
    t->ndim = 0;
    const char* p = sh + 10;
    size_t n = 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') ++p;
        if (*p == ')') break;
        char* end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || t->ndim >= 16) { fclose(f); free(h); return tw_npy_die("%s: bad shape", path); }
        t->shape[t->ndim++] = v;
        n *= (size_t)v;
        p = end;
    }
    free(h);
    size_t nbytes = n * itemsize(t->dtype);
    t->data = malloc(nbytes ? nbytes : 1);
    if (t->data == NULL || fread(t->data, 1, nbytes, f) != nbytes) { fclose(f); return tw_npy_die("%s: truncated data", path); }
    fclose(f);
    return 0;
}

static inline int write_npy(const char* path, const tw_tensor* t) {
    const char* descr = NULL;
    for (size_t i = 0; i < sizeof NPY_TYPES / sizeof NPY_TYPES[0]; ++i)
        if (NPY_TYPES[i].code == t->dtype.code && NPY_TYPES[i].bits == t->dtype.bits) descr = NPY_TYPES[i].descr;
    if (descr == NULL) return tw_npy_die("%s: an output of a dtype .npy cannot hold", path);
    char shape[512] = "";
    size_t k = 0, n = 1;
    for (int i = 0; i < t->ndim; ++i) {
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%" PRId64 ",%s", t->shape[i], i + 1 < t->ndim ? " " : "");
        n *= (size_t)t->shape[i];
    }
    if (t->ndim > 1) shape[k - 1] = 0; /* (2, 3) but (5,) */
    char header[700];
    int len = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    FILE* f = fopen(path, "wb");
    if (f == NULL) return tw_npy_die_errno("cannot write", path);
    unsigned short hl = (unsigned short)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(header, 1, (size_t)len, f);
    for (int i = 0; i < pad; ++i) fputc(' ', f);
    fputc('\n', f);
    size_t nbytes = n * itemsize(t->dtype);
    int bad = fwrite(t->data, 1, nbytes, f) != nbytes || ferror(f);
    bad |= fclose(f) != 0;
    if (bad) return tw_npy_die_errno("cannot write", path);
    return 0;
}

#endif
