/*
 * predictor_pilot.c - owns the pilot predictor: for each MoE layer L and the
 * next MoE layer L', a decayed count of how often a token routed to expert f
 * at L went on to expert e at L'. A guess for L' averages, over the ubatch's
 * tokens and their experts f at L, the learnt P(e | f), and keeps the most
 * likely experts until they carry the asked share of the k routed slots.
 *
 * Why counts and not a model: they learn online from the routing the engine
 * sees anyway, need no training data, and cost k*k adds per token; the decay
 * lets them follow a change of topic without forgetting it in one token. All
 * memory is taken at create, so observe and predict can run on the engine's
 * hot path.
 *
 * Averaging over a token's experts is calibrated (on the replays in
 * predictor.h recall comes out close to the mass asked) but dilutes: when
 * each of a token's k experts leads to its own expert at L', every P(e | f)
 * also holds the other k-1 experts' targets, so the right k rank first yet
 * carry only about one of the k slots between them, and a high mass then
 * pads the set with weak guesses.
 */
#include "predictor.h"
#include "predictor_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Decay is done by growing the weight of new observations rather than shrinking every old count, so an
   observe touches only the k*k cells it adds to. Once the weight passes this, the layer's counts are
   divided by it: far from float's range, and rare (about 40 half-lives apart) so its n_expert^2 cost
   vanishes per call. */
#define PILOT_RESCALE_AT 1e12
/* After a rescale, counts this small in units of the newest observation are 66+ half-lives old: zeroing
   them keeps denormal floats (slow on x86) out of the table. */
#define PILOT_FORGOTTEN 1e-20
/* A half-life of h calls grows the weight by 2^(1/h) per call; below this half-life one call's growth
   alone would approach float's range, and each call all but replaces the past anyway. */
#define PILOT_MIN_HALF_LIFE (1.0 / 64.0)

struct pilot_scored {
    double score;
    uint32_t id;
};

struct pilot {
    uint32_t n_expert;
    double mass, growth;
    uint32_t *table;     /* n_layer: the layer's table, or UINT32_MAX for a layer with no next MoE layer */
    float *count;        /* per table, n_expert x n_expert: [f][e] in units of that table's weight */
    double *row_sum;     /* per table, n_expert: sum over e of count[f][e], so P(e | f) needs no pass */
    double *increment;   /* per table: the weight of the next observation */
    double *weight;      /* scratch, n_expert: how much each expert f of the asked layer speaks */
    struct pilot_scored *scored; /* scratch, n_expert */
};

static void pilot_free(void *impl) {
    struct pilot *pilot = impl;
    if (!pilot) {
        return;
    }
    free(pilot->table);
    free(pilot->count);
    free(pilot->row_sum);
    free(pilot->increment);
    free(pilot->weight);
    free(pilot->scored);
    free(pilot);
}

/* Brings table t back to a weight of 1, and re-sums its rows so float rounding in the adds cannot drift
   the row sums away from the counts they normalise. */
static void pilot_rescale(struct pilot *pilot, uint32_t t) {
    size_t n = pilot->n_expert;
    float scale = (float)(1.0 / pilot->increment[t]);
    for (size_t f = 0; f < n; f++) {
        float *row = pilot->count + ((size_t)t * n + f) * n;
        double sum = 0;
        for (size_t e = 0; e < n; e++) {
            float value = row[e] * scale;
            if (value < (float)PILOT_FORGOTTEN) {
                value = 0;
            }
            row[e] = value;
            sum += value;
        }
        pilot->row_sum[(size_t)t * n + f] = sum;
    }
    pilot->increment[t] = 1;
}

static int pilot_observe(void *impl, uint32_t from_layer, const int32_t *from_ids, const int32_t *to_ids, uint32_t k,
                         uint32_t n_tokens) {
    struct pilot *pilot = impl;
    uint32_t t = pilot->table[from_layer];
    size_t n = pilot->n_expert;
    float unit = (float)pilot->increment[t];
    for (size_t row = 0; row < n_tokens; row++) {
        const int32_t *from = from_ids + row * k, *to = to_ids + row * k;
        for (uint32_t i = 0; i < k; i++) {
            if (from[i] < 0 || (uint32_t)from[i] >= n) {
                continue;
            }
            size_t f = (size_t)from[i];
            float *counts = pilot->count + ((size_t)t * n + f) * n;
            uint32_t added = 0;
            for (uint32_t j = 0; j < k; j++) {
                if (to[j] >= 0 && (uint32_t)to[j] < n) {
                    counts[to[j]] += unit;
                    added++;
                }
            }
            pilot->row_sum[(size_t)t * n + f] += (double)unit * added;
        }
    }
    if (pilot->increment[t] * pilot->growth > PILOT_RESCALE_AT) {
        pilot_rescale(pilot, t);
    }
    pilot->increment[t] *= pilot->growth;
    return 0;
}

static int compare_scored(const void *a, const void *b) {
    const struct pilot_scored *x = a, *y = b;
    if (x->score != y->score) {
        return x->score > y->score ? -1 : 1;
    }
    return x->id < y->id ? -1 : x->id > y->id;
}

static size_t pilot_predict(void *impl, uint32_t layer, const int32_t *ids, uint32_t k, uint32_t n_tokens,
                            uint32_t *out, size_t capacity) {
    struct pilot *pilot = impl;
    uint32_t t = pilot->table[layer];
    size_t n = pilot->n_expert;
    const double *row_sum = pilot->row_sum + (size_t)t * n;
    /* Every token weighs the same, shared evenly among its experts that have been seen leading somewhere:
       the score of e is then the expected share of a token's k slots at the next layer that go to e.
       Adding up each f's weight first makes the cost one pass over each distinct f's row, however many
       tokens share it. */
    memset(pilot->weight, 0, n * sizeof(*pilot->weight));
    uint32_t known_rows = 0;
    for (size_t row = 0; row < n_tokens; row++) {
        const int32_t *from = ids + row * k;
        uint32_t known = 0;
        for (uint32_t i = 0; i < k; i++) {
            known += from[i] >= 0 && (uint32_t)from[i] < n && row_sum[from[i]] > 0;
        }
        if (known == 0) {
            continue;
        }
        known_rows++;
        for (uint32_t i = 0; i < k; i++) {
            if (from[i] >= 0 && (uint32_t)from[i] < n && row_sum[from[i]] > 0) {
                pilot->weight[from[i]] += 1.0 / known;
            }
        }
    }
    if (known_rows == 0) {
        return 0;
    }
    /* tokens nothing is known about are left out of the average, so what is known still sums to k and
       the mass cut keeps its meaning */
    struct pilot_scored *scored = pilot->scored;
    for (size_t e = 0; e < n; e++) {
        scored[e] = (struct pilot_scored){0, (uint32_t)e};
    }
    for (size_t f = 0; f < n; f++) {
        if (pilot->weight[f] == 0) {
            continue;
        }
        const float *counts = pilot->count + ((size_t)t * n + f) * n;
        double scale = pilot->weight[f] * k / (row_sum[f] * known_rows);
        for (size_t e = 0; e < n; e++) {
            scored[e].score += counts[e] * scale;
        }
    }
    size_t n_scored = 0;
    for (size_t e = 0; e < n; e++) {
        if (scored[e].score > 0) {
            scored[n_scored++] = scored[e];
        }
    }
    qsort(scored, n_scored, sizeof(*scored), compare_scored);
    /* the tolerance keeps a set that carries the whole mass, up to rounding, from taking one more expert */
    double target = pilot->mass * k * (1 - 1e-9), carried = 0;
    size_t emitted = 0;
    while (emitted < n_scored && emitted < capacity && carried < target) {
        carried += scored[emitted].score;
        out[emitted] = scored[emitted].id;
        emitted++;
    }
    return emitted;
}

static double pilot_probability(void *impl, size_t i) {
    struct pilot *pilot = impl;
    /* a share of one token's slots is at most one: the chance that one token needs the expert */
    double score = pilot->scored[i].score;
    return score < 1 ? score : 1;
}

static const struct guanaco_predictor_ops pilot_ops = {
    .probability = pilot_probability,
    .observe = pilot_observe,
    .predict = pilot_predict,
    .free = pilot_free,
};

int guanaco_predictor_pilot_create(const struct guanaco_predictor_config *config, const uint8_t *moe_layer,
                                   const uint32_t *next_layer, const struct guanaco_predictor_ops **ops,
                                   void **impl) {
    uint32_t n_tables = 0;
    for (uint32_t l = 0; l < config->n_layer; l++) {
        n_tables += moe_layer[l] && next_layer[l] != UINT32_MAX;
    }
    uint64_t n = config->n_expert;
    /* n above 2^16 is refused before n * n could overflow */
    if (n > 65536 || (uint64_t)n_tables * n * n > GUANACO_PILOT_MAX_ENTRIES) {
        return -E2BIG;
    }
    struct pilot *pilot = calloc(1, sizeof(*pilot));
    if (!pilot) {
        return -ENOMEM;
    }
    pilot->n_expert = config->n_expert;
    pilot->mass = config->mass > 0 ? config->mass : GUANACO_PILOT_DEFAULT_MASS;
    double half_life = config->half_life > 0 ? config->half_life : GUANACO_PILOT_DEFAULT_HALF_LIFE;
    pilot->growth = pow(2.0, 1.0 / fmax(half_life, PILOT_MIN_HALF_LIFE));
    /* at least one element each, so a model with a single MoE layer is not mistaken for out of memory */
    size_t tables = n_tables ? n_tables : 1;
    pilot->table = malloc(config->n_layer * sizeof(*pilot->table));
    pilot->count = calloc(tables * n * n, sizeof(*pilot->count));
    pilot->row_sum = calloc(tables * n, sizeof(*pilot->row_sum));
    pilot->increment = malloc(tables * sizeof(*pilot->increment));
    pilot->weight = malloc(n * sizeof(*pilot->weight));
    pilot->scored = malloc(n * sizeof(*pilot->scored));
    if (!pilot->table || !pilot->count || !pilot->row_sum || !pilot->increment || !pilot->weight ||
        !pilot->scored) {
        pilot_free(pilot);
        return -ENOMEM;
    }
    uint32_t t = 0;
    for (uint32_t l = 0; l < config->n_layer; l++) {
        pilot->table[l] = moe_layer[l] && next_layer[l] != UINT32_MAX ? t++ : UINT32_MAX;
    }
    for (size_t i = 0; i < tables; i++) {
        pilot->increment[i] = 1;
    }
    *ops = &pilot_ops;
    *impl = pilot;
    return 0;
}
