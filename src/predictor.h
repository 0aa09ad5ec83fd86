/*
 * predictor.h - owns guessing which experts the next MoE layer will route
 * to, from what the current layer routed to. Pure bookkeeping like policy.h:
 * no I/O, no globals, no allocation after create, the same inputs always
 * give the same guesses, so the live engine and guanaco-sim run one code.
 * One implementation per file behind a small ops table (predictor_*.c).
 *
 * The engine's use, per MoE layer L of a ubatch, with L' the next MoE layer:
 *
 *     guanaco_predictor_observe(p, prev_layer, prev_ids, L, ids, k, n_tokens);  // learn prev -> L
 *     n = guanaco_predictor_predict(p, L, ids, k, n_tokens, out, capacity);     // guess L'
 *     ... start reading out[0..n) of L' while L computes ...
 *
 * ids are row-major: n_tokens rows of k expert ids, row t of both layers
 * being the same token. Ids outside [0, n_expert) are ignored.
 * Not thread-safe: one caller at a time.
 */
#ifndef GUANACO_PREDICTOR_H
#define GUANACO_PREDICTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum guanaco_predictor_kind {
    GUANACO_PREDICTOR_NONE,  /* predicts nothing: prefetch off */
    GUANACO_PREDICTOR_PILOT, /* cross-layer transition statistics with a mass cut-off */
    GUANACO_PREDICTOR_GATE,  /* the next layer's router on this layer's input; pilot when there are no scores */
};

/* Each kind's name as users type it (--guanaco-prefetch, the tools' --predictor), in enum order, X(name)
   per kind: expanded by predictor.c and options.c, as GUANACO_POLICY_KIND_NAMES is. */
#define GUANACO_PREDICTOR_KIND_NAMES(X) X("none") X("pilot") X("gate")

/* What --guanaco-prefetch means when it is not given (src/options.c; guanaco-plan's --predictor follows it). */
#define GUANACO_PREDICTOR_DEFAULT GUANACO_PREDICTOR_PILOT

struct guanaco_predictor_config {
    enum guanaco_predictor_kind kind;
    uint32_t n_layer, n_expert, top_k;
    const uint8_t *moe_layer; /* n_layer flags, 1 = the layer routes; NULL = every layer */
    double mass;              /* pilot: smallest set whose probability reaches mass * top_k; 0 = default */
    double half_life;         /* pilot: decay of transition counts, in observed ubatches; 0 = default */
    uint32_t gate_margin;     /* gate: ranks kept per token beyond top_k; 0 = default */
};

/* pilot's defaults, for a config's 0. Mass 0.6: the largest that keeps the mean guessed set near 2 * top_k
   (prefetch reads cost disk time) in guanaco-sim replays (half-life 64): real Mixtral humaneval+gsm8k
   recall 0.66 with 3.7 of 8 experts (0.9: 0.92 with 6.5), tracegen qwen3-30b-a3b recall 0.62 with 15.5
   of 128 (0.9: 0.88 with 45), tracegen mixtral-8x7b 0.63 with 4.1; recall tracks mass closely. */
#define GUANACO_PILOT_DEFAULT_MASS 0.6
#define GUANACO_PILOT_DEFAULT_HALF_LIFE 64.0
/* pilot keeps n_expert^2 counts per MoE layer that has a next one (4 bytes each); a model that needs more
   than this many in all is refused with -E2BIG rather than taking over 256 MiB. */
#define GUANACO_PILOT_MAX_ENTRIES (64u * 1024u * 1024u)

/* gate's defaults. Each token keeps its top k + margin experts; how many of them get read is decided by
   their measured hit rate (guanaco_predictor_probability), so the margin only bounds the candidates. */
#define GUANACO_GATE_DEFAULT_MARGIN 8u
/* gate scores at most this many tokens per ubatch: a larger one (a prompt's) is scored on an even sample of
   this many, whose guesses are not scored for the calibration (it is per token) */
#define GUANACO_GATE_MAX_TOKENS 32u
/* The smallest ubatch that is a prompt's: throttled apart from decode (engine.c), teaching the layers' widths
   (guanaco_predictor_reads_whole_next_layer) and keeping the stream buffers (residency.h, n_expert_used). */
#define GUANACO_PROMPT_MIN_TOKENS (GUANACO_GATE_MAX_TOKENS + 1)

struct guanaco_predictor;

/* How often a predictor's guesses for one layer held the experts really chosen (gate only). */
struct guanaco_predictor_recall {
    uint64_t tokens;  /* tokens whose guess was checked */
    uint32_t ranks;   /* ranks kept per token: top_k + margin */
    double top_k;     /* share of the chosen experts that were in the token's top k */
    double all_ranks; /* share that were in any of its ranks */
};

int guanaco_predictor_kind_from_name(const char *name, enum guanaco_predictor_kind *kind); /* 0 or -EINVAL */
const char *guanaco_predictor_kind_name(enum guanaco_predictor_kind kind);
const char *guanaco_predictor_kind_names(void); /* joined with '|': "none|pilot|gate" */

/* 0, -EINVAL (bad config: no layers or experts, top_k 0 or above n_expert, mass outside (0, 1], a
   negative or non-finite half_life, an unknown kind), -E2BIG (pilot's tables would exceed
   GUANACO_PILOT_MAX_ENTRIES) or -ENOMEM. */
int guanaco_predictor_create(const struct guanaco_predictor_config *config, struct guanaco_predictor **out);
void guanaco_predictor_free(struct guanaco_predictor *p); /* NULL accepted */

/* Learn that the tokens that routed to from_ids at from_layer routed to to_ids at to_layer.
   0, or -EINVAL (layers out of range or dense, k or n_tokens 0). */
int guanaco_predictor_observe(struct guanaco_predictor *p, uint32_t from_layer, const int32_t *from_ids,
                              uint32_t to_layer, const int32_t *to_ids, uint32_t k, uint32_t n_tokens);

/* Guess the distinct experts the next MoE layer after `layer` will use for these tokens, most likely
   first: writes at most `capacity` into out and returns how many. 0 when nothing is known yet, when
   `layer` is the last MoE layer, or for NONE. */
size_t guanaco_predictor_predict(struct guanaco_predictor *p, uint32_t layer, const int32_t *ids, uint32_t k,
                                 uint32_t n_tokens, uint32_t *out, size_t capacity);

/* Whether this predictor guesses from router scores (gate): the caller then computes them and calls
   guanaco_predictor_predict_scores, falling back to guanaco_predictor_predict when it cannot. */
bool guanaco_predictor_uses_scores(const struct guanaco_predictor *p);

/* Guess the next MoE layer after `layer` from its router's scores for these tokens: n_tokens rows of
   n_expert floats, a higher score meaning more likely chosen (any monotone transform of the router's
   selection scores). Most likely first; returns how many were written, 0 for kinds without scores, the
   last MoE layer, or n_tokens above GUANACO_GATE_MAX_TOKENS. `absent` (NULL, or n_expert flags) marks
   the next layer's experts that are not resident: their probability is then learned on absent guesses
   alone, which is what a read-ahead pays for (resident experts are the popular ones, so an absent guess
   at the same rank is chosen less often). */
size_t guanaco_predictor_predict_scores(struct guanaco_predictor *p, uint32_t layer, const float *scores,
                                        uint32_t n_tokens, const uint8_t *absent, uint32_t *out, size_t capacity);

/* The gate's recall at `layer` (the layer guessed), 0; -ENOTSUP for kinds that keep none, -EINVAL. */
int guanaco_predictor_recall(const struct guanaco_predictor *p, uint32_t layer,
                             struct guanaco_predictor_recall *recall);

/* The chance, from 0 to 1, that a token of the last predict call needs its i-th guess (i < the count
   that call returned, `emitted`; 0 otherwise). The guesses come most likely first, so this falls with i. */
double guanaco_predictor_probability(const struct guanaco_predictor *p, size_t i, size_t emitted);

/*
 * The engine's read-ahead rules, which guanaco-sim replays: a ubatch that needs at least 3/4 of a layer's
 * experts is a prompt, and reads the whole next layer ahead (the next layer will need nearly all of it
 * too); a decode guess is read ahead only while it is resident already or at least this likely (a wrong
 * one costs disk time that demand reads need, and CPU time that compute needs).
 */
#define GUANACO_READ_AHEAD_SURE_PROBABILITY 0.5
bool guanaco_read_ahead_is_prompt(size_t distinct_experts, uint32_t n_expert);

/*
 * Whether a call of `layer` that used `distinct` experts for n_tokens tokens reads the whole next MoE layer
 * ahead: it is a prompt's (guanaco_read_ahead_is_prompt), and the next layer's last call of at least
 * GUANACO_PROMPT_MIN_TOKENS tokens was one too. Records this layer's width when the call has that many tokens.
 * Routing can be skewed per layer: the model's own at 25% used 90-95% of layer 0's experts in a 256-token
 * ubatch and 70% of layer 1's, so all of layer 1 wasted a third of its read-ahead and filled its buffer, which at a
 * tight limit took the non-expert weights' page cache (pilot against none 0.85x on 256-token prompts and 0.86x in
 * decode after them, level with 0.5 GB more room; bench/PIPELINE.md, Dec 5).
 */
bool guanaco_predictor_reads_whole_next_layer(struct guanaco_predictor *p, uint32_t layer, size_t distinct,
                                              uint32_t n_tokens);

/* One MoE call, as the read-ahead rule sees it. */
struct guanaco_read_ahead_call {
    uint32_t layer;          /* the layer that just routed */
    const int32_t *ids;      /* its n_tokens x k expert ids */
    uint32_t k, n_tokens;
    const float *scores;     /* the next MoE layer's router scores (gate), or NULL: n_scored rows, for the */
    uint32_t n_scored;       /* tokens or an even sample of them */
    const uint8_t *absent;   /* n_expert flags: the next MoE layer's experts that are not resident */
    bool prompts_read_ahead; /* false: a prompt's call reads nothing ahead (direct loading that does not stream) */
};

/*
 * The read-ahead rule, the engine's and guanaco-sim's: which experts of the next MoE layer after call->layer to
 * name (out, most likely first, at most capacity; the count is returned) and how many of the first ones to read
 * (*n_read). A prompt's call reads the whole next layer when guanaco_predictor_reads_whole_next_layer says so;
 * where the next layer is narrow, the router scores' guesses where there are scores (gate), else nothing. Any
 * other call's predictor guesses (from the scores where it can), and a guess is read while it is resident
 * already or at least GUANACO_READ_AHEAD_SURE_PROBABILITY likely.
 *
 * Without scores such a prompt reads nothing ahead, because no guess from the routing alone paid: on the
 * 24-layer Q8_0 model's own routing, where a 256-token prompt uses 30-40 of 128 experts in most layers and two
 * prompts share a third of them, pilot's guesses for the whole ubatch (one minus the product of each token's
 * chance of not needing an expert) were 35-37% used at every threshold from 0.5 to 0.999, and 0.7 GiB of wasted
 * copies per prompt at 25% left decode after it at 0.69-0.75 tok/s against 7.7 (bench/PIPELINE.md, Dec 6).
 */
size_t guanaco_read_ahead_choose(struct guanaco_predictor *p, const struct guanaco_read_ahead_call *call,
                                 uint32_t *out, size_t capacity, size_t *n_read);

/* The next MoE layer after `layer`, or UINT32_MAX when there is none. */
uint32_t guanaco_predictor_next_layer(const struct guanaco_predictor *p, uint32_t layer);

#endif
