/*
 * predictor.c - owns the public face of the expert predictors (predictor.h):
 * the kind names, the config and argument checks, the order of the MoE
 * layers, and the dispatch to an implementation's ops table
 * (predictor_impl.h). Checking here once means every implementation can
 * trust its arguments, and NONE needs no implementation at all.
 */
#include "predictor.h"
#include "predictor_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct guanaco_predictor {
    enum guanaco_predictor_kind kind;
    uint32_t n_layer, n_expert, top_k;
    uint8_t *moe_layer;   /* n_layer flags, always present: a NULL in the config is expanded here */
    uint32_t *next_layer; /* n_layer: the next MoE layer after each layer, or UINT32_MAX */
    uint8_t *prompt_narrow; /* n_layer: its last prompt-sized call was not guanaco_read_ahead_is_prompt */
    uint8_t *seen;          /* scratch, n_expert: the ids guanaco_read_ahead_choose has counted */
    const struct guanaco_predictor_ops *ops; /* NULL for NONE */
    void *impl;
};

#define NAME_ENTRY(name) name,
#define NAME_JOINED(name) "|" name
static const char *const kind_names[] = {GUANACO_PREDICTOR_KIND_NAMES(NAME_ENTRY)};
static const char kind_names_joined[] = GUANACO_PREDICTOR_KIND_NAMES(NAME_JOINED); /* "|none|pilot|gate" */
#define KIND_COUNT (sizeof(kind_names) / sizeof(kind_names[0]))
_Static_assert(KIND_COUNT == GUANACO_PREDICTOR_GATE + 1, "one name per predictor kind");

int guanaco_predictor_kind_from_name(const char *name, enum guanaco_predictor_kind *kind) {
    if (!name || !kind) {
        return -EINVAL;
    }
    for (size_t i = 0; i < KIND_COUNT; i++) {
        if (strcmp(kind_names[i], name) == 0) {
            *kind = (enum guanaco_predictor_kind)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *guanaco_predictor_kind_name(enum guanaco_predictor_kind kind) {
    return (unsigned)kind < KIND_COUNT ? kind_names[kind] : "unknown";
}

const char *guanaco_predictor_kind_names(void) {
    return kind_names_joined + 1;
}

static int check_config(const struct guanaco_predictor_config *config) {
    if ((unsigned)config->kind >= KIND_COUNT || config->n_layer == 0 || config->n_expert == 0 ||
        config->top_k == 0 || config->top_k > config->n_expert || config->gate_margin > config->n_expert) {
        return -EINVAL;
    }
    /* written so that NAN fails too */
    if (!(config->mass == 0 || (config->mass > 0 && config->mass <= 1))) {
        return -EINVAL;
    }
    if (!(config->half_life >= 0 && isfinite(config->half_life))) {
        return -EINVAL;
    }
    return 0;
}

int guanaco_predictor_create(const struct guanaco_predictor_config *config, struct guanaco_predictor **out) {
    if (!config || !out) {
        return -EINVAL;
    }
    *out = NULL;
    int err = check_config(config);
    if (err != 0) {
        return err;
    }
    struct guanaco_predictor *p = calloc(1, sizeof(*p));
    if (!p) {
        return -ENOMEM;
    }
    p->kind = config->kind;
    p->n_layer = config->n_layer;
    p->n_expert = config->n_expert;
    p->top_k = config->top_k;
    p->moe_layer = malloc(config->n_layer * sizeof(*p->moe_layer));
    p->next_layer = malloc(config->n_layer * sizeof(*p->next_layer));
    p->prompt_narrow = calloc(config->n_layer, sizeof(*p->prompt_narrow));
    p->seen = malloc(config->n_expert);
    if (!p->moe_layer || !p->next_layer || !p->prompt_narrow || !p->seen) {
        guanaco_predictor_free(p);
        return -ENOMEM;
    }
    for (uint32_t l = 0; l < config->n_layer; l++) {
        p->moe_layer[l] = config->moe_layer ? config->moe_layer[l] != 0 : 1;
    }
    uint32_t next = UINT32_MAX;
    for (uint32_t l = config->n_layer; l-- > 0;) {
        p->next_layer[l] = next;
        if (p->moe_layer[l]) {
            next = l;
        }
    }
    if (config->kind == GUANACO_PREDICTOR_PILOT) {
        err = guanaco_predictor_pilot_create(config, p->moe_layer, p->next_layer, &p->ops, &p->impl);
    } else if (config->kind == GUANACO_PREDICTOR_GATE) {
        err = guanaco_predictor_gate_create(config, p->moe_layer, p->next_layer, &p->ops, &p->impl);
    }
    if (err != 0) {
        guanaco_predictor_free(p);
        return err;
    }
    *out = p;
    return 0;
}

void guanaco_predictor_free(struct guanaco_predictor *p) {
    if (!p) {
        return;
    }
    if (p->ops) {
        p->ops->free(p->impl);
    }
    free(p->moe_layer);
    free(p->next_layer);
    free(p->prompt_narrow);
    free(p->seen);
    free(p);
}

static int routes(const struct guanaco_predictor *p, uint32_t layer) {
    return layer < p->n_layer && p->moe_layer[layer];
}

int guanaco_predictor_observe(struct guanaco_predictor *p, uint32_t from_layer, const int32_t *from_ids,
                              uint32_t to_layer, const int32_t *to_ids, uint32_t k, uint32_t n_tokens) {
    if (!p || !from_ids || !to_ids || k == 0 || n_tokens == 0 || !routes(p, from_layer) || !routes(p, to_layer)) {
        return -EINVAL;
    }
    /* Only adjacent MoE layers are learnt: that is the one transition predict is ever asked about, and a
       caller that skipped a layer (a ubatch cut short, a first layer) must not teach a wrong one. */
    if (to_layer != p->next_layer[from_layer] || !p->ops) {
        return 0;
    }
    return p->ops->observe(p->impl, from_layer, from_ids, to_ids, k, n_tokens);
}

size_t guanaco_predictor_predict(struct guanaco_predictor *p, uint32_t layer, const int32_t *ids, uint32_t k,
                                 uint32_t n_tokens, uint32_t *out, size_t capacity) {
    /* a size cannot carry an error: a call that cannot be answered is answered with nothing to fetch */
    if (!p || !p->ops || !ids || !out || capacity == 0 || k == 0 || n_tokens == 0 || !routes(p, layer) ||
        p->next_layer[layer] == UINT32_MAX) {
        return 0;
    }
    return p->ops->predict(p->impl, layer, ids, k, n_tokens, out, capacity);
}

bool guanaco_predictor_uses_scores(const struct guanaco_predictor *p) {
    return p && p->ops && p->ops->predict_scores;
}

size_t guanaco_predictor_predict_scores(struct guanaco_predictor *p, uint32_t layer, const float *scores,
                                        uint32_t n_tokens, const uint8_t *absent, uint32_t *out, size_t capacity) {
    if (!guanaco_predictor_uses_scores(p) || !scores || !out || capacity == 0 || n_tokens == 0 ||
        n_tokens > GUANACO_GATE_MAX_TOKENS || !routes(p, layer) || p->next_layer[layer] == UINT32_MAX) {
        return 0;
    }
    return p->ops->predict_scores(p->impl, layer, p->next_layer[layer], scores, n_tokens, absent, out, capacity);
}

int guanaco_predictor_recall(const struct guanaco_predictor *p, uint32_t layer,
                             struct guanaco_predictor_recall *recall) {
    if (!p || !recall || layer >= p->n_layer) {
        return -EINVAL;
    }
    if (!p->ops || !p->ops->recall) {
        return -ENOTSUP;
    }
    return p->ops->recall(p->impl, layer, recall);
}

double guanaco_predictor_probability(const struct guanaco_predictor *p, size_t i, size_t emitted) {
    if (!p || !p->ops || i >= emitted) {
        return 0;
    }
    return p->ops->probability(p->impl, i);
}

bool guanaco_read_ahead_is_prompt(size_t distinct_experts, uint32_t n_expert) {
    return 4 * (uint64_t)distinct_experts >= 3 * (uint64_t)n_expert;
}

bool guanaco_predictor_reads_whole_next_layer(struct guanaco_predictor *p, uint32_t layer, size_t distinct,
                                              uint32_t n_tokens) {
    if (!p || !routes(p, layer)) {
        return false;
    }
    const bool wide = guanaco_read_ahead_is_prompt(distinct, p->n_expert);
    if (n_tokens >= GUANACO_PROMPT_MIN_TOKENS) {
        p->prompt_narrow[layer] = !wide;
    }
    const uint32_t next = p->next_layer[layer];
    return wide && next != UINT32_MAX && !p->prompt_narrow[next];
}

size_t guanaco_read_ahead_choose(struct guanaco_predictor *p, const struct guanaco_read_ahead_call *call,
                                 uint32_t *out, size_t capacity, size_t *n_read) {
    *n_read = 0;
    if (!p || !call || !out || capacity == 0 || guanaco_predictor_next_layer(p, call->layer) == UINT32_MAX) {
        return 0;
    }
    memset(p->seen, 0, p->n_expert);
    size_t distinct = 0;
    for (size_t i = 0; i < (size_t)call->k * call->n_tokens; i++) {
        const int32_t id = call->ids[i];
        if (id >= 0 && (uint32_t)id < p->n_expert && !p->seen[id]) {
            p->seen[id] = 1;
            distinct++;
        }
    }
    const bool whole_layer = guanaco_predictor_reads_whole_next_layer(p, call->layer, distinct, call->n_tokens);
    const bool prompt = guanaco_read_ahead_is_prompt(distinct, p->n_expert);
    if (prompt && (whole_layer || !call->prompts_read_ahead || !call->scores)) {
        size_t n = 0;
        for (uint32_t e = 0; call->prompts_read_ahead && whole_layer && e < p->n_expert && n < capacity; e++) {
            out[n++] = e;
        }
        *n_read = n;
        return n;
    }
    size_t n = call->scores ? guanaco_predictor_predict_scores(p, call->layer, call->scores, call->n_scored,
                                                               call->absent, out, capacity)
                            : 0;
    if (n == 0 && prompt) {
        return 0;
    }
    if (n == 0) {
        n = guanaco_predictor_predict(p, call->layer, call->ids, call->k, call->n_tokens, out, capacity);
    }
    /* A wrong guess costs more than disk time: the kernel's page-cache work for it runs on the cores the layers
       compute on. Filling the disk's idle time with the pilot's best guesses made decode 15% slower on 2 cores
       (measured while reads still copied; not measured again since). So a guess is read only when it is likely
       enough to pay. */
    size_t read = 0;
    while (read < n && (!call->absent[out[read]] ||
                        guanaco_predictor_probability(p, read, n) >= GUANACO_READ_AHEAD_SURE_PROBABILITY)) {
        read++;
    }
    *n_read = read;
    return n;
}

uint32_t guanaco_predictor_next_layer(const struct guanaco_predictor *p, uint32_t layer) {
    return p && layer < p->n_layer ? p->next_layer[layer] : UINT32_MAX;
}
