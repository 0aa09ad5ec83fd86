/*
 * test_policy.c - owns the tests of the replacement policies (policy.c), the
 * MIN replay (belady.c) and the trace simulator (simulate.c): exact victims
 * on hand-made sequences, the budget and cap invariants on random and skewed
 * traces, Belady as an upper bound, guanaco's utility shares (room moves to
 * the layer where it hits, an idle layer shrinks) and its working-set floor, determinism, and (printed, not
 * asserted) the cost per policy on a decode-sized trace and each policy's
 * hit rate against Belady.
 *
 * GUANACO_PERF_TOKENS sets the tokens of the timing run (default 100000;
 * 0 skips it).
 */
#include "belady.h"
#include "budget.h"
#include "policy.h"
#include "routing_synth.h"
#include "simulate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "check.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>


static const enum guanaco_policy_kind all_kinds[] = {GUANACO_POLICY_LRU, GUANACO_POLICY_LFU,
                                                     GUANACO_POLICY_LAYER_LRU, GUANACO_POLICY_GUANACO};
#define N_KINDS (sizeof(all_kinds) / sizeof(all_kinds[0]))

/* ---- deterministic random numbers ---- */

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double random_unit(uint64_t *state) {
    return (double)(next_random(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- traces built here ---- */

struct owned_trace {
    struct guanaco_request_trace view;
    uint64_t *expert_bytes;
    uint64_t *request_token;
    uint32_t *request_layer;
    size_t *request_start;
    uint32_t *experts;
    size_t capacity_requests, capacity_experts;
};

static void trace_init(struct owned_trace *t, uint32_t n_layer, uint32_t n_expert, const uint64_t *bytes,
                       size_t requests, size_t experts) {
    memset(t, 0, sizeof(*t));
    t->expert_bytes = malloc(n_layer * sizeof(uint64_t));
    memcpy(t->expert_bytes, bytes, n_layer * sizeof(uint64_t));
    t->capacity_requests = requests;
    t->capacity_experts = experts;
    t->request_token = malloc(requests * sizeof(uint64_t));
    t->request_layer = malloc(requests * sizeof(uint32_t));
    t->request_start = malloc((requests + 1) * sizeof(size_t));
    t->experts = malloc(experts * sizeof(uint32_t));
    if (!t->expert_bytes || !t->request_token || !t->request_layer || !t->request_start || !t->experts) {
        fprintf(stderr, "out of memory building a trace\n");
        exit(2);
    }
    t->request_start[0] = 0;
    t->view = (struct guanaco_request_trace){.n_layer = n_layer, .n_expert = n_expert, .expert_bytes = t->expert_bytes,
                                     .request_token = t->request_token, .request_layer = t->request_layer,
                                     .request_start = t->request_start, .experts = t->experts};
}

static void trace_add(struct owned_trace *t, uint64_t token, uint32_t layer, const uint32_t *experts, size_t n) {
    size_t r = t->view.n_requests++;
    t->request_token[r] = token;
    t->request_layer[r] = layer;
    memcpy(t->experts + t->request_start[r], experts, n * sizeof(uint32_t));
    t->request_start[r + 1] = t->request_start[r] + n;
}

static void trace_free(struct owned_trace *t) {
    free(t->expert_bytes);
    free(t->request_token);
    free(t->request_layer);
    free(t->request_start);
    free(t->experts);
}

/*
 * Decode-like routing: every token sweeps the MoE layers in order and picks
 * `k` distinct experts per layer. Popularity is Zipf(skew) over a per-layer
 * permutation; with probability `reuse` a pick repeats one the layer made a
 * few tokens back (geometric, mean `depth`: adjacent tokens share experts); every `drift`
 * tokens a tenth of the ranks are shuffled (topics change, hot experts cool).
 * skew 0, reuse 0 and drift 0 give uniform random routing.
 */
struct routing_shape {
    double skew, reuse;
    double depth;    /* reuse draws from a token back a geometric number of steps of this mean (>= 1) */
    uint32_t drift;
    double spread;   /* layers differ: layer l's skew is skew * (1 + spread * (2 l / (L - 1) - 1)) */
};

static void make_routing(struct owned_trace *t, uint32_t n_layer, uint32_t n_expert, const uint64_t *bytes,
                         uint32_t k, size_t tokens, struct routing_shape shape, uint64_t seed) {
    uint32_t moe_layers = 0;
    for (uint32_t l = 0; l < n_layer; l++) {
        moe_layers += bytes[l] != 0;
    }
    trace_init(t, n_layer, n_expert, bytes, tokens * moe_layers, tokens * moe_layers * k);
    uint64_t rng = seed;
    double *cdf = malloc((size_t)n_layer * n_expert * sizeof(double)), *totals = malloc(n_layer * sizeof(double));
    uint32_t *rank_to_expert = malloc((size_t)n_layer * n_expert * sizeof(uint32_t));
    enum { window = 64 };
    uint32_t *previous = calloc((size_t)n_layer * k * window, sizeof(uint32_t)); /* ring of recent picks */
    uint8_t *taken = calloc(n_expert, 1);
    for (uint32_t l = 0; l < n_layer; l++) {
        double position = n_layer > 1 ? 2.0 * l / (n_layer - 1) - 1.0 : 0.0, total = 0;
        double skew = shape.skew * (1.0 + shape.spread * position);
        for (uint32_t r = 0; r < n_expert; r++) {
            total += pow(r + 1.0, -skew);
            cdf[(size_t)l * n_expert + r] = total;
        }
        totals[l] = total;
    }
    for (uint32_t l = 0; l < n_layer; l++) {
        uint32_t *perm = rank_to_expert + (size_t)l * n_expert;
        for (uint32_t e = 0; e < n_expert; e++) {
            perm[e] = e;
        }
        for (uint32_t e = n_expert; e > 1; e--) {
            uint32_t j = (uint32_t)(next_random(&rng) % e), swap = perm[e - 1];
            perm[e - 1] = perm[j];
            perm[j] = swap;
        }
    }
    uint32_t chosen[512];
    for (size_t token = 0; token < tokens; token++) {
        for (uint32_t l = 0; l < n_layer; l++) {
            if (bytes[l] == 0) {
                continue;
            }
            uint32_t *perm = rank_to_expert + (size_t)l * n_expert;
            if (shape.drift && token > 0 && token % shape.drift == 0) {
                for (uint32_t i = 0; i < n_expert / 10; i++) {
                    uint32_t a = (uint32_t)(next_random(&rng) % n_expert), b = (uint32_t)(next_random(&rng) % n_expert);
                    uint32_t swap = perm[a];
                    perm[a] = perm[b];
                    perm[b] = swap;
                }
            }
            uint32_t n = 0;
            while (n < k) {
                uint32_t e;
                if (token > 0 && random_unit(&rng) < shape.reuse) {
                    /* back = 1, 2, ... with P(back > j) = (1 - 1/depth)^j, within what exists */
                    double stay = shape.depth > 1 ? 1.0 - 1.0 / shape.depth : 0.0;
                    size_t back = 1;
                    while (back < token && back < window && random_unit(&rng) < stay) {
                        back++;
                    }
                    e = previous[((size_t)l * window + (token - back) % window) * k + next_random(&rng) % k];
                } else {
                    const double *layer_cdf = cdf + (size_t)l * n_expert;
                    double u = random_unit(&rng) * totals[l];
                    uint32_t lo = 0, hi = n_expert - 1;
                    while (lo < hi) {
                        uint32_t mid = (lo + hi) / 2;
                        if (layer_cdf[mid] < u) {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    e = perm[lo];
                }
                if (!taken[e]) {
                    taken[e] = 1;
                    chosen[n++] = e;
                }
            }
            for (uint32_t i = 0; i < n; i++) {
                taken[chosen[i]] = 0;
                previous[((size_t)l * window + token % window) * k + i] = chosen[i];
            }
            trace_add(t, token, l, chosen, n);
        }
    }
    free(cdf);
    free(totals);
    free(rank_to_expert);
    free(previous);
    free(taken);
}

static struct guanaco_policy_config config_of(enum guanaco_policy_kind kind, const struct guanaco_request_trace *t,
                                              uint64_t budget, uint32_t cap) {
    return (struct guanaco_policy_config){.kind = kind, .n_layer = t->n_layer, .n_expert = t->n_expert,
                                          .expert_bytes = t->expert_bytes, .budget_bytes = budget,
                                          .max_per_layer = cap};
}

/*
 * Replays a trace step by step and checks, after every access and evict: the
 * missing list is exactly what was not resident; victims were resident, are
 * not now, and were not needed by the protected request; resident bytes stay
 * within max(budget, the request's bytes); only the protected layer may stay
 * over the cap, and only by what it needs now; the byte count matches the
 * resident set. Returns the hits, and a hash of every decision.
 */
static uint64_t replay_checked(enum guanaco_policy_kind kind, const struct guanaco_request_trace *t, uint64_t budget,
                               uint32_t cap, bool oracle_hints, uint64_t *hash_out, int *violations) {
    struct guanaco_policy_config config = config_of(kind, t, budget, cap);
    struct guanaco_policy *policy = NULL;
    if (guanaco_policy_create(&config, &policy) != 0) {
        (*violations)++;
        return 0;
    }
    size_t n_slots = (size_t)t->n_layer * t->n_expert;
    uint32_t *missing = malloc(t->n_expert * sizeof(uint32_t));
    uint32_t *victim_layers = malloc(n_slots * sizeof(uint32_t)), *victim_experts = malloc(n_slots * sizeof(uint32_t));
    uint8_t *was_resident = malloc(t->n_expert);
    uint64_t hits = 0, hash = 1469598103934665603ull;
    for (size_t r = 0; r < t->n_requests; r++) {
        uint32_t layer = t->request_layer[r];
        const uint32_t *experts = t->experts + t->request_start[r];
        size_t n = t->request_start[r + 1] - t->request_start[r], n_missing = 0, n_victims = 0;
        for (uint32_t e = 0; e < t->n_expert; e++) {
            was_resident[e] = guanaco_policy_is_resident(policy, layer, e);
        }
        if (guanaco_policy_access(policy, layer, experts, n, t->request_token[r], missing, &n_missing) != 0) {
            (*violations)++;
            break;
        }
        size_t expected_missing = 0;
        for (size_t i = 0; i < n; i++) {
            expected_missing += !was_resident[experts[i]];
            *violations += !guanaco_policy_is_resident(policy, layer, experts[i]);
        }
        for (size_t i = 0; i < n_missing; i++) {
            *violations += was_resident[missing[i]];
        }
        *violations += n_missing != expected_missing;
        hits += n - n_missing;
        for (size_t i = t->request_start[r + 1]; oracle_hints && r + 1 < t->n_requests && i < t->request_start[r + 2]; i++) {
            guanaco_policy_hint(policy, t->request_layer[r + 1], t->experts[i], 1.0f); /* a perfect pilot */
        }
        if (guanaco_policy_evict(policy, layer, victim_layers, victim_experts, n_slots, &n_victims) != 0) {
            (*violations)++;
        }
        for (size_t v = 0; v < n_victims; v++) {
            *violations += guanaco_policy_is_resident(policy, victim_layers[v], victim_experts[v]);
            for (size_t i = 0; i < n && victim_layers[v] == layer; i++) {
                *violations += experts[i] == victim_experts[v];
            }
            hash = (hash ^ (victim_layers[v] * 1000003ull + victim_experts[v])) * 1099511628211ull;
        }
        hash = (hash ^ n_missing) * 1099511628211ull;
        uint64_t request_bytes = n * t->expert_bytes[layer];
        uint64_t resident = guanaco_policy_resident_bytes(policy);
        *violations += resident > (budget > request_bytes ? budget : request_bytes);
        if (cap) {
            for (uint32_t l = 0; l < t->n_layer; l++) {
                uint32_t count = guanaco_policy_layer_resident_count(policy, l);
                *violations += count > cap && !(l == layer && count <= n);
            }
        }
        if (r % 97 == 0 || r + 1 == t->n_requests) {
            uint64_t counted = 0;
            for (uint32_t l = 0; l < t->n_layer; l++) {
                for (uint32_t e = 0; e < t->n_expert; e++) {
                    counted += guanaco_policy_is_resident(policy, l, e) ? t->expert_bytes[l] : 0;
                }
            }
            *violations += counted != resident;
        }
    }
    free(missing);
    free(victim_layers);
    free(victim_experts);
    free(was_resident);
    guanaco_policy_free(policy);
    if (hash_out) {
        *hash_out = hash;
    }
    return hits;
}

/* ---- hand-made sequences ---- */

/* A guanaco policy of one variant (guanaco_policy_variant), or any kind with variant 0. */
static struct guanaco_policy *make_variant(enum guanaco_policy_kind kind, enum guanaco_policy_variant variant,
                                           uint32_t n_layer, uint32_t n_expert, const uint64_t *bytes, uint64_t budget,
                                           uint32_t cap) {
    struct guanaco_policy_config config = {.kind = kind, .n_layer = n_layer, .n_expert = n_expert,
                                           .expert_bytes = bytes, .budget_bytes = budget, .max_per_layer = cap,
                                           .variant = variant};
    struct guanaco_policy *policy = NULL;
    return guanaco_policy_create(&config, &policy) == 0 ? policy : NULL;
}

static struct guanaco_policy *make_policy(enum guanaco_policy_kind kind, uint32_t n_layer, uint32_t n_expert,
                                          const uint64_t *bytes, uint64_t budget, uint32_t cap) {
    struct guanaco_policy_config config = {.kind = kind, .n_layer = n_layer, .n_expert = n_expert,
                                           .expert_bytes = bytes, .budget_bytes = budget, .max_per_layer = cap};
    struct guanaco_policy *policy = NULL;
    return guanaco_policy_create(&config, &policy) == 0 ? policy : NULL;
}

/* One access of a single expert then evict; returns the victim count and the first victim. */
static size_t touch(struct guanaco_policy *policy, uint32_t layer, uint32_t expert, uint64_t now,
                    uint32_t *victim_layer, uint32_t *victim_expert) {
    uint32_t missing[1], layers[64], experts[64];
    size_t n_missing, n_victims = 0;
    if (guanaco_policy_access(policy, layer, &expert, 1, now, missing, &n_missing) != 0 ||
        guanaco_policy_evict(policy, layer, layers, experts, 64, &n_victims) != 0) {
        return 999;
    }
    if (n_victims && victim_layer) {
        *victim_layer = layers[0];
        *victim_expert = experts[0];
    }
    return n_victims;
}

static void test_names_and_errors(void) {
    enum guanaco_policy_kind kind;
    for (size_t i = 0; i < N_KINDS; i++) {
        CHECK(guanaco_policy_kind_from_name(guanaco_policy_kind_name(all_kinds[i]), &kind) == 0 && kind == all_kinds[i]);
    }
    CHECK(guanaco_policy_kind_from_name("belady", &kind) == -EINVAL);
    CHECK(strstr(guanaco_policy_kind_names(), guanaco_policy_kind_name(GUANACO_POLICY_DEFAULT)) != NULL);
    CHECK(strcmp(guanaco_policy_kind_names(), "lru|lfu|layer-lru|guanaco") == 0); /* joined from the one list */

    uint64_t bytes[2] = {0, 100};
    struct guanaco_policy_config bad = {.kind = GUANACO_POLICY_LRU, .n_layer = 0, .n_expert = 4, .expert_bytes = bytes};
    struct guanaco_policy *policy = (struct guanaco_policy *)&bad;
    CHECK(guanaco_policy_create(&bad, &policy) == -EINVAL && policy == NULL);
    bad.n_layer = 2;
    bad.kind = (enum guanaco_policy_kind)42;
    CHECK(guanaco_policy_create(&bad, &policy) == -EINVAL);

    for (size_t i = 0; i < N_KINDS; i++) {
        policy = make_policy(all_kinds[i], 2, 4, bytes, 250, 0);
        uint32_t ids[2] = {1, 4}, missing[2];
        size_t n_missing = 7;
        CHECK(policy != NULL);
        CHECK(guanaco_policy_access(policy, 0, ids, 1, 0, missing, &n_missing) == -EINVAL); /* dense layer */
        CHECK(guanaco_policy_access(policy, 2, ids, 1, 0, missing, &n_missing) == -EINVAL);
        CHECK(guanaco_policy_access(policy, 1, ids, 2, 0, missing, &n_missing) == -EINVAL && n_missing == 0);
        CHECK(guanaco_policy_resident_bytes(policy) == 0 && !guanaco_policy_is_resident(policy, 1, 1));
        guanaco_policy_hint(policy, 9, 9, 1.0f); /* ignored */
        guanaco_policy_free(policy);
    }
}

static void test_lru_victims(void) {
    uint64_t bytes[2] = {10, 10};
    struct guanaco_policy *policy = make_policy(GUANACO_POLICY_LRU, 2, 4, bytes, 30, 0);
    uint32_t vl = 99, ve = 99;
    CHECK(touch(policy, 0, 0, 0, NULL, NULL) == 0);
    CHECK(touch(policy, 1, 1, 0, NULL, NULL) == 0);
    CHECK(touch(policy, 0, 2, 1, NULL, NULL) == 0);
    CHECK(touch(policy, 0, 0, 1, NULL, NULL) == 0);                       /* hit: (0,0) is recent again */
    CHECK(touch(policy, 1, 3, 2, &vl, &ve) == 1 && vl == 1 && ve == 1);   /* least recent: (1,1) */
    CHECK(touch(policy, 0, 2, 3, NULL, NULL) == 0);
    CHECK(touch(policy, 1, 1, 3, &vl, &ve) == 1 && vl == 0 && ve == 0);   /* now (0,0) is */
    CHECK(guanaco_policy_resident_bytes(policy) == 30);
    guanaco_policy_free(policy);

    /* the textbook string 1 2 3 4 1 2 5 1 2 3 4 5 in 3 frames: LRU faults 10 times */
    const uint32_t string[12] = {1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5};
    uint64_t one = 1;
    policy = make_policy(GUANACO_POLICY_LRU, 1, 6, &one, 3, 0);
    size_t faults = 0;
    for (int i = 0; i < 12; i++) {
        uint32_t missing[1];
        size_t n_missing, n_victims;
        uint32_t layers[4], experts[4];
        guanaco_policy_access(policy, 0, &string[i], 1, (uint64_t)i, missing, &n_missing);
        guanaco_policy_evict(policy, 0, layers, experts, 4, &n_victims);
        faults += n_missing;
    }
    CHECK(faults == 10);
    guanaco_policy_free(policy);
}

static void test_lfu_and_layer_lru_victims(void) {
    uint64_t bytes[2] = {10, 10};
    struct guanaco_policy_config config = {.kind = GUANACO_POLICY_LFU, .n_layer = 1, .n_expert = 4,
                                           .expert_bytes = bytes, .budget_bytes = 30, .half_life = 1e9};
    struct guanaco_policy *policy = NULL;
    CHECK(guanaco_policy_create(&config, &policy) == 0);
    uint32_t vl = 99, ve = 99;
    for (uint64_t t = 0; t < 3; t++) {
        touch(policy, 0, 0, t, NULL, NULL);
    }
    touch(policy, 0, 1, 3, NULL, NULL);
    touch(policy, 0, 1, 4, NULL, NULL);
    touch(policy, 0, 2, 5, NULL, NULL);
    touch(policy, 0, 0, 6, NULL, NULL); /* expert 2 is both the least frequent and not the least recent */
    CHECK(touch(policy, 0, 3, 7, &vl, &ve) == 1 && ve == 2);
    guanaco_policy_free(policy);

    /* decay: 0 was used often long ago, 1 a little lately; with a short half-life 0 goes first */
    config.half_life = 2;
    CHECK(guanaco_policy_create(&config, &policy) == 0);
    for (uint64_t t = 0; t < 5; t++) {
        touch(policy, 0, 0, t, NULL, NULL);
    }
    touch(policy, 0, 1, 40, NULL, NULL);
    touch(policy, 0, 2, 41, NULL, NULL);
    CHECK(touch(policy, 0, 3, 42, &vl, &ve) == 1 && ve == 0);
    guanaco_policy_free(policy);

    /* layer-lru: the layer above its share gives, even when another holds the globally oldest */
    policy = make_policy(GUANACO_POLICY_LAYER_LRU, 2, 8, bytes, 40, 0);
    CHECK(guanaco_policy_layer_target_bytes(policy, 0) == 20);
    touch(policy, 0, 0, 0, NULL, NULL);
    touch(policy, 0, 1, 0, NULL, NULL);
    touch(policy, 1, 0, 0, NULL, NULL);
    touch(policy, 1, 1, 1, NULL, NULL);
    CHECK(touch(policy, 1, 2, 2, &vl, &ve) == 1 && vl == 1 && ve == 0);
    guanaco_policy_free(policy);
}

static void test_oversubscription_and_capacity(void) {
    uint64_t bytes[2] = {10, 10};
    for (size_t i = 0; i < N_KINDS; i++) {
        struct guanaco_policy *policy = make_policy(all_kinds[i], 2, 16, bytes, 30, 0);
        uint32_t ids[6] = {0, 1, 2, 3, 4, 5}, missing[6], layers[16], experts[16];
        size_t n_missing, n_victims;
        CHECK(guanaco_policy_access(policy, 0, ids, 6, 0, missing, &n_missing) == 0 && n_missing == 6);
        CHECK(guanaco_policy_evict(policy, 0, layers, experts, 16, &n_victims) == 0 && n_victims == 0);
        CHECK(guanaco_policy_resident_bytes(policy) == 60); /* all six needed now: overshoot of one layer */
        CHECK(guanaco_policy_access(policy, 1, ids, 1, 0, missing, &n_missing) == 0 && n_missing == 1);
        /* a full array stops evict early; the next call carries on */
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 2, &n_victims) == -ENOBUFS && n_victims == 2);
        CHECK(layers[0] == 0 && layers[1] == 0 && guanaco_policy_resident_bytes(policy) == 50);
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0 && n_victims == 2);
        CHECK(guanaco_policy_resident_bytes(policy) == 30 && guanaco_policy_is_resident(policy, 1, 0));
        guanaco_policy_free(policy);
    }
}

/* A reserve for read-ahead lowers the budget rule for every kind, never below what the protected layer needs,
   and giving it back lets the next access keep more. */
static void test_reserve(void) {
    uint64_t bytes[2] = {10, 10};
    for (size_t i = 0; i < N_KINDS; i++) {
        struct guanaco_policy *policy = make_policy(all_kinds[i], 2, 16, bytes, 60, 0);
        uint32_t ids[6] = {0, 1, 2, 3, 4, 5}, missing[6], layers[16], experts[16];
        size_t n_missing, n_victims;
        CHECK(guanaco_policy_access(policy, 0, ids, 3, 0, missing, &n_missing) == 0);
        CHECK(guanaco_policy_access(policy, 1, ids, 3, 1, missing, &n_missing) == 0);
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0 && n_victims == 0);
        CHECK(guanaco_policy_resident_bytes(policy) == 60);
        guanaco_policy_set_reserve(policy, 25);
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0 && n_victims == 3);
        CHECK(guanaco_policy_resident_bytes(policy) == 30); /* 60 - 25 rounds down to whole experts */
        for (uint32_t e = 0; e < 3; e++) {
            CHECK(guanaco_policy_is_resident(policy, 1, e)); /* the protected layer kept its experts */
        }
        guanaco_policy_set_reserve(policy, 60); /* more than the budget: only the protected layer stays */
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0 && n_victims == 0);
        CHECK(guanaco_policy_resident_bytes(policy) == 30);
        guanaco_policy_set_reserve(policy, 0);
        CHECK(guanaco_policy_access(policy, 0, ids + 3, 3, 2, missing, &n_missing) == 0 && n_missing == 3);
        CHECK(guanaco_policy_evict(policy, 0, layers, experts, 16, &n_victims) == 0 && n_victims == 0);
        CHECK(guanaco_policy_resident_bytes(policy) == 60);
        guanaco_policy_free(policy);
    }
}

/* --guanaco-ram auto resizes the budget once a context's buffers are known: a smaller one is reached at the
   next evict (protected layer kept), a larger one lets more stay, and layer-lru's shares follow it. */
static void test_set_budget(void) {
    uint64_t bytes[2] = {10, 10};
    for (size_t i = 0; i < N_KINDS; i++) {
        struct guanaco_policy *policy = make_policy(all_kinds[i], 2, 16, bytes, 60, 0);
        uint32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7}, missing[8], layers[16], experts[16];
        size_t n_missing, n_victims;
        CHECK(guanaco_policy_access(policy, 0, ids, 3, 0, missing, &n_missing) == 0);
        CHECK(guanaco_policy_access(policy, 1, ids, 3, 1, missing, &n_missing) == 0);
        guanaco_policy_set_budget(policy, 40);
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0 && n_victims == 2);
        CHECK(guanaco_policy_resident_bytes(policy) == 40);
        for (uint32_t e = 0; e < 3; e++) {
            CHECK(guanaco_policy_is_resident(policy, 1, e));
        }
        guanaco_policy_set_budget(policy, 160);
        CHECK(guanaco_policy_access(policy, 0, ids, 8, 2, missing, &n_missing) == 0);
        CHECK(guanaco_policy_access(policy, 1, ids, 8, 3, missing, &n_missing) == 0);
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0 && n_victims == 0);
        CHECK(guanaco_policy_resident_bytes(policy) == 160);
        guanaco_policy_set_budget(policy, 100);
        CHECK(guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims) == 0);
        CHECK(guanaco_policy_resident_bytes(policy) <= 100 && guanaco_policy_resident_bytes(policy) >= 80);
        if (all_kinds[i] == GUANACO_POLICY_LAYER_LRU) {
            CHECK(guanaco_policy_layer_target_bytes(policy, 0) == 50); /* half of the new budget */
        }
        guanaco_policy_free(policy);
    }
}

static void test_cap(void) {
    uint64_t bytes[2] = {10, 10};
    for (size_t i = 0; i < N_KINDS; i++) {
        struct guanaco_policy *policy = make_policy(all_kinds[i], 2, 8, bytes, 1000, 2);
        for (uint32_t e = 0; e < 5; e++) {
            touch(policy, 0, e, e, NULL, NULL);
        }
        CHECK(guanaco_policy_layer_resident_count(policy, 0) == 2);
        CHECK(guanaco_policy_is_resident(policy, 0, 4) && guanaco_policy_is_resident(policy, 0, 3));
        uint32_t ids[3] = {5, 6, 7}, missing[3], layers[8], experts[8];
        size_t n_missing, n_victims;
        guanaco_policy_access(policy, 0, ids, 3, 9, missing, &n_missing);
        CHECK(guanaco_policy_evict(policy, 0, layers, experts, 8, &n_victims) == 0 && n_victims == 2);
        CHECK(guanaco_policy_layer_resident_count(policy, 0) == 3); /* over the cap only by what it needs */
        touch(policy, 1, 0, 10, NULL, NULL);                       /* once layer 0 is done, back under it */
        CHECK(guanaco_policy_layer_resident_count(policy, 0) == 2);
        guanaco_policy_free(policy);
    }
}

/* Accesses of layer 1 that need all it holds, so every victim must come from layer 0. */
static size_t grow_layer1(struct guanaco_policy *policy, uint32_t n, uint64_t now, uint32_t *victim) {
    uint32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7}, missing[8], layers[16], experts[16];
    size_t n_missing, n_victims = 0;
    guanaco_policy_access(policy, 1, ids, n, now, missing, &n_missing);
    guanaco_policy_evict(policy, 1, layers, experts, 16, &n_victims);
    if (n_victims == 1 && layers[0] == 0) {
        *victim = experts[0];
    }
    return n_victims;
}

static void test_guanaco_hint(void) {
    uint64_t bytes[2] = {10, 10};
    struct guanaco_policy *policy = make_policy(GUANACO_POLICY_GUANACO, 2, 8, bytes, 50, 0);
    uint32_t ids[4] = {0, 1, 2, 3}, missing[4], victim = 99;
    size_t n_missing;
    guanaco_policy_access(policy, 0, ids, 4, 0, missing, &n_missing);
    CHECK(grow_layer1(policy, 1, 0, &victim) == 0);
    guanaco_policy_hint(policy, 0, 0, 0.9f); /* at now 0, lifetime 1: protects while now < 2 */
    CHECK(grow_layer1(policy, 2, 1, &victim) == 1 && victim == 1); /* 0 was coldest (ties by id), but hinted */
    CHECK(guanaco_policy_is_resident(policy, 0, 0));
    CHECK(grow_layer1(policy, 3, 2, &victim) == 1 && victim == 0); /* lapsed: layer 0 never came */
    guanaco_policy_hint(policy, 0, 2, 1.0f);
    guanaco_policy_hint(policy, 0, 2, 0.0f);                       /* withdrawn */
    CHECK(grow_layer1(policy, 4, 2, &victim) == 1 && victim == 2);
    guanaco_policy_hint(policy, 0, 3, 1.0f);                       /* everything layer 0 has: hints yield */
    CHECK(grow_layer1(policy, 5, 2, &victim) == 1 && victim == 3 && guanaco_policy_resident_bytes(policy) == 50);
    guanaco_policy_free(policy);

    /* a hint is a guess about the layer's next access: that access ends it, right or wrong */
    policy = make_policy(GUANACO_POLICY_GUANACO, 1, 8, bytes, 40, 0);
    uint32_t vl = 99, ve = 99;
    guanaco_policy_access(policy, 0, ids, 4, 0, missing, &n_missing);
    guanaco_policy_hint(policy, 0, 0, 1.0f);
    CHECK(touch(policy, 0, 4, 0, &vl, &ve) == 1 && ve == 0);
    guanaco_policy_free(policy);
}

/* One decode step of `layer` with ids[0..n): access, then evict. Returns the hits. */
static size_t step(struct guanaco_policy *policy, uint32_t layer, const uint32_t *ids, size_t n, uint64_t now) {
    uint32_t missing[16], layers[64], experts[64];
    size_t n_missing, n_victims;
    guanaco_policy_access(policy, layer, ids, n, now, missing, &n_missing);
    guanaco_policy_evict(policy, layer, layers, experts, 64, &n_victims);
    return n - n_missing;
}

/*
 * Utility shares: layer 0 routes to expert 0 and one of the other 7 in turn, so beyond 2 its experts never hit
 * (it would need all 8); layer 1 cycles through 6 experts two at a time, so it hits only when it holds all 6.
 * With 8 experts of budget, guanaco moves layer 0's useless room to layer 1 (2 + 6) and hits 3 of 4; layer-lru's
 * fixed halves (4 + 4) leave layer 1 cycling through misses and hit 1 of 4.
 */
static void test_guanaco_utility_shares(void) {
    uint64_t bytes[2] = {10, 10};
    size_t hits[2] = {0, 0};
    uint32_t held0 = 0, held1 = 0;
    for (int k = 0; k < 2; k++) {
        enum guanaco_policy_kind kind = k == 0 ? GUANACO_POLICY_GUANACO : GUANACO_POLICY_LAYER_LRU;
        struct guanaco_policy *policy = make_policy(kind, 2, 8, bytes, 80, 0);
        for (uint64_t t = 0; t < 400; t++) {
            uint32_t hot[2] = {0, 1 + (uint32_t)(t % 7)}, cycle[2] = {(uint32_t)(2 * t % 6), (uint32_t)(2 * t % 6 + 1)};
            size_t h0 = step(policy, 0, hot, 2, t), h1 = step(policy, 1, cycle, 2, t);
            if (t >= 300) {
                hits[k] += h0 + h1;
            }
        }
        if (k == 0) {
            held0 = guanaco_policy_layer_resident_count(policy, 0);
            held1 = guanaco_policy_layer_resident_count(policy, 1);
        }
        guanaco_policy_free(policy);
    }
    printf("guanaco: hot layer and 6-expert cycle in 8 experts of budget: guanaco holds %u + %u and hits %zu of "
           "400 in the last 100 tokens, layer-lru hits %zu\n", held0, held1, hits[0], hits[1]);
    CHECK(held0 == 2 && held1 == 6);
    CHECK(hits[0] == 300);
    CHECK(hits[1] == 100); /* layer 0's expert 0 only */
}

/*
 * The working-set floor: with a budget of exactly one token's working set per layer (2 of 8 experts, 3 layers)
 * no layer is ever left holding fewer experts than its last access needed, whatever the per-rank counts say,
 * so guanaco hits exactly what lru does there. Layer 0 is skewed (its second expert is worth little), layers 1
 * and 2 repeat their experts from token to token (each is worth much).
 */
static void test_guanaco_working_set_floor(void) {
    uint64_t bytes[3] = {10, 10, 10};
    uint64_t rng = 23;
    struct guanaco_policy *guanaco = make_policy(GUANACO_POLICY_GUANACO, 3, 8, bytes, 60, 0);
    struct guanaco_policy *lru = make_policy(GUANACO_POLICY_LRU, 3, 8, bytes, 60, 0);
    uint32_t previous[3][2] = {{0, 1}, {0, 1}, {0, 1}};
    size_t hits_guanaco = 0, hits_lru = 0;
    bool floor_kept = true;
    for (uint64_t t = 0; t < 600; t++) {
        for (uint32_t layer = 0; layer < 3; layer++) {
            uint32_t ids[2];
            for (int i = 0; i < 2; i++) {
                do {
                    uint32_t fresh = (uint32_t)(next_random(&rng) % 8);
                    bool reuse = layer > 0 && random_unit(&rng) < 0.7;
                    ids[i] = layer == 0 && i == 0 ? 0 : reuse ? previous[layer][i] : fresh;
                } while (i == 1 && ids[1] == ids[0]);
            }
            previous[layer][0] = ids[0];
            previous[layer][1] = ids[1];
            hits_guanaco += step(guanaco, layer, ids, 2, t);
            hits_lru += step(lru, layer, ids, 2, t);
            for (uint32_t other = 0; other < 3 && t > 0; other++) {
                floor_kept &= guanaco_policy_layer_resident_count(guanaco, other) >= 2;
            }
        }
    }
    printf("guanaco: one working set per layer: %zu hits, lru %zu, floor kept: %s\n", hits_guanaco, hits_lru,
           floor_kept ? "yes" : "no");
    CHECK(floor_kept);
    CHECK(hits_guanaco == hits_lru);
    guanaco_policy_free(guanaco);
    guanaco_policy_free(lru);
}

/* Two busy layers share the budget; when layer 0 goes idle its share shrinks and layer 1's grows, and back. */
static void test_guanaco_idle_layer_shrinks(enum guanaco_policy_variant variant) {
    uint64_t bytes[2] = {10, 10};
    struct guanaco_policy *policy = make_variant(GUANACO_POLICY_GUANACO, variant, 2, 32, bytes, 160, 0);
    uint64_t rng = 11;
    uint64_t target0_busy = 0, target1_busy = 0;
    uint32_t resident0_busy = 0;
    uint64_t target0_idle = 0, target1_idle = 0;
    uint32_t resident0_idle = 0;
    for (uint64_t t = 0; t < 900; t++) {
        if (t == 600) {
            target0_idle = guanaco_policy_layer_target_bytes(policy, 0);
            target1_idle = guanaco_policy_layer_target_bytes(policy, 1);
            resident0_idle = guanaco_policy_layer_resident_count(policy, 0);
        }
        for (uint32_t layer = 0; layer < 2; layer++) {
            if (layer == 0 && t >= 300 && t < 600) {
                continue; /* layer 0 idle for 300 tokens, then busy again */
            }
            uint32_t ids[4], missing[4], layers[32], experts[32];
            size_t n = 0, n_missing, n_victims;
            while (n < 4) {
                /* zipf 1 over 32 (weight 1/(e+1)): each extra expert hits less, so equal layers share evenly */
                double u = random_unit(&rng) * 4.0585, sum = 0; /* 4.0585: the 32 weights' sum */
                uint32_t e = 0;
                while (e < 31 && (sum += 1.0 / (e + 1)) < u) {
                    e++;
                }
                bool dup = false;
                for (size_t i = 0; i < n; i++) {
                    dup |= ids[i] == e;
                }
                if (!dup) {
                    ids[n++] = e;
                }
            }
            guanaco_policy_access(policy, layer, ids, n, t, missing, &n_missing);
            guanaco_policy_evict(policy, layer, layers, experts, 32, &n_victims);
        }
        if (t == 299) {
            target0_busy = guanaco_policy_layer_target_bytes(policy, 0);
            target1_busy = guanaco_policy_layer_target_bytes(policy, 1);
            resident0_busy = guanaco_policy_layer_resident_count(policy, 0);
        }
    }
    uint64_t target0_back = guanaco_policy_layer_target_bytes(policy, 0);
    uint32_t resident0_back = guanaco_policy_layer_resident_count(policy, 0);
    printf("guanaco (variant %d): layer 0 busy/idle/busy again: target %llu -> %llu -> %llu bytes (%u -> %u -> %u experts); "
           "layer 1 always busy: %llu -> %llu\n",
           (int)variant, (unsigned long long)target0_busy, (unsigned long long)target0_idle,
           (unsigned long long)target0_back,
           resident0_busy, resident0_idle, resident0_back, (unsigned long long)target1_busy,
           (unsigned long long)target1_idle);
    CHECK(target0_busy >= 50 && target0_busy <= 110); /* about half while both are busy */
    CHECK(resident0_busy >= 5);
    if (variant == GUANACO_POLICY_FLOOR_RECENT || variant == GUANACO_POLICY_NO_FLOOR_RECENT ||
        variant == GUANACO_POLICY_LRU_ORDER) {
        CHECK(target0_idle * 4 < target0_busy);
        CHECK(resident0_idle <= 1);
    } else { /* in frequency order layer 1's last ranks hit less, so the idle layer's fading counts compete longer */
        CHECK(target0_idle * 2 < target0_busy);
        CHECK(resident0_idle <= 3);
    }
    CHECK(target1_idle > target1_busy);
    CHECK(target0_back >= 40 && resident0_back >= 4); /* and it grows back, to its working set at least */
    guanaco_policy_free(policy);
}

/*
 * The duel (ADAPT): on tracegen's Qwen3-30B-A3B preset at 8 experts per layer (one token's working set) the
 * floor costs hits, and on its Mixtral-8x7B preset at 2 (one working set again) dropping it costs hits; ADAPT
 * must gain 3 points over lru on the first and not lose on the second, so it has to choose differently.
 */
struct synth_sink {
    struct owned_trace *trace;
    uint32_t top_k, tokens; /* tokens per sequence */
};

static int add_decision(void *user, uint32_t sequence, uint32_t token, uint32_t layer, const int32_t *ids) {
    struct synth_sink *sink = user;
    uint32_t experts[64];
    for (uint32_t i = 0; i < sink->top_k; i++) {
        experts[i] = (uint32_t)ids[i];
    }
    /* one clock over the sequences, one after another, as guanaco-sim replays them */
    trace_add(sink->trace, (uint64_t)sequence * sink->tokens + token, layer, experts, sink->top_k);
    return 0;
}

/* A trace of the named tracegen preset, one byte per expert; with zipf > 0 the preset's shape routed as
   guanaco-tracegen --shape with these flags. false (and nothing to free) when the preset is unknown. */
static bool synth_trace(struct owned_trace *t, const char *preset_name, double zipf, double zipf_offset,
                        double zipf_spread) {
    const struct guanaco_synth_preset *preset = guanaco_synth_preset_find(preset_name);
    CHECK(preset != NULL);
    if (!preset) {
        return false;
    }
    struct guanaco_synth_params params = preset->params;
    if (zipf > 0) {
        params = (struct guanaco_synth_params){
            .n_layer = params.n_layer, .n_expert = params.n_expert, .top_k = params.top_k,
            .moe_layer = params.moe_layer, .sequences = 4, .tokens = 512, .seed = 1,
            .zipf = zipf, .zipf_offset = zipf_offset, .zipf_spread = zipf_spread, .topic_strength = 1.0,
        };
    }
    uint64_t bytes[256];
    CHECK(params.n_layer <= 256 && params.top_k <= 64);
    for (uint32_t l = 0; l < params.n_layer; l++) {
        bytes[l] = 1;
    }
    size_t requests = (size_t)params.sequences * params.tokens * params.n_layer;
    trace_init(t, params.n_layer, params.n_expert, bytes, requests, requests * params.top_k);
    struct synth_sink sink = {.trace = t, .top_k = params.top_k, .tokens = params.tokens};
    CHECK(guanaco_synth_generate(&params, add_decision, &sink) == 0);
    return true;
}

static double hit_percent(const struct owned_trace *t, enum guanaco_policy_kind kind,
                          enum guanaco_policy_variant variant, uint32_t per_layer) {
    struct guanaco_policy_config config = config_of(kind, &t->view, (uint64_t)per_layer * t->view.n_layer, 0);
    config.variant = variant;
    struct guanaco_replay_stats stats;
    CHECK(guanaco_simulate(&t->view, NULL, &config, false, &stats) == 0);
    return stats.accesses ? 100.0 * (double)stats.hits / (double)stats.accesses : 0;
}

static void test_guanaco_duel(void) {
    static const struct {
        const char *preset;
        uint32_t per_layer;
        double zipf, zipf_offset, zipf_spread; /* 0: the preset's */
    } cases[] = {{"qwen3-30b-a3b", 8, 0, 0, 0},
                 {"mixtral-8x7b", 2, 0, 0, 0},
                 /* bench/POLICY.md's qwen3-static at 64e: steep fixed popularity at half the experts, where every
                    other variant misses 0.4% more than lru, so only following lru's order from the start ties it */
                 {"qwen3-30b-a3b", 64, 8, 20, 0.8}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct owned_trace t;
        if (!synth_trace(&t, cases[c].preset, cases[c].zipf, cases[c].zipf_offset, cases[c].zipf_spread)) {
            continue;
        }
        double lru = hit_percent(&t, GUANACO_POLICY_LRU, 0, cases[c].per_layer);
        double floor = hit_percent(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_FLOOR_RECENT, cases[c].per_layer);
        double no_floor = hit_percent(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_NO_FLOOR_RECENT, cases[c].per_layer);
        double adapt = hit_percent(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_ADAPT, cases[c].per_layer);
        double lru_order = hit_percent(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_LRU_ORDER, cases[c].per_layer);
        printf("guanaco duel: %s preset%s at %u experts per layer: lru %.2f%%, lru order %.2f%%, floor %.2f%%, "
               "no floor %.2f%%, adapt %.2f%%\n", cases[c].preset, cases[c].zipf > 0 ? " (static)" : "",
               cases[c].per_layer, lru, lru_order, floor, no_floor, adapt);
        CHECK(lru_order == lru); /* the variant is lru's order exactly: every victim the same */
        if (c == 0) {
            CHECK(no_floor >= floor + 3.0); /* the floor is the wrong choice here ... */
            CHECK(adapt >= lru + 3.0);      /* ... and the duel drops it */
        } else if (c == 1) {
            CHECK(no_floor + 1.0 <= lru);   /* dropping the floor is the wrong choice here ... */
            CHECK(adapt >= lru);            /* ... and the duel keeps it */
        } else {
            CHECK(floor < lru && no_floor < lru); /* the other variants lose here ... */
            CHECK(adapt >= lru);                  /* ... and the duel does not follow them */
        }
        trace_free(&t);
    }
}

/*
 * The duel counts a call's misses per token (guanaco_policy_access_batch). The synthetic trace is cut into turns:
 * a 32-token prompt, its ubatch one call per layer (the union of its tokens' experts; a call that needs half of
 * the layer or more is streamed, so the policy hears of its hits only, as in the engine), then 96 decode tokens,
 * after the engine's preload. Counted whole, a prompt's call adds dozens of misses per layer at once, and the
 * duel chose the decode's variant from them: on Qwen3-preset routing at 32 experts per layer (25%) it then hit
 * 80.4% of the decode's accesses against lru's 82.2%, the loss measured live (bench/PIPELINE.md, Dec 5). Per
 * token it must not lose to lru in any case, and keep a 3-point gain at 8 and 16 experts per layer.
 * The floor variant keeps every layer at its working set, as lru does, and moves only the rest by the per-rank
 * counts, so it must not lose to lru here either. It did while a hit was counted at the rank its key from before
 * its previous use gave it (deeper than the access found it): 80.7% against 82.2% at 32 experts per layer, 96.0
 * against 96.3% on static routing; with that fixed, the whole count no longer loses in these cases either.
 */
/* The distinct experts that requests [first, end) name in `layer`, into ids (seen: n_expert zeroed flags, left
   zeroed); returns how many, and the number of those requests in *tokens when given. */
static size_t union_of_layer(const struct guanaco_request_trace *v, size_t first, size_t end, uint32_t layer,
                             uint8_t *seen, uint32_t *ids, size_t *tokens) {
    size_t n = 0, requests = 0;
    for (size_t q = first; q < end; q++) {
        requests += v->request_layer[q] == layer;
        for (size_t i = v->request_start[q]; v->request_layer[q] == layer && i < v->request_start[q + 1]; i++) {
            if (!seen[v->experts[i]]) {
                seen[v->experts[i]] = 1;
                ids[n++] = v->experts[i];
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        seen[ids[i]] = 0;
    }
    if (tokens) {
        *tokens = requests;
    }
    return n;
}

static double decode_hit_percent_with_prompts(const struct owned_trace *t, enum guanaco_policy_kind kind,
                                              enum guanaco_policy_variant variant, uint32_t per_layer,
                                              bool per_token) {
    enum { PROMPT = 32, TURN = 128 };
    const struct guanaco_request_trace *v = &t->view;
    struct guanaco_policy_config config = config_of(kind, v, (uint64_t)per_layer * v->n_layer, 0);
    config.variant = variant;
    struct guanaco_policy *policy = NULL;
    CHECK(guanaco_policy_create(&config, &policy) == 0);
    size_t n_slots = (size_t)v->n_layer * v->n_expert;
    uint32_t *ids = malloc(v->n_expert * sizeof(uint32_t)), *missing = malloc(v->n_expert * sizeof(uint32_t));
    uint32_t *victim_layers = malloc(n_slots * sizeof(uint32_t)), *victim_experts = malloc(n_slots * sizeof(uint32_t));
    uint8_t *in_prompt = calloc(v->n_expert, 1);
    CHECK(ids && missing && victim_layers && victim_experts && in_prompt && policy);
    uint64_t hits = 0, accesses = 0;
    /* the engine's --guanaco-preload: every layer starts with its share of the budget, the lowest-numbered */
    for (uint32_t layer = 0; policy && layer < v->n_layer; layer++) {
        size_t n_victims = 0, n_missing = 0;
        for (uint32_t e = 0; e < per_layer && e < v->n_expert; e++) {
            ids[e] = e;
        }
        CHECK(guanaco_policy_access(policy, layer, ids, per_layer < v->n_expert ? per_layer : v->n_expert, 0, missing,
                                    &n_missing) == 0);
        CHECK(guanaco_policy_evict(policy, layer, victim_layers, victim_experts, n_slots, &n_victims) == 0);
    }
    size_t r = 0;
    while (policy && r < v->n_requests) {
        uint64_t token = v->request_token[r];
        if (token % TURN != 0) { /* a decode token: every layer's request on its own */
            size_t n_victims = 0, n_missing = 0, n = v->request_start[r + 1] - v->request_start[r];
            CHECK(guanaco_policy_access(policy, v->request_layer[r], v->experts + v->request_start[r], n, token,
                                        missing, &n_missing) == 0);
            CHECK(guanaco_policy_evict(policy, v->request_layer[r], victim_layers, victim_experts, n_slots,
                                       &n_victims) == 0);
            hits += n - n_missing;
            accesses += n;
            r++;
            continue;
        }
        /* a prompt: tokens [token, token + PROMPT), one call per layer with the union of their experts */
        size_t end = r;
        while (end < v->n_requests && v->request_token[end] < token + PROMPT) {
            end++;
        }
        for (uint32_t layer = 0; layer < v->n_layer; layer++) {
            size_t n = union_of_layer(v, r, end, layer, in_prompt, ids, NULL);
            size_t n_victims = 0, n_missing = 0;
            if (guanaco_streams_layer(n, v->n_expert)) { /* streamed: the policy hears of its hits only */
                size_t n_hits = 0;
                for (size_t i = 0; i < n; i++) {
                    if (guanaco_policy_is_resident(policy, layer, ids[i])) {
                        ids[n_hits++] = ids[i];
                    }
                }
                n = n_hits;
            }
            if (n == 0) {
                continue;
            }
            CHECK(guanaco_policy_access_batch(policy, layer, ids, n, token, per_token ? PROMPT : 1, missing,
                                              &n_missing) == 0);
            CHECK(guanaco_policy_evict(policy, layer, victim_layers, victim_experts, n_slots, &n_victims) == 0);
        }
        r = end;
    }
    guanaco_policy_free(policy);
    free(ids);
    free(missing);
    free(victim_layers);
    free(victim_experts);
    free(in_prompt);
    return accesses ? 100.0 * (double)hits / (double)accesses : 0;
}

static void test_guanaco_duel_per_token(void) {
    static const struct {
        uint32_t per_layer;
        double zipf, zipf_offset, zipf_spread; /* 0: the preset's */
    } cases[] = {{8, 0, 0, 0}, {16, 0, 0, 0}, {32, 0, 0, 0}, {32, 8, 20, 0.8}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct owned_trace t;
        if (!synth_trace(&t, "qwen3-30b-a3b", cases[c].zipf, cases[c].zipf_offset, cases[c].zipf_spread)) {
            continue;
        }
        uint32_t per_layer = cases[c].per_layer;
        double lru = decode_hit_percent_with_prompts(&t, GUANACO_POLICY_LRU, 0, per_layer, true);
        double adapt = decode_hit_percent_with_prompts(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_ADAPT, per_layer, true);
        double whole = decode_hit_percent_with_prompts(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_ADAPT, per_layer, false);
        double floor = decode_hit_percent_with_prompts(&t, GUANACO_POLICY_GUANACO, GUANACO_POLICY_FLOOR_RECENT, per_layer,
                                                       true);
        printf("guanaco duel with 32-token prompts: %s at %u experts per layer: decode hits lru %.2f%%, floor %.2f%%, "
               "adapt %.2f%% (a prompt's misses counted whole: %.2f%%)\n", cases[c].zipf > 0 ? "static" : "preset",
               per_layer, lru, floor, adapt, whole);
        CHECK(adapt >= lru);
        CHECK(floor >= lru);
        if (cases[c].per_layer < 32) {
            CHECK(adapt >= lru + 3.0);
        }
        trace_free(&t);
    }
}

/* Hits of a replay in which each request is one access of `tokens[r]` tokens (NULL: one each) and one evict. */
static uint64_t batch_replay_hits(const struct guanaco_request_trace *v, const struct guanaco_policy_config *config,
                                  const size_t *row_start) {
    struct guanaco_policy *policy = NULL;
    size_t n_slots = (size_t)v->n_layer * v->n_expert;
    uint32_t *missing = malloc(v->n_expert * sizeof(uint32_t));
    uint32_t *victim_layers = malloc(n_slots * sizeof(uint32_t)), *victim_experts = malloc(n_slots * sizeof(uint32_t));
    CHECK(missing && victim_layers && victim_experts && guanaco_policy_create(config, &policy) == 0);
    uint64_t hits = 0;
    for (size_t r = 0; policy && r < v->n_requests; r++) {
        size_t n = v->request_start[r + 1] - v->request_start[r], n_missing = 0, n_victims = 0;
        uint32_t tokens = row_start ? (uint32_t)(row_start[r + 1] - row_start[r]) : 1;
        CHECK(guanaco_policy_access_batch(policy, v->request_layer[r], v->experts + v->request_start[r], n,
                                          v->request_token[r], tokens, missing, &n_missing) == 0);
        CHECK(guanaco_policy_evict(policy, v->request_layer[r], victim_layers, victim_experts, n_slots, &n_victims) == 0);
        hits += n - n_missing;
    }
    guanaco_policy_free(policy);
    free(missing);
    free(victim_layers);
    free(victim_experts);
    return hits;
}

/*
 * guanaco_simulate counts a ubatch's misses per token, as the live residency does: a request of several rows (a
 * prompt's union of experts) weighs in the guanaco policy's duel as that many tokens. The Qwen3-preset trace with
 * the first 32 tokens of every 128 merged into one request per layer, as the engine's prompt calls are.
 */
static void test_simulate_counts_rows(void) {
    enum { PROMPT = 32, TURN = 128 };
    struct owned_trace t, merged;
    if (!synth_trace(&t, "qwen3-30b-a3b", 0, 0, 0)) {
        return;
    }
    const struct guanaco_request_trace *v = &t.view;
    trace_init(&merged, v->n_layer, v->n_expert, v->expert_bytes, v->n_requests, v->request_start[v->n_requests]);
    size_t *row_start = malloc((v->n_requests + 1) * sizeof(size_t));
    uint32_t *ids = malloc(v->n_expert * sizeof(uint32_t));
    uint8_t *seen = calloc(v->n_expert, 1);
    CHECK(row_start && ids && seen);
    row_start[0] = 0;
    for (size_t r = 0; row_start && ids && seen && r < v->n_requests;) {
        uint64_t token = v->request_token[r];
        size_t end = r + 1;
        if (token % TURN == 0) { /* a prompt: one request per layer, the union of its tokens' experts */
            while (end < v->n_requests && v->request_token[end] < token + PROMPT) {
                end++;
            }
        }
        for (uint32_t layer = 0; layer < v->n_layer; layer++) {
            size_t tokens = 0, n = union_of_layer(v, r, end, layer, seen, ids, &tokens);
            if (tokens > 0) {
                trace_add(&merged, token, layer, ids, n);
                row_start[merged.view.n_requests] = row_start[merged.view.n_requests - 1] + tokens;
            }
        }
        r = end;
    }
    struct guanaco_request_rows rows = {.top_k = 8, .request_row_start = row_start};
    uint64_t budget = 16 * (uint64_t)v->n_layer * v->expert_bytes[v->n_layer - 1];
    struct guanaco_policy_config config = config_of(GUANACO_POLICY_GUANACO, &merged.view, budget, 0);
    struct guanaco_replay_stats per_token, per_request;
    CHECK(guanaco_simulate(&merged.view, &rows, &config, false, &per_token) == 0);
    CHECK(guanaco_simulate(&merged.view, NULL, &config, false, &per_request) == 0);
    uint64_t live = batch_replay_hits(&merged.view, &config, row_start);
    uint64_t whole = batch_replay_hits(&merged.view, &config, NULL);
    printf("guanaco_simulate with 32-token prompt requests, 16 experts per layer: hits %llu counted per token, "
           "%llu counted per request\n", (unsigned long long)per_token.hits, (unsigned long long)per_request.hits);
    CHECK(per_token.hits == live && per_request.hits == whole);
    CHECK(per_token.hits != per_request.hits); /* the rows reach the policy: this trace tells the two apart */
    rows.request_row_start = NULL;
    CHECK(guanaco_simulate(&merged.view, &rows, &config, false, &per_token) == -EINVAL);
    free(row_start);
    free(ids);
    free(seen);
    trace_free(&merged);
    trace_free(&t);
}

/* ---- Belady ---- */

static void test_belady_exact(void) {
    /* the textbook string in 3 frames: MIN faults 7 times (FIFO 9, LRU 10) */
    const uint32_t string[12] = {1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5};
    uint64_t one = 1;
    struct owned_trace t;
    trace_init(&t, 1, 6, &one, 12, 12);
    for (int i = 0; i < 12; i++) {
        trace_add(&t, (uint64_t)i, 0, &string[i], 1);
    }
    struct guanaco_replay_stats stats;
    bool exact = false;
    CHECK(guanaco_belady(&t.view, 3, &stats, &exact) == 0 && exact);
    CHECK(stats.misses == 7 && stats.hits == 5 && stats.evictions == 4 && stats.bytes_read == 7);
    trace_free(&t);

    /* requests of several experts, all resident at once: {0,1} {2} {0} {1} in 2 frames.
       At {2}, 0 is next needed before 1, so 1 goes; at {1}, 0 and 2 are never needed again. */
    uint64_t bytes[2] = {5, 9};
    trace_init(&t, 2, 4, bytes, 8, 16);
    trace_add(&t, 0, 0, (uint32_t[]){0, 1}, 2);
    trace_add(&t, 1, 0, (uint32_t[]){2}, 1);
    trace_add(&t, 2, 0, (uint32_t[]){0}, 1);
    trace_add(&t, 3, 0, (uint32_t[]){1}, 1);
    CHECK(guanaco_belady(&t.view, 10, &stats, &exact) == 0 && exact);
    CHECK(stats.hits == 1 && stats.misses == 4 && stats.evictions == 2 && stats.bytes_read == 20);
    trace_add(&t, 4, 1, (uint32_t[]){3}, 1); /* a layer of another size: farthest-next-use is a heuristic */
    CHECK(guanaco_belady(&t.view, 10, &stats, &exact) == 0 && !exact);
    CHECK(stats.peak_resident_bytes <= 10 || stats.worst_overshoot_bytes <= 9);
    /* a request bigger than the budget still loads whole */
    CHECK(guanaco_belady(&t.view, 5, &stats, &exact) == 0 && stats.worst_overshoot_bytes == 5);
    trace_add(&t, 5, 0, (uint32_t[]){1, 1}, 2); /* repeated expert: malformed */
    CHECK(guanaco_belady(&t.view, 10, &stats, &exact) == -EINVAL);
    trace_free(&t);
}

/* Fewest misses over every possible eviction choice, by dynamic programming over resident sets. */
static uint32_t optimal_misses(const struct owned_trace *t, size_t r, uint32_t resident, uint32_t frames,
                               uint32_t *memo) {
    if (r == t->view.n_requests) {
        return 0;
    }
    uint32_t *cell = &memo[r * 256 + resident];
    if (*cell != UINT32_MAX) {
        return *cell;
    }
    uint32_t needed = 0;
    for (size_t i = t->request_start[r]; i < t->request_start[r + 1]; i++) {
        needed |= 1u << (t->request_layer[r] * t->view.n_expert + t->experts[i]);
    }
    uint32_t loaded = resident | needed, limit = frames;
    if ((uint32_t)__builtin_popcount(needed) > limit) {
        limit = (uint32_t)__builtin_popcount(needed);
    }
    uint32_t best = UINT32_MAX;
    for (uint32_t keep = loaded;; keep = (keep - 1) & loaded) { /* every subset that still holds the request */
        if ((keep & needed) == needed && (uint32_t)__builtin_popcount(keep) <= limit) {
            uint32_t rest = optimal_misses(t, r + 1, keep, frames, memo);
            best = rest < best ? rest : best;
        }
        if (keep == 0) {
            break;
        }
    }
    *cell = best + (uint32_t)__builtin_popcount(needed & ~resident);
    return *cell;
}

static void test_belady_against_exhaustive(void) {
    uint64_t rng = 3, bytes[2] = {7, 7};
    int mismatches = 0;
    for (int round = 0; round < 300; round++) {
        uint32_t n_expert = 2 + (uint32_t)(next_random(&rng) % 3), frames = 1 + (uint32_t)(next_random(&rng) % 4);
        size_t n_requests = 4 + next_random(&rng) % 10;
        struct owned_trace t;
        trace_init(&t, 2, n_expert, bytes, n_requests, n_requests * n_expert);
        for (size_t r = 0; r < n_requests; r++) {
            uint32_t ids[4], n = 0;
            for (uint32_t e = 0; e < n_expert; e++) {
                if (next_random(&rng) % 3 == 0) {
                    ids[n++] = e;
                }
            }
            trace_add(&t, r / 2, (uint32_t)(r % 2), ids, n);
        }
        uint32_t *memo = malloc(n_requests * 256 * sizeof(uint32_t));
        memset(memo, 0xff, n_requests * 256 * sizeof(uint32_t));
        struct guanaco_replay_stats stats;
        bool exact;
        guanaco_belady(&t.view, frames * 7, &stats, &exact);
        mismatches += stats.misses != optimal_misses(&t, 0, 0, frames, memo);
        free(memo);
        trace_free(&t);
    }
    CHECK(mismatches == 0);
}

/* Belady is an upper bound for every policy, with and without a cap; all invariants hold throughout. */
static void test_bound_and_invariants(void) {
    uint64_t bytes[6] = {100, 100, 100, 100, 100, 100};
    uint64_t mixed[6] = {0, 100, 300, 0, 200, 100};
    struct routing_shape uniform = {0, 0, 1, 0, 0}, skewed = {1.0, 0.6, 3, 100, 0.5};
    struct {
        const char *name;
        const uint64_t *bytes;
        struct routing_shape shape;
    } cases[] = {{"random", bytes, uniform}, {"skewed", bytes, skewed}, {"skewed, mixed sizes", mixed, skewed}};
    for (size_t c = 0; c < 3; c++) {
        struct owned_trace t;
        make_routing(&t, 6, 32, cases[c].bytes, 4, 400, cases[c].shape, 100 + c);
        uint64_t all = 0;
        for (int l = 0; l < 6; l++) {
            all += 32 * cases[c].bytes[l];
        }
        uint64_t budgets[3] = {all / 10, all / 4, all / 2};
        for (int b = 0; b < 3; b++) {
            struct guanaco_replay_stats best;
            bool exact;
            CHECK(guanaco_belady(&t.view, budgets[b], &best, &exact) == 0);
            CHECK(exact == (cases[c].bytes == bytes));
            for (size_t i = 0; i < N_KINDS; i++) {
                for (uint32_t cap = 0; cap <= 6; cap += 3) { /* 3: below the 4 experts of a request */
                    int violations = 0;
                    uint64_t hash1, hash2;
                    bool hints = cap == 0 && all_kinds[i] == GUANACO_POLICY_GUANACO;
                    uint64_t hits = replay_checked(all_kinds[i], &t.view, budgets[b], cap, false, &hash1, &violations);
                    uint64_t again = replay_checked(all_kinds[i], &t.view, budgets[b], cap, false, &hash2, &violations);
                    uint64_t hinted = hints ? replay_checked(all_kinds[i], &t.view, budgets[b], 0, true, NULL, &violations) : 0;
                    if (exact && hints) {
                        CHECK(best.hits >= hinted);
                    }
                    CHECK(violations == 0);
                    CHECK(hits == again && hash1 == hash2); /* deterministic */
                    if (exact) {
                        CHECK(best.hits >= hits);
                    }
                    struct guanaco_replay_stats simulated;
                    struct guanaco_policy_config config = config_of(all_kinds[i], &t.view, budgets[b], cap);
                    CHECK(guanaco_simulate(&t.view, NULL, &config, false, &simulated) == 0 && simulated.hits == hits);
                    if (violations || (exact && best.hits < hits)) {
                        fprintf(stderr, "  in %s, budget %llu, %s, cap %u: hits %llu, belady %llu, %d violations\n",
                                cases[c].name, (unsigned long long)budgets[b], guanaco_policy_kind_name(all_kinds[i]),
                                cap, (unsigned long long)hits, (unsigned long long)best.hits, violations);
                    }
                }
            }
        }
        trace_free(&t);
    }
}

/* ---- printed: hit rates against Belady, and the cost per policy ---- */

static void print_hit_rates(void) {
    enum { LAYERS = 48, EXPERTS = 128, K = 8, TOKENS = 2000 };
    uint64_t bytes[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        bytes[l] = 1;
    }
    /* calibrated: layer-lru here gives 41/66/82/91% at 8/16/32/64 experts per layer, where REFERENCE.md
       section 7 measured per-layer LRU on Qwen3-30B-A3B at 42/65/81/92% */
    struct routing_shape shape = {1.0, 0.6, 3, 500, 0.5};
    struct owned_trace t;
    make_routing(&t, LAYERS, EXPERTS, bytes, K, TOKENS, shape, 42);
    printf("hit rate on a skewed synthetic trace (%d tokens x %d layers x %d of %d experts, zipf %.1f +-%.0f%% "
           "by layer, reuse %.1f from ~%.0f tokens back, drift every %u):\n", TOKENS, LAYERS, K, EXPERTS, shape.skew,
           100 * shape.spread, shape.reuse, shape.depth, shape.drift);
    printf("  budget    belady");
    for (size_t i = 0; i < N_KINDS; i++) {
        printf("  %9s", guanaco_policy_kind_name(all_kinds[i]));
    }
    printf("  guanaco+oracle hints\n");
    const int percents[4] = {5, 10, 25, 50}; /* 5%: less than one token's working set (6.25%) */
    for (int b = 0; b < 4; b++) {
        uint64_t budget = (uint64_t)LAYERS * EXPERTS * percents[b] / 100;
        struct guanaco_replay_stats stats;
        bool exact;
        guanaco_belady(&t.view, budget, &stats, &exact);
        printf("  %5d%%  %7.1f%%", percents[b], 100.0 * stats.hits / stats.accesses);
        for (size_t i = 0; i < N_KINDS; i++) {
            struct guanaco_policy_config config = config_of(all_kinds[i], &t.view, budget, 0);
            guanaco_simulate(&t.view, NULL, &config, false, &stats);
            printf("  %8.1f%%", 100.0 * stats.hits / stats.accesses);
        }
        int violations = 0;
        uint64_t hinted = replay_checked(GUANACO_POLICY_GUANACO, &t.view, budget, 0, true, NULL, &violations);
        printf("  %8.1f%%\n", 100.0 * hinted / stats.accesses);
        CHECK(violations == 0);
    }
    trace_free(&t);
}

static double seconds_since(const struct timespec *start) {
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    return (double)(end.tv_sec - start->tv_sec) + (double)(end.tv_nsec - start->tv_nsec) * 1e-9;
}

static void print_timings(size_t tokens) {
    enum { LAYERS = 48, EXPERTS = 128, K = 8 };
    uint64_t bytes[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        bytes[l] = 1;
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    struct owned_trace t;
    make_routing(&t, LAYERS, EXPERTS, bytes, K, tokens, (struct routing_shape){1.0, 0.6, 3, 500, 0.5}, 5);
    size_t accesses = t.request_start[t.view.n_requests];
    printf("timing: %zu tokens x %d layers x %d of %d experts = %zu accesses (generated in %.2f s), budget 25%%:\n",
           tokens, LAYERS, K, EXPERTS, accesses, seconds_since(&start));
    uint64_t budget = (uint64_t)LAYERS * EXPERTS / 4;
    struct guanaco_replay_stats stats;
    for (size_t i = 0; i < N_KINDS; i++) {
        struct guanaco_policy_config config = config_of(all_kinds[i], &t.view, budget, 0);
        clock_gettime(CLOCK_MONOTONIC, &start);
        guanaco_simulate(&t.view, NULL, &config, false, &stats);
        double s = seconds_since(&start);
        printf("  %-9s %6.2f s  %5.1f ns/access  hit %.1f%%\n", guanaco_policy_kind_name(all_kinds[i]), s,
               s * 1e9 / (double)accesses, 100.0 * stats.hits / stats.accesses);
    }
    bool exact;
    clock_gettime(CLOCK_MONOTONIC, &start);
    guanaco_belady(&t.view, budget, &stats, &exact);
    double s = seconds_since(&start);
    printf("  %-9s %6.2f s  %5.1f ns/access  hit %.1f%%\n", "belady", s, s * 1e9 / (double)accesses,
           100.0 * stats.hits / stats.accesses);
    trace_free(&t);
}

int main(void) {
    test_names_and_errors();
    test_lru_victims();
    test_lfu_and_layer_lru_victims();
    test_oversubscription_and_capacity();
    test_reserve();
    test_set_budget();
    test_cap();
    test_guanaco_hint();
    test_guanaco_utility_shares();
    test_guanaco_working_set_floor();
    for (int v = GUANACO_POLICY_ADAPT; v <= GUANACO_POLICY_LRU_ORDER; v++) {
        test_guanaco_idle_layer_shrinks((enum guanaco_policy_variant)v);
    }
    test_guanaco_duel();
    test_guanaco_duel_per_token();
    test_simulate_counts_rows();
    test_belady_exact();
    test_belady_against_exhaustive();
    test_bound_and_invariants();
    print_hit_rates();
    const char *env = getenv("GUANACO_PERF_TOKENS");
    size_t tokens = env ? strtoull(env, NULL, 10) : 100000;
    if (tokens > 0) {
        print_timings(tokens);
    }
    return check_summary();
}
