/* Attention for a decoding step: a few queries per (row, head) over the cached keys,
 *     out_i = softmax(q_i K^T / sqrt(d_k) + bias_i + mask_i) V,
 * where every query may see every key given (one new position over the self-attention
 * cache, or any queries over the encoder memory). attnkit/kernels/step_attention.py has the why.
 *
 * The keys and values are read where the cache holds them: row b's key at position p is in
 * cache row rows[b, p] (beam search's history without copying, see kv_cache.py), or in row b
 * itself when rows is NULL. Every tensor comes with its strides in floats (or bytes for the
 * mask), so views of the cache, of the fused projection and of a broadcast mask need no copy.
 * One OpenMP team shares the (row, head) pairs. The output is (batch, queries, heads, d_k),
 * contiguous: the layout the output projection reads.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const float *q;       /* (batch, heads, queries, d) at q_strides */
    const float *k, *v;   /* (cache rows, kv heads, positions, d) at kv_strides, last 1 */
    const int64_t *rows;  /* (batch, positions) at rows_stride, or NULL */
    const bool *mask;     /* (batch, queries, keys) at mask_strides, True = may attend; or NULL */
    const float *bias;    /* (batch, heads, queries, keys) at bias_strides, or NULL */
    float *out;           /* (batch, queries, heads, d), contiguous */
    int64_t q_strides[3], kv_strides[3], rows_stride, mask_strides[2], bias_strides[3];
    int64_t batch, heads, kv_heads, queries, keys, d;
    float scale;
} step_attention_args;

/* The sum of the eight lanes of v. */
static inline float lanes_sum(__m256 v) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    return _mm_cvtss_f32(_mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 0x55)));
}

/* Where row b's key (or value) at position p lies. */
static inline const float *at(const step_attention_args *a, const float *base, int64_t b,
                              int64_t kv_h, int64_t p) {
    const int64_t row = a->rows ? a->rows[b * a->rows_stride + p] : b;
    return base + row * a->kv_strides[0] + kv_h * a->kv_strides[1] + p * a->kv_strides[2];
}

/* scores[p] = q . key_p for the keys p in [0, keys): four keys at a time, each its own
 * accumulator, so that the multiply-adds of one key do not wait on each other's results
 * (a float sum is not reassociated by the compiler, which would keep it one chain). */
static void dots(const step_attention_args *a, const float *q, int64_t b, int64_t kv_h,
                 float *scores) {
    const int64_t d = a->d, vec = d - d % 8;
    int64_t p = 0;
    for (; p + 4 <= a->keys; p += 4) {
        const float *key[4];
        __m256 acc[4];
        for (int j = 0; j < 4; ++j) key[j] = at(a, a->k, b, kv_h, p + j), acc[j] = _mm256_setzero_ps();
        for (int64_t c = 0; c < vec; c += 8) {
            const __m256 qc = _mm256_loadu_ps(q + c);
            for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(key[j] + c), acc[j]);
        }
        for (int j = 0; j < 4; ++j) {
            float s = lanes_sum(acc[j]);
            for (int64_t c = vec; c < d; ++c) s += q[c] * key[j][c];
            scores[p + j] = s;
        }
    }
    for (; p < a->keys; ++p) {
        const float *key = at(a, a->k, b, kv_h, p);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t c = 0; c < vec; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(key + c), acc);
        float s = lanes_sum(acc);
        for (int64_t c = vec; c < d; ++c) s += q[c] * key[c];
        scores[p] = s;
    }
}

/* out = sum_p weights[p] value_p / total, 32 floats of out at a time held in registers. */
static void weighted_values(const step_attention_args *a, const float *weights, float total,
                            int64_t b, int64_t kv_h, float *out) {
    const int64_t d = a->d;
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t p = 0; p < a->keys; ++p) {
            if (weights[p] == 0.0f) continue;
            const float *value = at(a, a->v, b, kv_h, p) + c;
            const __m256 w = _mm256_set1_ps(weights[p]);
            for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * j), acc[j]);
        }
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + c + 8 * j, _mm256_mul_ps(acc[j], inv));
    }
    for (; c < d; ++c) {
        float sum = 0.0f;
        for (int64_t p = 0; p < a->keys; ++p) sum += weights[p] * at(a, a->v, b, kv_h, p)[c];
        out[c] = sum / total;
    }
}

static void attend_one(const step_attention_args *a, int64_t b, int64_t h, float *scores) {
    const int64_t kv_h = h / (a->heads / a->kv_heads);
    for (int64_t i = 0; i < a->queries; ++i) {
        const float *q = a->q + b * a->q_strides[0] + h * a->q_strides[1] + i * a->q_strides[2];
        const bool *mask = a->mask ? a->mask + b * a->mask_strides[0] + i * a->mask_strides[1] : NULL;
        const float *bias =
            a->bias ? a->bias + b * a->bias_strides[0] + h * a->bias_strides[1] + i * a->bias_strides[2]
                    : NULL;
        float *out = a->out + ((b * a->queries + i) * a->heads + h) * a->d;
        dots(a, q, b, kv_h, scores);
        float top = -INFINITY;
        for (int64_t p = 0; p < a->keys; ++p) {
            float s = scores[p] * a->scale;
            if (bias) s += bias[p];
            if (mask && !mask[p]) s = -INFINITY;
            scores[p] = s;
            top = s > top ? s : top;
        }
        if (top == -INFINITY) { /* every key masked: zeros */
            for (int64_t c = 0; c < a->d; ++c) out[c] = 0.0f;
            continue;
        }
        float total = 0.0f;
        for (int64_t p = 0; p < a->keys; ++p) total += scores[p] = expf(scores[p] - top);
        weighted_values(a, scores, total, b, kv_h, out);
    }
}

/* 0, or 1 where a thread could not allocate its scores (nothing is then left half done). */
int step_attention(const step_attention_args *a, int threads) {
    const int64_t pairs = a->batch * a->heads;
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && pairs > 1) reduction(| : failed)
    {
        /* On the heap: a long context's scores would not fit a worker thread's stack. */
        float *scores = malloc(sizeof(float) * (size_t)(a->keys > 0 ? a->keys : 1));
        failed = scores == NULL;
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < pairs; ++pair) {
            if (scores) attend_one(a, pair / a->heads, pair % a->heads, scores);
        }
        free(scores);
    }
    return failed;
}
