/* word2vec's SGD with negative sampling, one update at a time, as the C tool and gensim do it.
 *
 * For each kept word w of a sentence and each context word c within its window:
 * skip-gram lets c's input vector h = v_c predict w; CBOW lets the mean h of the
 * whole context's input vectors predict w once. Then, for w (label 1) and k
 * words drawn from the noise distribution (label 0; one equal to w is skipped):
 *
 *     g = alpha (label - sigma(v'_t . h)),   step_h += g v'_t,   v'_t += g h
 *
 * and last each input vector of h gets step_h (CBOW: each context word, whole).
 *
 * Noise-contrastive estimation (Gutmann and Hyvarinen 2010, in Mnih and Teh's 2012 form)
 * is the same loop with the score shifted by the log of the noise's odds: with offsets[t] =
 * log(k q(t)), sigma(v'_t . h - offsets[t]) is the probability that t came from the data
 * rather than from k draws of the noise q, and g = alpha (label - sigma(v'_t . h -
 * offsets[t])). NCE keeps a noise draw equal to the true word (its estimator counts every
 * draw); negative sampling (offsets NULL) skips it, as the C tool does.
 * Every update sees the last one's vectors. Batching them on tensors instead
 * (all pairs of a batch from the same vectors, the steps summed) diverged on a
 * real corpus and ran 8x slower than gensim (attnkit/embeddings/word2vec.py says
 * more), so this loop is C.
 *
 * Threads share the vectors without locks (Hogwild, as the C tool and gensim):
 * each takes a contiguous share of the sentences, its own random stream, and
 * lowers its learning rate linearly from alpha0 to alpha1 over its share.
 * Subsampling (keep[w]), the dynamic window (b uniform in 1..window) and the
 * negatives (Walker's alias table: slot s holds s with probability own[s], else
 * alias[s]) are drawn here. The sigmoid is exact, not the C tool's table.
 * Built by attnkit/kernels/loader.py for attnkit/kernels/sgns.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* splitmix64: a fast stream with good bits, one state word per thread */
static inline uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline double uniform(uint64_t *state) { return (next_random(state) >> 11) * 0x1.0p-53; }

static inline float dot(const float *a, const float *b, int64_t d) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

static inline void axpy(float g, const float *x, float *y, int64_t d) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) y[i] += g * x[i];
}

/* log sigma(x), without overflow either way */
static inline double log_sigmoid(double x) {
    return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

/* A word drawn from the alias table: slot s holds s with probability own[s], else alias[s]. */
static inline int64_t draw(const double *own, const int64_t *alias, int64_t n, uint64_t *state) {
    int64_t slot = (int64_t)(next_random(state) % (uint64_t)n);
    return uniform(state) < own[slot] ? slot : alias[slot];
}

/* `count` draws into out[], for tests of the very sampler the loop uses. */
void sgns_draw(const double *own, const int64_t *alias, int64_t n, int64_t count, uint64_t seed,
               int64_t *out) {
    uint64_t state = seed;
    for (int64_t i = 0; i < count; ++i) out[i] = draw(own, alias, n, &state);
}

/* The output side of one update: h predicts `target` against the negatives. Moves their
 * output vectors, adds h's step to step_h, and returns the loss before the update. */
static double output_step(const float *h, float *out, int64_t d, int64_t target,
                          const int64_t *negatives, int k, float alpha, const float *offsets,
                          float *step_h) {
    double loss = 0.0;
    for (int j = 0; j <= k; ++j) {
        int64_t word = j == 0 ? target : negatives[j - 1];
        if (j > 0 && word == target && !offsets) continue;
        float *v = out + word * d;
        float f = dot(h, v, d) - (offsets ? offsets[word] : 0.0f);
        float label = j == 0 ? 1.0f : 0.0f;
        loss -= log_sigmoid(j == 0 ? f : -f);
        float g = (label - 1.0f / (1.0f + expf(-f))) * alpha;
        axpy(g, v, step_h, d); /* with v' before it moves */
        axpy(g, h, v, d);
    }
    return loss;
}

/* One whole update: the input vectors of `inputs` (one for skip-gram; CBOW's context, whose
 * mean is h) predict `target`; NCE's with `offsets` (log k q(w) per word), else negative
 * sampling's. `work` holds 2 d floats. Returns the loss. */
double sgns_update(float *in, float *out, int64_t d, const int64_t *inputs, int64_t n_inputs,
                   int64_t target, const int64_t *negatives, int k, float alpha,
                   const float *offsets, float *work) {
    float *h = work, *step_h = work + d;
    memset(step_h, 0, d * sizeof(float));
    if (n_inputs == 1) {
        h = in + inputs[0] * d;
    } else {
        memset(h, 0, d * sizeof(float));
        for (int64_t i = 0; i < n_inputs; ++i) axpy(1.0f, in + inputs[i] * d, h, d);
        for (int64_t i = 0; i < d; ++i) h[i] /= (float)n_inputs;
    }
    double loss = output_step(h, out, d, target, negatives, k, alpha, offsets, step_h);
    for (int64_t i = 0; i < n_inputs; ++i) axpy(1.0f, step_h, in + inputs[i] * d, d);
    return loss;
}

typedef struct {
    float *in, *out;
    int64_t vocab, d;
    const int64_t *ids, *starts; /* sentence s is ids[starts[s] .. starts[s + 1]) */
    const double *keep, *own;
    const int64_t *alias;
    int window, k, cbow;
    const float *offsets; /* NCE's log k q(w); NULL for negative sampling */
} corpus_t;

/* Trains on sentences [first, last) with one random stream; returns the loss, counts pairs. */
static double train_share(const corpus_t *c, int64_t first, int64_t last, float alpha0,
                          float alpha1, uint64_t seed, int64_t *pairs) {
    int64_t longest = 1, words = c->starts[last] - c->starts[first];
    for (int64_t s = first; s < last; ++s)
        if (c->starts[s + 1] - c->starts[s] > longest) longest = c->starts[s + 1] - c->starts[s];
    int64_t *kept = malloc(longest * sizeof(int64_t));
    int64_t *context = malloc(2 * (int64_t)c->window * sizeof(int64_t));
    int64_t *negatives = malloc((c->k + 1) * sizeof(int64_t));
    float *work = malloc(2 * c->d * sizeof(float));
    double loss = 0.0;
    if (!kept || !context || !negatives || !work || words == 0) {
        free(kept), free(context), free(negatives), free(work);
        return words == 0 ? 0.0 : NAN; /* NaN: no memory, which sgns.py reports */
    }
    int64_t done = 0;
    uint64_t state = seed;
    for (int64_t s = first; s < last; ++s) {
        float alpha = alpha0 + (alpha1 - alpha0) * (float)((double)done / (double)words);
        int64_t n = 0;
        for (int64_t i = c->starts[s]; i < c->starts[s + 1]; ++i)
            if (c->keep[c->ids[i]] >= 1.0 || uniform(&state) < c->keep[c->ids[i]])
                kept[n++] = c->ids[i];
        done += c->starts[s + 1] - c->starts[s];
        for (int64_t i = 0; i < n; ++i) {
            int64_t reach = c->window - (int64_t)(next_random(&state) % (uint64_t)c->window);
            int64_t m = 0;
            for (int64_t j = i - reach; j <= i + reach; ++j)
                if (j >= 0 && j < n && j != i) context[m++] = kept[j];
            if (m == 0) continue;
            int updates = c->cbow ? 1 : (int)m;
            for (int u = 0; u < updates; ++u) {
                for (int j = 0; j < c->k; ++j) negatives[j] = draw(c->own, c->alias, c->vocab, &state);
                loss += sgns_update(c->in, c->out, c->d, c->cbow ? context : context + u,
                                    c->cbow ? m : 1, kept[i], negatives, c->k, alpha, c->offsets,
                                    work);
            }
            *pairs += updates;
        }
    }
    free(kept);
    free(context);
    free(negatives);
    free(work);
    return loss;
}

/* One pass over sentences [0, n_sentences), shared by `threads` threads in contiguous shares of
 * about equal words. Returns the summed loss of every update; *pairs gets their number. */
double sgns_train(float *in, float *out, int64_t vocab, int64_t d, const int64_t *ids,
                  const int64_t *starts, int64_t n_sentences, const double *keep,
                  const double *own, const int64_t *alias, int window, int k, int cbow,
                  const float *offsets, float alpha0, float alpha1, uint64_t seed, int threads,
                  int64_t *pairs) {
    corpus_t c = {in, out, vocab, d, ids, starts, keep, own, alias, window, k, cbow, offsets};
    double loss = 0.0;
    int64_t total_pairs = 0;
#pragma omp parallel num_threads(threads) reduction(+ : loss, total_pairs)
    {
        int t = 0, n = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        n = omp_get_num_threads();
#endif
        /* the share of thread t: the sentences whose first word falls in its slice of words */
        int64_t words = starts[n_sentences], first = 0, last = 0;
        while (first < n_sentences && starts[first] < words * t / n) ++first;
        last = first;
        while (last < n_sentences && starts[last] < words * (t + 1) / n) ++last;
        int64_t mine = 0;
        if (last > first)
            loss += train_share(&c, first, last, alpha0, alpha1,
                                seed + 0x632be59bd9b4e019ULL * (uint64_t)(t + 1), &mine);
        total_pairs += mine;
    }
    *pairs = total_pairs;
    return loss;
}
