/*
 * policy_lfu.c - owns the lfu kind: a global LFU with exponential decay
 * (half_life; see guanaco_policy_decayed_add). Each layer keeps its resident
 * slots in a heap by decayed count, and a heap of layers by their coldest
 * slot finds the globally coldest: O(log n) per access and per victim.
 */
#include "policy_impl.h"

#include <errno.h>
#include <math.h>

struct lfu {
    struct guanaco_heap *slot_heaps;      /* per layer: its resident slots, coldest first */
    struct guanaco_heap_keys slot_order;
    uint32_t *slot_heap_items;            /* n_expert per layer */
    uint32_t *slot_position;              /* shared by the layers' heaps: their ids are disjoint */
    double *slot_key;                     /* per slot: decayed uses, on the config's half-life */
    struct guanaco_heap layer_heap;       /* layers by their coldest slot */
    struct guanaco_heap_keys layer_order;
    uint32_t *layer_heap_items;
    uint32_t *layer_position;
    double *layer_key;
    uint32_t *deferred;                   /* slots set aside in this evict pass */
    uint32_t n_deferred;
};

static double heat_time(const struct guanaco_policy_state *s) {
    return (double)s->now / s->half_life;
}

static void lfu_free(void *impl) {
    struct lfu *f = impl;
    if (!f) {
        return;
    }
    free(f->slot_heaps);
    free(f->slot_heap_items);
    free(f->slot_position);
    free(f->slot_key);
    free(f->layer_heap_items);
    free(f->layer_position);
    free(f->layer_key);
    free(f->deferred);
    free(f);
}

/* The layer whose coldest slot is globally coldest first. */
static void refresh(struct lfu *f, uint32_t layer) {
    uint32_t top = guanaco_heap_top(&f->slot_heaps[layer]);
    bool wanted = top != GUANACO_HEAP_ABSENT;
    f->layer_key[layer] = wanted ? f->slot_key[top] : 0;
    if (!wanted) {
        if (guanaco_heap_contains(&f->layer_heap, layer)) {
            guanaco_heap_remove(&f->layer_heap, layer);
        }
    } else if (guanaco_heap_contains(&f->layer_heap, layer)) {
        guanaco_heap_update(&f->layer_heap, layer);
    } else {
        guanaco_heap_push(&f->layer_heap, layer);
    }
}

static void lfu_touch(void *impl, const struct guanaco_policy_state *s, uint32_t slot, bool hit) {
    struct lfu *f = impl;
    struct guanaco_heap *heap = &f->slot_heaps[guanaco_policy_layer_of(s, slot)];
    f->slot_key[slot] = guanaco_policy_decayed_add(f->slot_key[slot], heat_time(s), 1.0);
    if (hit) {
        guanaco_heap_update(heap, slot); /* its key only grew */
    } else {
        guanaco_heap_push(heap, slot);
    }
}

static void lfu_access_end(void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    (void)s;
    refresh(impl, layer);
}

/* Set a slot aside for the rest of this evict pass. */
static void defer_slot(struct lfu *f, uint32_t layer, uint32_t slot) {
    guanaco_heap_remove(&f->slot_heaps[layer], slot);
    refresh(f, layer);
    f->deferred[f->n_deferred++] = slot;
}

static uint32_t lfu_cap_victim(void *impl, const struct guanaco_policy_state *s, uint32_t layer,
                               uint32_t protect_layer, bool take_hinted) {
    (void)take_hinted; /* lfu keeps no hints */
    struct lfu *f = impl;
    for (uint32_t slot = guanaco_heap_top(&f->slot_heaps[layer]); slot != GUANACO_HEAP_ABSENT;
         slot = guanaco_heap_top(&f->slot_heaps[layer])) {
        if (!guanaco_policy_is_needed_now(s, slot, protect_layer)) {
            return slot;
        }
        defer_slot(f, layer, slot);
    }
    return GUANACO_POLICY_NO_SLOT;
}

static uint32_t lfu_budget_victim(void *impl, const struct guanaco_policy_state *s, uint32_t protect_layer,
                                  bool take_hinted) {
    (void)take_hinted;
    struct lfu *f = impl;
    for (uint32_t layer = guanaco_heap_top(&f->layer_heap); layer != GUANACO_HEAP_ABSENT;
         layer = guanaco_heap_top(&f->layer_heap)) {
        uint32_t slot = guanaco_heap_top(&f->slot_heaps[layer]);
        if (!guanaco_policy_is_needed_now(s, slot, protect_layer)) {
            return slot;
        }
        defer_slot(f, layer, slot);
    }
    return GUANACO_POLICY_NO_SLOT;
}

static void lfu_evicted(void *impl, const struct guanaco_policy_state *s, uint32_t slot) {
    struct lfu *f = impl;
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    if (guanaco_heap_contains(&f->slot_heaps[layer], slot)) {
        guanaco_heap_remove(&f->slot_heaps[layer], slot);
    }
    refresh(f, layer);
}

static void lfu_restore(void *impl, const struct guanaco_policy_state *s) {
    struct lfu *f = impl;
    for (uint32_t i = 0; i < f->n_deferred; i++) {
        uint32_t slot = f->deferred[i];
        uint32_t layer = guanaco_policy_layer_of(s, slot);
        guanaco_heap_push(&f->slot_heaps[layer], slot);
        refresh(f, layer);
    }
    f->n_deferred = 0;
}

static void lfu_seed(void *impl, const struct guanaco_policy_state *s, uint32_t layer, const double *rate) {
    struct lfu *f = impl;
    /* a use in every token keeps a decayed count at 1 / (1 - 2^(-1/H)) */
    const double every_token = 1.0 / (1.0 - exp2(-1.0 / s->half_life));
    for (uint32_t e = 0; e < s->n_expert; e++) {
        double r = rate[e] > 1.0 ? 1.0 : rate[e];
        if (!(r > 0)) { /* zero, negative or NaN */
            continue;
        }
        uint32_t slot = layer * s->n_expert + e;
        f->slot_key[slot] = guanaco_policy_decayed_add(f->slot_key[slot], heat_time(s), r * every_token);
        if (guanaco_heap_contains(&f->slot_heaps[layer], slot)) {
            guanaco_heap_update(&f->slot_heaps[layer], slot);
        }
    }
    refresh(f, layer);
}

static const struct guanaco_policy_ops lfu_ops = {
    .touch = lfu_touch,
    .access_end = lfu_access_end,
    .cap_victim = lfu_cap_victim,
    .budget_victim = lfu_budget_victim,
    .evicted = lfu_evicted,
    .restore = lfu_restore,
    .seed = lfu_seed,
    .free = lfu_free,
};

int guanaco_policy_lfu_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops, void **impl) {
    struct lfu *f = calloc(1, sizeof(*f));
    if (!f) {
        return -ENOMEM;
    }
    bool ok = true;
    f->slot_heaps = guanaco_policy_alloc(s->n_layer, sizeof(*f->slot_heaps), &ok);
    f->slot_heap_items = guanaco_policy_alloc(s->n_slots, sizeof(uint32_t), &ok);
    f->slot_position = guanaco_policy_alloc(s->n_slots, sizeof(uint32_t), &ok);
    f->slot_key = guanaco_policy_alloc(s->n_slots, sizeof(double), &ok);
    f->layer_heap_items = guanaco_policy_alloc(s->n_layer, sizeof(uint32_t), &ok);
    f->layer_position = guanaco_policy_alloc(s->n_layer, sizeof(uint32_t), &ok);
    f->layer_key = guanaco_policy_alloc(s->n_layer, sizeof(double), &ok);
    f->deferred = guanaco_policy_alloc(s->n_slots, sizeof(uint32_t), &ok);
    if (!ok) {
        lfu_free(f);
        return -ENOMEM;
    }
    f->slot_order = (struct guanaco_heap_keys){.keys = f->slot_key};
    f->layer_order = (struct guanaco_heap_keys){.keys = f->layer_key};
    for (uint32_t i = 0; i < s->n_slots; i++) {
        f->slot_position[i] = GUANACO_HEAP_ABSENT;
        f->slot_key[i] = -INFINITY;
    }
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        f->slot_heaps[layer] = guanaco_heap_make(f->slot_heap_items + (size_t)layer * s->n_expert, f->slot_position,
                                                 guanaco_heap_key_before, &f->slot_order);
        f->layer_position[layer] = GUANACO_HEAP_ABSENT;
    }
    f->layer_heap = guanaco_heap_make(f->layer_heap_items, f->layer_position, guanaco_heap_key_before, &f->layer_order);
    *ops = &lfu_ops;
    *impl = f;
    return 0;
}
