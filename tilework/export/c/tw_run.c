/* tilework export: run a function of the exported model on .npy files.
 *
 *     tw_run model.twb FUNCTION [-o OUTDIR] [--repeat N] in0.npy in1.npy ...
 *
 * Inputs are given in the function's parameter order (bound weights excluded). Outputs are
 * written as OUTDIR/output0.npy, ... (default: the current directory). --repeat N runs the
 * function N more times and prints the median time per call in microseconds. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tw_model.h"

#include "tw_npy.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

#define USAGE "usage: tw_run WEIGHTS.twb FUNCTION [-o OUTDIR] [--repeat N] INPUT.npy ...\n"
#define MAX_REPEAT 100000000

static int usage(const char* why, const char* arg) {
    fprintf(stderr, "error: ");
    fprintf(stderr, why, arg);
    fprintf(stderr, "\n" USAGE);
    return 2;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, USAGE);
        return 2;
    }
    const char* outdir = ".";
    int repeat = 0, n_in = 0;
    tw_tensor inputs[64];
    for (int i = 3; i < argc; ++i) {
        if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--repeat") == 0) {
            if (i + 1 == argc) return usage("%s needs a value", argv[i]);
        }
        if (strcmp(argv[i], "-o") == 0) {
            outdir = argv[++i];
        } else if (strcmp(argv[i], "--repeat") == 0) {
            const char* text = argv[++i];
            char* end;
            errno = 0;
            long v = strtol(text, &end, 10);
            if (end == text || *end != 0 || errno != 0 || v < 0 || v > MAX_REPEAT)
                return usage("--repeat takes a whole number of runs from 0 to 100000000, got '%s'", text);
            repeat = (int)v;
        } else if (n_in < 64) {
            if (read_npy(argv[i], &inputs[n_in])) return 2;
            ++n_in;
        } else {
            return usage("more than 64 inputs (at %s)", argv[i]);
        }
    }
    tw_model* m = tw_model_create(argv[1]);
    if (m == NULL) return tw_npy_die("%s", tw_model_error(NULL));
    tw_tensor outputs[64];
    int n = tw_model_run(m, argv[2], inputs, n_in, outputs, 64);
    if (n < 0) {
        fprintf(stderr, "error: %s\n", tw_model_error(m));
        tw_model_free(m);
        return 1;
    }
    for (int i = 0; i < n && i < 64; ++i) {
        char path[4096];
        snprintf(path, sizeof path, "%s/output%d.npy", outdir, i);
        if (write_npy(path, &outputs[i])) return 2;
    }
    if (repeat > 0) {
        double* t = (double*)malloc(sizeof(double) * (size_t)repeat);
        if (t == NULL) return tw_npy_die("%s", "out of memory for the timings");
        for (int r = 0; r < repeat; ++r) {
            double t0 = now_us();
            if (tw_model_run(m, argv[2], inputs, n_in, outputs, 64) < 0) return tw_npy_die("%s", tw_model_error(m));
            t[r] = now_us() - t0;
        }
        qsort(t, (size_t)repeat, sizeof(double), cmp_double);
        printf("median_us %.3f\n", t[repeat / 2]);
        free(t);
    }
    tw_model_free(m);
    for (int i = 0; i < n_in; ++i) {
        free(inputs[i].data);
        free(inputs[i].shape);
    }
    return 0;
}
