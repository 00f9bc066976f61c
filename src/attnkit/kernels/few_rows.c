/* y = x W^T + b for a few rows of x: the products of one decoding step.
 *
 * x is (rows, in), W is (out, in) as nn.Linear stores it, y is (rows, out), all
 * contiguous float32. With one row per sentence the step's time is the time to
 * read W, so W is read exactly once, in stored order: each output feature o
 * streams its row W[o] while the few rows of x (at most 8 x in floats per pass)
 * stay in the L1 cache, and every 8 floats of W feed up to 8 fused
 * multiply-adds. BLAS kernels tile for many rows and, with 8 rows, run at a
 * fraction of this speed (bench/bench_linear.py).
 *
 * Plain C with GCC's vector extension (8 floats = one AVX2 register); the
 * output features are shared between the threads by OpenMP, which is the
 * runtime torch itself runs on. Built by attnkit/kernels/few_rows.py.
 */
#include <stdint.h>

/* Eight floats, loadable from any float address (the rows need no alignment). */
typedef float v8 __attribute__((vector_size(32), aligned(4)));

/* Floats ahead of the current one to ask the memory for: W arrives before it is needed. */
#define PREFETCH 256

static inline float lanes_sum(v8 v) {
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += v[j];
    return s;
}

/* y[r * out] = bias + <w, x[r]> for R <= 8 rows of x against one row w of W. Always inlined
 * with a constant R, so the R accumulators live in registers and the loops unroll. */
static inline __attribute__((always_inline)) void dot_rows(int R, const float *x, const float *w,
                                                           float bias, float *y, int64_t in,
                                                           int64_t out) {
    v8 acc[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= in; k += 8) {
        __builtin_prefetch(w + k + PREFETCH);
        v8 wk = *(const v8 *)(w + k);
        for (int r = 0; r < R; ++r) acc[r] += wk * *(const v8 *)(x + r * in + k);
    }
    for (int r = 0; r < R; ++r) {
        float s = bias + lanes_sum(acc[r]);
        for (int64_t t = k; t < in; ++t) s += w[t] * x[r * in + t]; /* in % 8 left over */
        y[r * out] = s;
    }
}

/* b may be NULL (no bias). With one thread no OpenMP team is started, as in torch's own
 * parallel_for: that is how a DataLoader's forked workers run (tests/test_linear.py runs the
 * kernel in one). */
void few_rows_linear(const float *x, const float *w, const float *b, float *y, int64_t rows,
                     int64_t in, int64_t out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t o = 0; o < out; ++o) {
        const float *wo = w + o * in;
        float bias = b ? b[o] : 0.0f;
        /* Rows in passes of 8, 4, 2, 1: the row of W is in L1 after the first pass. */
        int64_t r = 0;
        for (; r + 8 <= rows; r += 8) dot_rows(8, x + r * in, wo, bias, y + r * out + o, in, out);
        if (rows - r >= 4) {
            dot_rows(4, x + r * in, wo, bias, y + r * out + o, in, out);
            r += 4;
        }
        if (rows - r >= 2) {
            dot_rows(2, x + r * in, wo, bias, y + r * out + o, in, out);
            r += 2;
        }
        if (rows - r == 1) dot_rows(1, x + r * in, wo, bias, y + r * out + o, in, out);
    }
}
