/* GloVe's two loops: counting co-occurrences into a hash table, and AdaGrad on the weighted
 * least squares, one co-occurrence at a time (Pennington et al. 2014).
 *
 * Counting: in each sentence, a word w_t and each word w_{t+k} within `window` after it add
 * 1/k (or 1, without distance weighting) to X[w_t, w_{t+k}] and, symmetric, to
 * X[w_{t+k}, w_t]. The counts live in an open-addressing table of (key = i V + j, value)
 * slots, linear probing, EMPTY keys free; the caller grows it (glove_rehash) when
 * glove_count stops short because the next sentence could pass the load it allows. Memory
 * goes with the distinct pairs, not with the corpus, which is read a chunk at a time.
 *
 * Training, for each nonzero X_ij in the order given, the paper's
 *
 *     J_ij = f(X_ij) (w_i . c_j + b_i + b~_j - log X_ij)^2,  f(x) = min(1, (x / x_max)^alpha)
 *
 * and AdaGrad as the reference C tool applies it: with diff the bracket and g = eta f diff,
 * each gradient component (g c_j for w_i, g w_i for c_j, clipped to +-clip) is divided by
 * the square root of its accumulated squares (which start at 1) and then added to them; the
 * biases take g alike. Both vectors move from their values before the update. Threads share
 * the parameters without locks (Hogwild), each a contiguous share of the pairs, which the
 * caller has shuffled. The loss returned is sum_ij 0.5 J_ij, as the reference reports it.
 * Built by attnkit/kernels/loader.py for attnkit/kernels/glove.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define EMPTY UINT64_MAX

static inline uint64_t mix(uint64_t z) { /* splitmix64's finaliser: keys spread over slots */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* capacity is a power of two; the caller keeps the load below 1 */
static inline void add(uint64_t *keys, double *vals, int64_t capacity, uint64_t key, double x,
                       int64_t *used) {
    uint64_t mask = (uint64_t)capacity - 1, slot = mix(key) & mask;
    while (keys[slot] != EMPTY && keys[slot] != key) slot = (slot + 1) & mask;
    if (keys[slot] == EMPTY) {
        keys[slot] = key;
        vals[slot] = 0.0;
        ++*used;
    }
    vals[slot] += x;
}

/* Counts sentences [0, n_sentences) of ids (sentence s is ids[starts[s] .. starts[s + 1]))
 * until the next sentence could take the table past `max_used` slots; returns the number of
 * sentences counted. */
int64_t glove_count(const int64_t *ids, const int64_t *starts, int64_t n_sentences, int window,
                    int symmetric, int distance_weighting, int64_t vocab, uint64_t *keys,
                    double *vals, int64_t capacity, int64_t *used, int64_t max_used) {
    for (int64_t s = 0; s < n_sentences; ++s) {
        int64_t first = starts[s], last = starts[s + 1];
        /* a sentence of n words adds at most 2 n window new pairs */
        if (*used + 2 * (last - first) * (int64_t)window > max_used) return s;
        for (int64_t t = first; t < last; ++t) {
            for (int64_t k = 1; k <= window && t + k < last; ++k) {
                uint64_t a = (uint64_t)ids[t], b = (uint64_t)ids[t + k];
                double x = distance_weighting ? 1.0 / (double)k : 1.0;
                add(keys, vals, capacity, a * (uint64_t)vocab + b, x, used);
                if (symmetric) add(keys, vals, capacity, b * (uint64_t)vocab + a, x, used);
            }
        }
    }
    return n_sentences;
}

/* Moves every pair of one table into another, larger one (emptied by the caller). */
void glove_rehash(const uint64_t *keys, const double *vals, int64_t capacity, uint64_t *new_keys,
                  double *new_vals, int64_t new_capacity, int64_t *new_used) {
    for (int64_t s = 0; s < capacity; ++s)
        if (keys[s] != EMPTY) add(new_keys, new_vals, new_capacity, keys[s], vals[s], new_used);
}

/* The table's pairs as rows i, columns j and counts, in slot order; returns how many. */
int64_t glove_extract(const uint64_t *keys, const double *vals, int64_t capacity, int64_t vocab,
                      int32_t *rows, int32_t *cols, float *counts) {
    int64_t n = 0;
    for (int64_t s = 0; s < capacity; ++s) {
        if (keys[s] == EMPTY) continue;
        rows[n] = (int32_t)(keys[s] / (uint64_t)vocab);
        cols[n] = (int32_t)(keys[s] % (uint64_t)vocab);
        counts[n++] = (float)vals[s];
    }
    return n;
}

static inline uint64_t next_random(uint64_t *state) {
    return mix(*state += 0x9e3779b97f4a7c15ULL);
}

/* Fisher-Yates over the three arrays together, from `seed`. */
void glove_shuffle(int32_t *rows, int32_t *cols, float *counts, int64_t n, uint64_t seed) {
    uint64_t state = seed;
    for (int64_t i = n - 1; i > 0; --i) {
        int64_t j = (int64_t)(next_random(&state) % (uint64_t)(i + 1));
        int32_t r = rows[i], c = cols[i];
        float x = counts[i];
        rows[i] = rows[j], cols[i] = cols[j], counts[i] = counts[j];
        rows[j] = r, cols[j] = c, counts[j] = x;
    }
}

static inline float clip(float g, float bound) { return g > bound ? bound : g < -bound ? -bound : g; }

typedef struct {
    float *w, *c, *bw, *bc;     /* word and context vectors (V x d), their biases (V) */
    float *gw, *gc, *gbw, *gbc; /* AdaGrad's accumulated squared steps, alike */
    int64_t d;
    float eta, x_max, alpha, bound;
} params_t;

/* One update on X_ij = x; `step` holds 2 d floats. Returns 0.5 J_ij before it. */
static double update(const params_t *p, int64_t i, int64_t j, float x, float *step) {
    float *wi = p->w + i * p->d, *cj = p->c + j * p->d;
    float *gwi = p->gw + i * p->d, *gcj = p->gc + j * p->d;
    float dot = 0.0f;
    for (int64_t k = 0; k < p->d; ++k) dot += wi[k] * cj[k];
    float diff = dot + p->bw[i] + p->bc[j] - logf(x);
    float weight = x > p->x_max ? 1.0f : powf(x / p->x_max, p->alpha);
    float fdiff = weight * diff;
    double cost = 0.5 * (double)fdiff * (double)diff;
    if (!isfinite(fdiff)) return cost; /* the reference skips such a step too */
    float g = p->eta * fdiff;
    for (int64_t k = 0; k < p->d; ++k) {
        float a = clip(g * cj[k], p->bound), b = clip(g * wi[k], p->bound);
        step[k] = a / sqrtf(gwi[k]);
        step[p->d + k] = b / sqrtf(gcj[k]);
        gwi[k] += a * a;
        gcj[k] += b * b;
    }
    for (int64_t k = 0; k < p->d; ++k) {
        wi[k] -= step[k];
        cj[k] -= step[p->d + k];
    }
    p->bw[i] -= g / sqrtf(p->gbw[i]);
    p->bc[j] -= g / sqrtf(p->gbc[j]);
    p->gbw[i] += g * g;
    p->gbc[j] += g * g;
    return cost;
}

/* One pass over the n pairs, `threads` threads each a contiguous share; returns the summed
 * 0.5 J (NaN: no memory for the work buffers). */
double glove_train(float *w, float *c, float *bw, float *bc, float *gw, float *gc, float *gbw,
                   float *gbc, int64_t d, const int32_t *rows, const int32_t *cols,
                   const float *counts, int64_t n, float eta, float x_max, float alpha,
                   float bound, int threads) {
    params_t p = {w, c, bw, bc, gw, gc, gbw, gbc, d, eta, x_max, alpha, bound};
    double cost = 0.0;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(+ : cost, failed)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        float *step = malloc(2 * d * sizeof(float));
        if (!step) {
            failed += 1;
        } else {
            for (int64_t e = n * t / nt; e < n * (t + 1) / nt; ++e)
                cost += update(&p, rows[e], cols[e], counts[e], step);
            free(step);
        }
    }
    return failed ? NAN : cost;
}
