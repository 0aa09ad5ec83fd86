/*
 * policy_guanaco.c - owns the guanaco kind (the documented design):
 * - cold-first: within a layer the unpinned experts leave in order of a
 *   short-half-life score (recency with a memory of frequency);
 * - hot set: an expert whose long-half-life heat says it is used in at least
 *   PIN_ON_SHARE of tokens is pinned, while pinned bytes stay within
 *   PIN_BUDGET_SHARE of the budget; the pin is released once its heat falls
 *   below PIN_OFF_SHARE. Heat decays with time whether or not the expert is
 *   used, and a min-heap of pinned heat finds the ones that cooled, so a pin
 *   never outlives its use;
 * - per-layer shares: each layer's pressure is the decayed bytes of its
 *   accesses to unpinned experts, with misses on experts it evicted recently
 *   (ghost hits: a larger share would have kept them) counted GHOST_WEIGHT
 *   extra times. Victims come from the layer whose unpinned bytes are largest
 *   relative to its pressure, so shares follow pressure both ways: a busy
 *   layer grows, and an idle layer's pressure decays, so it shrinks;
 * - hints: a hinted expert is skipped by eviction until its layer's next
 *   access (the guess came true or not) or the hint's lifetime ends,
 *   whichever is first, unless nothing else is left.
 * Scores, heat and pressure are decayed counts (guanaco_policy_decayed_add).
 * O(log n) per access and per victim.
 */
#include "policy_impl.h"

#include <errno.h>
#include <math.h>

/* tuning, measured on synthetic decode traces calibrated to REFERENCE.md section 7 (per-layer LRU hit rates of
   Qwen3-30B-A3B); hit rates moved by under a point across 2x changes of each */
#define RECENCY_SPEEDUP 16.0     /* the cold-first score decays this much faster than heat: 2 tokens */
#define PIN_ON_SHARE 0.5         /* pinned once its heat says it is used in half the tokens */
#define PIN_OFF_SHARE 0.25       /* released below a quarter: hysteresis, so pins do not flap */
#define PIN_BUDGET_SHARE 0.5     /* pinned bytes stay within half the budget */
#define GHOST_WEIGHT 2.0         /* a ghost hit weighs this much more than an ordinary access */

struct guanaco {
    double score_half_life;      /* the cold-first score: the config's half_life / RECENCY_SPEEDUP */
    double heat_half_life;       /* heat and layer pressure: the config's half_life */

    /* per layer, a heap of its resident slots: unpinned (tier 0) by cold-first score, then pinned ones */
    struct guanaco_heap *slot_heaps;
    struct guanaco_heap_keys slot_order;
    uint32_t *slot_heap_items;
    uint32_t *slot_position;
    double *slot_key;
    uint8_t *slot_tier;          /* 1 while pinned, so pinned experts leave a layer last */

    struct guanaco_heap layer_heap; /* which layer gives up an unpinned expert next */
    struct guanaco_heap_keys layer_order;
    uint32_t *layer_heap_items;
    uint32_t *layer_position;
    double *layer_key;

    double *heat;                /* per slot: decayed uses on the heat half-life */
    struct guanaco_heap pin_heap; /* pinned slots by heat: the first to cool on top */
    struct guanaco_heap_keys pin_order;
    uint32_t *pin_heap_items;
    uint32_t *pin_position;
    uint64_t pinned_bytes;
    uint64_t pin_budget;
    double pin_on_log_heat;      /* log2 of the heat that pins, and of the heat that releases */
    double pin_off_log_heat;
    uint64_t *hint_end;          /* a hint protects the slot while now < hint_end ... */
    uint64_t *hint_call;         /* ... and its layer's last access is still the one before the hint */
    uint64_t *evicted_at;        /* the layer's eviction count when the slot left; 0 = never */
    uint64_t *layer_evictions;
    uint64_t *layer_pinned_bytes;
    uint64_t *layer_evictable_bytes; /* unpinned resident bytes still in the slot heap */
    double *pressure;            /* per layer, heat-scaled key of decayed access bytes */

    double unpinned_uses, ghost_hits; /* of the access in progress */
    uint32_t *deferred;          /* slots set aside in this evict pass */
    uint32_t n_deferred;
};

static double score_time(const struct guanaco *g, const struct guanaco_policy_state *s) {
    return (double)s->now / g->score_half_life;
}

static double heat_time(const struct guanaco *g, const struct guanaco_policy_state *s) {
    return (double)s->now / g->heat_half_life;
}

static void guanaco_free(void *impl) {
    struct guanaco *g = impl;
    if (!g) {
        return;
    }
    free(g->slot_heaps);
    free(g->slot_heap_items);
    free(g->slot_position);
    free(g->slot_key);
    free(g->slot_tier);
    free(g->layer_heap_items);
    free(g->layer_position);
    free(g->layer_key);
    free(g->heat);
    free(g->pin_heap_items);
    free(g->pin_position);
    free(g->hint_end);
    free(g->hint_call);
    free(g->evicted_at);
    free(g->layer_evictions);
    free(g->layer_pinned_bytes);
    free(g->layer_evictable_bytes);
    free(g->pressure);
    free(g->deferred);
    free(g);
}

/* A hint lasts until the layer's next access (the guess then came true or not) or until it expires. */
static bool is_hinted(const struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot) {
    return s->now < g->hint_end[slot] && g->hint_call[slot] == s->layer_last_call[guanaco_policy_layer_of(s, slot)];
}

/* Whether evict may take the slot in this pass. */
static bool may_take(const struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot,
                     uint32_t protect_layer, bool take_hinted) {
    return !guanaco_policy_is_needed_now(s, slot, protect_layer) && (take_hinted || !is_hinted(g, s, slot));
}

/* Most unpinned bytes per unit of pressure first: key -(log2 bytes - pressure). */
static void refresh(struct guanaco *g, uint32_t layer) {
    bool wanted = g->layer_evictable_bytes[layer] > 0;
    g->layer_key[layer] = wanted ? g->pressure[layer] - log2((double)g->layer_evictable_bytes[layer]) : 0;
    if (!wanted) {
        if (guanaco_heap_contains(&g->layer_heap, layer)) {
            guanaco_heap_remove(&g->layer_heap, layer);
        }
    } else if (guanaco_heap_contains(&g->layer_heap, layer)) {
        guanaco_heap_update(&g->layer_heap, layer);
    } else {
        guanaco_heap_push(&g->layer_heap, layer);
    }
}

/* ---- the hot set ---- */

static void pin(struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot) {
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    uint64_t bytes = s->expert_bytes[layer];
    g->slot_tier[slot] = 1;
    guanaco_heap_update(&g->slot_heaps[layer], slot);
    guanaco_heap_push(&g->pin_heap, slot);
    g->pinned_bytes += bytes;
    g->layer_pinned_bytes[layer] += bytes;
    g->layer_evictable_bytes[layer] -= bytes;
}

static void unpin(struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot) {
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    uint64_t bytes = s->expert_bytes[layer];
    g->slot_tier[slot] = 0;
    guanaco_heap_update(&g->slot_heaps[layer], slot);
    guanaco_heap_remove(&g->pin_heap, slot);
    g->pinned_bytes -= bytes;
    g->layer_pinned_bytes[layer] -= bytes;
    g->layer_evictable_bytes[layer] += bytes;
    refresh(g, layer);
}

/* Pins whose heat fell under the release threshold, coolest first: O(log n) each. */
static void release_cooled_pins(void *impl, const struct guanaco_policy_state *s) {
    struct guanaco *g = impl;
    double threshold = g->pin_off_log_heat + heat_time(g, s);
    for (uint32_t slot = guanaco_heap_top(&g->pin_heap); slot != GUANACO_HEAP_ABSENT && g->heat[slot] < threshold;
         slot = guanaco_heap_top(&g->pin_heap)) {
        unpin(g, s, slot);
    }
}

/* ---- access ---- */

static void guanaco_access_begin(void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    (void)layer;
    struct guanaco *g = impl;
    release_cooled_pins(g, s);
    g->unpinned_uses = 0;
    g->ghost_hits = 0;
}

static void guanaco_touch(void *impl, const struct guanaco_policy_state *s, uint32_t slot, bool hit) {
    struct guanaco *g = impl;
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    uint64_t bytes = s->expert_bytes[layer];
    if (!hit && g->evicted_at[slot] != 0) {
        /* ghost window: as many evictions back as the layer holds experts */
        uint64_t window = s->layer_resident[layer] > 1 ? s->layer_resident[layer] : 1;
        if (g->layer_evictions[layer] - g->evicted_at[slot] < window) {
            g->ghost_hits += 1;
        }
    }
    g->slot_key[slot] = guanaco_policy_decayed_add(g->slot_key[slot], score_time(g, s), 1.0);
    g->heat[slot] = guanaco_policy_decayed_add(g->heat[slot], heat_time(g, s), 1.0);
    if (hit) {
        guanaco_heap_update(&g->slot_heaps[layer], slot);
    } else {
        g->slot_tier[slot] = 0;
        guanaco_heap_push(&g->slot_heaps[layer], slot);
        g->layer_evictable_bytes[layer] += bytes;
    }
    if (g->slot_tier[slot]) {
        guanaco_heap_update(&g->pin_heap, slot);
    } else {
        g->unpinned_uses += 1;
        if (g->heat[slot] - heat_time(g, s) >= g->pin_on_log_heat && g->pinned_bytes + bytes <= g->pin_budget) {
            pin(g, s, slot);
        }
    }
}

static void guanaco_access_end(void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    struct guanaco *g = impl;
    if (g->unpinned_uses + g->ghost_hits > 0) {
        g->pressure[layer] = guanaco_policy_decayed_add(g->pressure[layer], heat_time(g, s),
                                                        (double)s->expert_bytes[layer] *
                                                            (g->unpinned_uses + GHOST_WEIGHT * g->ghost_hits));
    }
    refresh(g, layer);
}

/* ---- evict ---- */

/* Set a heap-held slot aside for the rest of this evict pass. */
static void defer_slot(struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot) {
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    guanaco_heap_remove(&g->slot_heaps[layer], slot);
    if (g->slot_tier[slot]) {
        guanaco_heap_remove(&g->pin_heap, slot);
    } else {
        g->layer_evictable_bytes[layer] -= s->expert_bytes[layer];
    }
    refresh(g, layer);
    g->deferred[g->n_deferred++] = slot;
}

static void guanaco_restore(void *impl, const struct guanaco_policy_state *s) {
    struct guanaco *g = impl;
    for (uint32_t i = 0; i < g->n_deferred; i++) {
        uint32_t slot = g->deferred[i];
        uint32_t layer = guanaco_policy_layer_of(s, slot);
        guanaco_heap_push(&g->slot_heaps[layer], slot);
        if (g->slot_tier[slot]) {
            guanaco_heap_push(&g->pin_heap, slot);
        } else {
            g->layer_evictable_bytes[layer] += s->expert_bytes[layer];
        }
        refresh(g, layer);
    }
    g->n_deferred = 0;
}

static uint32_t guanaco_cap_victim(void *impl, const struct guanaco_policy_state *s, uint32_t layer,
                                   uint32_t protect_layer, bool take_hinted) {
    struct guanaco *g = impl;
    for (uint32_t slot = guanaco_heap_top(&g->slot_heaps[layer]); slot != GUANACO_HEAP_ABSENT;
         slot = guanaco_heap_top(&g->slot_heaps[layer])) {
        if (may_take(g, s, slot, protect_layer, take_hinted)) {
            return slot;
        }
        defer_slot(g, s, slot);
    }
    return GUANACO_POLICY_NO_SLOT;
}

static uint32_t guanaco_budget_victim(void *impl, const struct guanaco_policy_state *s, uint32_t protect_layer,
                                      bool take_hinted) {
    struct guanaco *g = impl;
    /* unpinned, from the layer most above its share; then the coolest pin */
    for (uint32_t layer = guanaco_heap_top(&g->layer_heap); layer != GUANACO_HEAP_ABSENT;
         layer = guanaco_heap_top(&g->layer_heap)) {
        uint32_t slot = guanaco_heap_top(&g->slot_heaps[layer]); /* unpinned: tier 0 comes first */
        if (may_take(g, s, slot, protect_layer, take_hinted)) {
            return slot;
        }
        defer_slot(g, s, slot);
    }
    for (uint32_t slot = guanaco_heap_top(&g->pin_heap); slot != GUANACO_HEAP_ABSENT;
         slot = guanaco_heap_top(&g->pin_heap)) {
        if (may_take(g, s, slot, protect_layer, take_hinted)) {
            return slot;
        }
        defer_slot(g, s, slot);
    }
    return GUANACO_POLICY_NO_SLOT;
}

static void guanaco_evicted(void *impl, const struct guanaco_policy_state *s, uint32_t slot) {
    struct guanaco *g = impl;
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    uint64_t bytes = s->expert_bytes[layer];
    if (guanaco_heap_contains(&g->slot_heaps[layer], slot)) {
        guanaco_heap_remove(&g->slot_heaps[layer], slot);
        if (!g->slot_tier[slot]) {
            g->layer_evictable_bytes[layer] -= bytes;
        }
    }
    if (g->slot_tier[slot]) {
        if (guanaco_heap_contains(&g->pin_heap, slot)) {
            guanaco_heap_remove(&g->pin_heap, slot);
        }
        g->pinned_bytes -= bytes;
        g->layer_pinned_bytes[layer] -= bytes;
        g->slot_tier[slot] = 0;
    }
    g->evicted_at[slot] = ++g->layer_evictions[layer];
    refresh(g, layer);
}

/* ---- budget, hints, priors and queries ---- */

static void guanaco_budget_changed(void *impl, const struct guanaco_policy_state *s) {
    struct guanaco *g = impl;
    g->pin_budget = (uint64_t)((double)s->budget * PIN_BUDGET_SHARE);
}

static void guanaco_hint(void *impl, const struct guanaco_policy_state *s, uint32_t slot, float weight) {
    struct guanaco *g = impl;
    g->hint_end[slot] = weight > 0 ? s->now + s->hint_lifetime + 1 : 0;
    g->hint_call[slot] = s->layer_last_call[guanaco_policy_layer_of(s, slot)];
}

static void guanaco_seed(void *impl, const struct guanaco_policy_state *s, uint32_t layer, const double *rate) {
    struct guanaco *g = impl;
    /* a use in every token keeps a decayed count at 1 / (1 - 2^(-1/H)) */
    const double heat_every_token = 1.0 / (1.0 - exp2(-1.0 / g->heat_half_life));
    const double score_every_token = 1.0 / (1.0 - exp2(-1.0 / g->score_half_life));
    for (uint32_t e = 0; e < s->n_expert; e++) {
        double r = rate[e] > 1.0 ? 1.0 : rate[e];
        if (!(r > 0)) { /* zero, negative or NaN */
            continue;
        }
        uint32_t slot = layer * s->n_expert + e;
        g->slot_key[slot] = guanaco_policy_decayed_add(g->slot_key[slot], score_time(g, s), r * score_every_token);
        g->heat[slot] = guanaco_policy_decayed_add(g->heat[slot], heat_time(g, s), r * heat_every_token);
        if (g->slot_tier[slot] && guanaco_heap_contains(&g->pin_heap, slot)) {
            guanaco_heap_update(&g->pin_heap, slot);
        }
        if (guanaco_heap_contains(&g->slot_heaps[layer], slot)) {
            guanaco_heap_update(&g->slot_heaps[layer], slot);
        }
    }
    refresh(g, layer);
}

static bool guanaco_is_pinned(const void *impl, uint32_t slot) {
    return ((const struct guanaco *)impl)->slot_tier[slot];
}

static uint64_t guanaco_target_bytes(const void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    const struct guanaco *g = impl;
    if (g->pressure[layer] == -INFINITY) {
        return 0;
    }
    /* shares of the unpinned budget in proportion to 2^pressure, scaled by the largest to stay finite */
    double top = -INFINITY, sum = 0;
    for (uint32_t l = 0; l < s->n_layer; l++) {
        top = g->pressure[l] > top ? g->pressure[l] : top;
    }
    for (uint32_t l = 0; l < s->n_layer; l++) {
        sum += g->pressure[l] == -INFINITY ? 0 : exp2(g->pressure[l] - top);
    }
    uint64_t unpinned_budget = s->budget > g->pinned_bytes ? s->budget - g->pinned_bytes : 0;
    double share = exp2(g->pressure[layer] - top) / sum;
    return g->layer_pinned_bytes[layer] + (uint64_t)(share * (double)unpinned_budget);
}

static const struct guanaco_policy_ops guanaco_ops = {
    .access_begin = guanaco_access_begin,
    .touch = guanaco_touch,
    .access_end = guanaco_access_end,
    .evict_begin = release_cooled_pins,
    .cap_victim = guanaco_cap_victim,
    .budget_victim = guanaco_budget_victim,
    .evicted = guanaco_evicted,
    .restore = guanaco_restore,
    .budget_changed = guanaco_budget_changed,
    .hint = guanaco_hint,
    .seed = guanaco_seed,
    .is_pinned = guanaco_is_pinned,
    .layer_target_bytes = guanaco_target_bytes,
    .free = guanaco_free,
};

int guanaco_policy_guanaco_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops,
                                  void **impl) {
    struct guanaco *g = calloc(1, sizeof(*g));
    if (!g) {
        return -ENOMEM;
    }
    size_t slots = s->n_slots, layers = s->n_layer;
    bool ok = true;
    g->slot_heaps = guanaco_policy_alloc(layers, sizeof(*g->slot_heaps), &ok);
    g->slot_heap_items = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
    g->slot_position = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
    g->slot_key = guanaco_policy_alloc(slots, sizeof(double), &ok);
    g->slot_tier = guanaco_policy_alloc(slots, sizeof(uint8_t), &ok);
    g->layer_heap_items = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->layer_position = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->layer_key = guanaco_policy_alloc(layers, sizeof(double), &ok);
    g->heat = guanaco_policy_alloc(slots, sizeof(double), &ok);
    g->pin_heap_items = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
    g->pin_position = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
    g->hint_end = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->hint_call = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->evicted_at = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->layer_evictions = guanaco_policy_alloc(layers, sizeof(uint64_t), &ok);
    g->layer_pinned_bytes = guanaco_policy_alloc(layers, sizeof(uint64_t), &ok);
    g->layer_evictable_bytes = guanaco_policy_alloc(layers, sizeof(uint64_t), &ok);
    g->pressure = guanaco_policy_alloc(layers, sizeof(double), &ok);
    g->deferred = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
    if (!ok) {
        guanaco_free(g);
        return -ENOMEM;
    }
    g->heat_half_life = s->half_life;
    g->score_half_life = s->half_life / RECENCY_SPEEDUP;
    g->slot_order = (struct guanaco_heap_keys){.keys = g->slot_key, .tiers = g->slot_tier};
    g->layer_order = (struct guanaco_heap_keys){.keys = g->layer_key};
    g->pin_order = (struct guanaco_heap_keys){.keys = g->heat};
    for (uint32_t i = 0; i < s->n_slots; i++) {
        g->slot_position[i] = GUANACO_HEAP_ABSENT;
        g->pin_position[i] = GUANACO_HEAP_ABSENT;
        g->slot_key[i] = -INFINITY;
        g->heat[i] = -INFINITY;
    }
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        g->slot_heaps[layer] = guanaco_heap_make(g->slot_heap_items + (size_t)layer * s->n_expert, g->slot_position,
                                                 guanaco_heap_key_before, &g->slot_order);
        g->layer_position[layer] = GUANACO_HEAP_ABSENT;
        g->pressure[layer] = -INFINITY;
    }
    g->layer_heap = guanaco_heap_make(g->layer_heap_items, g->layer_position, guanaco_heap_key_before, &g->layer_order);
    g->pin_heap = guanaco_heap_make(g->pin_heap_items, g->pin_position, guanaco_heap_key_before, &g->pin_order);
    /* a use in every token keeps the heat at 1 / (1 - 2^(-1/H)) */
    double every_token = 1.0 / (1.0 - exp2(-1.0 / g->heat_half_life));
    g->pin_on_log_heat = log2(PIN_ON_SHARE * every_token);
    g->pin_off_log_heat = log2(PIN_OFF_SHARE * every_token);
    guanaco_budget_changed(g, s);
    *ops = &guanaco_ops;
    *impl = g;
    return 0;
}
