/*
 * policy.c - owns the public face of the replacement policies (policy.h): the
 * kind names, the config and argument checks, the bookkeeping every kind
 * shares (resident flags and bytes, per-layer counts, the per-layer caps, the
 * reserve, the budget, the clock) and the evict loop, which asks the kind's
 * ops table (policy_impl.h) for victims. Each kind is one file and holds
 * only its own order of victims: policy_lru.c, policy_lfu.c,
 * policy_layer_lru.c, policy_guanaco.c. Everything is allocated in
 * guanaco_policy_create(); access and evict only index arrays.
 *
 * Decode sweeps the layers in order every token, so the slot used longest ago
 * is usually one of the layer that runs next: a global LRU under a budget
 * smaller than one token's working set evicts every expert just before it is
 * needed again. The layer-lru and guanaco kinds therefore decide how much
 * each layer may hold first, and which of that layer's experts go second.
 */
#include "policy.h"
#include "policy_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct guanaco_policy {
    enum guanaco_policy_kind kind;
    struct guanaco_policy_state state; /* its arrays are the ones below, read only to the kinds */
    uint64_t reserve;                  /* bytes set aside for reads in flight outside the policy (prefetch) */
    uint64_t resident_bytes;

    uint64_t *expert_bytes;            /* per layer, a copy of the config's */
    uint8_t *resident;                 /* per slot */
    uint64_t *needed_call;             /* per slot */
    uint32_t *layer_resident;
    uint64_t *layer_resident_bytes;
    uint64_t *layer_last_call;
    uint8_t *layer_over_cap;           /* queued in over_cap_layers */
    uint32_t *over_cap_layers;
    uint32_t n_over_cap;

    const struct guanaco_policy_ops *ops;
    void *impl;
};

#define NAME_ENTRY(name) name,
#define NAME_JOINED(name) "|" name
static const char *const kind_names[] = {GUANACO_POLICY_KIND_NAMES(NAME_ENTRY)};
static const char kind_names_joined[] = GUANACO_POLICY_KIND_NAMES(NAME_JOINED); /* "|lru|lfu|..." */
#define KIND_COUNT (sizeof(kind_names) / sizeof(kind_names[0]))

static const guanaco_policy_create_fn kind_create[] = {
    [GUANACO_POLICY_LRU] = guanaco_policy_lru_create,
    [GUANACO_POLICY_LFU] = guanaco_policy_lfu_create,
    [GUANACO_POLICY_LAYER_LRU] = guanaco_policy_layer_lru_create,
    [GUANACO_POLICY_GUANACO] = guanaco_policy_guanaco_create,
};
_Static_assert(sizeof(kind_create) / sizeof(kind_create[0]) == KIND_COUNT, "one name per policy kind");

int guanaco_policy_kind_from_name(const char *name, enum guanaco_policy_kind *kind) {
    for (size_t i = 0; name && i < KIND_COUNT; i++) {
        if (strcmp(name, kind_names[i]) == 0) {
            *kind = (enum guanaco_policy_kind)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *guanaco_policy_kind_name(enum guanaco_policy_kind kind) {
    if ((unsigned)kind < KIND_COUNT) {
        return kind_names[kind];
    }
    return "unknown";
}

const char *guanaco_policy_kind_names(void) {
    return kind_names_joined + 1;
}

double guanaco_policy_decayed_add(double key, double time, double amount) {
    double now_log = key - time;
    if (now_log < -64) { /* under 2^-64: nothing left to add to, and no libm call */
        return time + (amount == 1.0 ? 0.0 : log2(amount));
    }
    return time + log2(exp2(now_log) + amount);
}

void guanaco_policy_free(struct guanaco_policy *p) {
    if (!p) {
        return;
    }
    if (p->ops) {
        p->ops->free(p->impl);
    }
    free(p->expert_bytes);
    free(p->resident);
    free(p->needed_call);
    free(p->layer_resident);
    free(p->layer_resident_bytes);
    free(p->layer_last_call);
    free(p->layer_over_cap);
    free(p->over_cap_layers);
    free(p);
}

int guanaco_policy_create(const struct guanaco_policy_config *config, struct guanaco_policy **out) {
    *out = NULL;
    if (!config || config->n_layer == 0 || config->n_expert == 0 || !config->expert_bytes ||
        (uint64_t)config->n_layer * config->n_expert >= GUANACO_POLICY_NO_SLOT - config->n_layer - 1 ||
        (unsigned)config->kind >= KIND_COUNT || (unsigned)config->variant > GUANACO_POLICY_LRU_ORDER ||
        config->half_life < 0 || !isfinite(config->half_life)) {
        return -EINVAL;
    }
    struct guanaco_policy *p = calloc(1, sizeof(*p));
    if (!p) {
        return -ENOMEM;
    }
    p->kind = config->kind;
    size_t slots = (size_t)config->n_layer * config->n_expert, layers = config->n_layer;
    bool ok = true;
    p->expert_bytes = guanaco_policy_alloc(layers, sizeof(*p->expert_bytes), &ok);
    p->resident = guanaco_policy_alloc(slots, sizeof(*p->resident), &ok);
    p->needed_call = guanaco_policy_alloc(slots, sizeof(*p->needed_call), &ok);
    p->layer_resident = guanaco_policy_alloc(layers, sizeof(*p->layer_resident), &ok);
    p->layer_resident_bytes = guanaco_policy_alloc(layers, sizeof(*p->layer_resident_bytes), &ok);
    p->layer_last_call = guanaco_policy_alloc(layers, sizeof(*p->layer_last_call), &ok);
    p->layer_over_cap = guanaco_policy_alloc(layers, sizeof(*p->layer_over_cap), &ok);
    p->over_cap_layers = guanaco_policy_alloc(layers, sizeof(*p->over_cap_layers), &ok);
    if (!ok) {
        guanaco_policy_free(p);
        return -ENOMEM;
    }
    memcpy(p->expert_bytes, config->expert_bytes, layers * sizeof(*p->expert_bytes));
    uint64_t every_expert_bytes = 0;
    for (size_t l = 0; l < layers; l++) {
        every_expert_bytes += p->expert_bytes[l] * config->n_expert;
    }
    p->state = (struct guanaco_policy_state){
        .n_layer = config->n_layer,
        .n_expert = config->n_expert,
        .n_slots = (uint32_t)slots,
        .max_per_layer = config->max_per_layer,
        .hint_lifetime = config->hint_lifetime ? config->hint_lifetime : 1,
        .half_life = config->half_life > 0 ? config->half_life : GUANACO_POLICY_DEFAULT_HALF_LIFE,
        .budget = config->budget_bytes,
        .every_expert_bytes = every_expert_bytes,
        .variant = config->variant,
        .call_tokens = 1,
        .expert_bytes = p->expert_bytes,
        .resident = p->resident,
        .needed_call = p->needed_call,
        .layer_resident = p->layer_resident,
        .layer_resident_bytes = p->layer_resident_bytes,
        .layer_last_call = p->layer_last_call,
    };
    int err = kind_create[p->kind](&p->state, &p->ops, &p->impl);
    if (err != 0) {
        guanaco_policy_free(p);
        return err;
    }
    *out = p;
    return 0;
}

void guanaco_policy_set_budget(struct guanaco_policy *p, uint64_t bytes) {
    if (!p) {
        return;
    }
    p->state.budget = bytes;
    if (p->ops->budget_changed) {
        p->ops->budget_changed(p->impl, &p->state);
    }
}

void guanaco_policy_set_reserve(struct guanaco_policy *p, uint64_t bytes) {
    p->reserve = bytes;
}

/* ---- access ---- */

int guanaco_policy_access(struct guanaco_policy *p, uint32_t layer, const uint32_t *experts, size_t n,
                          uint64_t now, uint32_t *missing, size_t *n_missing) {
    return guanaco_policy_access_batch(p, layer, experts, n, now, 1, missing, n_missing);
}

int guanaco_policy_access_batch(struct guanaco_policy *p, uint32_t layer, const uint32_t *experts, size_t n,
                                uint64_t now, uint32_t tokens, uint32_t *missing, size_t *n_missing) {
    struct guanaco_policy_state *s = &p->state;
    *n_missing = 0;
    if (layer >= s->n_layer || p->expert_bytes[layer] == 0 || (n > 0 && (!experts || !missing))) {
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (experts[i] >= s->n_expert) {
            return -EINVAL;
        }
    }
    if (now > s->now) {
        s->now = now;
    }
    uint64_t bytes = p->expert_bytes[layer];
    uint64_t call = ++s->call;
    s->call_tokens = tokens ? tokens : 1;
    p->layer_last_call[layer] = call;
    if (p->ops->access_begin) {
        p->ops->access_begin(p->impl, s, layer);
    }
    uint32_t base = layer * s->n_expert;
    for (size_t i = 0; i < n; i++) {
        uint32_t slot = base + experts[i];
        bool hit = p->resident[slot];
        if (!hit) {
            missing[(*n_missing)++] = experts[i];
            p->resident[slot] = 1;
            p->resident_bytes += bytes;
            p->layer_resident[layer]++;
            p->layer_resident_bytes[layer] += bytes;
        }
        p->needed_call[slot] = call;
        p->ops->touch(p->impl, s, slot, hit);
    }
    if (p->ops->access_end) {
        p->ops->access_end(p->impl, s, layer);
    }
    if (s->max_per_layer && p->layer_resident[layer] > s->max_per_layer && !p->layer_over_cap[layer]) {
        p->layer_over_cap[layer] = 1;
        p->over_cap_layers[p->n_over_cap++] = layer;
    }
    return 0;
}

/* ---- evict ---- */

struct victims {
    uint32_t *layers;
    uint32_t *experts;
    size_t capacity;
    size_t count;
};

static void evict_slot(struct guanaco_policy *p, uint32_t slot, struct victims *victims) {
    uint32_t layer = guanaco_policy_layer_of(&p->state, slot);
    uint64_t bytes = p->expert_bytes[layer];
    p->resident[slot] = 0;
    p->resident_bytes -= bytes;
    p->layer_resident[layer]--;
    p->layer_resident_bytes[layer] -= bytes;
    p->ops->evicted(p->impl, &p->state, slot);
    victims->layers[victims->count] = layer;
    victims->experts[victims->count] = slot - layer * p->state.n_expert;
    victims->count++;
}

static void restore(struct guanaco_policy *p) {
    if (p->ops->restore) {
        p->ops->restore(p->impl, &p->state);
    }
}

int guanaco_policy_evict(struct guanaco_policy *p, uint32_t protect_layer, uint32_t *victim_layers,
                         uint32_t *victim_experts, size_t capacity, size_t *n_victims) {
    const struct guanaco_policy_state *s = &p->state;
    struct victims victims = {.layers = victim_layers, .experts = victim_experts, .capacity = capacity};
    *n_victims = 0;
    if (capacity > 0 && (!victim_layers || !victim_experts)) {
        return -EINVAL;
    }
    if (p->ops->evict_begin) {
        p->ops->evict_begin(p->impl, s);
    }
    int result = 0;

    /* caps first: a layer's own experts are the only ones that bring it under its cap */
    uint32_t still_over = 0;
    for (uint32_t i = 0; i < p->n_over_cap; i++) {
        uint32_t layer = p->over_cap_layers[i];
        /* a hinted expert goes only when nothing else of the layer may */
        for (int pass = 0; pass < 2 && p->layer_resident[layer] > s->max_per_layer && result == 0; pass++) {
            while (p->layer_resident[layer] > s->max_per_layer) {
                if (victims.count == victims.capacity) {
                    result = -ENOBUFS;
                    break;
                }
                uint32_t slot = p->ops->cap_victim(p->impl, s, layer, protect_layer, pass == 1);
                if (slot == GUANACO_POLICY_NO_SLOT) {
                    break;
                }
                evict_slot(p, slot, &victims);
            }
            restore(p);
        }
        if (p->layer_resident[layer] > s->max_per_layer) {
            p->over_cap_layers[still_over++] = layer; /* holds only what it needs now, or victims ran out */
        } else {
            p->layer_over_cap[layer] = 0;
        }
    }
    p->n_over_cap = still_over;

    const uint64_t limit = s->budget > p->reserve ? s->budget - p->reserve : 0;
    for (int pass = 0; pass < 2 && p->resident_bytes > limit && result == 0; pass++) {
        while (p->resident_bytes > limit) {
            if (victims.count == victims.capacity) {
                result = -ENOBUFS;
                break;
            }
            uint32_t slot = p->ops->budget_victim(p->impl, s, protect_layer, pass == 1);
            if (slot == GUANACO_POLICY_NO_SLOT) {
                break;
            }
            evict_slot(p, slot, &victims);
        }
        restore(p);
    }
    *n_victims = victims.count;
    return result;
}

/* ---- hints, priors and queries ---- */

void guanaco_policy_hint(struct guanaco_policy *p, uint32_t layer, uint32_t expert, float weight) {
    if (!p->ops->hint || layer >= p->state.n_layer || expert >= p->state.n_expert) {
        return;
    }
    p->ops->hint(p->impl, &p->state, layer * p->state.n_expert + expert, weight);
}

void guanaco_policy_seed(struct guanaco_policy *p, uint32_t layer, const double *rate) {
    if (!rate || layer >= p->state.n_layer || p->expert_bytes[layer] == 0 || !p->ops->seed) {
        return;
    }
    p->ops->seed(p->impl, &p->state, layer, rate);
}

bool guanaco_policy_is_resident(const struct guanaco_policy *p, uint32_t layer, uint32_t expert) {
    return layer < p->state.n_layer && expert < p->state.n_expert && p->resident[layer * p->state.n_expert + expert];
}

uint64_t guanaco_policy_resident_bytes(const struct guanaco_policy *p) {
    return p->resident_bytes;
}

bool guanaco_policy_holds_every_expert(const struct guanaco_policy *p) {
    return p->state.budget >= p->state.every_expert_bytes && p->resident_bytes >= p->state.every_expert_bytes;
}

uint32_t guanaco_policy_layer_resident_count(const struct guanaco_policy *p, uint32_t layer) {
    return layer < p->state.n_layer ? p->layer_resident[layer] : 0;
}

bool guanaco_policy_is_pinned(const struct guanaco_policy *p, uint32_t layer, uint32_t expert) {
    return p->ops->is_pinned && guanaco_policy_is_resident(p, layer, expert) &&
           p->ops->is_pinned(p->impl, layer * p->state.n_expert + expert);
}

uint64_t guanaco_policy_layer_target_bytes(const struct guanaco_policy *p, uint32_t layer) {
    if (layer >= p->state.n_layer || !p->ops->layer_target_bytes) {
        return 0;
    }
    return p->ops->layer_target_bytes(p->impl, &p->state, layer);
}
