/* y = x W^T + b for a few rows of x, with W in int8 and each row of x quantized on its own:
 * the int8 products of one decoding step (attnkit/nn/int8_linear.py has the equations).
 *
 * W is (out, in) int8 with one float32 scale s_o per output; x is (rows, in) float32. Row r
 * is quantized on its own peak to whole numbers in [-Q, Q] (Q = `levels`),
 *     q_rk = round(x_rk * (Q / max_k |x_rk|)),  s_r = max_k |x_rk| / Q,
 * the dot products are exact in int32, and
 *     y_ro = (((float)(q_r . q_o)) * s_o) * s_r + b_o,
 * in that order and without fused multiply-adds (this file is built with -ffp-contract=off):
 * `Int8Linear`'s many-row paths do the same float32 operations, so a row's result is the
 * same bit for bit whichever path runs it.
 *
 * The many-row paths run the same steps around a library's int8 product: `int8_quantize_rows`
 * before it, `int8_rescale` after it.
 *
 * As in few_rows.c, W is read exactly once, in stored order, by output feature, while the
 * few quantized rows stay in the L1 cache; the output features are shared among threads.
 * Two builds of this one file: with AVX512-VNNI, 64 byte products per instruction
 * (vpdpbusd multiplies unsigned by signed bytes, so each row is stored as q + 128 and
 * 128 sum_k q_ok, given as `w_offset`, is taken off again); with AVX2 alone, the bytes are
 * widened to 16 bits and multiplied in pairs (vpmaddwd), which no sum of int8 products can
 * overflow. Built by attnkit/kernels/int8_rows.py.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Int8Linear's floor under a row's peak: levels / peak stays finite, so 0 stays 0. */
#define PEAK_FLOOR 1e-30f

/* Rows per call: the quantized rows (at most 16 x 4 KiB at in = 4096) stay in L1/L2. */
#define MAX_ROWS 16

/* s_r, and the row quantized into q: q[k] = round(x[k] * (levels / peak)), ties to even
 * (vcvtps2dq in the default rounding mode, as nearbyintf), eight at a time. */
static float quantize_row(const float *x, int64_t in, float levels, int8_t *q) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 peaks = _mm256_setzero_ps(), nans = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= in; k += 8) {
        const __m256 xk = _mm256_loadu_ps(x + k);
        peaks = _mm256_max_ps(peaks, _mm256_and_ps(xk, magnitude));
        nans = _mm256_or_ps(nans, _mm256_cmp_ps(xk, xk, _CMP_UNORD_Q));
    }
    float lanes[8], peak = 0.0f;
    _mm256_storeu_ps(lanes, peaks);
    for (int i = 0; i < 8; ++i) peak = fmaxf(peak, lanes[i]);
    int nan = _mm256_movemask_ps(nans) != 0;
    for (; k < in; ++k) {
        peak = fmaxf(peak, fabsf(x[k]));
        nan |= isnan(x[k]);
    }
    /* NaN stays NaN (through s_r), as torch's amax keeps it; a row of zeros stays zeros. */
    peak = nan ? NAN : fmaxf(peak, PEAK_FLOOR);
    const float inv = levels / peak;
    const __m256 inv8 = _mm256_set1_ps(inv);
    for (k = 0; k + 8 <= in; k += 8) {
        const __m256i q32 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), inv8));
        const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
        _mm_storel_epi64((__m128i *)(q + k), _mm_packs_epi16(q16, q16));
    }
    for (; k < in; ++k) q[k] = (int8_t)nearbyintf(x[k] * inv);
    return peak / levels;
}

#if defined(__AVX512VNNI__)
#define STEP 64
typedef __m512i acc_t;
typedef uint8_t row_t; /* q + 128 */

static inline row_t row_value(int8_t q) { return (row_t)(q + 128); }
static inline acc_t acc_zero(void) { return _mm512_setzero_si512(); }
static inline __m512i load_w(const int8_t *w) { return _mm512_loadu_si512(w); }
static inline acc_t acc_madd(acc_t acc, const row_t *x, __m512i w) {
    return _mm512_dpbusd_epi32(acc, _mm512_loadu_si512(x), w);
}
static inline int32_t acc_sum(acc_t acc) { return _mm512_reduce_add_epi32(acc); }
#else
#define STEP 16
typedef __m256i acc_t;
typedef int16_t row_t;

static inline row_t row_value(int8_t q) { return q; }
static inline acc_t acc_zero(void) { return _mm256_setzero_si256(); }
static inline __m256i load_w(const int8_t *w) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
}
static inline acc_t acc_madd(acc_t acc, const row_t *x, __m256i w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x), w));
}
static inline int32_t acc_sum(acc_t acc) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* The exact q_r . q_o (the stored rows' sums less `offset`) for R rows against one row of W,
 * R a constant after inlining. */
static inline __attribute__((always_inline)) void dot_rows(int R, const row_t *x, const int8_t *w,
                                                           int64_t in, int32_t offset,
                                                           int32_t *dots) {
    acc_t acc[8];
    for (int r = 0; r < R; ++r) acc[r] = acc_zero();
    int64_t k = 0;
    for (; k + STEP <= in; k += STEP) {
        __builtin_prefetch(w + k + 1024);
        const __typeof__(load_w(w)) wk = load_w(w + k);
        for (int r = 0; r < R; ++r) acc[r] = acc_madd(acc[r], x + r * in + k, wk);
    }
    for (int r = 0; r < R; ++r) {
        int32_t s = acc_sum(acc[r]) - offset;
        for (int64_t t = k; t < in; ++t) s += (int32_t)x[r * in + t] * w[t]; /* in % STEP */
        dots[r] = s;
    }
}

/* w_offset is 128 sum_k q_ok per output for the VNNI build and unread by the AVX2 one; b may
 * be NULL. rows <= MAX_ROWS (the caller's limit, `KERNEL_ROWS`): 0 is returned, or 1 when
 * rows is over it and nothing was done. One thread starts no OpenMP team. */
int int8_rows_linear(const float *x, const int8_t *w, const int32_t *w_offset,
                     const float *w_scale, const float *b, float *y, int64_t rows, int64_t in,
                     int64_t out, int levels, int threads) {
    if (rows > MAX_ROWS) return 1;
    row_t xq[rows * in];
    int8_t q[in];
    float s[MAX_ROWS];
    for (int64_t r = 0; r < rows; ++r) {
        s[r] = quantize_row(x + r * in, in, (float)levels, q);
        for (int64_t k = 0; k < in; ++k) xq[r * in + k] = row_value(q[k]);
    }
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t o = 0; o < out; ++o) {
        const int8_t *wo = w + o * in;
#if defined(__AVX512VNNI__)
        const int32_t offset = w_offset[o];
#else
        const int32_t offset = 0;
#endif
        int32_t dots[MAX_ROWS];
        int64_t r = 0;
        for (; r + 8 <= rows; r += 8) dot_rows(8, xq + r * in, wo, in, offset, dots + r);
        if (rows - r >= 4) {
            dot_rows(4, xq + r * in, wo, in, offset, dots + r);
            r += 4;
        }
        if (rows - r >= 2) {
            dot_rows(2, xq + r * in, wo, in, offset, dots + r);
            r += 2;
        }
        if (rows - r == 1) dot_rows(1, xq + r * in, wo, in, offset, dots + r);
        for (r = 0; r < rows; ++r) {
            float v = ((float)dots[r] * w_scale[o]) * s[r];
            y[r * out + o] = b ? v + b[o] : v;
        }
    }
    return 0;
}

/* The many-row paths' first step: row r of x into q (rows, in) int8, and s_r into s. */
void int8_quantize_rows(const float *x, int8_t *q, float *s, int64_t rows, int64_t in,
                        int levels, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) s[r] = quantize_row(x + r * in, in, (float)levels, q + r * in);
}

/* Their last step, in place on the exact sums q_r . q_o (rows, out) of the int8 product:
 * y_ro = ((float)dots_ro * s_o) * s_r + b_o, as the kernel's, written over dots_ro (memcpy,
 * so that the float's bits go where the int32's were without aliasing them). b may be NULL. */
void int8_rescale(int32_t *dots, const float *w_scale, const float *s, const float *b,
                  int64_t rows, int64_t out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        int32_t *d = dots + r * out;
        for (int64_t o = 0; o < out; ++o) {
            float v = ((float)d[o] * w_scale[o]) * s[r];
            if (b) v = v + b[o];
            memcpy(d + o, &v, sizeof v);
        }
    }
}
