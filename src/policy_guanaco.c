/*
 * policy_guanaco.c - owns the guanaco kind:
 * - cold-first: within a layer experts leave in order of a short-half-life
 *   score (recency with a memory of frequency), the keep order;
 * - utility shares (after Qureshi and Patt's utility-based cache
 *   partitioning): each layer counts, decayed, the hits at each rank of its
 *   keep order (0 = kept longest), and the misses on experts it evicted
 *   recently at the rank they would have had (its resident count plus how
 *   many evictions back they left: a larger share would have kept them).
 *   A budget victim comes from the layer whose last-kept expert's rank has
 *   the fewest hits per byte, so each share sits where one more expert is
 *   worth as much in every layer; an idle layer's counts decay, so it shrinks;
 * - the working-set floor: a layer accessed in this token or the last is
 *   taken below the experts its last access needed only when no layer holds
 *   more than its own. A layer under
 *   its working set must read it all back at its next access, a loss the
 *   per-rank counts do not see, and the floor keeps every layer at least
 *   where lru and layer-lru keep it (bench/POLICY.md: without it guanaco
 *   lost up to 5 points to lru at one token's working set on Mixtral);
 * - hints: a hinted expert is skipped by eviction until its layer's next
 *   access (the guess came true or not) or the hint's lifetime ends,
 *   whichever is first, unless nothing else is left.
 * - a choice made by set dueling (after Qureshi et al.'s DIP): whether the
 *   floor holds, and whether the cold-first score remembers 2 tokens
 *   (recency) or 32 (frequency); or none of the above: lru's order, every
 *   slot by its last use, no floor, no shares. A shadow copy of the policy
 *   runs each of the five fixed variants on the same accesses (demand only:
 *   no hints, no reserve). The policy starts in lru's order and follows the
 *   one that missed least lately, once it leads by DUEL_MARGIN. The floor is
 *   right on Mixtral's top-2 (without it up to 3.7 points lost to lru at one
 *   token's working set) and wrong on Qwen3's skewed top-8 (with it no gain
 *   over lru there); frequency wins on static popularity and loses on drift;
 *   and where no variant leads by the margin, each of the four still lost to
 *   lru by a few misses (qwen3-static at 64 experts per layer: 0.4% more
 *   misses), which starting from lru's order removes (bench/POLICY.md).
 *   Every score is kept for every slot, so a switch only re-sorts the heaps.
 * There is no pinned hot set: pins cost up to 19 points at one token's
 * working set on routing with reuse and no skew (bench/POLICY.md), and the
 * per-rank counts already keep a hot layer's experts.
 * Scores and rank counts are decayed counts (guanaco_policy_decayed_add).
 * O(log n) per victim, O(n_expert) per hit (its rank), O(n_layer) per evict;
 * ADAPT does all of it five times (itself and four shadows; the fifth shadow, lru's order, is the lru kind).
 */
#include "policy_impl.h"

#include <errno.h>
#include <math.h>

/* tuning, checked on every cell of bench/POLICY.md (recorded Mixtral and six synthetic presets, 4-5 budgets) */
#define RECENCY_SPEEDUP 16.0 /* the cold-first score decays this much faster than the config's half-life: 2 tokens;
                                8 or 32 lose up to half a point to lru in some cells */
#define RANK_SLOWDOWN 4.0    /* the per-rank counts decay this much slower than the config's half-life: 128
                                tokens; 1 and 16 move no cell by more than a point */
#define RANK_PRIOR 1.0       /* before any counts, rank r of n holds RANK_PRIOR * (n - r) / n hits: equal shares */
#define FREQUENCY_SPEEDUP 1.0 /* the frequent variants' score decays at the config's half-life: 32 tokens */
#define DUEL_SLOWDOWN 4.0    /* the shadows' miss counts decay this much slower than the config's half-life: 128
                                tokens; 8 and 16 lose the same one cell and gain the same at 8 experts per layer */
#define DUEL_MARGIN 0.05     /* another variant is followed once its shadow missed this much less than the followed
                                one's: at 0.02 recorded HumanEval lost 0.4 points to lru at 2 experts per layer
                                (switching on noise), at 0.1 qwen3-preset's gain at 8 experts per layer was gone */
#define VARIANTS 5           /* the fixed ones, enum guanaco_policy_variant from FLOOR_RECENT on */
#define LRU_ORDER 4          /* the fifth: lru's order, every slot by its last use, no floor, no shares */
#define LAST_USE 2           /* the keep orders (scores) are recent (0), frequent (1) and the last use (lru's) */
#define SCORES 3

struct guanaco {
    double score_half_life[2]; /* the cold-first scores, recent and frequent: the config's half_life / *_SPEEDUP */
    double rank_half_life;  /* the per-rank counts: the config's half_life * RANK_SLOWDOWN */
    unsigned variant;       /* followed now, 0 to VARIANTS - 1: bit 0 frequent, bit 1 no floor, or LRU_ORDER */

    /* per layer, a heap of its resident slots by cold-first score, lowest (the next to leave) first */
    struct guanaco_heap *slot_heaps;
    struct guanaco_heap_keys slot_order;
    uint32_t *slot_heap_items;
    uint32_t *slot_position;
    double *slot_keys[SCORES];   /* per slot, every score: recent, frequent, the touch count at its last use */
    uint64_t touches;            /* touches so far: the last-use score */
    double *slot_key;            /* the one the variant followed orders by */

    struct guanaco_heap layer_heap; /* which layer gives up an expert next */
    struct guanaco_heap_keys layer_order;
    uint32_t *layer_heap_items;
    uint32_t *layer_position;
    double *layer_key;
    uint8_t *layer_tier;         /* 1 while a layer holds no more than its working set: taken last */

    double *rank_hits;           /* per layer and rank (n_expert each): decayed hits at that rank */
    uint32_t *working_set;       /* per layer: the distinct experts its last access needed */
    uint64_t *accessed_at;       /* per layer: `now` at its last access */
    uint32_t *surplus;           /* per layer marked for its next access: resident experts that access does not need */
    uint32_t *incoming;          /* ... and the experts it needs that are being read */
    uint32_t *layer_held;        /* per layer: resident slots still in its heap (not set aside) */
    double *begin_key;           /* per slot touched by the access in progress: its score before the access */
    uint64_t *touched_call;      /* per slot: the last access call that touched it (a repeated id counts once) */
    uint64_t *missed_call;       /* per slot: the access call in which it was a miss */
    uint32_t begin_resident;     /* of the access in progress: the layer's resident count before it */
    uint32_t n_touched;          /* of the access in progress */

    uint64_t *hint_end;          /* a hint protects the slot while now < hint_end ... */
    uint64_t *hint_call;         /* ... and its layer's last access is still the one before the hint */
    uint64_t *evicted_at;        /* the layer's eviction count when the slot left; 0 = never */
    uint64_t *layer_evictions;
    uint32_t *deferred;          /* slots set aside in this evict pass; also the heaps' items while they re-sort */
    uint32_t n_deferred;

    /* the duel (ADAPT only): a shadow per fixed variant sees every access, demand only, no hints */
    struct guanaco_policy *shadows[VARIANTS];
    double shadow_misses[VARIANTS]; /* decayed misses, as keys */
    double duel_half_life;
    uint32_t *access_ids;         /* the access in progress's distinct experts, for the shadows */
    uint32_t n_access_ids;
    uint32_t *shadow_missing;
    uint32_t *shadow_victim_layers;
    uint32_t *shadow_victim_experts;
};

static bool keeps_floor(unsigned variant) {
    return variant != LRU_ORDER && (variant & 2) == 0;
}

static unsigned score_of(unsigned variant) {
    return variant == LRU_ORDER ? LAST_USE : variant & 1;
}

static double score_time(const struct guanaco *g, const struct guanaco_policy_state *s, unsigned score) {
    return (double)s->now / g->score_half_life[score];
}

static double rank_time(const struct guanaco *g, const struct guanaco_policy_state *s) {
    return (double)s->now / g->rank_half_life;
}

static void guanaco_free(void *impl) {
    struct guanaco *g = impl;
    if (!g) {
        return;
    }
    free(g->slot_heaps);
    free(g->slot_heap_items);
    free(g->slot_position);
    for (unsigned score = 0; score < SCORES; score++) {
        free(g->slot_keys[score]);
    }
    free(g->layer_heap_items);
    free(g->layer_position);
    free(g->layer_key);
    free(g->layer_tier);
    free(g->rank_hits);
    free(g->working_set);
    free(g->accessed_at);
    free(g->surplus);
    free(g->incoming);
    free(g->layer_held);
    free(g->begin_key);
    free(g->touched_call);
    free(g->missed_call);
    free(g->hint_end);
    free(g->hint_call);
    free(g->evicted_at);
    free(g->layer_evictions);
    free(g->deferred);
    for (unsigned v = 0; v < VARIANTS; v++) {
        guanaco_policy_free(g->shadows[v]);
    }
    free(g->access_ids);
    free(g->shadow_missing);
    free(g->shadow_victim_layers);
    free(g->shadow_victim_experts);
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

/* A layer not accessed in this token or the last one is idle: its working set no longer holds it. */
static bool floor_lapsed(const struct guanaco *g, const struct guanaco_policy_state *s, uint32_t layer) {
    return g->accessed_at[layer] + 1 < s->now;
}

/* The layer's place in the layer heap: above its working set first, then by the hits per byte at its last
   rank, fewest first. The rank counts every resident expert, those set aside in this evict pass too: they stay,
   so the next victim is still the last (counting only the rest drew victims from other layers and lost up to 3
   points to lru at 3 experts per layer on Mixtral). */
static void refresh(struct guanaco *g, const struct guanaco_policy_state *s, uint32_t layer) {
    if (g->layer_held[layer] == 0) {
        if (guanaco_heap_contains(&g->layer_heap, layer)) {
            guanaco_heap_remove(&g->layer_heap, layer);
        }
        return;
    }
    if (g->variant == LRU_ORDER) { /* the layer whose coldest expert was used longest ago, as lru takes it */
        g->layer_tier[layer] = 0;
        g->layer_key[layer] = g->slot_key[guanaco_heap_top(&g->slot_heaps[layer])];
    } else {
        bool marked = s->layer_last_call[layer] == s->call + 1; /* its access is next: it keeps what that needs */
        g->layer_tier[layer] = marked ? g->surplus[layer] == 0
                                      : keeps_floor(g->variant) && s->layer_resident[layer] <= g->working_set[layer] &&
                                            !floor_lapsed(g, s, layer);
        uint32_t last = s->layer_resident[layer] - 1 + (marked ? g->incoming[layer] : 0); /* ranks after its reads */
        last = last < s->n_expert ? last : s->n_expert - 1;
        g->layer_key[layer] =
            g->rank_hits[(size_t)layer * s->n_expert + last] - log2((double)s->expert_bytes[layer]);
    }
    if (guanaco_heap_contains(&g->layer_heap, layer)) {
        guanaco_heap_update(&g->layer_heap, layer);
    } else {
        guanaco_heap_push(&g->layer_heap, layer);
    }
}

/* ---- access ---- */

static void guanaco_access_begin(void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    struct guanaco *g = impl;
    g->begin_resident = s->layer_resident[layer];
    g->n_touched = 0;
    g->n_access_ids = 0;
}

/* A hit's rank in the keep order as the access found it: how many experts then resident would leave after it
   (an expert the access touched already is ordered by its key from before the access; a tie goes to the lower
   slot). The hit's own key is read before guanaco_touch adds this use to it: its begin_key is still the one from
   its previous access, and counting by that put hits deeper than the access found them. Written without
   branches: it runs for every hit in the followed policy and in each of the four shadows, and was 58% of the
   guanaco kind's time (1.96 us per access against lru's 0.01). */
static uint32_t rank_of(const struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot) {
    const uint32_t first = guanaco_policy_layer_of(s, slot) * s->n_expert, end = first + s->n_expert;
    const uint64_t call = s->call;
    const double key = g->slot_key[slot];
    uint32_t rank = 0;
    for (uint32_t e = first; e < end; e++) {
        const double other = g->touched_call[e] == call ? g->begin_key[e] : g->slot_key[e];
        const unsigned counted = (e != slot) & (s->resident[e] != 0) & (g->missed_call[e] != call);
        const unsigned after = (key < other) | ((key == other) & (slot < e));
        rank += counted & after;
    }
    return rank;
}

static void guanaco_touch(void *impl, const struct guanaco_policy_state *s, uint32_t slot, bool hit) {
    struct guanaco *g = impl;
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    if (g->touched_call[slot] == s->call) { /* the same id again in one access: one use */
        return;
    }
    g->touched_call[slot] = s->call;
    g->access_ids[g->n_access_ids++] = slot - layer * s->n_expert;
    uint64_t rank = UINT64_MAX;
    if (hit) {
        rank = rank_of(g, s, slot);
    } else {
        g->missed_call[slot] = s->call;
        if (g->evicted_at[slot] != 0) { /* a ghost: the rank a larger share would have kept it at */
            rank = g->begin_resident + (g->layer_evictions[layer] - g->evicted_at[slot]);
        }
    }
    if (rank < s->n_expert) {
        size_t i = (size_t)layer * s->n_expert + rank;
        g->rank_hits[i] = guanaco_policy_decayed_add(g->rank_hits[i], rank_time(g, s), 1.0);
    }
    g->n_touched += 1;
    g->begin_key[slot] = g->slot_key[slot];
    for (unsigned score = 0; score < LAST_USE; score++) {
        g->slot_keys[score][slot] = guanaco_policy_decayed_add(g->slot_keys[score][slot], score_time(g, s, score), 1.0);
    }
    g->slot_keys[LAST_USE][slot] = (double)++g->touches;
    if (hit) {
        guanaco_heap_update(&g->slot_heaps[layer], slot);
    } else {
        guanaco_heap_push(&g->slot_heaps[layer], slot);
        g->layer_held[layer] += 1;
    }
}

/* ---- the duel ---- */

/* The access in progress and the evict after it, in a shadow: its misses. */
static double run_shadow(struct guanaco *g, struct guanaco_policy *shadow, const struct guanaco_policy_state *s,
                         uint32_t layer) {
    size_t n_missing = 0, n_victims = 0;
    if (guanaco_policy_access(shadow, layer, g->access_ids, g->n_access_ids, s->now, g->shadow_missing,
                              &n_missing) != 0) {
        return 0;
    }
    while (guanaco_policy_evict(shadow, layer, g->shadow_victim_layers, g->shadow_victim_experts, s->n_slots,
                                &n_victims) == -ENOBUFS) {
    }
    return (double)n_missing;
}

/* Every layer's heap re-sorted by the other score: out with the old keys, in with the new. */
static void follow_score(struct guanaco *g, const struct guanaco_policy_state *s, unsigned score) {
    uint32_t n = 0;
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        while (guanaco_heap_top(&g->slot_heaps[layer]) != GUANACO_HEAP_ABSENT) {
            g->deferred[n++] = guanaco_heap_pop(&g->slot_heaps[layer]);
        }
    }
    g->slot_key = g->slot_keys[score];
    g->slot_order.keys = g->slot_key;
    for (uint32_t i = 0; i < n; i++) {
        guanaco_heap_push(&g->slot_heaps[guanaco_policy_layer_of(s, g->deferred[i])], g->deferred[i]);
    }
}

/* Switches the followed variant: the heaps re-sort for another score, and every layer takes its new place. */
static void follow(struct guanaco *g, const struct guanaco_policy_state *s, unsigned variant) {
    unsigned was = g->variant;
    g->variant = variant;
    if (score_of(variant) != score_of(was)) {
        follow_score(g, s, score_of(variant));
    }
    for (uint32_t l = 0; l < s->n_layer; l++) {
        refresh(g, s, l);
    }
}

/* Set dueling (after Qureshi et al.'s DIP): each shadow runs one fixed variant on the same accesses; the policy
   follows the one with the fewest decayed misses, once it leads the followed one by DUEL_MARGIN, so that noise
   between near ties does not flip it. A switch re-sorts the layers (and their heaps, for another score).
   Misses count per token of the call (guanaco_policy_access_batch): counted whole, a prompt's ubatch, dozens of
   misses per layer in one call, chose the variant for the decode after it, and on the model's own routing that
   choice missed 35% more than lru in the decode (guanaco-sim on the live runs' traces, bench/PIPELINE.md). */
static void run_duel(struct guanaco *g, const struct guanaco_policy_state *s, uint32_t layer) {
    double time = (double)s->now / g->duel_half_life;
    unsigned best = g->variant;
    for (unsigned v = 0; v < VARIANTS; v++) {
        double misses = run_shadow(g, g->shadows[v], s, layer) / s->call_tokens;
        g->shadow_misses[v] = guanaco_policy_decayed_add(g->shadow_misses[v], time, misses);
        if (g->shadow_misses[v] < g->shadow_misses[best]) {
            best = v;
        }
    }
    if (best == g->variant || !(g->shadow_misses[best] < g->shadow_misses[g->variant] + log2(1.0 - DUEL_MARGIN))) {
        return;
    }
    follow(g, s, best);
}

static void guanaco_access_end(void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    struct guanaco *g = impl;
    g->working_set[layer] = g->n_touched;
    g->accessed_at[layer] = s->now;
    if (g->shadows[0] && s->budget < s->every_expert_bytes) { /* with room for every expert, the variants agree */
        run_duel(g, s, layer);
    }
    refresh(g, s, layer);
}

/* ---- evict ---- */

/*
 * Layers that went idle since their floor was set lose it; a layer whose next access is already marked
 * (the engine evicts while it reads, before the access) is held at what that access needs, so its
 * other experts are surplus. O(n_layer), plus O(n_expert) for a marked layer.
 */
static void guanaco_evict_begin(void *impl, const struct guanaco_policy_state *s) {
    struct guanaco *g = impl;
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        bool marked = s->layer_last_call[layer] == s->call + 1;
        if (marked) {
            uint32_t first = layer * s->n_expert, surplus = 0, incoming = 0;
            for (uint32_t e = first; e < first + s->n_expert; e++) {
                bool needed = s->needed_call[e] == s->call + 1;
                surplus += s->resident[e] && !needed;
                incoming += !s->resident[e] && needed;
            }
            g->surplus[layer] = surplus;
            g->incoming[layer] = incoming;
        }
        if (marked || (g->layer_tier[layer] && floor_lapsed(g, s, layer))) {
            refresh(g, s, layer);
        }
    }
}

/* Set a heap-held slot aside for the rest of this evict pass. */
static void defer_slot(struct guanaco *g, const struct guanaco_policy_state *s, uint32_t slot) {
    uint32_t layer = guanaco_policy_layer_of(s, slot);
    guanaco_heap_remove(&g->slot_heaps[layer], slot);
    g->layer_held[layer] -= 1;
    refresh(g, s, layer);
    g->deferred[g->n_deferred++] = slot;
}

static void guanaco_restore(void *impl, const struct guanaco_policy_state *s) {
    struct guanaco *g = impl;
    for (uint32_t i = 0; i < g->n_deferred; i++) {
        uint32_t slot = g->deferred[i];
        uint32_t layer = guanaco_policy_layer_of(s, slot);
        guanaco_heap_push(&g->slot_heaps[layer], slot);
        g->layer_held[layer] += 1;
        refresh(g, s, layer);
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
    for (uint32_t layer = guanaco_heap_top(&g->layer_heap); layer != GUANACO_HEAP_ABSENT;
         layer = guanaco_heap_top(&g->layer_heap)) {
        uint32_t slot = guanaco_heap_top(&g->slot_heaps[layer]);
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
    if (guanaco_heap_contains(&g->slot_heaps[layer], slot)) {
        guanaco_heap_remove(&g->slot_heaps[layer], slot);
        g->layer_held[layer] -= 1;
    }
    g->evicted_at[slot] = ++g->layer_evictions[layer];
    if (g->surplus[layer] > 0) {
        g->surplus[layer] -= 1; /* only a marked layer has surplus, and its needed experts are never victims */
    }
    refresh(g, s, layer);
}

/* ---- hints, priors and queries ---- */

static void guanaco_hint(void *impl, const struct guanaco_policy_state *s, uint32_t slot, float weight) {
    struct guanaco *g = impl;
    g->hint_end[slot] = weight > 0 ? s->now + s->hint_lifetime + 1 : 0;
    g->hint_call[slot] = s->layer_last_call[guanaco_policy_layer_of(s, slot)];
}

static void guanaco_seed(void *impl, const struct guanaco_policy_state *s, uint32_t layer, const double *rate) {
    struct guanaco *g = impl;
    if (g->shadows[0] && g->variant == LRU_ORDER) {
        /* A prior says which experts matter, and lru's order has no place for it: a seeded duel starts in the
           order the prior fills (the floor, recency), where it started before lru's order was a variant. */
        follow(g, s, 0);
    }
    for (unsigned v = 0; v < VARIANTS && g->shadows[v]; v++) {
        guanaco_policy_seed(g->shadows[v], layer, rate);
    }
    for (uint32_t e = 0; e < s->n_expert; e++) {
        double r = rate[e] > 1.0 ? 1.0 : rate[e];
        if (!(r > 0)) { /* zero, negative or NaN */
            continue;
        }
        uint32_t slot = layer * s->n_expert + e;
        for (unsigned score = 0; score < LAST_USE; score++) {
            /* a use in every token keeps a decayed count at 1 / (1 - 2^(-1/H)) */
            double every_token = 1.0 / (1.0 - exp2(-1.0 / g->score_half_life[score]));
            g->slot_keys[score][slot] =
                guanaco_policy_decayed_add(g->slot_keys[score][slot], score_time(g, s, score), r * every_token);
        }
        if (guanaco_heap_contains(&g->slot_heaps[layer], slot)) {
            guanaco_heap_update(&g->slot_heaps[layer], slot);
        }
    }
    refresh(g, s, layer);
}

/* Shares are not set ahead: a layer holds what the per-rank counts left it after the last evict. */
static uint64_t guanaco_target_bytes(const void *impl, const struct guanaco_policy_state *s, uint32_t layer) {
    (void)impl;
    return s->layer_resident_bytes[layer];
}

static void guanaco_budget_changed(void *impl, const struct guanaco_policy_state *s) {
    struct guanaco *g = impl;
    for (unsigned v = 0; v < VARIANTS && g->shadows[v]; v++) {
        guanaco_policy_set_budget(g->shadows[v], s->budget);
    }
}

static const struct guanaco_policy_ops guanaco_ops = {
    .access_begin = guanaco_access_begin,
    .touch = guanaco_touch,
    .access_end = guanaco_access_end,
    .evict_begin = guanaco_evict_begin,
    .cap_victim = guanaco_cap_victim,
    .budget_victim = guanaco_budget_victim,
    .evicted = guanaco_evicted,
    .restore = guanaco_restore,
    .budget_changed = guanaco_budget_changed,
    .hint = guanaco_hint,
    .seed = guanaco_seed,
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
    for (unsigned score = 0; score < SCORES; score++) {
        g->slot_keys[score] = guanaco_policy_alloc(slots, sizeof(double), &ok);
    }
    g->layer_heap_items = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->layer_position = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->layer_key = guanaco_policy_alloc(layers, sizeof(double), &ok);
    g->layer_tier = guanaco_policy_alloc(layers, sizeof(uint8_t), &ok);
    g->rank_hits = guanaco_policy_alloc(slots, sizeof(double), &ok);
    g->working_set = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->accessed_at = guanaco_policy_alloc(layers, sizeof(uint64_t), &ok);
    g->surplus = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->incoming = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->layer_held = guanaco_policy_alloc(layers, sizeof(uint32_t), &ok);
    g->begin_key = guanaco_policy_alloc(slots, sizeof(double), &ok);
    g->touched_call = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->missed_call = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->hint_end = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->hint_call = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->evicted_at = guanaco_policy_alloc(slots, sizeof(uint64_t), &ok);
    g->layer_evictions = guanaco_policy_alloc(layers, sizeof(uint64_t), &ok);
    g->deferred = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
    g->access_ids = guanaco_policy_alloc(s->n_expert, sizeof(uint32_t), &ok);
    if (ok && s->variant == GUANACO_POLICY_ADAPT) {
        g->shadow_missing = guanaco_policy_alloc(s->n_expert, sizeof(uint32_t), &ok);
        g->shadow_victim_layers = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
        g->shadow_victim_experts = guanaco_policy_alloc(slots, sizeof(uint32_t), &ok);
        for (unsigned v = 0; v < VARIANTS && ok; v++) {
            /* lru's order is the lru kind's, O(1) per access where a guanaco copy ranks every hit (test_policy
               checks that the two miss alike) */
            struct guanaco_policy_config shadow = {
                .kind = v == LRU_ORDER ? GUANACO_POLICY_LRU : GUANACO_POLICY_GUANACO,
                .n_layer = s->n_layer,
                .n_expert = s->n_expert,
                .expert_bytes = s->expert_bytes,
                .budget_bytes = s->budget,
                .max_per_layer = s->max_per_layer,
                .half_life = s->half_life,
                .hint_lifetime = s->hint_lifetime,
                .variant = (enum guanaco_policy_variant)(GUANACO_POLICY_FLOOR_RECENT + v),
            };
            ok = guanaco_policy_create(&shadow, &g->shadows[v]) == 0;
            g->shadow_misses[v] = -INFINITY;
        }
    }
    if (!ok) {
        guanaco_free(g);
        return -ENOMEM;
    }
    g->score_half_life[0] = s->half_life / RECENCY_SPEEDUP;
    g->score_half_life[1] = s->half_life / FREQUENCY_SPEEDUP;
    /* ADAPT starts in lru's order: where no variant leads by DUEL_MARGIN it stays there, and ties lru (a prior,
       guanaco_seed, moves it to the floor and recency first) */
    g->variant = s->variant == GUANACO_POLICY_ADAPT ? LRU_ORDER : (unsigned)s->variant - GUANACO_POLICY_FLOOR_RECENT;
    g->slot_key = g->slot_keys[score_of(g->variant)];
    g->duel_half_life = s->half_life * DUEL_SLOWDOWN;
    g->rank_half_life = s->half_life * RANK_SLOWDOWN;
    g->slot_order = (struct guanaco_heap_keys){.keys = g->slot_key};
    g->layer_order = (struct guanaco_heap_keys){.keys = g->layer_key, .tiers = g->layer_tier};
    for (uint32_t i = 0; i < s->n_slots; i++) {
        g->slot_position[i] = GUANACO_HEAP_ABSENT;
        for (unsigned score = 0; score < SCORES; score++) {
            g->slot_keys[score][i] = -INFINITY;
        }
        g->rank_hits[i] = log2(RANK_PRIOR * (double)(s->n_expert - i % s->n_expert) / s->n_expert);
    }
    for (uint32_t layer = 0; layer < s->n_layer; layer++) {
        g->slot_heaps[layer] = guanaco_heap_make(g->slot_heap_items + (size_t)layer * s->n_expert, g->slot_position,
                                                 guanaco_heap_key_before, &g->slot_order);
        g->layer_position[layer] = GUANACO_HEAP_ABSENT;
    }
    g->layer_heap = guanaco_heap_make(g->layer_heap_items, g->layer_position, guanaco_heap_key_before, &g->layer_order);
    *ops = &guanaco_ops;
    *impl = g;
    return 0;
}
