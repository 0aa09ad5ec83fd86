/*
 * predictor_gate.c - owns the gate predictor: turning the next MoE layer's
 * router scores for this ubatch's tokens (its router applied to the current
 * layer's MoE input, computed by router_gate.c) into a guess, and learning
 * how far down each token's ranking the real choice reaches.
 *
 * Why a ranking and a calibration: the next layer's router sees a slightly
 * different input (one more layer of residual updates) than the one the
 * guess is made from, so its top-k is right most of the time but not always.
 * Each token's top (k + margin) experts are kept with their rank, and every
 * observe counts, per layer and rank, how often the expert at that rank was
 * really chosen. That hit rate is the probability the engine's read rule
 * uses, so how much of the margin gets read is measured, not guessed.
 *
 * The read rule reads only guesses that are not resident, and those are
 * chosen less often than the rank's average: the resident experts are the
 * popular ones. On the 24-layer Qwen3 shape's own routing at a 25% budget,
 * reads chosen by the plain rank rate were 32% used (1.18 of 3.72 GB), and
 * decode lost a third. So each rank also keeps the hit rate of its absent
 * guesses alone, which starts at the rank's rate and takes over as absent
 * guesses are checked; an absent guess's probability is that one. It is
 * pooled over layers: decode sees about one absent guess per layer and
 * token, too few for a rate per layer within a run.
 *
 * When no scores come (the first ubatch, before every layer's router has been
 * seen; a router the engine cannot evaluate; a ubatch too large), the
 * predictor falls back to pilot, which learns from every observe anyway.
 * All memory is taken at create.
 */
#include "predictor.h"
#include "predictor_impl.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Before a rank has been observed: the first k ranks are the router's own choice on a nearby input. */
#define GATE_PRIOR_IN_TOP_K 0.8
#define GATE_PRIOR_IN_MARGIN 0.2
/* How many checked absent guesses the rank's overall rate counts for in the absent rate: a few, so that a
   rank's first absent guesses do not swing it to 0 or 1. */
#define GATE_ABSENT_PRIOR_WEIGHT 4.0

struct gate_emitted {
    double probability;
    uint32_t rank; /* the best rank any token gave it: breaks ties, as a higher score is likelier */
    uint32_t id;
};

struct gate {
    uint32_t n_layer, n_expert, top_k, ranks; /* ranks = top_k + margin, at most n_expert */
    const struct guanaco_predictor_ops *pilot_ops;
    void *pilot;
    bool last_from_scores; /* whether the last predict answered from scores (else pilot did) */
    /* the guess being checked: made at pending_from for the next MoE layer */
    uint32_t pending_from, pending_to, pending_tokens;
    uint32_t *ranked;      /* GUANACO_GATE_MAX_TOKENS x ranks: each token's best experts, best first */
    uint64_t *rank_hits;   /* n_layer x ranks: times the expert at that rank was chosen */
    uint64_t *tokens_seen; /* n_layer: tokens whose guess was checked */
    uint64_t *top_k_found, *margin_found; /* n_layer: chosen experts found in the top k, in all ranks */
    uint64_t *absent_seen, *absent_hits;  /* ranks: absent guesses at that rank checked, and chosen */
    uint8_t *pending_absent;              /* n_expert: which experts the pending guess was told are absent */
    double *need;          /* scratch, n_expert: the chance that no token needs the expert (1 = unguessed) */
    uint32_t *best_rank;   /* scratch, n_expert */
    struct gate_emitted *emitted; /* scratch, n_expert: the last guess, most likely first */
};

static void gate_free(void *impl) {
    struct gate *gate = impl;
    if (!gate) {
        return;
    }
    if (gate->pilot_ops) {
        gate->pilot_ops->free(gate->pilot);
    }
    free(gate->ranked);
    free(gate->rank_hits);
    free(gate->tokens_seen);
    free(gate->top_k_found);
    free(gate->margin_found);
    free(gate->absent_seen);
    free(gate->absent_hits);
    free(gate->pending_absent);
    free(gate->need);
    free(gate->best_rank);
    free(gate->emitted);
    free(gate);
}

static double rank_probability(const struct gate *gate, uint32_t layer, uint32_t rank) {
    double prior = rank < gate->top_k ? GATE_PRIOR_IN_TOP_K : GATE_PRIOR_IN_MARGIN;
    return ((double)gate->rank_hits[(size_t)layer * gate->ranks + rank] + prior) /
           ((double)gate->tokens_seen[layer] + 1.0);
}

/* The chance that an absent guess at `rank` is chosen: its own record, with the rank's rate as the prior. */
static double absent_rank_probability(const struct gate *gate, uint32_t layer, uint32_t rank) {
    return ((double)gate->absent_hits[rank] + GATE_ABSENT_PRIOR_WEIGHT * rank_probability(gate, layer, rank)) /
           ((double)gate->absent_seen[rank] + GATE_ABSENT_PRIOR_WEIGHT);
}

static bool chosen(const int32_t *ids, uint32_t k, uint32_t expert) {
    for (uint32_t i = 0; i < k; i++) {
        if (ids[i] >= 0 && (uint32_t)ids[i] == expert) {
            return true;
        }
    }
    return false;
}

static int gate_observe(void *impl, uint32_t from_layer, const int32_t *from_ids, const int32_t *to_ids, uint32_t k,
                        uint32_t n_tokens) {
    struct gate *gate = impl;
    /* the guess made at from_layer was for these tokens' next layer: score each token's ranking */
    if (gate->pending_from == from_layer && gate->pending_tokens == n_tokens && k == gate->top_k) {
        uint32_t to = gate->pending_to;
        uint64_t *hits = gate->rank_hits + (size_t)to * gate->ranks;
        uint64_t *absent_seen = gate->absent_seen, *absent_hits = gate->absent_hits;
        for (uint32_t t = 0; t < n_tokens; t++) {
            const uint32_t *ranked = gate->ranked + (size_t)t * gate->ranks;
            const int32_t *real = to_ids + (size_t)t * k;
            for (uint32_t r = 0; r < gate->ranks; r++) {
                bool was_chosen = chosen(real, k, ranked[r]);
                if (was_chosen) {
                    hits[r]++;
                    gate->margin_found[to]++;
                    gate->top_k_found[to] += r < gate->top_k;
                }
                if (gate->pending_absent[ranked[r]]) {
                    absent_seen[r]++;
                    absent_hits[r] += was_chosen;
                }
            }
        }
        gate->tokens_seen[to] += n_tokens;
    }
    gate->pending_from = UINT32_MAX;
    return gate->pilot_ops->observe(gate->pilot, from_layer, from_ids, to_ids, k, n_tokens);
}

static int compare_emitted(const void *a, const void *b) {
    const struct gate_emitted *x = a, *y = b;
    if (x->probability != y->probability) {
        return x->probability > y->probability ? -1 : 1;
    }
    if (x->rank != y->rank) {
        return x->rank < y->rank ? -1 : 1;
    }
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The `ranks` highest scores of one token, best first, ties to the lower id: a selection pass per rank,
   as ranks is a small multiple of k and n_expert at most a few hundred. */
static void rank_token(const struct gate *gate, const float *scores, uint32_t *ranked) {
    for (uint32_t r = 0; r < gate->ranks; r++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t e = 0; e < gate->n_expert; e++) {
            bool taken = false;
            for (uint32_t q = 0; q < r && !taken; q++) {
                taken = ranked[q] == e;
            }
            /* NaN never wins, so a broken score cannot displace a real one */
            if (!taken && !isnan(scores[e]) && (best == UINT32_MAX || scores[e] > scores[best])) {
                best = e;
            }
        }
        /* all the rest are NaN: fill with the lowest unused ids, which the calibration will mark as weak */
        if (best == UINT32_MAX) {
            for (uint32_t e = 0; e < gate->n_expert && best == UINT32_MAX; e++) {
                bool taken = false;
                for (uint32_t q = 0; q < r && !taken; q++) {
                    taken = ranked[q] == e;
                }
                best = taken ? UINT32_MAX : e;
            }
        }
        ranked[r] = best;
    }
}

static size_t gate_predict_scores(void *impl, uint32_t layer, uint32_t next, const float *scores, uint32_t n_tokens,
                                  const uint8_t *absent, uint32_t *out, size_t capacity) {
    struct gate *gate = impl;
    for (uint32_t e = 0; e < gate->n_expert; e++) {
        gate->need[e] = 1;
        gate->best_rank[e] = UINT32_MAX;
        gate->pending_absent[e] = absent && absent[e];
    }
    for (uint32_t t = 0; t < n_tokens; t++) {
        uint32_t *ranked = gate->ranked + (size_t)t * gate->ranks;
        rank_token(gate, scores + (size_t)t * gate->n_expert, ranked);
        for (uint32_t r = 0; r < gate->ranks; r++) {
            uint32_t e = ranked[r];
            gate->need[e] *= 1 - (gate->pending_absent[e] ? absent_rank_probability(gate, next, r)
                                                           : rank_probability(gate, next, r));
            if (r < gate->best_rank[ranked[r]]) {
                gate->best_rank[ranked[r]] = r;
            }
        }
    }
    /* an expert is needed by the ubatch unless no token needs it */
    size_t n = 0;
    for (uint32_t e = 0; e < gate->n_expert; e++) {
        if (gate->need[e] < 1) {
            gate->emitted[n++] = (struct gate_emitted){1 - gate->need[e], gate->best_rank[e], e};
        }
    }
    qsort(gate->emitted, n, sizeof(*gate->emitted), compare_emitted);
    if (n > capacity) {
        n = capacity;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = gate->emitted[i].id;
    }
    gate->last_from_scores = true;
    gate->pending_from = layer;
    gate->pending_to = next;
    gate->pending_tokens = n_tokens;
    return n;
}

static int gate_recall(void *impl, uint32_t layer, struct guanaco_predictor_recall *recall) {
    struct gate *gate = impl;
    recall->tokens = gate->tokens_seen[layer];
    recall->ranks = gate->ranks;
    recall->top_k = gate->tokens_seen[layer]
                        ? (double)gate->top_k_found[layer] / ((double)gate->tokens_seen[layer] * gate->top_k)
                        : 0;
    recall->all_ranks = gate->tokens_seen[layer]
                            ? (double)gate->margin_found[layer] / ((double)gate->tokens_seen[layer] * gate->top_k)
                            : 0;
    return 0;
}

static size_t gate_predict(void *impl, uint32_t layer, const int32_t *ids, uint32_t k, uint32_t n_tokens,
                           uint32_t *out, size_t capacity) {
    struct gate *gate = impl;
    gate->last_from_scores = false;
    gate->pending_from = UINT32_MAX;
    return gate->pilot_ops->predict(gate->pilot, layer, ids, k, n_tokens, out, capacity);
}

static double gate_probability(void *impl, size_t i) {
    struct gate *gate = impl;
    return gate->last_from_scores ? gate->emitted[i].probability : gate->pilot_ops->probability(gate->pilot, i);
}

static const struct guanaco_predictor_ops gate_ops = {
    .observe = gate_observe,
    .probability = gate_probability,
    .predict = gate_predict,
    .predict_scores = gate_predict_scores,
    .recall = gate_recall,
    .free = gate_free,
};

int guanaco_predictor_gate_create(const struct guanaco_predictor_config *config, const uint8_t *moe_layer,
                                  const uint32_t *next_layer, const struct guanaco_predictor_ops **ops, void **impl) {
    struct gate *gate = calloc(1, sizeof(*gate));
    if (!gate) {
        return -ENOMEM;
    }
    int err = guanaco_predictor_pilot_create(config, moe_layer, next_layer, &gate->pilot_ops, &gate->pilot);
    if (err != 0) {
        free(gate);
        return err;
    }
    uint32_t margin = config->gate_margin ? config->gate_margin : GUANACO_GATE_DEFAULT_MARGIN;
    gate->n_layer = config->n_layer;
    gate->n_expert = config->n_expert;
    gate->top_k = config->top_k;
    gate->ranks = config->top_k + margin < config->n_expert ? config->top_k + margin : config->n_expert;
    gate->pending_from = UINT32_MAX;
    gate->ranked = malloc((size_t)GUANACO_GATE_MAX_TOKENS * gate->ranks * sizeof(*gate->ranked));
    gate->rank_hits = calloc((size_t)gate->n_layer * gate->ranks, sizeof(*gate->rank_hits));
    gate->tokens_seen = calloc(gate->n_layer, sizeof(*gate->tokens_seen));
    gate->top_k_found = calloc(gate->n_layer, sizeof(*gate->top_k_found));
    gate->margin_found = calloc(gate->n_layer, sizeof(*gate->margin_found));
    gate->absent_seen = calloc(gate->ranks, sizeof(*gate->absent_seen));
    gate->absent_hits = calloc(gate->ranks, sizeof(*gate->absent_hits));
    gate->pending_absent = calloc(gate->n_expert, sizeof(*gate->pending_absent));
    gate->need = malloc(gate->n_expert * sizeof(*gate->need));
    gate->best_rank = malloc(gate->n_expert * sizeof(*gate->best_rank));
    gate->emitted = malloc(gate->n_expert * sizeof(*gate->emitted));
    if (!gate->ranked || !gate->rank_hits || !gate->tokens_seen || !gate->top_k_found || !gate->margin_found ||
        !gate->absent_seen || !gate->absent_hits || !gate->pending_absent || !gate->need || !gate->best_rank ||
        !gate->emitted) {
        gate_free(gate);
        return -ENOMEM;
    }
    *ops = &gate_ops;
    *impl = gate;
    return 0;
}
