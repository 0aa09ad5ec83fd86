/*
 * policy_impl.h - owns the seam between policy.c (the public entry points,
 * argument checks and the bookkeeping every kind shares: resident flags and
 * bytes, per-layer counts, the caps, the reserve, the budget, the clock) and
 * each kind in policy_*.c, the way ggml's backends and the predictors
 * (predictor_impl.h) sit behind an interface table. A kind sees only checked
 * arguments and the shared state, read only, and holds its own order of
 * victims and nothing else.
 *
 * A slot is one expert of one layer, numbered layer * n_expert + expert.
 */
#ifndef GUANACO_POLICY_IMPL_H
#define GUANACO_POLICY_IMPL_H

#include "heap.h"
#include "policy.h"

#include <stdlib.h>

#define GUANACO_POLICY_NO_SLOT GUANACO_HEAP_ABSENT /* no victim, no layer */

/* Kept by policy.c; kinds read it. */
struct guanaco_policy_state {
    uint32_t n_layer;
    uint32_t n_expert;
    uint32_t n_slots;
    uint32_t max_per_layer;
    uint32_t hint_lifetime;       /* >= 1 */
    double half_life;             /* the config's, or the default: > 0 */
    enum guanaco_policy_variant variant; /* the config's, checked */
    uint64_t budget;
    uint64_t every_expert_bytes;  /* all experts of all layers: a budget this large never evicts */
    uint64_t now;                 /* the latest `now` any access gave */
    uint64_t call;                /* access calls so far; stamps what each call needed */
    uint32_t call_tokens;         /* tokens the access in progress serves, >= 1 (guanaco_policy_access_batch) */
    const uint64_t *expert_bytes; /* per layer */
    const uint8_t *resident;      /* per slot */
    const uint64_t *needed_call;  /* per slot: the access call that last needed it */
    const uint32_t *layer_resident;
    const uint64_t *layer_resident_bytes;
    const uint64_t *layer_last_call;
};

/*
 * The calls policy.c makes, in this order: per access, access_begin (after
 * the clock and the call stamp moved), touch per expert (after the shared
 * counters count it resident), access_end; per evict, evict_begin, then per
 * pass cap_victim or budget_victim until enough left (each victim: the shared
 * counters drop it, then evicted), then restore. Optional ones may be NULL.
 */
struct guanaco_policy_ops {
    void (*access_begin)(void *impl, const struct guanaco_policy_state *s, uint32_t layer); /* optional */
    void (*touch)(void *impl, const struct guanaco_policy_state *s, uint32_t slot, bool hit);
    void (*access_end)(void *impl, const struct guanaco_policy_state *s, uint32_t layer); /* optional */
    void (*evict_begin)(void *impl, const struct guanaco_policy_state *s);                /* optional */
    /* The next victim of a layer over its cap / for the budget, or GUANACO_POLICY_NO_SLOT; never one that
       guanaco_policy_is_needed_now(protect_layer); hinted ones only with take_hinted. A kind may set slots
       aside from its order until restore. */
    uint32_t (*cap_victim)(void *impl, const struct guanaco_policy_state *s, uint32_t layer, uint32_t protect_layer,
                           bool take_hinted);
    uint32_t (*budget_victim)(void *impl, const struct guanaco_policy_state *s, uint32_t protect_layer,
                              bool take_hinted);
    void (*evicted)(void *impl, const struct guanaco_policy_state *s, uint32_t slot);
    void (*restore)(void *impl, const struct guanaco_policy_state *s);                    /* optional */
    void (*budget_changed)(void *impl, const struct guanaco_policy_state *s);             /* optional */
    void (*hint)(void *impl, const struct guanaco_policy_state *s, uint32_t slot, float weight); /* optional */
    /* layer in range and not dense, rate not NULL */
    void (*seed)(void *impl, const struct guanaco_policy_state *s, uint32_t layer, const double *rate); /* optional */
    bool (*is_pinned)(const void *impl, uint32_t slot); /* optional; slot resident */
    uint64_t (*layer_target_bytes)(const void *impl, const struct guanaco_policy_state *s, uint32_t layer); /* optional */
    void (*free)(void *impl);
};

/* Each kind's constructor: state filled in (budget included), config checked. 0 or -ENOMEM. */
typedef int (*guanaco_policy_create_fn)(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops,
                                        void **impl);
int guanaco_policy_lru_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops, void **impl);
int guanaco_policy_lfu_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops, void **impl);
int guanaco_policy_layer_lru_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops,
                                    void **impl);
int guanaco_policy_guanaco_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops,
                                  void **impl);

/* ---- helpers the kinds share ---- */

/*
 * Decay without sweeps: a decayed score f(t) = sum over uses of
 * 2^-((t - t_use) / H) is stored as key = log2 f(t) + t / H, which does not
 * change while the slot is unused. Keys of different slots compare the same
 * way their scores do at any common time, so heaps stay valid as time
 * passes, and a use at scaled time t = now / H only rewrites its own key:
 * key' = t + log2(2^(key - t) + amount). A key that was never used is -INFINITY.
 */
double guanaco_policy_decayed_add(double key, double time, double amount);

/* calloc of count (at least one) items, clearing *ok on failure. */
static inline void *guanaco_policy_alloc(size_t count, size_t size, bool *ok) {
    void *memory = calloc(count ? count : 1, size);
    *ok = *ok && memory != NULL;
    return memory;
}

static inline uint32_t guanaco_policy_layer_of(const struct guanaco_policy_state *s, uint32_t slot) {
    return slot / s->n_expert;
}

/* Needed by protect_layer's last access: never a victim. */
static inline bool guanaco_policy_is_needed_now(const struct guanaco_policy_state *s, uint32_t slot,
                                                uint32_t protect_layer) {
    return protect_layer < s->n_layer && guanaco_policy_layer_of(s, slot) == protect_layer &&
           s->layer_last_call[protect_layer] != 0 && s->needed_call[slot] == s->layer_last_call[protect_layer];
}

/*
 * Intrusive doubly linked lists over ids (lru, layer-lru): prev and next have
 * an entry per id; ids past the slots are sentinels (a list is empty when
 * its sentinel links to itself). Each list runs most to least recent.
 */
static inline void guanaco_list_link_after(uint32_t *prev, uint32_t *next, uint32_t anchor, uint32_t id) {
    prev[id] = anchor;
    next[id] = next[anchor];
    prev[next[anchor]] = id;
    next[anchor] = id;
}

static inline void guanaco_list_unlink(uint32_t *prev, uint32_t *next, uint32_t id) {
    next[prev[id]] = next[id];
    prev[next[id]] = prev[id];
    prev[id] = next[id] = GUANACO_POLICY_NO_SLOT;
}

/* n_ids unlinked ids followed by n_lists empty lists (sentinels n_ids ...). */
static inline void guanaco_list_init(uint32_t *prev, uint32_t *next, uint32_t n_ids, uint32_t n_lists) {
    for (uint32_t i = 0; i < n_ids; i++) {
        prev[i] = next[i] = GUANACO_POLICY_NO_SLOT;
    }
    for (uint32_t l = 0; l < n_lists; l++) {
        prev[n_ids + l] = next[n_ids + l] = n_ids + l;
    }
}

/* The victim of a layer kept in a list (sentinel n_slots + layer): its least recent expert, unless that is needed
   now (then so is the rest). */
static inline uint32_t guanaco_list_victim(const struct guanaco_policy_state *s, const uint32_t *layer_prev,
                                           uint32_t layer, uint32_t protect_layer) {
    uint32_t tail = layer_prev[s->n_slots + layer];
    return tail < s->n_slots && !guanaco_policy_is_needed_now(s, tail, protect_layer) ? tail : GUANACO_POLICY_NO_SLOT;
}

#endif
