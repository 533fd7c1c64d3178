/* tilework ahead-of-time export: the `blas` backend's library calls in portable C.
 *
 * The Python VM runs these regions on the BLAS NumPy links (OpenBLAS); an exported model does
 * not depend on a BLAS: these loops compute the same products (row-major, destination given),
 * parallel over rows with OpenMP. The summation order differs from OpenBLAS's, so results
 * agree with the VM to float32 rounding, not bit for bit. Sizes as the externs get them:
 * matmul a[m,k] b[k,n]; linear x[m,k] w[n,k] (x @ w.T); batch_matmul nb of a[m,k] b[k,n]. */
#include <stdint.h>

#define TWB_DEFINE(T, S)                                                                        \
    static void twb_nn_##S(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k, int beta) { \
        _Pragma("omp parallel for if (m * n * k > 65536)")                                     \
        for (int64_t i = 0; i < m; ++i) {                                                       \
            T* ci = c + i * n;                                                                  \
            if (!beta)                                                                          \
                for (int64_t j = 0; j < n; ++j) ci[j] = 0;                                      \
            for (int64_t p = 0; p < k; ++p) {                                                   \
                T aip = a[i * k + p];                                                           \
                const T* bp = b + p * n;                                                        \
                for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];                           \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    static void twb_nt_##S(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k, int beta) { \
        _Pragma("omp parallel for if (m * n * k > 65536)")                                     \
        for (int64_t i = 0; i < m; ++i) {                                                       \
            for (int64_t j = 0; j < n; ++j) {                                                   \
                T acc = 0;                                                                      \
                const T* ai = a + i * k;                                                        \
                const T* bj = b + j * k;                                                        \
                for (int64_t p = 0; p < k; ++p) acc += ai[p] * bj[p];                           \
                c[i * n + j] = beta ? c[i * n + j] + acc : acc;                                 \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    static void twb_fill_bias_##S(const T* bias, T* c, int64_t m, int64_t n) {                  \
        for (int64_t i = 0; i < m; ++i)                                                         \
            for (int64_t j = 0; j < n; ++j) c[i * n + j] = bias[j];                             \
    }                                                                                           \
    int32_t twb_##S##_matmul(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k) {   \
        twb_nn_##S(a, b, c, m, n, k, 0);                                                        \
        return 0;                                                                               \
    }                                                                                           \
    int32_t twb_##S##_matmul_bias(const T* a, const T* b, const T* bias, T* c, int64_t m, int64_t n, int64_t k) { \
        twb_fill_bias_##S(bias, c, m, n);                                                       \
        twb_nn_##S(a, b, c, m, n, k, 1);                                                        \
        return 0;                                                                               \
    }                                                                                           \
    int32_t twb_##S##_linear(const T* x, const T* w, T* c, int64_t m, int64_t n, int64_t k) {   \
        twb_nt_##S(x, w, c, m, n, k, 0);                                                        \
        return 0;                                                                               \
    }                                                                                           \
    int32_t twb_##S##_linear_bias(const T* x, const T* w, const T* bias, T* c, int64_t m, int64_t n, int64_t k) { \
        twb_fill_bias_##S(bias, c, m, n);                                                       \
        twb_nt_##S(x, w, c, m, n, k, 1);                                                        \
        return 0;                                                                               \
    }                                                                                           \
    int32_t twb_##S##_batch_matmul(const T* a, const T* b, T* c, int64_t nb, int64_t m, int64_t n, int64_t k) { \
        for (int64_t t = 0; t < nb; ++t) twb_nn_##S(a + t * m * k, b + t * k * n, c + t * m * n, m, n, k, 0); \
        return 0;                                                                               \
    }

TWB_DEFINE(float, f32)
TWB_DEFINE(double, f64)
