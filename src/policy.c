/*
 * policy.c - owns the replacement policies behind policy.h: the per-slot and
 * per-layer bookkeeping of each kind and the choice of victims. Everything is
 * allocated in guanaco_policy_create(); access and evict only index arrays.
 *
 * A slot is one expert of one layer, numbered layer * n_expert + expert.
 * Decode sweeps the layers in order every token, so the slot used longest ago
 * is usually one of the layer that runs next: a global LRU under a budget
 * smaller than one token's working set evicts every expert just before it is
 * needed again. The layer-lru and guanaco kinds therefore decide how much
 * each layer may hold first, and which of that layer's experts go second.
 *
 * Decay without sweeps: a decayed score f(t) = sum over uses of
 * 2^-((t - t_use) / H) is stored as key = log2 f(t) + t / H, which does not
 * change while the slot is unused. Keys of different slots compare the same
 * way their scores do at any common time, so heaps stay valid as time
 * passes, and a use at time t only rewrites its own key:
 * key' = t/H + log2(2^(key - t/H) + 1).
 *
 * The guanaco kind (the documented design):
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
 */
#include "policy.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

/* guanaco tuning, measured on synthetic decode traces calibrated to REFERENCE.md section 7 (per-layer
   LRU hit rates of Qwen3-30B-A3B); hit rates moved by under a point across 2x changes of each */
#define RECENCY_SPEEDUP 16.0     /* the cold-first score decays this much faster than heat: 2 tokens */
#define PIN_ON_SHARE 0.5         /* pinned once its heat says it is used in half the tokens */
#define PIN_OFF_SHARE 0.25       /* released below a quarter: hysteresis, so pins do not flap */
#define PIN_BUDGET_SHARE 0.5     /* pinned bytes stay within half the budget */
#define GHOST_WEIGHT 2.0         /* a ghost hit weighs this much more than an ordinary access */

/* ---- indexed binary min-heap over ids, ordered by (tier, key, id) ---- */

struct heap {
    uint32_t *items;
    uint32_t count;
    uint32_t *position;   /* id -> index in items, NONE when absent; heaps over disjoint ids may share it */
    const double *keys;   /* id -> key */
    const uint8_t *tiers; /* id -> tier, compared before the key; NULL when unused */
};

static bool heap_before(const struct heap *heap, uint32_t a, uint32_t b) {
    if (heap->tiers && heap->tiers[a] != heap->tiers[b]) {
        return heap->tiers[a] < heap->tiers[b];
    }
    if (heap->keys[a] != heap->keys[b]) {
        return heap->keys[a] < heap->keys[b];
    }
    return a < b; /* ties by id: decisions never depend on history beyond the keys */
}

static void heap_place(struct heap *heap, uint32_t index, uint32_t id) {
    heap->items[index] = id;
    heap->position[id] = index;
}

static void heap_sift_up(struct heap *heap, uint32_t index) {
    uint32_t id = heap->items[index];
    while (index > 0) {
        uint32_t parent = (index - 1) / 2;
        if (!heap_before(heap, id, heap->items[parent])) {
            break;
        }
        heap_place(heap, index, heap->items[parent]);
        index = parent;
    }
    heap_place(heap, index, id);
}

static void heap_sift_down(struct heap *heap, uint32_t index) {
    uint32_t id = heap->items[index];
    for (;;) {
        uint32_t child = 2 * index + 1;
        if (child >= heap->count) {
            break;
        }
        if (child + 1 < heap->count && heap_before(heap, heap->items[child + 1], heap->items[child])) {
            child++;
        }
        if (!heap_before(heap, heap->items[child], id)) {
            break;
        }
        heap_place(heap, index, heap->items[child]);
        index = child;
    }
    heap_place(heap, index, id);
}

static bool heap_contains(const struct heap *heap, uint32_t id) {
    return heap->position[id] != NONE;
}

static uint32_t heap_top(const struct heap *heap) {
    return heap->count ? heap->items[0] : NONE;
}

static void heap_push(struct heap *heap, uint32_t id) {
    heap->items[heap->count] = id;
    heap->position[id] = heap->count;
    heap->count++;
    heap_sift_up(heap, heap->count - 1);
}

static void heap_remove(struct heap *heap, uint32_t id) {
    uint32_t index = heap->position[id];
    heap->position[id] = NONE;
    heap->count--;
    if (index == heap->count) {
        return;
    }
    uint32_t moved = heap->items[heap->count];
    heap_place(heap, index, moved);
    heap_sift_up(heap, index);
    heap_sift_down(heap, heap->position[moved]);
}

/* After the key or tier of `id` changed, wherever it moved. */
static void heap_update(struct heap *heap, uint32_t id) {
    heap_sift_up(heap, heap->position[id]);
    heap_sift_down(heap, heap->position[id]);
}

/* ---- the policy ---- */

struct guanaco_policy {
    enum guanaco_policy_kind kind;
    uint32_t n_layer;
    uint32_t n_expert;
    uint32_t n_slots;
    uint32_t max_per_layer;
    uint32_t hint_lifetime;
    uint64_t budget;
    uint64_t reserve;           /* bytes set aside for reads in flight outside the policy (prefetch) */
    uint64_t resident_bytes;
    uint64_t now;
    uint64_t call;              /* access calls so far; stamps what each call needed */
    double score_half_life;     /* guanaco's cold-first score: half_life / RECENCY_SPEEDUP */
    double heat_half_life;      /* lfu's score, guanaco's heat and layer pressure: the config's half_life */
    double score_time;          /* now / score_half_life */
    double heat_time;           /* now / heat_half_life */
    uint64_t *expert_bytes;     /* per layer, a copy of the config's */

    /* per slot */
    uint8_t *resident;
    uint64_t *needed_call;      /* the access call that last needed the slot */

    /* per layer */
    uint32_t *layer_resident;
    uint64_t *layer_resident_bytes;
    uint64_t *layer_last_call;
    uint8_t *layer_over_cap;    /* queued in over_cap_layers */
    uint32_t *over_cap_layers;
    uint32_t n_over_cap;

    /* lru and layer-lru: intrusive lists; ids past the slots are sentinels
       (global: n_slots; layer l: n_slots + l), each list runs MRU -> LRU */
    uint32_t *global_prev, *global_next;
    uint32_t *layer_prev, *layer_next;

    /* lfu and guanaco: one heap of resident slots per layer */
    struct heap *slot_heaps;
    uint32_t *slot_heap_items;
    uint32_t *slot_position;
    double *slot_key;
    uint8_t *slot_tier;         /* guanaco: 1 while pinned, so pinned experts leave a layer last */

    /* layer-lru, lfu and guanaco: which layer gives up an expert next */
    struct heap layer_heap;
    uint32_t *layer_heap_items;
    uint32_t *layer_position;
    double *layer_key;
    uint64_t *layer_share;      /* layer-lru: fixed share of the budget */

    /* guanaco */
    double *heat;               /* per slot: decayed uses on the heat half-life */
    struct heap pin_heap;       /* pinned slots by heat: the first to cool on top */
    uint32_t *pin_heap_items;
    uint32_t *pin_position;
    uint64_t pinned_bytes;
    uint64_t pin_budget;
    double pin_on_log_heat;     /* log2 of the heat that pins, and of the heat that releases */
    double pin_off_log_heat;
    uint64_t *hint_end;         /* a hint protects the slot while now < hint_end ... */
    uint64_t *hint_call;        /* ... and its layer's last access is still the one before the hint */
    uint64_t *evicted_at;       /* the layer's eviction count when the slot left; 0 = never */
    uint64_t *layer_evictions;
    uint64_t *layer_pinned_bytes;
    uint64_t *layer_evictable_bytes; /* unpinned resident bytes still in the slot heap */
    double *pressure;           /* per layer, heat-scaled key of decayed access bytes */

    /* evict's scratch: slots (or, for layer-lru, layers) set aside this call */
    uint32_t *deferred;
    uint32_t n_deferred;
};

static const char *const kind_names[] = {
    [GUANACO_POLICY_LRU] = "lru",
    [GUANACO_POLICY_LFU] = "lfu",
    [GUANACO_POLICY_LAYER_LRU] = "layer-lru",
    [GUANACO_POLICY_GUANACO] = "guanaco",
};

int guanaco_policy_kind_from_name(const char *name, enum guanaco_policy_kind *kind) {
    for (size_t i = 0; name && i < sizeof(kind_names) / sizeof(kind_names[0]); i++) {
        if (strcmp(name, kind_names[i]) == 0) {
            *kind = (enum guanaco_policy_kind)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *guanaco_policy_kind_name(enum guanaco_policy_kind kind) {
    if ((unsigned)kind < sizeof(kind_names) / sizeof(kind_names[0])) {
        return kind_names[kind];
    }
    return "unknown";
}

const char *guanaco_policy_kind_names(void) {
    return "lru|lfu|layer-lru|guanaco";
}

/* key' of a decayed score after adding `amount` at scaled time `time` (see the top). */
static double decayed_add(double key, double time, double amount) {
    double now_log = key - time;
    if (now_log < -64) { /* under 2^-64: nothing left to add to, and no libm call */
        return time + (amount == 1.0 ? 0.0 : log2(amount));
    }
    return time + log2(exp2(now_log) + amount);
}

static uint32_t layer_of(const struct guanaco_policy *p, uint32_t slot) {
    return slot / p->n_expert;
}

static bool uses_lists(const struct guanaco_policy *p) {
    return p->kind == GUANACO_POLICY_LRU || p->kind == GUANACO_POLICY_LAYER_LRU;
}

/* Needed by protect_layer's last access: never a victim. */
static bool is_needed_now(const struct guanaco_policy *p, uint32_t slot, uint32_t protect_layer) {
    return protect_layer < p->n_layer && layer_of(p, slot) == protect_layer &&
           p->layer_last_call[protect_layer] != 0 && p->needed_call[slot] == p->layer_last_call[protect_layer];
}

/* A hint lasts until the layer's next access (the guess then came true or not) or until it expires. */
static bool is_hinted(const struct guanaco_policy *p, uint32_t slot) {
    return p->hint_end && p->now < p->hint_end[slot] && p->hint_call[slot] == p->layer_last_call[layer_of(p, slot)];
}

void guanaco_policy_free(struct guanaco_policy *p) {
    if (!p) {
        return;
    }
    free(p->expert_bytes);
    free(p->resident);
    free(p->needed_call);
    free(p->layer_resident);
    free(p->layer_resident_bytes);
    free(p->layer_last_call);
    free(p->layer_over_cap);
    free(p->over_cap_layers);
    free(p->global_prev);
    free(p->global_next);
    free(p->layer_prev);
    free(p->layer_next);
    free(p->slot_heaps);
    free(p->slot_heap_items);
    free(p->slot_position);
    free(p->slot_key);
    free(p->slot_tier);
    free(p->layer_heap_items);
    free(p->layer_position);
    free(p->layer_key);
    free(p->layer_share);
    free(p->heat);
    free(p->pin_heap_items);
    free(p->pin_position);
    free(p->hint_end);
    free(p->hint_call);
    free(p->evicted_at);
    free(p->layer_evictions);
    free(p->layer_pinned_bytes);
    free(p->layer_evictable_bytes);
    free(p->pressure);
    free(p->deferred);
    free(p);
}

static void list_link_after(uint32_t *prev, uint32_t *next, uint32_t anchor, uint32_t id) {
    prev[id] = anchor;
    next[id] = next[anchor];
    prev[next[anchor]] = id;
    next[anchor] = id;
}

static void list_unlink(uint32_t *prev, uint32_t *next, uint32_t id) {
    next[prev[id]] = next[id];
    prev[next[id]] = prev[id];
    prev[id] = next[id] = NONE;
}

static int allocate(struct guanaco_policy *p) {
    size_t slots = p->n_slots, layers = p->n_layer;
    bool ok = true;
#define ALLOC(field, count)                                                   \
    do {                                                                      \
        p->field = calloc((count) ? (count) : 1, sizeof(*p->field));          \
        ok = ok && p->field != NULL;                                          \
    } while (0)
    ALLOC(expert_bytes, layers);
    ALLOC(resident, slots);
    ALLOC(needed_call, slots);
    ALLOC(layer_resident, layers);
    ALLOC(layer_resident_bytes, layers);
    ALLOC(layer_last_call, layers);
    ALLOC(layer_over_cap, layers);
    ALLOC(over_cap_layers, layers);
    ALLOC(deferred, slots > layers ? slots : layers);
    if (uses_lists(p)) {
        ALLOC(layer_prev, slots + layers);
        ALLOC(layer_next, slots + layers);
    }
    if (p->kind == GUANACO_POLICY_LRU) {
        ALLOC(global_prev, slots + 1);
        ALLOC(global_next, slots + 1);
    } else {
        ALLOC(layer_heap_items, layers);
        ALLOC(layer_position, layers);
        ALLOC(layer_key, layers);
    }
    if (p->kind == GUANACO_POLICY_LAYER_LRU) {
        ALLOC(layer_share, layers);
    }
    if (!uses_lists(p)) {
        ALLOC(slot_heaps, layers);
        ALLOC(slot_heap_items, slots);
        ALLOC(slot_position, slots);
        ALLOC(slot_key, slots);
        ALLOC(slot_tier, slots);
    }
    if (p->kind == GUANACO_POLICY_GUANACO) {
        ALLOC(heat, slots);
        ALLOC(pin_heap_items, slots);
        ALLOC(pin_position, slots);
        ALLOC(hint_end, slots);
        ALLOC(hint_call, slots);
        ALLOC(evicted_at, slots);
        ALLOC(layer_evictions, layers);
        ALLOC(layer_pinned_bytes, layers);
        ALLOC(layer_evictable_bytes, layers);
        ALLOC(pressure, layers);
    }
#undef ALLOC
    return ok ? 0 : -ENOMEM;
}

/* Everything that follows from the budget: layer-lru's fixed shares, guanaco's pin allowance. */
static void apply_budget(struct guanaco_policy *p, uint64_t bytes) {
    p->budget = bytes;
    if (p->kind == GUANACO_POLICY_LAYER_LRU) {
        /* equal expert counts per MoE layer: the share is proportional to the layer's expert bytes */
        double moe_bytes = 0;
        for (uint32_t l = 0; l < p->n_layer; l++) {
            moe_bytes += (double)p->expert_bytes[l];
        }
        for (uint32_t l = 0; l < p->n_layer; l++) {
            p->layer_share[l] = moe_bytes > 0 ? (uint64_t)((double)p->budget * (double)p->expert_bytes[l] / moe_bytes) : 0;
        }
    }
    if (p->kind == GUANACO_POLICY_GUANACO) {
        p->pin_budget = (uint64_t)((double)p->budget * PIN_BUDGET_SHARE);
    }
}

int guanaco_policy_create(const struct guanaco_policy_config *config, struct guanaco_policy **out) {
    *out = NULL;
    if (!config || config->n_layer == 0 || config->n_expert == 0 || !config->expert_bytes ||
        (uint64_t)config->n_layer * config->n_expert >= NONE - config->n_layer - 1 ||
        (unsigned)config->kind > GUANACO_POLICY_GUANACO || config->half_life < 0 || !isfinite(config->half_life)) {
        return -EINVAL;
    }
    struct guanaco_policy *p = calloc(1, sizeof(*p));
    if (!p) {
        return -ENOMEM;
    }
    p->kind = config->kind;
    p->n_layer = config->n_layer;
    p->n_expert = config->n_expert;
    p->n_slots = config->n_layer * config->n_expert;
    p->max_per_layer = config->max_per_layer;
    p->hint_lifetime = config->hint_lifetime ? config->hint_lifetime : 1;
    p->budget = config->budget_bytes;
    p->heat_half_life = config->half_life > 0 ? config->half_life : GUANACO_POLICY_DEFAULT_HALF_LIFE;
    p->score_half_life = p->heat_half_life / RECENCY_SPEEDUP;
    if (allocate(p) != 0) {
        guanaco_policy_free(p);
        return -ENOMEM;
    }
    memcpy(p->expert_bytes, config->expert_bytes, p->n_layer * sizeof(*p->expert_bytes));

    if (uses_lists(p)) {
        for (uint32_t i = 0; i < p->n_slots; i++) {
            p->layer_prev[i] = p->layer_next[i] = NONE;
        }
        for (uint32_t l = 0; l < p->n_layer; l++) {
            p->layer_prev[p->n_slots + l] = p->layer_next[p->n_slots + l] = p->n_slots + l;
        }
    }
    if (p->kind == GUANACO_POLICY_LRU) {
        for (uint32_t i = 0; i < p->n_slots; i++) {
            p->global_prev[i] = p->global_next[i] = NONE;
        }
        p->global_prev[p->n_slots] = p->global_next[p->n_slots] = p->n_slots;
    } else {
        p->layer_heap = (struct heap){.items = p->layer_heap_items, .position = p->layer_position, .keys = p->layer_key};
        for (uint32_t l = 0; l < p->n_layer; l++) {
            p->layer_position[l] = NONE;
        }
    }
    if (!uses_lists(p)) {
        for (uint32_t i = 0; i < p->n_slots; i++) {
            p->slot_position[i] = NONE;
            p->slot_key[i] = -INFINITY;
        }
        for (uint32_t l = 0; l < p->n_layer; l++) {
            p->slot_heaps[l] = (struct heap){.items = p->slot_heap_items + (size_t)l * p->n_expert,
                                             .position = p->slot_position,
                                             .keys = p->slot_key,
                                             .tiers = p->kind == GUANACO_POLICY_GUANACO ? p->slot_tier : NULL};
        }
    }
    if (p->kind == GUANACO_POLICY_GUANACO) {
        p->pin_heap = (struct heap){.items = p->pin_heap_items, .position = p->pin_position, .keys = p->heat};
        for (uint32_t i = 0; i < p->n_slots; i++) {
            p->pin_position[i] = NONE;
            p->heat[i] = -INFINITY;
        }
        for (uint32_t l = 0; l < p->n_layer; l++) {
            p->pressure[l] = -INFINITY;
        }
        /* a use in every token keeps the heat at 1 / (1 - 2^(-1/H)) */
        double every_token = 1.0 / (1.0 - exp2(-1.0 / p->heat_half_life));
        p->pin_on_log_heat = log2(PIN_ON_SHARE * every_token);
        p->pin_off_log_heat = log2(PIN_OFF_SHARE * every_token);
    }
    apply_budget(p, config->budget_bytes);
    *out = p;
    return 0;
}

void guanaco_policy_set_budget(struct guanaco_policy *policy, uint64_t bytes) {
    if (policy) {
        apply_budget(policy, bytes);
    }
}

/* ---- per-layer ordering: keys of the layer heap ---- */

static void layer_heap_refresh(struct guanaco_policy *p, uint32_t layer) {
    bool wanted;
    switch (p->kind) {
    case GUANACO_POLICY_LAYER_LRU:
        /* most bytes above its share first */
        wanted = p->layer_resident[layer] > 0;
        p->layer_key[layer] = (double)p->layer_share[layer] - (double)p->layer_resident_bytes[layer];
        break;
    case GUANACO_POLICY_LFU: {
        /* the layer whose coldest slot is globally coldest first */
        uint32_t top = heap_top(&p->slot_heaps[layer]);
        wanted = top != NONE;
        p->layer_key[layer] = wanted ? p->slot_key[top] : 0;
        break;
    }
    case GUANACO_POLICY_GUANACO:
        /* most unpinned bytes per unit of pressure first: -(log2 bytes - pressure) */
        wanted = p->layer_evictable_bytes[layer] > 0;
        p->layer_key[layer] = wanted ? p->pressure[layer] - log2((double)p->layer_evictable_bytes[layer]) : 0;
        break;
    default:
        return;
    }
    if (!wanted) {
        if (heap_contains(&p->layer_heap, layer)) {
            heap_remove(&p->layer_heap, layer);
        }
    } else if (heap_contains(&p->layer_heap, layer)) {
        heap_update(&p->layer_heap, layer);
    } else {
        heap_push(&p->layer_heap, layer);
    }
}

/* ---- guanaco's hot set ---- */

static void pin(struct guanaco_policy *p, uint32_t slot) {
    uint32_t layer = layer_of(p, slot);
    uint64_t bytes = p->expert_bytes[layer];
    p->slot_tier[slot] = 1;
    heap_update(&p->slot_heaps[layer], slot);
    heap_push(&p->pin_heap, slot);
    p->pinned_bytes += bytes;
    p->layer_pinned_bytes[layer] += bytes;
    p->layer_evictable_bytes[layer] -= bytes;
}

static void unpin(struct guanaco_policy *p, uint32_t slot) {
    uint32_t layer = layer_of(p, slot);
    uint64_t bytes = p->expert_bytes[layer];
    p->slot_tier[slot] = 0;
    heap_update(&p->slot_heaps[layer], slot);
    heap_remove(&p->pin_heap, slot);
    p->pinned_bytes -= bytes;
    p->layer_pinned_bytes[layer] -= bytes;
    p->layer_evictable_bytes[layer] += bytes;
    layer_heap_refresh(p, layer);
}

/* Pins whose heat fell under the release threshold, coolest first: O(log n) each. */
static void release_cooled_pins(struct guanaco_policy *p) {
    double threshold = p->pin_off_log_heat + p->heat_time;
    for (uint32_t slot = heap_top(&p->pin_heap); slot != NONE && p->heat[slot] < threshold;
         slot = heap_top(&p->pin_heap)) {
        unpin(p, slot);
    }
}

static void set_now(struct guanaco_policy *p, uint64_t now) {
    if (now > p->now) {
        p->now = now;
        p->score_time = (double)now / p->score_half_life;
        p->heat_time = (double)now / p->heat_half_life;
    }
}

/* ---- access ---- */

int guanaco_policy_access(struct guanaco_policy *p, uint32_t layer, const uint32_t *experts, size_t n,
                          uint64_t now, uint32_t *missing, size_t *n_missing) {
    *n_missing = 0;
    if (layer >= p->n_layer || p->expert_bytes[layer] == 0 || (n > 0 && (!experts || !missing))) {
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (experts[i] >= p->n_expert) {
            return -EINVAL;
        }
    }
    set_now(p, now);
    if (p->kind == GUANACO_POLICY_GUANACO) {
        release_cooled_pins(p);
    }
    uint64_t bytes = p->expert_bytes[layer];
    uint64_t call = ++p->call;
    p->layer_last_call[layer] = call;
    uint32_t base = layer * p->n_expert;
    double unpinned_uses = 0, ghost_hits = 0;

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
        switch (p->kind) {
        case GUANACO_POLICY_LRU:
            if (hit) {
                list_unlink(p->global_prev, p->global_next, slot);
                list_unlink(p->layer_prev, p->layer_next, slot);
            }
            list_link_after(p->global_prev, p->global_next, p->n_slots, slot);
            list_link_after(p->layer_prev, p->layer_next, p->n_slots + layer, slot);
            break;
        case GUANACO_POLICY_LAYER_LRU:
            if (hit) {
                list_unlink(p->layer_prev, p->layer_next, slot);
            }
            list_link_after(p->layer_prev, p->layer_next, p->n_slots + layer, slot);
            break;
        case GUANACO_POLICY_LFU:
            p->slot_key[slot] = decayed_add(p->slot_key[slot], p->heat_time, 1.0);
            if (hit) {
                heap_update(&p->slot_heaps[layer], slot); /* its key only grew */
            } else {
                heap_push(&p->slot_heaps[layer], slot);
            }
            break;
        case GUANACO_POLICY_GUANACO: {
            if (!hit && p->evicted_at[slot] != 0) {
                /* ghost window: as many evictions back as the layer holds experts */
                uint64_t window = p->layer_resident[layer] > 1 ? p->layer_resident[layer] : 1;
                if (p->layer_evictions[layer] - p->evicted_at[slot] < window) {
                    ghost_hits += 1;
                }
            }
            p->slot_key[slot] = decayed_add(p->slot_key[slot], p->score_time, 1.0);
            p->heat[slot] = decayed_add(p->heat[slot], p->heat_time, 1.0);
            if (hit) {
                heap_update(&p->slot_heaps[layer], slot);
            } else {
                p->slot_tier[slot] = 0;
                heap_push(&p->slot_heaps[layer], slot);
                p->layer_evictable_bytes[layer] += bytes;
            }
            if (p->slot_tier[slot]) {
                heap_update(&p->pin_heap, slot);
            } else {
                unpinned_uses += 1;
                if (p->heat[slot] - p->heat_time >= p->pin_on_log_heat &&
                    p->pinned_bytes + bytes <= p->pin_budget) {
                    pin(p, slot);
                }
            }
            break;
        }
        }
    }

    if (p->kind == GUANACO_POLICY_GUANACO && unpinned_uses + ghost_hits > 0) {
        p->pressure[layer] = decayed_add(p->pressure[layer], p->heat_time,
                                         (double)bytes * (unpinned_uses + GHOST_WEIGHT * ghost_hits));
    }
    if (p->kind != GUANACO_POLICY_LRU) {
        layer_heap_refresh(p, layer);
    }
    if (p->max_per_layer && p->layer_resident[layer] > p->max_per_layer && !p->layer_over_cap[layer]) {
        p->layer_over_cap[layer] = 1;
        p->over_cap_layers[p->n_over_cap++] = layer;
    }
    return 0;
}

/* ---- evict ---- */

static void remove_from_structures(struct guanaco_policy *p, uint32_t slot) {
    uint32_t layer = layer_of(p, slot);
    uint64_t bytes = p->expert_bytes[layer];
    switch (p->kind) {
    case GUANACO_POLICY_LRU:
        list_unlink(p->global_prev, p->global_next, slot);
        list_unlink(p->layer_prev, p->layer_next, slot);
        break;
    case GUANACO_POLICY_LAYER_LRU:
        list_unlink(p->layer_prev, p->layer_next, slot);
        break;
    case GUANACO_POLICY_LFU:
        if (heap_contains(&p->slot_heaps[layer], slot)) {
            heap_remove(&p->slot_heaps[layer], slot);
        }
        break;
    case GUANACO_POLICY_GUANACO:
        if (heap_contains(&p->slot_heaps[layer], slot)) {
            heap_remove(&p->slot_heaps[layer], slot);
            if (!p->slot_tier[slot]) {
                p->layer_evictable_bytes[layer] -= bytes;
            }
        }
        if (p->slot_tier[slot]) {
            if (heap_contains(&p->pin_heap, slot)) {
                heap_remove(&p->pin_heap, slot);
            }
            p->pinned_bytes -= bytes;
            p->layer_pinned_bytes[layer] -= bytes;
            p->slot_tier[slot] = 0;
        }
        p->evicted_at[slot] = ++p->layer_evictions[layer];
        break;
    }
}

struct victims {
    uint32_t *layers;
    uint32_t *experts;
    size_t capacity;
    size_t count;
};

static void evict_slot(struct guanaco_policy *p, uint32_t slot, struct victims *victims) {
    uint32_t layer = layer_of(p, slot);
    uint64_t bytes = p->expert_bytes[layer];
    remove_from_structures(p, slot);
    p->resident[slot] = 0;
    p->resident_bytes -= bytes;
    p->layer_resident[layer]--;
    p->layer_resident_bytes[layer] -= bytes;
    if (p->kind != GUANACO_POLICY_LRU) {
        layer_heap_refresh(p, layer);
    }
    victims->layers[victims->count] = layer;
    victims->experts[victims->count] = slot - layer * p->n_expert;
    victims->count++;
}

/* Set a heap-held slot aside for the rest of this evict call. */
static void defer_slot(struct guanaco_policy *p, uint32_t slot) {
    uint32_t layer = layer_of(p, slot);
    heap_remove(&p->slot_heaps[layer], slot);
    if (p->kind == GUANACO_POLICY_GUANACO) {
        if (p->slot_tier[slot]) {
            heap_remove(&p->pin_heap, slot);
        } else {
            p->layer_evictable_bytes[layer] -= p->expert_bytes[layer];
        }
    }
    layer_heap_refresh(p, layer);
    p->deferred[p->n_deferred++] = slot;
}

static void restore_deferred(struct guanaco_policy *p) {
    for (uint32_t i = 0; i < p->n_deferred; i++) {
        uint32_t slot = p->deferred[i];
        if (p->kind == GUANACO_POLICY_LAYER_LRU) {
            layer_heap_refresh(p, slot); /* for layer-lru the scratch holds layers */
            continue;
        }
        uint32_t layer = layer_of(p, slot);
        heap_push(&p->slot_heaps[layer], slot);
        if (p->kind == GUANACO_POLICY_GUANACO) {
            if (p->slot_tier[slot]) {
                heap_push(&p->pin_heap, slot);
            } else {
                p->layer_evictable_bytes[layer] += p->expert_bytes[layer];
            }
        }
        layer_heap_refresh(p, layer);
    }
    p->n_deferred = 0;
}

/* Whether evict may take the slot in this pass. */
static bool may_take(const struct guanaco_policy *p, uint32_t slot, uint32_t protect_layer, bool take_hinted) {
    return !is_needed_now(p, slot, protect_layer) && (take_hinted || !is_hinted(p, slot));
}

/* The victim a list-kind layer gives up: its LRU end, unless that is needed now (then so is the rest). */
static uint32_t layer_list_victim(const struct guanaco_policy *p, uint32_t layer, uint32_t protect_layer) {
    uint32_t tail = p->layer_prev[p->n_slots + layer];
    return tail < p->n_slots && !is_needed_now(p, tail, protect_layer) ? tail : NONE;
}

/* A heap-kind layer's next victim in this pass, setting aside what it may not take. */
static uint32_t layer_heap_victim(struct guanaco_policy *p, uint32_t layer, uint32_t protect_layer,
                                  bool take_hinted) {
    for (uint32_t slot = heap_top(&p->slot_heaps[layer]); slot != NONE; slot = heap_top(&p->slot_heaps[layer])) {
        if (may_take(p, slot, protect_layer, take_hinted)) {
            return slot;
        }
        defer_slot(p, slot);
    }
    return NONE;
}

/* The next victim of a layer over its cap, or NONE when it has nothing it may give. */
static uint32_t cap_victim(struct guanaco_policy *p, uint32_t layer, uint32_t protect_layer, bool take_hinted) {
    if (uses_lists(p)) {
        return layer_list_victim(p, layer, protect_layer);
    }
    return layer_heap_victim(p, layer, protect_layer, take_hinted);
}

/* The next victim for the budget, or NONE when nothing may go. */
static uint32_t budget_victim(struct guanaco_policy *p, uint32_t protect_layer, bool take_hinted) {
    switch (p->kind) {
    case GUANACO_POLICY_LRU:
        for (uint32_t slot = p->global_prev[p->n_slots]; slot < p->n_slots; slot = p->global_prev[slot]) {
            if (!is_needed_now(p, slot, protect_layer)) {
                return slot; /* skipped ones are needed now: at most one layer's working set */
            }
        }
        return NONE;
    case GUANACO_POLICY_LAYER_LRU:
        for (uint32_t layer = heap_top(&p->layer_heap); layer != NONE; layer = heap_top(&p->layer_heap)) {
            uint32_t slot = layer_list_victim(p, layer, protect_layer);
            if (slot != NONE) {
                return slot;
            }
            heap_remove(&p->layer_heap, layer); /* only needed-now experts left there */
            p->deferred[p->n_deferred++] = layer;
        }
        return NONE;
    case GUANACO_POLICY_LFU:
        for (uint32_t layer = heap_top(&p->layer_heap); layer != NONE; layer = heap_top(&p->layer_heap)) {
            uint32_t slot = heap_top(&p->slot_heaps[layer]);
            if (may_take(p, slot, protect_layer, true)) {
                return slot;
            }
            defer_slot(p, slot);
        }
        return NONE;
    case GUANACO_POLICY_GUANACO:
        /* unpinned, from the layer most above its share; then the coolest pin */
        for (uint32_t layer = heap_top(&p->layer_heap); layer != NONE; layer = heap_top(&p->layer_heap)) {
            uint32_t slot = heap_top(&p->slot_heaps[layer]); /* unpinned: tier 0 comes first */
            if (may_take(p, slot, protect_layer, take_hinted)) {
                return slot;
            }
            defer_slot(p, slot);
        }
        for (uint32_t slot = heap_top(&p->pin_heap); slot != NONE; slot = heap_top(&p->pin_heap)) {
            if (may_take(p, slot, protect_layer, take_hinted)) {
                return slot;
            }
            defer_slot(p, slot);
        }
        return NONE;
    }
    return NONE;
}

int guanaco_policy_evict(struct guanaco_policy *p, uint32_t protect_layer, uint32_t *victim_layers,
                         uint32_t *victim_experts, size_t capacity, size_t *n_victims) {
    struct victims victims = {.layers = victim_layers, .experts = victim_experts, .capacity = capacity};
    *n_victims = 0;
    if (capacity > 0 && (!victim_layers || !victim_experts)) {
        return -EINVAL;
    }
    if (p->kind == GUANACO_POLICY_GUANACO) {
        release_cooled_pins(p);
    }
    int result = 0;

    /* caps first: a layer's own experts are the only ones that bring it under its cap */
    uint32_t still_over = 0;
    for (uint32_t i = 0; i < p->n_over_cap; i++) {
        uint32_t layer = p->over_cap_layers[i];
        /* a hinted expert goes only when nothing else of the layer may */
        for (int pass = 0; pass < 2 && p->layer_resident[layer] > p->max_per_layer && result == 0; pass++) {
            while (p->layer_resident[layer] > p->max_per_layer) {
                if (victims.count == victims.capacity) {
                    result = -ENOBUFS;
                    break;
                }
                uint32_t slot = cap_victim(p, layer, protect_layer, pass == 1);
                if (slot == NONE) {
                    break;
                }
                evict_slot(p, slot, &victims);
            }
            restore_deferred(p);
        }
        if (p->layer_resident[layer] > p->max_per_layer) {
            p->over_cap_layers[still_over++] = layer; /* holds only what it needs now, or victims ran out */
        } else {
            p->layer_over_cap[layer] = 0;
        }
    }
    p->n_over_cap = still_over;

    const uint64_t limit = p->budget > p->reserve ? p->budget - p->reserve : 0;
    for (int pass = 0; pass < 2 && p->resident_bytes > limit && result == 0; pass++) {
        while (p->resident_bytes > limit) {
            if (victims.count == victims.capacity) {
                result = -ENOBUFS;
                break;
            }
            uint32_t slot = budget_victim(p, protect_layer, pass == 1);
            if (slot == NONE) {
                break;
            }
            evict_slot(p, slot, &victims);
        }
        restore_deferred(p);
    }
    *n_victims = victims.count;
    return result;
}

void guanaco_policy_set_reserve(struct guanaco_policy *p, uint64_t bytes) {
    p->reserve = bytes;
}

/* ---- hints and queries ---- */

void guanaco_policy_hint(struct guanaco_policy *p, uint32_t layer, uint32_t expert, float weight) {
    if (p->kind != GUANACO_POLICY_GUANACO || layer >= p->n_layer || expert >= p->n_expert) {
        return;
    }
    uint32_t slot = layer * p->n_expert + expert;
    p->hint_end[slot] = weight > 0 ? p->now + p->hint_lifetime + 1 : 0;
    p->hint_call[slot] = p->layer_last_call[layer];
}

void guanaco_policy_seed(struct guanaco_policy *p, uint32_t layer, const double *rate) {
    if (!rate || layer >= p->n_layer || p->expert_bytes[layer] == 0 ||
        (p->kind != GUANACO_POLICY_LFU && p->kind != GUANACO_POLICY_GUANACO)) {
        return;
    }
    /* a use in every token keeps a decayed count at 1 / (1 - 2^(-1/H)) */
    const double heat_every_token = 1.0 / (1.0 - exp2(-1.0 / p->heat_half_life));
    const double score_every_token = 1.0 / (1.0 - exp2(-1.0 / p->score_half_life));
    for (uint32_t e = 0; e < p->n_expert; e++) {
        double r = rate[e] > 1.0 ? 1.0 : rate[e];
        if (!(r > 0)) { /* zero, negative or NaN */
            continue;
        }
        uint32_t slot = layer * p->n_expert + e;
        if (p->kind == GUANACO_POLICY_LFU) {
            p->slot_key[slot] = decayed_add(p->slot_key[slot], p->heat_time, r * heat_every_token);
        } else {
            p->slot_key[slot] = decayed_add(p->slot_key[slot], p->score_time, r * score_every_token);
            p->heat[slot] = decayed_add(p->heat[slot], p->heat_time, r * heat_every_token);
            if (p->slot_tier[slot] && heap_contains(&p->pin_heap, slot)) {
                heap_update(&p->pin_heap, slot);
            }
        }
        if (heap_contains(&p->slot_heaps[layer], slot)) {
            heap_update(&p->slot_heaps[layer], slot);
        }
    }
    layer_heap_refresh(p, layer);
}

bool guanaco_policy_is_resident(const struct guanaco_policy *p, uint32_t layer, uint32_t expert) {
    return layer < p->n_layer && expert < p->n_expert && p->resident[layer * p->n_expert + expert];
}

uint64_t guanaco_policy_resident_bytes(const struct guanaco_policy *p) {
    return p->resident_bytes;
}

uint32_t guanaco_policy_layer_resident_count(const struct guanaco_policy *p, uint32_t layer) {
    return layer < p->n_layer ? p->layer_resident[layer] : 0;
}

bool guanaco_policy_is_pinned(const struct guanaco_policy *p, uint32_t layer, uint32_t expert) {
    return p->kind == GUANACO_POLICY_GUANACO && guanaco_policy_is_resident(p, layer, expert) &&
           p->slot_tier[layer * p->n_expert + expert];
}

uint64_t guanaco_policy_layer_target_bytes(const struct guanaco_policy *p, uint32_t layer) {
    if (layer >= p->n_layer) {
        return 0;
    }
    if (p->kind == GUANACO_POLICY_LAYER_LRU) {
        return p->layer_share[layer];
    }
    if (p->kind != GUANACO_POLICY_GUANACO || p->pressure[layer] == -INFINITY) {
        return 0;
    }
    /* shares of the unpinned budget in proportion to 2^pressure, scaled by the largest to stay finite */
    double top = -INFINITY, sum = 0;
    for (uint32_t l = 0; l < p->n_layer; l++) {
        top = p->pressure[l] > top ? p->pressure[l] : top;
    }
    for (uint32_t l = 0; l < p->n_layer; l++) {
        sum += p->pressure[l] == -INFINITY ? 0 : exp2(p->pressure[l] - top);
    }
    uint64_t unpinned_budget = p->budget > p->pinned_bytes ? p->budget - p->pinned_bytes : 0;
    double share = exp2(p->pressure[layer] - top) / sum;
    return p->layer_pinned_bytes[layer] + (uint64_t)(share * (double)unpinned_budget);
}
