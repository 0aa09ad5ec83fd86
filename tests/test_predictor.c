/*
 * test_predictor.c - owns the tests of the expert predictors (predictor.c,
 * predictor_pilot.c): kind names, refused configs and arguments, NONE and a
 * cold pilot predicting nothing, learnt maps predicted exactly (one expert
 * per token, groups of k), the ranking under k co-routed experts, uniform
 * routing giving large sets, decay letting a changed map win within a few
 * half-lives, ubatches of several tokens, ids out of range, dense layers
 * between MoE layers, capacity, and the long-run rescaling of the counts;
 * and gate (predictor_gate.c): ranking by score, the pilot fallback, the
 * per-rank calibration and its recall, several tokens, NaN scores; and the
 * read-ahead throttle (read_ahead_throttle.c): the bound on what a losing
 * read-ahead costs, a winning one kept, the margin, a machine that changes,
 * prompts starting on, ubatches from an earlier epoch.
 */
#include "predictor.h"
#include "read_ahead_throttle.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- helpers ---- */

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* k distinct ids below n into row. */
static void random_row(uint64_t *state, uint32_t n, uint32_t k, int32_t *row) {
    for (uint32_t i = 0; i < k; i++) {
        bool again;
        do {
            row[i] = (int32_t)(next_random(state) % n);
            again = false;
            for (uint32_t j = 0; j < i; j++) again = again || row[j] == row[i];
        } while (again);
    }
}

static struct guanaco_predictor *make(enum guanaco_predictor_kind kind, uint32_t n_layer, uint32_t n_expert,
                                      uint32_t k, double mass, double half_life) {
    struct guanaco_predictor_config config = {.kind = kind, .n_layer = n_layer, .n_expert = n_expert, .top_k = k,
                                              .mass = mass, .half_life = half_life};
    struct guanaco_predictor *p = NULL;
    int err = guanaco_predictor_create(&config, &p);
    CHECK(err == 0 && p != NULL);
    if (!p) {
        fprintf(stderr, "cannot create a predictor (%d): stopping\n", err);
        exit(1);
    }
    return p;
}

static bool contains(const uint32_t *set, size_t n, uint32_t id) {
    for (size_t i = 0; i < n; i++) {
        if (set[i] == id) return true;
    }
    return false;
}

static uint32_t map_a(uint32_t f, uint32_t n) { return (5 * f + 3) % n; }
static uint32_t map_b(uint32_t f, uint32_t n) { return (3 * f + 1) % n; }

/* ---- tests ---- */

static void test_kind_names(void) {
    enum guanaco_predictor_kind kind = GUANACO_PREDICTOR_PILOT;
    CHECK(guanaco_predictor_kind_from_name("none", &kind) == 0 && kind == GUANACO_PREDICTOR_NONE);
    CHECK(guanaco_predictor_kind_from_name("pilot", &kind) == 0 && kind == GUANACO_PREDICTOR_PILOT);
    CHECK(guanaco_predictor_kind_from_name("oracle", &kind) == -EINVAL);
    CHECK(guanaco_predictor_kind_from_name(NULL, &kind) == -EINVAL);
    CHECK(guanaco_predictor_kind_from_name("gate", &kind) == 0 && kind == GUANACO_PREDICTOR_GATE);
    CHECK(strcmp(guanaco_predictor_kind_names(), "none|pilot|gate") == 0);
    CHECK(strcmp(guanaco_predictor_kind_name(GUANACO_PREDICTOR_NONE), "none") == 0);
    CHECK(strcmp(guanaco_predictor_kind_name(GUANACO_PREDICTOR_PILOT), "pilot") == 0);
    CHECK(strcmp(guanaco_predictor_kind_name((enum guanaco_predictor_kind)9), "unknown") == 0);
}

static void test_bad_config(void) {
    const struct guanaco_predictor_config good = {.kind = GUANACO_PREDICTOR_PILOT, .n_layer = 4, .n_expert = 8,
                                                  .top_k = 2};
    struct guanaco_predictor *p = (struct guanaco_predictor *)&p; /* must be reset to NULL on failure */
    CHECK(guanaco_predictor_create(NULL, &p) == -EINVAL);
    CHECK(guanaco_predictor_create(&good, NULL) == -EINVAL);
    struct guanaco_predictor_config bad[] = {good, good, good, good, good, good, good, good, good, good, good};
    bad[0].n_layer = 0;
    bad[1].n_expert = 0;
    bad[2].top_k = 0;
    bad[3].top_k = 9;
    bad[4].mass = 1.5;
    bad[5].mass = -0.1;
    bad[6].mass = NAN;
    bad[7].half_life = -1;
    bad[8].half_life = INFINITY;
    bad[9].half_life = NAN;
    bad[10].kind = (enum guanaco_predictor_kind)7;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int err = guanaco_predictor_create(&bad[i], &p);
        CHECK(err == -EINVAL);
        CHECK(p == NULL);
        if (err != -EINVAL) fprintf(stderr, "  bad config %zu gave %d\n", i, err);
        guanaco_predictor_free(p);
    }
    guanaco_predictor_free(NULL);
    /* mass 1 is the top of the range, accepted */
    struct guanaco_predictor_config full = good;
    full.mass = 1;
    CHECK(guanaco_predictor_create(&full, &p) == 0);
    guanaco_predictor_free(p);
}

static void test_too_big(void) {
    /* 300 MoE layers of 512 experts: 299 tables of 512^2 counts, over GUANACO_PILOT_MAX_ENTRIES */
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_PILOT, .n_layer = 300, .n_expert = 512,
                                              .top_k = 8};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == -E2BIG);
    CHECK(p == NULL);
    /* NONE keeps no tables, so the same shape is fine */
    config.kind = GUANACO_PREDICTOR_NONE;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    guanaco_predictor_free(p);
    /* only MoE layers with a next MoE layer need a table: two MoE layers among 300 need one */
    uint8_t moe[300] = {0};
    moe[10] = moe[200] = 1;
    config.kind = GUANACO_PREDICTOR_PILOT;
    config.moe_layer = moe;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    CHECK(guanaco_predictor_next_layer(p, 10) == 200);
    guanaco_predictor_free(p);
}

static void test_none(void) {
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_NONE, 4, 8, 2, 0, 0);
    int32_t a[2] = {1, 2}, b[2] = {3, 4};
    uint32_t out[8];
    for (int i = 0; i < 10; i++) {
        CHECK(guanaco_predictor_observe(p, 0, a, 1, b, 2, 1) == 0);
    }
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_next_layer(p, 0) == 1);
    CHECK(guanaco_predictor_next_layer(p, 3) == UINT32_MAX);
    /* arguments are still checked */
    CHECK(guanaco_predictor_observe(p, 4, a, 1, b, 2, 1) == -EINVAL);
    guanaco_predictor_free(p);
}

static void test_bad_arguments(void) {
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 4, 8, 2, 0, 0);
    int32_t a[2] = {1, 2}, b[2] = {3, 4};
    uint32_t out[8];
    CHECK(guanaco_predictor_observe(NULL, 0, a, 1, b, 2, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 4, a, 1, b, 2, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 0, a, 4, b, 2, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, UINT32_MAX, a, 0, b, 2, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 0, NULL, 1, b, 2, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 0, a, 1, NULL, 2, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 0, a, 1, b, 0, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 0, a, 1, b, 2, 0) == -EINVAL);
    /* layers that are not next to each other are ignored, not refused: nothing is learnt */
    CHECK(guanaco_predictor_observe(p, 0, a, 2, b, 2, 1) == 0);
    CHECK(guanaco_predictor_observe(p, 1, a, 0, b, 2, 1) == 0);
    CHECK(guanaco_predictor_observe(p, 2, a, 2, b, 2, 1) == 0);
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 1, a, 2, 1, out, 8) == 0);
    /* now learn 0 -> 1, and check that predict's unanswerable calls answer nothing */
    CHECK(guanaco_predictor_observe(p, 0, a, 1, b, 2, 1) == 0);
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, out, 8) == 2);
    CHECK(guanaco_predictor_predict(NULL, 0, a, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 0, NULL, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, NULL, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, out, 0) == 0);
    CHECK(guanaco_predictor_predict(p, 0, a, 0, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 0, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 4, a, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 3, a, 2, 1, out, 8) == 0); /* the last MoE layer has no next one */
    CHECK(guanaco_predictor_next_layer(NULL, 0) == UINT32_MAX);
    CHECK(guanaco_predictor_next_layer(p, 4) == UINT32_MAX);
    guanaco_predictor_free(p);
}

static void test_cold(void) {
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 4, 8, 2, 0, 0);
    int32_t a[2] = {1, 2}, b[2] = {3, 4}, unseen[2] = {5, 6};
    uint32_t out[8];
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_observe(p, 0, a, 1, b, 2, 1) == 0);
    /* experts never seen at layer 0, and layers never observed, still know nothing */
    CHECK(guanaco_predictor_predict(p, 0, unseen, 2, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 1, b, 2, 1, out, 8) == 0);
    /* what was seen is predicted, most likely first and ties by lower id */
    CHECK(guanaco_predictor_predict(p, 0, a, 2, 1, out, 8) == 2 && out[0] == 3 && out[1] == 4);
    guanaco_predictor_free(p);
}

/* One expert per token: a map f -> g(f) learnt over a few hundred tokens is predicted exactly, as one expert. */
static void test_map_one_expert(void) {
    const uint32_t n = 32, layers = 4;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, layers, n, 1, 0.9, 0);
    uint64_t random = 1;
    for (int token = 0; token < 300; token++) {
        int32_t id = (int32_t)(next_random(&random) % n);
        for (uint32_t l = 0; l + 1 < layers; l++) {
            int32_t next = (int32_t)map_a((uint32_t)id, n);
            CHECK(guanaco_predictor_observe(p, l, &id, l + 1, &next, 1, 1) == 0);
            id = next;
        }
    }
    uint32_t out[32];
    size_t exact = 0;
    for (uint32_t l = 0; l + 1 < layers; l++) {
        for (uint32_t f = 0; f < n; f++) {
            int32_t id = (int32_t)f;
            size_t got = guanaco_predictor_predict(p, l, &id, 1, 1, out, n);
            exact += got == 1 && out[0] == map_a(f, n);
        }
    }
    /* every expert at layers 1.. is reached (map_a is a permutation), so every prediction is known */
    CHECK(exact == (layers - 1) * n);
    guanaco_predictor_free(p);
}

/* k experts per token, moving together: groups of k at one layer lead to a mapped group at the next. The
   set at mass 0.9 is exactly that group: recall 1 with k experts. */
static void test_map_groups(void) {
    const uint32_t n = 64, k = 4, groups = n / k;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, k, 0.9, 0);
    uint64_t random = 2;
    int32_t from[4], to[4];
    for (int token = 0; token < 400; token++) {
        uint32_t g = (uint32_t)(next_random(&random) % groups), h = map_a(g, groups);
        for (uint32_t i = 0; i < k; i++) {
            from[i] = (int32_t)(g * k + (i + (uint32_t)token) % k); /* order within a row does not matter */
            to[i] = (int32_t)(h * k + i);
        }
        CHECK(guanaco_predictor_observe(p, 0, from, 1, to, k, 1) == 0);
    }
    uint32_t out[64];
    size_t exact = 0;
    for (uint32_t g = 0; g < groups; g++) {
        for (uint32_t i = 0; i < k; i++) from[i] = (int32_t)(g * k + i);
        size_t got = guanaco_predictor_predict(p, 0, from, k, 1, out, n);
        bool all = got == k;
        for (uint32_t i = 0; all && i < k; i++) all = contains(out, got, map_a(g, groups) * k + i);
        exact += all;
    }
    CHECK(exact == groups);
    guanaco_predictor_free(p);
}

/* k experts per token chosen independently, each mapped on its own: every expert f is seen next to k-1
   random others, so each P(e | f) also spreads over their targets. The k targets still rank first, and
   a mass that asks for all of them gets them all. */
static void test_map_independent_experts(void) {
    const uint32_t n = 64, k = 4;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, k, 0.9, 0);
    uint64_t random = 3;
    int32_t from[4], to[4];
    for (int token = 0; token < 3000; token++) {
        random_row(&random, n, k, from);
        for (uint32_t i = 0; i < k; i++) to[i] = (int32_t)map_a((uint32_t)from[i], n);
        CHECK(guanaco_predictor_observe(p, 0, from, 1, to, k, 1) == 0);
    }
    uint32_t out[64];
    size_t ranked_first = 0, recalled = 0, tries = 50;
    for (size_t t = 0; t < tries; t++) {
        random_row(&random, n, k, from);
        size_t got = guanaco_predictor_predict(p, 0, from, k, 1, out, k); /* capacity k: the top k */
        bool all = got == k;
        for (uint32_t i = 0; all && i < k; i++) all = contains(out, got, map_a((uint32_t)from[i], n));
        ranked_first += all;
        got = guanaco_predictor_predict(p, 0, from, k, 1, out, n);
        all = true;
        for (uint32_t i = 0; i < k; i++) all = all && contains(out, got, map_a((uint32_t)from[i], n));
        recalled += all;
    }
    CHECK(ranked_first == tries);
    CHECK(recalled == tries);
    guanaco_predictor_free(p);
}

/* Routing that carries no information about the next layer: at mass 0.9 the guess is most of the layer. */
static void test_uniform_gives_large_sets(void) {
    const uint32_t n = 32, k = 4;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, k, 0.9, 0);
    uint64_t random = 4;
    int32_t from[4], to[4];
    for (int token = 0; token < 2000; token++) {
        random_row(&random, n, k, from);
        random_row(&random, n, k, to);
        CHECK(guanaco_predictor_observe(p, 0, from, 1, to, k, 1) == 0);
    }
    uint32_t out[32];
    size_t total = 0, tries = 100, hits = 0, routed = 0;
    for (size_t t = 0; t < tries; t++) {
        random_row(&random, n, k, from);
        random_row(&random, n, k, to);
        size_t got = guanaco_predictor_predict(p, 0, from, k, 1, out, n);
        total += got;
        for (uint32_t i = 0; i < k; i++) hits += contains(out, got, (uint32_t)to[i]);
        routed += k;
    }
    double mean = (double)total / (double)tries, recall = (double)hits / (double)routed;
    printf("uniform routing, mass 0.9: mean set %.1f of %u, recall %.2f\n", mean, n, recall);
    CHECK(mean > 5.0 * k);
    CHECK(recall > 0.6);
    guanaco_predictor_free(p);
}

/* The map changes; old counts halve every half_life calls, so the new map takes over within a few. */
static void test_decay(void) {
    const uint32_t n = 8;
    const double half_life = 16;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 0.5, half_life);
    uint32_t out[8];
    int calls = 0;
    for (; calls < 800; calls++) {
        int32_t f = calls % (int)n, e = (int32_t)map_a((uint32_t)f, n);
        guanaco_predictor_observe(p, 0, &f, 1, &e, 1, 1);
    }
    /* right after the change, one sighting of the new map does not outweigh many of the old one */
    int32_t f0 = 0, e0 = (int32_t)map_b(0, n);
    guanaco_predictor_observe(p, 0, &f0, 1, &e0, 1, 1);
    CHECK(guanaco_predictor_predict(p, 0, &f0, 1, 1, out, n) >= 1 && out[0] == map_a(0, n));
    /* four half-lives of the new map: it ranks first for every expert, and old targets fade */
    int changed_at = calls;
    for (; calls < changed_at + 4 * (int)half_life; calls++) {
        int32_t f = calls % (int)n, e = (int32_t)map_b((uint32_t)f, n);
        guanaco_predictor_observe(p, 0, &f, 1, &e, 1, 1);
    }
    size_t new_first = 0, old_dropped = 0;
    for (uint32_t f = 0; f < n; f++) {
        int32_t id = (int32_t)f;
        size_t got = guanaco_predictor_predict(p, 0, &id, 1, 1, out, n);
        new_first += got >= 1 && out[0] == map_b(f, n);
        old_dropped += got == 1; /* at mass 0.5 the new target alone carries it */
    }
    CHECK(new_first == n);
    CHECK(old_dropped == n);
    /* a half-life far longer than the run does not forget: the old map, seen 100x more, still leads */
    struct guanaco_predictor *slow = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 0.5, 1e9);
    for (int c = 0; c < 800; c++) {
        int32_t f = c % (int)n, e = (int32_t)map_a((uint32_t)f, n);
        guanaco_predictor_observe(slow, 0, &f, 1, &e, 1, 1);
    }
    for (int c = 0; c < 64; c++) {
        int32_t f = c % (int)n, e = (int32_t)map_b((uint32_t)f, n);
        guanaco_predictor_observe(slow, 0, &f, 1, &e, 1, 1);
    }
    CHECK(guanaco_predictor_predict(slow, 0, &f0, 1, 1, out, n) >= 1 && out[0] == map_a(0, n));
    guanaco_predictor_free(slow);
    guanaco_predictor_free(p);
}

/* Ubatches of several tokens: the guess covers every token's next experts, weighted by how many tokens
   need each; learning a ubatch at once equals learning its tokens one by one (without decay). */
static void test_multi_token(void) {
    const uint32_t n = 16;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 0.9, 1e12);
    struct guanaco_predictor *q = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 0.9, 1e12);
    int32_t from[16], to[16];
    for (uint32_t f = 0; f < n; f++) {
        from[f] = (int32_t)f;
        to[f] = (int32_t)map_a(f, n);
    }
    for (int round = 0; round < 5; round++) {
        CHECK(guanaco_predictor_observe(p, 0, from, 1, to, 1, n) == 0);
        for (uint32_t f = 0; f < n; f++) {
            CHECK(guanaco_predictor_observe(q, 0, &from[f], 1, &to[f], 1, 1) == 0);
        }
    }
    uint32_t out[16], out_q[16];
    int32_t ubatch[3] = {2, 7, 2};
    size_t got = guanaco_predictor_predict(p, 0, ubatch, 1, 3, out, n);
    size_t got_q = guanaco_predictor_predict(q, 0, ubatch, 1, 3, out_q, n);
    CHECK(got == 2 && out[0] == map_a(2, n) && out[1] == map_a(7, n)); /* two tokens need map_a(2) */
    CHECK(got_q == got && memcmp(out, out_q, got * sizeof(*out)) == 0);
    /* a mass of 0.5 is carried by the expert two of the three tokens need */
    struct guanaco_predictor *half = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 0.5, 0);
    CHECK(guanaco_predictor_observe(half, 0, from, 1, to, 1, n) == 0);
    CHECK(guanaco_predictor_predict(half, 0, ubatch, 1, 3, out, n) == 1 && out[0] == map_a(2, n));
    /* a token nothing is known about does not dilute the others */
    int32_t with_unknown[2] = {3, 99};
    CHECK(guanaco_predictor_predict(half, 0, with_unknown, 1, 2, out, n) == 1 && out[0] == map_a(3, n));
    guanaco_predictor_free(half);
    guanaco_predictor_free(q);
    guanaco_predictor_free(p);
}

static void test_ids_out_of_range(void) {
    const uint32_t n = 8;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, 3, 0.9, 0);
    int32_t from[3] = {-1, 2, 8}, to[3] = {5, 1000, -7};
    CHECK(guanaco_predictor_observe(p, 0, from, 1, to, 3, 1) == 0);
    uint32_t out[8];
    int32_t only_bad[3] = {-1, 8, INT32_MAX};
    CHECK(guanaco_predictor_predict(p, 0, only_bad, 3, 1, out, n) == 0);
    /* only 2 -> 5 was a valid pair, so it carries the whole guess */
    int32_t query[3] = {2, -3, 9};
    CHECK(guanaco_predictor_predict(p, 0, query, 3, 1, out, n) == 1 && out[0] == 5);
    guanaco_predictor_free(p);
}

/* Dense layers between MoE layers: the next MoE layer is learnt and predicted across them. */
static void test_dense_layers(void) {
    const uint8_t moe[5] = {0, 1, 0, 1, 1};
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_PILOT, .n_layer = 5, .n_expert = 8,
                                              .top_k = 1, .moe_layer = moe};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    if (!p) return;
    CHECK(guanaco_predictor_next_layer(p, 0) == 1);
    CHECK(guanaco_predictor_next_layer(p, 1) == 3);
    CHECK(guanaco_predictor_next_layer(p, 2) == 3);
    CHECK(guanaco_predictor_next_layer(p, 3) == 4);
    CHECK(guanaco_predictor_next_layer(p, 4) == UINT32_MAX);
    int32_t a = 1, b = 6, c = 2;
    uint32_t out[8];
    CHECK(guanaco_predictor_observe(p, 0, &a, 1, &b, 1, 1) == -EINVAL); /* a dense layer routes nothing */
    CHECK(guanaco_predictor_observe(p, 1, &a, 2, &b, 1, 1) == -EINVAL);
    CHECK(guanaco_predictor_observe(p, 1, &a, 4, &b, 1, 1) == 0); /* skips layer 3: ignored */
    CHECK(guanaco_predictor_predict(p, 1, &a, 1, 1, out, 8) == 0);
    CHECK(guanaco_predictor_observe(p, 1, &a, 3, &b, 1, 1) == 0);
    CHECK(guanaco_predictor_observe(p, 3, &b, 4, &c, 1, 1) == 0);
    CHECK(guanaco_predictor_predict(p, 1, &a, 1, 1, out, 8) == 1 && out[0] == 6);
    CHECK(guanaco_predictor_predict(p, 3, &b, 1, 1, out, 8) == 1 && out[0] == 2);
    CHECK(guanaco_predictor_predict(p, 2, &a, 1, 1, out, 8) == 0);
    CHECK(guanaco_predictor_predict(p, 4, &c, 1, 1, out, 8) == 0);
    guanaco_predictor_free(p);
}

/* A prompt reads the whole next layer ahead only while that layer's last prompt-sized call used most of it:
   each layer remembers its own width (skewed routing makes some layers narrow), decode-sized calls teach
   nothing, and the last MoE layer has nothing after it. */
static void test_whole_next_layer(void) {
    const uint8_t moe[4] = {1, 0, 1, 1}; /* 0 -> 2 -> 3 */
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_PILOT, .n_layer = 4, .n_expert = 128,
                                              .top_k = 8, .moe_layer = moe};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    if (!p) return;
    const uint32_t prompt = GUANACO_PROMPT_MIN_TOKENS, decode = 1;
    CHECK(guanaco_predictor_reads_whole_next_layer(p, 0, 120, prompt)); /* nothing known of layer 2 yet */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 0, 90, prompt)); /* layer 0 itself narrow */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 2, 89, prompt)); /* layer 2 is narrow now */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 0, 120, prompt));
    CHECK(guanaco_predictor_reads_whole_next_layer(p, 2, 120, decode)); /* layer 3 unknown; too few tokens */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 0, 120, prompt)); /* so layer 2 is still narrow */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 3, 60, prompt)); /* layer 3 narrow, and the last */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 2, 120, prompt)); /* wide again, but layer 3 narrow */
    CHECK(guanaco_predictor_reads_whole_next_layer(p, 0, 120, prompt));
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 3, 128, prompt)); /* the last MoE layer */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 1, 128, prompt)); /* dense */
    CHECK(!guanaco_predictor_reads_whole_next_layer(NULL, 0, 128, prompt));
    guanaco_predictor_free(p);
}

/* The read-ahead rule: a decode guess is read while resident or likely; a wide prompt call reads the whole next
   layer while that layer is wide, and nothing once it is narrow or without prompt read-ahead. */
static void test_read_ahead_choose(void) {
    const uint32_t n = 8, prompt = GUANACO_PROMPT_MIN_TOKENS;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 1.0, 1e12);
    int32_t zero = 0, one = 1, two = 2;
    for (int i = 0; i < 3; i++) {
        CHECK(guanaco_predictor_observe(p, 0, &zero, 1, &one, 1, 1) == 0);
    }
    CHECK(guanaco_predictor_observe(p, 0, &zero, 1, &two, 1, 1) == 0);
    for (int32_t f = 3; f < (int32_t)n; f++) {
        CHECK(guanaco_predictor_observe(p, 0, &f, 1, &f, 1, 1) == 0);
    }
    uint8_t absent[8];
    memset(absent, 1, sizeof(absent));
    uint32_t out[8];
    size_t n_read = 99;
    struct guanaco_read_ahead_call decode = {.layer = 0, .ids = &zero, .k = 1, .n_tokens = 1, .absent = absent,
                                             .prompts_read_ahead = true};
    /* 1 is 3/4 likely, 2 1/4 */
    CHECK(guanaco_read_ahead_choose(p, &decode, out, n, &n_read) == 2 && out[0] == 1 && out[1] == 2 && n_read == 1);
    absent[2] = 0; /* resident: read on, whatever its chance */
    CHECK(guanaco_read_ahead_choose(p, &decode, out, n, &n_read) == 2 && n_read == 2);
    absent[1] = 0, absent[2] = 1;
    CHECK(guanaco_read_ahead_choose(p, &decode, out, n, &n_read) == 2 && n_read == 1);
    absent[1] = 1;
    decode.layer = 1; /* the last MoE layer: nothing follows */
    CHECK(guanaco_read_ahead_choose(p, &decode, out, n, &n_read) == 0 && n_read == 0);

    /* 32 tokens on experts 3..7 and one on 0: 6 of 8 distinct, a prompt's width */
    int32_t ids[GUANACO_PROMPT_MIN_TOKENS];
    for (uint32_t t = 0; t < prompt; t++) {
        ids[t] = t + 1 < prompt ? (int32_t)(3 + t % 5) : 0;
    }
    struct guanaco_read_ahead_call wide = {.layer = 0, .ids = ids, .k = 1, .n_tokens = prompt, .absent = absent,
                                           .prompts_read_ahead = true};
    CHECK(guanaco_read_ahead_choose(p, &wide, out, n, &n_read) == n && n_read == n); /* layer 1 not known narrow */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 1, 2, prompt));                /* now it is */
    CHECK(guanaco_read_ahead_choose(p, &wide, out, n, &n_read) == 0 && n_read == 0);
    CHECK(guanaco_predictor_reads_whole_next_layer(p, 1, 7, prompt) == false);        /* wide again */
    CHECK(guanaco_read_ahead_choose(p, &wide, out, n, &n_read) == n && n_read == n);
    /* a narrow prompt call guesses as decode does: two tokens on 0 lead to 1 (3/4) and 2 (1/4) */
    int32_t on_zero[GUANACO_PROMPT_MIN_TOKENS];
    memset(on_zero, 0, sizeof(on_zero));
    struct guanaco_read_ahead_call narrow = {.layer = 0, .ids = on_zero, .k = 1, .n_tokens = prompt,
                                             .absent = absent, .prompts_read_ahead = true};
    CHECK(guanaco_read_ahead_choose(p, &narrow, out, n, &n_read) == 2 && out[0] == 1 && n_read == 1);
    wide.prompts_read_ahead = false;
    CHECK(guanaco_read_ahead_choose(p, &wide, out, n, &n_read) == 0 && n_read == 0);
    CHECK(guanaco_read_ahead_choose(NULL, &wide, out, n, &n_read) == 0 && n_read == 0);
    guanaco_predictor_free(p);
}

/* Masses and capacity: mass 1 keeps every expert ever seen after f, capacity caps the set, and the order
   is by likelihood. */
static void test_mass_and_capacity(void) {
    const uint32_t n = 8;
    struct guanaco_predictor *all = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 1.0, 1e12);
    struct guanaco_predictor *fallback = make(GUANACO_PREDICTOR_PILOT, 2, n, 1, 0, 1e12);
    /* 0 -> 4 five times, 0 -> 6 three times, 0 -> 1 twice */
    const int32_t targets[10] = {4, 6, 4, 1, 4, 6, 4, 1, 6, 4};
    int32_t f = 0;
    for (int i = 0; i < 10; i++) {
        guanaco_predictor_observe(all, 0, &f, 1, &targets[i], 1, 1);
        guanaco_predictor_observe(fallback, 0, &f, 1, &targets[i], 1, 1);
    }
    uint32_t out[8];
    CHECK(guanaco_predictor_predict(all, 0, &f, 1, 1, out, n) == 3 && out[0] == 4 && out[1] == 6 && out[2] == 1);
    CHECK(guanaco_predictor_predict(all, 0, &f, 1, 1, out, 2) == 2 && out[0] == 4 && out[1] == 6);
    /* the default mass (0.6 when this was written) needs 4 (0.5) and 6 (0.3) */
    size_t expected = GUANACO_PILOT_DEFAULT_MASS <= 0.5 ? 1 : GUANACO_PILOT_DEFAULT_MASS <= 0.8 ? 2 : 3;
    CHECK(guanaco_predictor_predict(fallback, 0, &f, 1, 1, out, n) == expected);
    guanaco_predictor_free(fallback);
    guanaco_predictor_free(all);
}

/* Many calls at a short half-life pass the rescaling point again and again; the counts must stay finite,
   the guesses right, and two predictors fed the same calls must agree exactly. */
static void test_long_run(void) {
    const uint32_t n = 16, k = 2;
    struct guanaco_predictor *p = make(GUANACO_PREDICTOR_PILOT, 3, n, k, 0.9, 0.5);
    struct guanaco_predictor *q = make(GUANACO_PREDICTOR_PILOT, 3, n, k, 0.9, 0.5);
    uint64_t random = 5;
    int32_t from[2], to[2];
    for (int c = 0; c < 20000; c++) {
        random_row(&random, n, k, from);
        uint32_t g = (uint32_t)from[0] / 2; /* pairs {2g, 2g+1} lead to pairs */
        from[0] = (int32_t)(2 * g);
        from[1] = (int32_t)(2 * g + 1);
        uint32_t h = map_a(g, n / 2);
        to[0] = (int32_t)(2 * h);
        to[1] = (int32_t)(2 * h + 1);
        guanaco_predictor_observe(p, 0, from, 1, to, k, 1);
        guanaco_predictor_observe(q, 0, from, 1, to, k, 1);
    }
    /* at this half-life a pair unseen for a few dozen calls is forgotten outright; show each one last */
    for (uint32_t g = 0; g < n / 2; g++) {
        uint32_t h = map_a(g, n / 2);
        int32_t pair[2] = {(int32_t)(2 * g), (int32_t)(2 * g + 1)}, next[2] = {(int32_t)(2 * h), (int32_t)(2 * h + 1)};
        guanaco_predictor_observe(p, 0, pair, 1, next, k, 1);
        guanaco_predictor_observe(q, 0, pair, 1, next, k, 1);
    }
    uint32_t out[16], out_q[16];
    size_t right = 0, same = 0;
    for (uint32_t g = 0; g < n / 2; g++) {
        from[0] = (int32_t)(2 * g);
        from[1] = (int32_t)(2 * g + 1);
        size_t got = guanaco_predictor_predict(p, 0, from, k, 1, out, n);
        size_t got_q = guanaco_predictor_predict(q, 0, from, k, 1, out_q, n);
        uint32_t h = map_a(g, n / 2);
        right += got == 2 && contains(out, got, 2 * h) && contains(out, got, 2 * h + 1);
        same += got == got_q && memcmp(out, out_q, got * sizeof(*out)) == 0;
    }
    CHECK(right == n / 2);
    CHECK(same == n / 2);
    guanaco_predictor_free(q);
    guanaco_predictor_free(p);
}

/* ---- gate ---- */

/* Scores for one token: `best` get 10, 9, ... in that order, the rest less, by id. */
static void gate_scores(float *row, uint32_t n_expert, const uint32_t *best, uint32_t n_best) {
    for (uint32_t e = 0; e < n_expert; e++) {
        row[e] = -(float)e / (float)n_expert;
    }
    for (uint32_t i = 0; i < n_best; i++) {
        row[best[i]] = 10.0f - (float)i;
    }
}

static void test_gate_scores_rank_and_fallback(void) {
    const uint32_t n_layer = 3, n = 16, k = 2;
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_GATE, .n_layer = n_layer, .n_expert = n,
                                              .top_k = k, .gate_margin = 2};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    CHECK(guanaco_predictor_uses_scores(p));
    float scores[2 * 16];
    uint32_t best[4] = {7, 3, 12, 0};
    gate_scores(scores, n, best, 4);
    uint32_t out[16];
    size_t emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, n);
    /* top k + margin = 4 ranks, in score order: before any observation the top k lead the margin */
    CHECK(emitted == 4);
    CHECK(out[0] == 7 && out[1] == 3 && contains(out, emitted, 12) && contains(out, emitted, 0));
    CHECK(guanaco_predictor_probability(p, 0, emitted) > guanaco_predictor_probability(p, 3, emitted));
    CHECK(guanaco_predictor_probability(p, 1, emitted) >= 0.5 && guanaco_predictor_probability(p, 3, emitted) < 0.5);
    /* the last MoE layer has nothing after it; prompt-sized ubatches are not scored */
    CHECK(guanaco_predictor_predict_scores(p, n_layer - 1, scores, 1, NULL, out, n) == 0);
    CHECK(guanaco_predictor_predict_scores(p, 0, scores, GUANACO_GATE_MAX_TOKENS + 1, NULL, out, n) == 0);
    CHECK(guanaco_predictor_predict_scores(p, 0, NULL, 1, NULL, out, n) == 0);
    /* capacity cuts the most likely first */
    CHECK(guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, 1) == 1 && out[0] == 7);
    /* without scores it is pilot: nothing known yet, then a learnt map */
    int32_t from[2] = {1, 2}, to[2] = {5, 9};
    CHECK(guanaco_predictor_predict(p, 0, from, k, 1, out, n) == 0);
    for (int i = 0; i < 8; i++) {
        CHECK(guanaco_predictor_observe(p, 0, from, 1, to, k, 1) == 0);
    }
    emitted = guanaco_predictor_predict(p, 0, from, k, 1, out, n);
    CHECK(emitted == 2 && contains(out, emitted, 5) && contains(out, emitted, 9));
    guanaco_predictor_free(p);
    /* pilot has no scores and no recall */
    p = make(GUANACO_PREDICTOR_PILOT, n_layer, n, k, 0, 0);
    struct guanaco_predictor_recall recall;
    CHECK(!guanaco_predictor_uses_scores(p));
    CHECK(guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, n) == 0);
    CHECK(guanaco_predictor_recall(p, 0, &recall) == -ENOTSUP);
    guanaco_predictor_free(p);
    config.gate_margin = n + 1;
    CHECK(guanaco_predictor_create(&config, &p) == -EINVAL && p == NULL);
}

/* The hit rate per rank is learnt: when the router's second choice is always wrong and its third always
   right, the third ends up more likely than the second, and the recall says what was found. */
static void test_gate_calibration(void) {
    const uint32_t n = 16, k = 2;
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_GATE, .n_layer = 2, .n_expert = n,
                                              .top_k = k, .gate_margin = 2};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    uint64_t state = 11;
    float scores[16];
    uint32_t out[16];
    size_t emitted = 0;
    for (int round = 0; round < 200; round++) {
        uint32_t best[4];
        int32_t row[4];
        random_row(&state, n, 4, row);
        for (int i = 0; i < 4; i++) best[i] = (uint32_t)row[i];
        gate_scores(scores, n, best, 4);
        emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, n);
        CHECK(emitted == 4);
        int32_t from[2] = {0, 1}, real[2] = {(int32_t)best[0], (int32_t)best[2]};
        CHECK(guanaco_predictor_observe(p, 0, from, 1, real, k, 1) == 0);
    }
    /* the last guess: rank 0 and rank 2 are always right, ranks 1 and 3 never */
    CHECK(guanaco_predictor_probability(p, 0, emitted) > 0.95);
    CHECK(guanaco_predictor_probability(p, 1, emitted) > 0.95);
    CHECK(guanaco_predictor_probability(p, 2, emitted) < 0.05);
    struct guanaco_predictor_recall recall;
    CHECK(guanaco_predictor_recall(p, 1, &recall) == 0);
    CHECK(recall.tokens == 200 && recall.ranks == 4);
    CHECK(fabs(recall.top_k - 0.5) < 1e-9 && fabs(recall.all_ranks - 1.0) < 1e-9);
    CHECK(guanaco_predictor_recall(p, 0, &recall) == 0 && recall.tokens == 0);
    CHECK(guanaco_predictor_recall(p, 2, &recall) == -EINVAL);
    /* an observe for other tokens than the guess (another ubatch size) is not scored */
    emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, n);
    int32_t from2[4] = {0, 1, 2, 3}, real2[4] = {4, 5, 6, 7};
    CHECK(guanaco_predictor_observe(p, 0, from2, 1, real2, k, 2) == 0);
    CHECK(guanaco_predictor_recall(p, 1, &recall) == 0 && recall.tokens == 200);
    guanaco_predictor_free(p);
}

/* The probability the last guess gave expert `id`, -1 when it was not guessed. */
static double probability_of(const struct guanaco_predictor *p, const uint32_t *out, size_t emitted, uint32_t id) {
    for (size_t i = 0; i < emitted; i++) {
        if (out[i] == id) {
            return guanaco_predictor_probability(p, i, emitted);
        }
    }
    return -1;
}

/* The rate of absent guesses is learnt apart: when the router's first choice is always right where it is
   resident and always wrong where it is absent (the popular experts are the resident ones), an absent first
   choice falls below the read rule's bar while the rank's overall rate stays high; told nothing absent, the
   guess reads as before. */
static void test_gate_absent_calibration(void) {
    const uint32_t n = 16, k = 2;
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_GATE, .n_layer = 2, .n_expert = n,
                                              .top_k = k, .gate_margin = 2};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    uint8_t absent[16] = {0};
    for (uint32_t e = 8; e < n; e++) {
        absent[e] = 1; /* experts 8-15 are never resident */
    }
    uint64_t state = 5;
    float scores[16];
    uint32_t out[16];
    for (int round = 0; round < 400; round++) {
        int32_t row[4];
        random_row(&state, n, 4, row);
        uint32_t best[4];
        for (int i = 0; i < 4; i++) best[i] = (uint32_t)row[i];
        gate_scores(scores, n, best, 4);
        CHECK(guanaco_predictor_predict_scores(p, 0, scores, 1, absent, out, n) == 4);
        /* the first choice is right when resident; the second always */
        int32_t from[2] = {0, 1}, real[2] = {absent[best[0]] ? (int32_t)best[3] : (int32_t)best[0], (int32_t)best[1]};
        if (real[0] == real[1]) {
            real[0] = (int32_t)best[2];
        }
        CHECK(guanaco_predictor_observe(p, 0, from, 1, real, k, 1) == 0);
    }
    uint32_t absent_first[4] = {9, 2, 3, 4}, resident_first[4] = {2, 9, 3, 4};
    gate_scores(scores, n, absent_first, 4);
    size_t emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, absent, out, n);
    CHECK(emitted == 4 && probability_of(p, out, emitted, 9) < 0.2);
    /* the same expert at the same rank, not marked absent: the rank's overall rate, about a half */
    emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, n);
    CHECK(emitted == 4 && probability_of(p, out, emitted, 9) > 0.3);
    /* a resident first choice is not marked absent either */
    gate_scores(scores, n, resident_first, 4);
    emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, absent, out, n);
    CHECK(emitted == 4 && probability_of(p, out, emitted, 2) > 0.3);
    guanaco_predictor_free(p);
}

/* Several tokens: an expert several tokens rank is more likely than one only a single token ranks, and
   NaN scores never win over real ones. */
static void test_gate_union(void) {
    const uint32_t n = 8, k = 1;
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_GATE, .n_layer = 2, .n_expert = n,
                                              .top_k = k, .gate_margin = 1};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    float scores[3 * 8];
    uint32_t a[2] = {4, 6}, b[2] = {4, 1}, c[2] = {2, 6};
    gate_scores(scores, n, a, 2);
    gate_scores(scores + n, n, b, 2);
    gate_scores(scores + 2 * n, n, c, 2);
    uint32_t out[8];
    size_t emitted = guanaco_predictor_predict_scores(p, 0, scores, 3, NULL, out, n);
    CHECK(emitted == 4 && out[0] == 4 && contains(out, emitted, 2) && contains(out, emitted, 6) &&
          contains(out, emitted, 1));
    for (size_t i = 1; i < emitted; i++) {
        CHECK(guanaco_predictor_probability(p, i - 1, emitted) >= guanaco_predictor_probability(p, i, emitted));
    }
    for (uint32_t e = 0; e < n; e++) scores[e] = NAN;
    scores[5] = -100.0f;
    emitted = guanaco_predictor_predict_scores(p, 0, scores, 1, NULL, out, n);
    CHECK(emitted == 2 && out[0] == 5);
    guanaco_predictor_free(p);
}

/* A wide prompt call whose next layer is narrow reads the router scores' likely guesses (gate), scored on a
   sample of its tokens; without scores, nothing; where the next layer is wide, all of it. */
static void test_gate_prompt_read_ahead(void) {
    const uint32_t n = 8, prompt = GUANACO_PROMPT_MIN_TOKENS;
    struct guanaco_predictor_config config = {.kind = GUANACO_PREDICTOR_GATE, .n_layer = 2, .n_expert = n,
                                              .top_k = 1, .gate_margin = 1};
    struct guanaco_predictor *p = NULL;
    CHECK(guanaco_predictor_create(&config, &p) == 0);
    if (!p) return;
    float scores[3 * 8];
    uint32_t a[2] = {4, 6}, b[2] = {4, 1}, c[2] = {2, 6};
    gate_scores(scores, n, a, 2);
    gate_scores(scores + n, n, b, 2);
    gate_scores(scores + 2 * n, n, c, 2);
    int32_t ids[GUANACO_PROMPT_MIN_TOKENS];
    for (uint32_t t = 0; t < prompt; t++) {
        ids[t] = (int32_t)(t % 6);
    }
    uint8_t absent[8];
    memset(absent, 1, sizeof(absent));
    uint32_t out[8];
    size_t n_read = 99;
    struct guanaco_read_ahead_call call = {.layer = 0, .ids = ids, .k = 1, .n_tokens = prompt, .scores = scores,
                                           .n_scored = 3, .absent = absent, .prompts_read_ahead = true};
    CHECK(guanaco_read_ahead_choose(p, &call, out, n, &n_read) == n && n_read == n); /* layer 1 not known narrow */
    CHECK(!guanaco_predictor_reads_whole_next_layer(p, 1, 2, prompt));
    /* before any calibration: a top-1 rank is 0.8 likely, the margin's 0.2; 4 is top for two of the three sampled
       tokens (0.96), 2 for one (0.8), 6 in the margin of two (0.36), 1 of one (0.2) */
    size_t got = guanaco_read_ahead_choose(p, &call, out, n, &n_read);
    CHECK(got == 4 && out[0] == 4 && out[1] == 2 && out[2] == 6 && out[3] == 1 && n_read == 2);
    call.scores = NULL;
    CHECK(guanaco_read_ahead_choose(p, &call, out, n, &n_read) == 0 && n_read == 0);
    guanaco_predictor_free(p);
}

/* ---- the read-ahead throttle ---- */

/* Runs n ubatches of one token through the throttle, each taking off_ns or on_ns (the first `change_at`,
   then the swapped values), plus a 50% outlier in every fifth ubatch; returns the total time and how many
   read ahead. */
static double run_throttle(struct guanaco_read_ahead_throttle *t, int n, double off_ns, double on_ns, int change_at,
                           int *on_count) {
    double total = 0.0;
    *on_count = 0;
    for (int i = 0; i < n; i++) {
        bool on = guanaco_read_ahead_throttle_allows(t);
        double ns = (i < change_at ? on : !on) ? on_ns : off_ns;
        ns *= i % 5 == 4 ? 1.5 : 1.0;
        total += ns;
        *on_count += on;
        guanaco_read_ahead_throttle_observe(t, on, 1, (uint64_t)ns);
    }
    return total;
}

/* The engine's decode throttle. */
static int init_decode_throttle(struct guanaco_read_ahead_throttle *t, bool enabled) {
    return guanaco_read_ahead_throttle_init(t, enabled, false, GUANACO_THROTTLE_DECODE_EPOCH,
                                            GUANACO_THROTTLE_DECODE_EXPLORE_EVERY, GUANACO_THROTTLE_DECODE_FIRST_EXPLORE);
}

static void test_throttle(void) {
    struct guanaco_read_ahead_throttle t;
    CHECK(guanaco_read_ahead_throttle_init(&t, true, false, 0, 8, 1) == -EINVAL);
    CHECK(guanaco_read_ahead_throttle_init(&t, true, false, GUANACO_THROTTLE_MAX_EPOCH + 1, 8, 1) == -EINVAL);
    CHECK(guanaco_read_ahead_throttle_init(&t, true, false, 4, 1, 1) == -EINVAL);
    CHECK(guanaco_read_ahead_throttle_init(&t, true, false, 4, 8, 0) == -EINVAL);
    CHECK(guanaco_read_ahead_throttle_init(&t, true, false, 4, 8, 8) == -EINVAL);
    CHECK(guanaco_read_ahead_throttle_init(NULL, true, false, 4, 8, 1) == -EINVAL);

    /* off: read-ahead always runs, and the time is still measured */
    int on_count = 0;
    CHECK(init_decode_throttle(&t, false) == 0);
    (void)run_throttle(&t, 100, 100e6, 113e6, 1000, &on_count);
    CHECK(on_count == 100);
    CHECK(t.estimate[1] > 0.0 && t.estimate[0] == 0.0);

    /* decode, read-ahead 13% slower (gate on a saturated disk): it starts off, is tried in the third epoch,
       then gets one epoch in 8 at most (the gap widens), so the whole run is within 3% of never reading ahead */
    const int n = 800;
    const int epoch = (int)GUANACO_THROTTLE_DECODE_EPOCH;
    CHECK(init_decode_throttle(&t, true) == 0);
    CHECK(!guanaco_read_ahead_throttle_allows(&t));
    double total = run_throttle(&t, n, 100e6, 113e6, n, &on_count);
    int never_count = 0;
    struct guanaco_read_ahead_throttle never;
    CHECK(init_decode_throttle(&never, true) == 0);
    double never_total = run_throttle(&never, n, 100e6, 100e6, n, &never_count);
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t));
    CHECK(on_count > 0 && on_count <= n / 8 + 2 * epoch);
    CHECK(total <= 1.03 * never_total);
    CHECK(t.ubatches[0] + t.ubatches[1] == (uint64_t)n);

    /* read-ahead 20% faster: off's warm-up and its first warm epoch, read-ahead tried in the third and kept
       from the fourth, then off one epoch in 8 at most */
    CHECK(init_decode_throttle(&t, true) == 0);
    CHECK(!guanaco_read_ahead_throttle_allows(&t));
    (void)run_throttle(&t, 2 * epoch, 100e6, 80e6, n, &on_count);
    CHECK(on_count == 0 && guanaco_read_ahead_throttle_allows(&t));
    (void)run_throttle(&t, n - 2 * epoch, 100e6, 80e6, n, &on_count);
    CHECK(guanaco_read_ahead_throttle_prefers_on(&t));
    CHECK(on_count >= (n - 2 * epoch) - (n / epoch / 8 + 2) * epoch);

    /* A cold first epoch does not decide: off's first epoch took twice its real time (the policy and the
       page cache filling), and read-ahead really costs 5%. Off's second epoch replaces the cold one, so
       read-ahead runs only in its explorations. Averaging the cold epoch in kept read-ahead on for about 30
       epochs. */
    CHECK(init_decode_throttle(&t, true) == 0);
    for (int i = 0; i < epoch; i++) {
        guanaco_read_ahead_throttle_observe(&t, false, 1, 200000000ull);
    }
    on_count = 0;
    for (int i = 0; i < 16 * epoch; i++) {
        bool on = guanaco_read_ahead_throttle_allows(&t);
        on_count += on;
        guanaco_read_ahead_throttle_observe(&t, on, 1, on ? 105000000ull : 100000000ull);
    }
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t) && t.estimate[0] == 100000000.0);
    CHECK(on_count == epoch); /* epoch 2; it lost, so the next is 16 epochs later, beyond these */
    CHECK(t.explorations_cut == 0); /* 5% is no reason to cut one short */

    /* A cache that warms for longer than one epoch (the model's own routing after a 64-token prompt): off
       takes 200 ms at the first token, 10 ms less each token after, down to 80; read-ahead takes 93 (gate).
       Off's first two epochs (200-130 ms) would keep read-ahead on; the epoch after the exploration, at 80,
       keeps it off. Over llama-bench's 33 decode ubatches, only the exploration reads ahead. */
    CHECK(init_decode_throttle(&t, true) == 0);
    on_count = 0;
    for (int i = 0; i < 33; i++) {
        bool on = guanaco_read_ahead_throttle_allows(&t);
        double off_ms = 200.0 - 10.0 * i < 80.0 ? 80.0 : 200.0 - 10.0 * i;
        on_count += on;
        guanaco_read_ahead_throttle_observe(&t, on, 1, (uint64_t)((on ? 93.0 : off_ms) * 1e6));
    }
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t) && t.estimate[0] == 80e6);
    CHECK(on_count == epoch);

    /* Gate on the model's own routing lost 45% per token. The exploration is cut after two ubatches, and each
       one that loses doubles the gap: over 33 ubatches (llama-bench -n 32), 2 read ahead; over a long run, the
       loss stays under 2%. Without the cut and the wider gaps that was 8 of 33 (11%) and 1 epoch in 8. */
    CHECK(init_decode_throttle(&t, true) == 0);
    on_count = 0;
    for (int i = 0; i < 33; i++) {
        bool on = guanaco_read_ahead_throttle_allows(&t);
        on_count += on;
        guanaco_read_ahead_throttle_observe(&t, on, 1, on ? 145000000ull : 100000000ull);
    }
    CHECK(on_count == 2 && t.explorations_cut == 1);
    CHECK(init_decode_throttle(&t, true) == 0);
    total = run_throttle(&t, 4 * n, 100e6, 145e6, 4 * n, &on_count);
    CHECK(init_decode_throttle(&never, true) == 0);
    never_total = run_throttle(&never, 4 * n, 100e6, 100e6, 4 * n, &never_count);
    CHECK(total <= 1.02 * never_total);
    CHECK(t.explorations_cut >= 3 && t.explore_gap == GUANACO_THROTTLE_MAX_EXPLORE_GAP);

    /* A wide gap still finds a read-ahead that starts to pay (the disk gets quiet): after 60 epochs of
       losing 13%, it pays 20%, and is chosen within the widest gap and two of its epochs. */
    CHECK(init_decode_throttle(&t, true) == 0);
    (void)run_throttle(&t, 60 * epoch, 100e6, 113e6, 60 * epoch, &on_count);
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t) && t.explore_gap > GUANACO_THROTTLE_DECODE_EXPLORE_EVERY);
    int found_after = -1;
    for (int i = 0; i < (int)(GUANACO_THROTTLE_MAX_EXPLORE_GAP + 3) * epoch && found_after < 0; i++) {
        bool on = guanaco_read_ahead_throttle_allows(&t);
        guanaco_read_ahead_throttle_observe(&t, on, 1, on ? 80000000ull : 100000000ull);
        found_after = guanaco_read_ahead_throttle_prefers_on(&t) ? i : -1;
    }
    CHECK(found_after >= 0);
    CHECK(t.explore_gap == GUANACO_THROTTLE_DECODE_EXPLORE_EVERY); /* a new choice starts the gap over */

    /* a 1% gain is within the margin: off, which wastes nothing, keeps the run */
    CHECK(init_decode_throttle(&t, true) == 0);
    (void)run_throttle(&t, n, 100e6, 99e6, n, &on_count);
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t));

    /* the machine changes half-way (the disk gets busy): read-ahead stops paying and is dropped within
       a few of its own epochs */
    CHECK(init_decode_throttle(&t, true) == 0);
    (void)run_throttle(&t, n / 2, 100e6, 80e6, n / 2, &on_count);
    CHECK(guanaco_read_ahead_throttle_prefers_on(&t));
    int later_on = 0;
    (void)run_throttle(&t, n / 2, 100e6, 80e6, 0, &later_on);
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t));
    CHECK(later_on <= 4 * epoch + n / 2 / 8 + epoch);

    /* prompts start on: llama-bench's warmup prompt and its timed one, and the two ubatches of a 1024-token
       prompt, all read ahead; a losing read-ahead is still left after the first exploration */
    CHECK(guanaco_read_ahead_throttle_init(&t, true, true, GUANACO_THROTTLE_PROMPT_EPOCH,
                                           GUANACO_THROTTLE_PROMPT_EXPLORE_EVERY,
                                           GUANACO_THROTTLE_PROMPT_FIRST_EXPLORE) == 0);
    for (int i = 0; i < 4; i++) {
        CHECK(guanaco_read_ahead_throttle_allows(&t));
        guanaco_read_ahead_throttle_observe(&t, true, 512, 512 * 50000000ull);
    }
    (void)run_throttle(&t, 40, 40e6, 50e6, 40, &on_count);
    CHECK(!guanaco_read_ahead_throttle_prefers_on(&t) && on_count <= 40 / 8 + 8);

    /* a ubatch that began in the previous epoch counts as run, not measured */
    CHECK(guanaco_read_ahead_throttle_init(&t, true, false, 1, 8, 7) == 0);
    guanaco_read_ahead_throttle_observe(&t, true, 1, 5);
    CHECK(t.ubatches[1] == 1 && t.estimate[1] == 0.0 && t.estimate[0] == 0.0 && !t.on);
    guanaco_read_ahead_throttle_observe(&t, false, 2, 400);
    CHECK(t.estimate[0] == 200.0 && !t.on);
    guanaco_read_ahead_throttle_observe(&t, false, 0, 400); /* empty: ignored */
    CHECK(t.ubatches[0] == 1);
}

int main(void) {
    test_kind_names();
    test_bad_config();
    test_too_big();
    test_none();
    test_bad_arguments();
    test_cold();
    test_map_one_expert();
    test_map_groups();
    test_map_independent_experts();
    test_uniform_gives_large_sets();
    test_decay();
    test_multi_token();
    test_ids_out_of_range();
    test_dense_layers();
    test_whole_next_layer();
    test_read_ahead_choose();
    test_gate_prompt_read_ahead();
    test_mass_and_capacity();
    test_long_run();
    test_gate_scores_rank_and_fallback();
    test_gate_calibration();
    test_gate_absent_calibration();
    test_gate_union();
    test_throttle();
    return check_summary();
}
