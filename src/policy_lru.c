/*
 * policy_lru.c - owns the lru kind: one recency list over every slot, and one
 * per layer for the per-layer caps. O(1) per access and per victim.
 */
#include "policy_impl.h"

#include <errno.h>

struct lru {
    /* ids past the slots are sentinels: global n_slots; layer l n_slots + l */
    uint32_t *global_prev, *global_next;
    uint32_t *layer_prev, *layer_next;
};

static void lru_free(void *impl) {
    struct lru *lru = impl;
    if (!lru) {
        return;
    }
    free(lru->global_prev);
    free(lru->global_next);
    free(lru->layer_prev);
    free(lru->layer_next);
    free(lru);
}

static void lru_touch(void *impl, const struct guanaco_policy_state *s, uint32_t slot, bool hit) {
    struct lru *lru = impl;
    if (hit) {
        guanaco_list_unlink(lru->global_prev, lru->global_next, slot);
        guanaco_list_unlink(lru->layer_prev, lru->layer_next, slot);
    }
    guanaco_list_link_after(lru->global_prev, lru->global_next, s->n_slots, slot);
    guanaco_list_link_after(lru->layer_prev, lru->layer_next, s->n_slots + guanaco_policy_layer_of(s, slot), slot);
}

static uint32_t lru_cap_victim(void *impl, const struct guanaco_policy_state *s, uint32_t layer,
                               uint32_t protect_layer, bool take_hinted) {
    (void)take_hinted;
    return guanaco_list_victim(s, ((struct lru *)impl)->layer_prev, layer, protect_layer);
}

static uint32_t lru_budget_victim(void *impl, const struct guanaco_policy_state *s, uint32_t protect_layer,
                                  bool take_hinted) {
    (void)take_hinted;
    const struct lru *lru = impl;
    for (uint32_t slot = lru->global_prev[s->n_slots]; slot < s->n_slots; slot = lru->global_prev[slot]) {
        if (!guanaco_policy_is_needed_now(s, slot, protect_layer)) {
            return slot; /* skipped ones are needed now: at most one layer's working set */
        }
    }
    return GUANACO_POLICY_NO_SLOT;
}

static void lru_evicted(void *impl, const struct guanaco_policy_state *s, uint32_t slot) {
    (void)s;
    struct lru *lru = impl;
    guanaco_list_unlink(lru->global_prev, lru->global_next, slot);
    guanaco_list_unlink(lru->layer_prev, lru->layer_next, slot);
}

static const struct guanaco_policy_ops lru_ops = {
    .touch = lru_touch,
    .cap_victim = lru_cap_victim,
    .budget_victim = lru_budget_victim,
    .evicted = lru_evicted,
    .free = lru_free,
};

int guanaco_policy_lru_create(const struct guanaco_policy_state *s, const struct guanaco_policy_ops **ops, void **impl) {
    struct lru *lru = calloc(1, sizeof(*lru));
    if (!lru) {
        return -ENOMEM;
    }
    bool ok = true;
    lru->global_prev = guanaco_policy_alloc(s->n_slots + 1, sizeof(uint32_t), &ok);
    lru->global_next = guanaco_policy_alloc(s->n_slots + 1, sizeof(uint32_t), &ok);
    lru->layer_prev = guanaco_policy_alloc((size_t)s->n_slots + s->n_layer, sizeof(uint32_t), &ok);
    lru->layer_next = guanaco_policy_alloc((size_t)s->n_slots + s->n_layer, sizeof(uint32_t), &ok);
    if (!ok) {
        lru_free(lru);
        return -ENOMEM;
    }
    guanaco_list_init(lru->global_prev, lru->global_next, s->n_slots, 1);
    guanaco_list_init(lru->layer_prev, lru->layer_next, s->n_slots, s->n_layer);
    *ops = &lru_ops;
    *impl = lru;
    return 0;
}
