/*
 * policy_layer_lru.c - owns the layer-lru kind: the budget split between MoE
 * layers in proportion to expert bytes, LRU inside each layer. Victims come
 * from the layer most above its share (a heap of layers), and within it the
 * least recent expert: O(1) per access plus O(log n_layer) per victim.
 */
#include "policy_impl.h"

#include <errno.h>

struct layer_lru {
    uint32_t *layer_prev, *layer_next; /* per layer, MRU -> LRU; sentinel of layer l: n_slots + l */
    struct guanaco_heap layer_heap;    /* layers holding experts, most bytes above their share first */
    struct guanaco_heap_keys layer_order;
    uint32_t *layer_heap_items;
    uint32_t *layer_position;
    double *layer_key;
    uint64_t *layer_share;             /* fixed share of the budget */
    uint32_t *deferred;                /* layers set aside in this evict pass: only needed-now experts left */
    uint32_t n_deferred;
};

static void layer_lru_free(void *impl) {
    struct layer_lru *l = impl;
    if (!l) {
        return;
    }
    free(l->layer_prev);
    free(l->layer_next);
    free(l->layer_heap_items);
    free(l->layer_position);
    free(l->layer_key);
    free(l->layer_share);
    free(l->deferred);
    free(l);
}

static void refresh(struct layer_lru *l, const struct guanaco_policy_state *s, uint32_t layer) {
    /* most bytes above its share first */
    bool wanted = s->layer_resident[layer] > 0;
    l->layer_key[layer] = (double)l->layer_share[layer] - (double)s->layer_resident_bytes[layer];
    if (!wanted) {
        if (guanaco_heap_contains(&l->layer_heap, layer)) {
            guanaco_heap_remove(&l->layer_heap, layer);
        }
    } else if (guanaco_heap_contains(&l->layer_heap, layer)) {
        guanaco_heap_update(&l->layer_heap, layer);
    } else {
        guanaco_heap_push(&l->layer_heap, layer);
    }
}

static void layer_lru_touch(void *impl, const struct guanaco_policy_state *s, uint32_t slot, bool hit) {
    struct layer_lru *l = impl;
    if (hit) {
        guanaco_list_unlink(l->layer_prev, l->layer_next, slot);
    }
    guanaco_list_link_after(l->layer_prev, l->layer_next, s->n_slots + guanaco_policy_layer_of(s, slot), slot);
}

static void layer_lru_access_end(void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    refresh(impl, s, layer);
}

static uint32_t layer_lru_cap_victim(void *impl, const struct guanaco_policy_state *s, uint32_t layer,
                                     uint32_t protect_layer, bool take_hinted) {
    (void)take_hinted;
    return guanaco_list_victim(s, ((struct layer_lru *)impl)->layer_prev, layer, protect_layer);
}

static uint32_t layer_lru_budget_victim(void *impl, const struct guanaco_policy_state *s, uint32_t protect_layer,
                                        bool take_hinted) {
    (void)take_hinted;
    struct layer_lru *l = impl;
    for (uint32_t layer = guanaco_heap_top(&l->layer_heap); layer != GUANACO_POLICY_NO_SLOT;
         layer = guanaco_heap_top(&l->layer_heap)) {
        uint32_t slot = guanaco_list_victim(s, l->layer_prev, layer, protect_layer);
        if (slot != GUANACO_POLICY_NO_SLOT) {
            return slot;
        }
        guanaco_heap_remove(&l->layer_heap, layer); /* only needed-now experts left there */
        l->deferred[l->n_deferred++] = layer;
    }
    return GUANACO_POLICY_NO_SLOT;
}

static void layer_lru_evicted(void *impl, const struct guanaco_policy_state *s, uint32_t slot) {
    struct layer_lru *l = impl;
    guanaco_list_unlink(l->layer_prev, l->layer_next, slot);
    refresh(l, s, guanaco_policy_layer_of(s, slot));
}

static void layer_lru_restore(void *impl, const struct guanaco_policy_state *s) {
    struct layer_lru *l = impl;
    for (uint32_t i = 0; i < l->n_deferred; i++) {
        refresh(l, s, l->deferred[i]);
    }
    l->n_deferred = 0;
}

static void layer_lru_budget_changed(void *impl, const struct guanaco_policy_state *s) {
    struct layer_lru *l = impl;
    /* equal expert counts per MoE layer: the share is proportional to the layer's expert bytes */
    double moe_bytes = 0;
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        moe_bytes += (double)s->expert_bytes[layer];
    }
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        l->layer_share[layer] =
            moe_bytes > 0 ? (uint64_t)((double)s->budget * (double)s->expert_bytes[layer] / moe_bytes) : 0;
    }
}

static uint64_t layer_lru_target_bytes(const void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    (void)s;
    return ((const struct layer_lru *)impl)->layer_share[layer];
}

static const struct guanaco_policy_ops layer_lru_ops = {
    .touch = layer_lru_touch,
    .access_end = layer_lru_access_end,
    .cap_victim = layer_lru_cap_victim,
    .budget_victim = layer_lru_budget_victim,
    .evicted = layer_lru_evicted,
    .restore = layer_lru_restore,
    .budget_changed = layer_lru_budget_changed,
    .layer_target_bytes = layer_lru_target_bytes,
    .free = layer_lru_free,
};

int guanaco_policy_layer_lru_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops,
                                    void **impl) {
    struct layer_lru *l = calloc(1, sizeof(*l));
    if (!l) {
        return -ENOMEM;
    }
    bool ok = true;
    l->layer_prev = guanaco_policy_alloc((size_t)s->n_slots + s->n_layer, sizeof(uint32_t), &ok);
    l->layer_next = guanaco_policy_alloc((size_t)s->n_slots + s->n_layer, sizeof(uint32_t), &ok);
    l->layer_heap_items = guanaco_policy_alloc(s->n_layer, sizeof(uint32_t), &ok);
    l->layer_position = guanaco_policy_alloc(s->n_layer, sizeof(uint32_t), &ok);
    l->layer_key = guanaco_policy_alloc(s->n_layer, sizeof(double), &ok);
    l->layer_share = guanaco_policy_alloc(s->n_layer, sizeof(uint64_t), &ok);
    l->deferred = guanaco_policy_alloc(s->n_layer, sizeof(uint32_t), &ok);
    if (!ok) {
        layer_lru_free(l);
        return -ENOMEM;
    }
    guanaco_list_init(l->layer_prev, l->layer_next, s->n_slots, s->n_layer);
    l->layer_order = (struct guanaco_heap_keys){.keys = l->layer_key};
    l->layer_heap = guanaco_heap_make(l->layer_heap_items, l->layer_position, guanaco_heap_key_before, &l->layer_order);
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        l->layer_position[layer] = GUANACO_HEAP_ABSENT;
    }
    layer_lru_budget_changed(l, s);
    *ops = &layer_lru_ops;
    *impl = l;
    return 0;
}
