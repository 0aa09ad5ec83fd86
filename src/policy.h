/*
 * policy.h - owns the replacement policy: which (layer, expert) slots stay
 * resident under a RAM budget in bytes, and which are evicted when the router
 * brings in new ones. Pure bookkeeping: no I/O, no globals, no allocation
 * after guanaco_policy_create(), and the same inputs always give the same
 * decisions, so the live engine and the offline simulator run the same code.
 *
 * The engine's loop, per MoE layer, as the router's ids arrive:
 *
 *     guanaco_policy_access(policy, layer, distinct_ids, n, token, missing, &n_missing);
 *     ... read the n_missing experts ...
 *     guanaco_policy_evict(policy, layer, victim_layers, victim_experts, cap, &n_victims);
 *     ... drop the victims' pages ...
 *
 * Oversubscription: access always succeeds, because every expert it names is
 * needed now. Evict then brings the resident bytes back under the budget as
 * far as it may without touching the experts the protected layer needed in
 * its last access. So after evict:
 *
 *     resident_bytes <= max(budget, bytes of protect_layer's experts in its last access)
 *
 * The worst-case overshoot is one layer's working set: the distinct experts
 * the ubatch routes to in that layer (at most n_tokens * n_expert_used, and
 * at most n_expert) times its expert bytes. The same holds per layer for
 * max_per_layer: a layer holds more than the cap only while it is the
 * protected layer and needed more than the cap at once.
 *
 * Cost per access: O(1) for lru and layer-lru (plus O(log n_layer) per
 * eviction for layer-lru), O(log n) for lfu, with n the resident experts of
 * one layer plus n_layer, and for guanaco O(log n) plus O(n_expert) per hit
 * (its rank) and O(n_layer) per evict. Not thread-safe: one caller at a time.
 */
#ifndef GUANACO_POLICY_H
#define GUANACO_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum guanaco_policy_kind {
    /* Global LRU over every slot: O(1) per access, intrusive lists. */
    GUANACO_POLICY_LRU,
    /* Global LFU with exponential decay (half_life), O(log n) per access. */
    GUANACO_POLICY_LFU,
    /* The budget split between MoE layers in proportion to expert bytes, LRU
       inside each layer: O(1) per access plus O(log n_layer) per eviction. */
    GUANACO_POLICY_LAYER_LRU,
    /* Cold-first eviction, per-layer shares from each layer's hits per rank
       (utility), a working-set floor, pilot hints, and two choices made by
       set dueling against shadow copies. See policy_guanaco.c. */
    GUANACO_POLICY_GUANACO,
};

/* Each kind's name as users type it (--guanaco-policy, the tools' --policy), in enum order: the one list
   that policy.c's lookups and options.c's choices expand, X(name) per kind. A macro, so that options.c
   (and its fuzz harness) takes the names without linking the policies. */
#define GUANACO_POLICY_KIND_NAMES(X) X("lru") X("lfu") X("layer-lru") X("guanaco")

/* What --guanaco-policy means when it is not given (src/options.c uses this):
   guanaco, its variants chosen by the duel. In bench/POLICY.md (two recorded
   Mixtral traces and ten synthetic presets, 4-5 budgets each) it loses to lru
   in none of 54 cells and gains 5.5-16 points at 8-16 experts per layer on
   Qwen3-like routing; layer-lru, the default before it, lost 4 cells (up to
   3.2 points) and gained nothing at 8. */
#define GUANACO_POLICY_DEFAULT GUANACO_POLICY_GUANACO

/* Half-life of decayed use counts when the config leaves it 0, in units of `now` (tokens). */
#define GUANACO_POLICY_DEFAULT_HALF_LIFE 32.0

/* guanaco's choice (policy_guanaco.c): whether a layer keeps its working-set floor, and whether the order in
   which a layer's experts leave remembers a short history (recency) or a long one (frequency); or lru's order
   over every slot, with no floor and no shares. ADAPT, the default, runs a shadow copy of the policy for each of
   the five fixed variants on the same accesses, starts in lru's order (with a prior from guanaco_policy_seed:
   the floor and recency, which use it) and follows the one that missed least lately; the fixed variants are
   those shadows (and tests). Other kinds ignore it. */
enum guanaco_policy_variant {
    GUANACO_POLICY_ADAPT,
    GUANACO_POLICY_FLOOR_RECENT,
    GUANACO_POLICY_FLOOR_FREQUENT,
    GUANACO_POLICY_NO_FLOOR_RECENT,
    GUANACO_POLICY_NO_FLOOR_FREQUENT,
    GUANACO_POLICY_LRU_ORDER,
};

struct guanaco_policy_config {
    enum guanaco_policy_kind kind;
    uint32_t n_layer;
    uint32_t n_expert;
    const uint64_t *expert_bytes; /* n_layer entries: bytes of one expert of the layer; 0 = dense layer */
    uint64_t budget_bytes;
    uint32_t max_per_layer;       /* most resident experts in one layer; 0 = no cap */
    double half_life;             /* decay of use counts (lfu's score) in units of `now`; guanaco's
                                     cold-first order decays 16 times faster and its per-rank hit
                                     counts 4 times slower; 0 = the default */
    uint32_t hint_lifetime;       /* a hint lapses at now + this if its layer is not accessed; 0 = 1 */
    enum guanaco_policy_variant variant; /* guanaco only; 0 = ADAPT */
};

struct guanaco_policy;

/* The kind called `name` (GUANACO_POLICY_KIND_NAMES): 0, or -EINVAL. */
int guanaco_policy_kind_from_name(const char *name, enum guanaco_policy_kind *kind);
const char *guanaco_policy_kind_name(enum guanaco_policy_kind kind);
/* The names joined with '|' ("lru|lfu|..."), for messages that list the accepted values. */
const char *guanaco_policy_kind_names(void);

/* Allocates everything the policy will ever need. 0, -EINVAL (bad config) or -ENOMEM. */
int guanaco_policy_create(const struct guanaco_policy_config *config, struct guanaco_policy **out);
void guanaco_policy_free(struct guanaco_policy *policy);

/*
 * Mark the ubatch's distinct experts of `layer` as needed now: returns in
 * `missing` (room for n entries) the ones that were not resident, which the
 * caller reads, and makes them resident in the accounting. `now` is a logical
 * clock (the token index) that never goes back; an earlier value counts as
 * the latest seen. A repeated id is a hit the second time. 0, or -EINVAL
 * (layer out of range or dense, an expert out of range) with nothing changed.
 */
int guanaco_policy_access(struct guanaco_policy *policy, uint32_t layer, const uint32_t *experts, size_t n,
                          uint64_t now, uint32_t *missing, size_t *n_missing);

/*
 * guanaco_policy_access for a call that serves `tokens` tokens at once (a
 * ubatch; 0 counts as 1); guanaco_policy_access is this with 1. The guanaco
 * kind's duel counts such a call's misses per token: a prompt's ubatch needs
 * dozens of a layer's experts in one call, and counted whole, its misses
 * outweighed every decode token after it (bench/PIPELINE.md, Dec 5).
 */
int guanaco_policy_access_batch(struct guanaco_policy *policy, uint32_t layer, const uint32_t *experts, size_t n,
                                uint64_t now, uint32_t tokens, uint32_t *missing, size_t *n_missing);

/*
 * After the reads: choose victims until every capped layer is within
 * max_per_layer and resident bytes <= budget, never taking an expert that
 * protect_layer needed in its last access. Victims are no longer resident
 * when this returns. 0 when done (which may leave the overshoot described at
 * the top), or -ENOBUFS when `capacity` victims were taken first: those are
 * evicted, and another call continues.
 */
int guanaco_policy_evict(struct guanaco_policy *policy, uint32_t protect_layer, uint32_t *victim_layers,
                         uint32_t *victim_experts, size_t capacity, size_t *n_victims);

/*
 * Sets aside `bytes` of the budget for experts being read ahead outside the
 * policy's accounting (the engine's prefetch): from the next evict on, the
 * budget rule is resident_bytes <= budget - bytes, so resident experts plus
 * reads ahead stay within the budget. 0 gives the whole budget back.
 */
void guanaco_policy_set_reserve(struct guanaco_policy *policy, uint64_t bytes);

/*
 * Changes the budget (--guanaco-ram auto, once a context's buffers are known).
 * Nothing is evicted here: the next evict brings the resident bytes under the
 * new budget, as after any access.
 */
void guanaco_policy_set_budget(struct guanaco_policy *policy, uint64_t bytes);

/*
 * A predictor's guess that (layer, expert) is needed at the layer's next
 * access, with its confidence. The guanaco policy keeps a hinted expert
 * resident until that access, or until now + hint_lifetime if the access
 * does not come, unless nothing else is left to evict; weight <= 0
 * withdraws the hint. Other policies ignore hints. Out-of-range ids are ignored.
 */
void guanaco_policy_hint(struct guanaco_policy *policy, uint32_t layer, uint32_t expert, float weight);

/*
 * A prior on `layer` (the imatrix's routing counts): rate[e] is how often
 * expert e is expected per token (its share of the layer's routings times
 * top-k), clamped to [0, 1]. It is added to the decayed use counts as the
 * steady state of an expert used at that rate (rate / (1 - 2^(-1/H)) for
 * half-life H): lfu's score and guanaco's cold-first score, so a hot expert
 * is kept over a cold one before either is used. The prior decays like any
 * use, so routing that differs takes over within a few half-lives. guanaco's
 * per-rank counts are left alone (a prior says which experts of a layer, not
 * how much room the layer needs). lru and layer-lru keep
 * recency only: for them the preload's access order is the prior (the
 * most-routed accessed last). Out-of-range layers, dense layers and rates
 * that are not finite are ignored.
 */
void guanaco_policy_seed(struct guanaco_policy *policy, uint32_t layer, const double *rate);

bool guanaco_policy_is_resident(const struct guanaco_policy *policy, uint32_t layer, uint32_t expert);
uint64_t guanaco_policy_resident_bytes(const struct guanaco_policy *policy);
/* Every expert of every layer resident, under a budget that keeps them all: no access can miss or evict. */
bool guanaco_policy_holds_every_expert(const struct guanaco_policy *policy);
uint32_t guanaco_policy_layer_resident_count(const struct guanaco_policy *policy, uint32_t layer);
/* Whether a kind with a pinned hot set holds (layer, expert) in it. No kind pins now (guanaco's pins cost
   up to 19 points of hit rate, bench/POLICY.md), so this is false; the status line's hot-pinned share reads it. */
bool guanaco_policy_is_pinned(const struct guanaco_policy *policy, uint32_t layer, uint32_t expert);
/*
 * The bytes the policy means the layer to hold now: its fixed share for
 * layer-lru, its resident bytes for guanaco (its shares are not set ahead:
 * the per-rank counts choose each victim), and 0 for policies without one.
 */
uint64_t guanaco_policy_layer_target_bytes(const struct guanaco_policy *policy, uint32_t layer);

#endif
