/*
 * hook.c - owns the eval-callback glue between ggml's scheduler and the
 * engine: asking for exactly one node per MoE layer (ffn_moe_topk), reading
 * the router's expert ids through the view's strides (copying them off the
 * device when they are not in host memory), and chaining whatever callback
 * the user had installed.
 *
 * The policy's clock is the engine's (tokens through the last MoE layer, all
 * contexts together), not this context's token index: the policy belongs to
 * the model, so with several contexts decay, hints and churn must all read
 * one time.
 *
 * Why only ffn_moe_topk: each node we ask for ends a scheduler chunk and
 * costs a synchronisation (REFERENCE.md section 2). One per layer is ~0.2 ms
 * per token; asking for every node made decode 2.6x slower in the seed.
 */
#include "engine.h"
#include "log.h"
#include "monotonic_clock.h"

#include "ggml-backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUTER_NODE_PREFIX "ffn_moe_topk-"

struct guanaco_hook {
    struct guanaco_engine *engine;
    uint32_t context_id;  /* this context's sequence id in a recorded trace */
    uint64_t *rows_seen;  /* per layer: this context's routings so far, i.e. its next token's index (replay, trace) */
    ggml_backend_sched_eval_callback user_callback;
    void *user_data;
    int32_t *ids;        /* scratch: one ubatch of ids, contiguous */
    size_t ids_capacity; /* in int32 */
    void *device_copy;   /* scratch for ids that live in device memory */
    size_t device_copy_capacity;
    int previous_layer;  /* the MoE layer this context routed last, -1 before any */
    int previous_tokens; /* the rows of its ids */
    int32_t *previous_ids; /* its ids: the predictor learns from layer to layer of the same tokens */
    size_t previous_capacity; /* in bytes */
    float *next_scores;       /* gate: the next layer's router scores, GUANACO_GATE_MAX_TOKENS x n_expert */
    void *gate_scratch;       /* gate: one input row converted to the router's dot-product type */
    size_t gate_scratch_bytes;
    _Atomic int error; /* first error of the graph being computed (negative errno), 0 when none */
    bool read_ahead_on;         /* what the throttle said when this ubatch reached its first MoE layer */
    uint64_t ubatch_started_ns; /* then; 0 when this ubatch is not being timed */
    int ubatch_tokens;          /* its tokens then: llama.cpp's last layer keeps only the rows that give logits */
    /* When this ubatch passed its last MoE layer; 0 before. It is reported to the throttle when the next one
       starts: its read-ahead's kernel work also lands after its last MoE layer (output head, the next token's
       first layers), where timing up to the last layer's stall missed it. */
    uint64_t ubatch_moe_end_ns;
};

/*
 * Hands the pending ubatch to the throttle, timed up to `now` (the next ubatch's first MoE layer): a whole
 * cycle. A gap after its last MoE layer longer than the MoE part itself is idle time (a server waiting for a
 * request, a new context), not this ubatch's cost: then only the MoE part counts. now = 0 at the end.
 */
static void report_timed(struct guanaco_hook *hook, uint64_t now) {
    if (!hook->ubatch_moe_end_ns) {
        return;
    }
    uint64_t moe = hook->ubatch_moe_end_ns - hook->ubatch_started_ns;
    uint64_t gap = now > hook->ubatch_moe_end_ns ? now - hook->ubatch_moe_end_ns : UINT64_MAX;
    guanaco_engine_read_ahead_timed(hook->engine, hook->ubatch_tokens, hook->read_ahead_on, gap <= moe ? moe + gap : moe);
    hook->ubatch_moe_end_ns = 0;
    hook->ubatch_started_ns = 0;
}

/* The MoE layer of a router node, or -1. Called for every node of every graph: keep it cheap. */
static int router_layer(const struct guanaco_engine *engine, const struct ggml_tensor *t) {
    if (t->name[0] != 'f' || strncmp(t->name, ROUTER_NODE_PREFIX, sizeof(ROUTER_NODE_PREFIX) - 1) != 0) {
        return -1;
    }
    const char *digits = t->name + sizeof(ROUTER_NODE_PREFIX) - 1;
    int layer = 0;
    if (*digits == '\0') {
        return -1;
    }
    for (; *digits; digits++) {
        if (*digits < '0' || *digits > '9' || layer > 1000000) {
            return -1;
        }
        layer = layer * 10 + (*digits - '0');
    }
    if (layer >= engine->manifest.n_layer || !engine->moe_layer_of[layer]) {
        return -1;
    }
    return layer;
}

static int grow(void **buffer, size_t *capacity, size_t needed) {
    if (needed <= *capacity) {
        return 0;
    }
    void *grown = realloc(*buffer, needed);
    if (!grown) {
        return -ENOMEM;
    }
    *buffer = grown;
    *capacity = needed;
    return 0;
}

/* Writes the replay's ids over the view, through its strides, so MUL_MAT_ID and the
 * gathered weights both follow the recorded routing. */
static void overwrite_router_ids(struct guanaco_hook *hook, struct ggml_tensor *t, int layer, int k, int n_tokens) {
    for (int token = 0; token < n_tokens; token++) {
        const int32_t *ids = guanaco_engine_replay_ids(hook->engine, layer, hook->rows_seen[layer] + (uint64_t)token);
        memcpy(&hook->ids[(size_t)token * (size_t)k], ids, (size_t)k * sizeof(int32_t));
    }
    const bool on_host = !t->buffer || ggml_backend_buffer_is_host(t->buffer);
    char *base = on_host ? t->data : hook->device_copy;
    for (int token = 0; token < n_tokens; token++) {
        char *row = base + (size_t)token * t->nb[1];
        for (int slot = 0; slot < k; slot++) {
            memcpy(row + (size_t)slot * t->nb[0], &hook->ids[(size_t)token * (size_t)k + (size_t)slot], sizeof(int32_t));
        }
    }
    if (!on_host) {
        ggml_backend_tensor_set(t, hook->device_copy, 0, ggml_nbytes(t));
    }
}

/* Gathers the [k, n_tokens] ids of a strided I32 view into hook->ids. */
static int read_router_ids(struct guanaco_hook *hook, const struct ggml_tensor *t, int *k, int *n_tokens) {
    if (t->type != GGML_TYPE_I32) {
        return -EINVAL;
    }
    *k = (int)t->ne[0];
    *n_tokens = (int)t->ne[1];
    const char *base = t->data;
    /* No buffer means a plain ggml context: host memory. */
    if (t->buffer && !ggml_backend_buffer_is_host(t->buffer)) {
        size_t span = ggml_nbytes(t);
        if (hook->device_copy == NULL) { /* once per context: the evidence tests/test_rpc.sh looks for */
            guanaco_log_info("router ids of %s live in %s memory: copied to the host", t->name,
                             ggml_backend_buffer_name(t->buffer));
        }
        if (grow(&hook->device_copy, &hook->device_copy_capacity, span) < 0) {
            return -ENOMEM;
        }
        ggml_backend_tensor_get((struct ggml_tensor *)t, hook->device_copy, 0, span);
        base = hook->device_copy;
    }
    size_t count = (size_t)*k * (size_t)*n_tokens;
    size_t capacity_bytes = hook->ids_capacity * sizeof(int32_t);
    if (grow((void **)&hook->ids, &capacity_bytes, count * sizeof(int32_t)) < 0) {
        return -ENOMEM;
    }
    hook->ids_capacity = capacity_bytes / sizeof(int32_t);
    for (int token = 0; token < *n_tokens; token++) {
        const char *row = base + (size_t)token * t->nb[1];
        for (int slot = 0; slot < *k; slot++) {
            memcpy(&hook->ids[(size_t)token * (size_t)*k + (size_t)slot], row + (size_t)slot * t->nb[0],
                   sizeof(int32_t));
        }
    }
    return 0;
}

/* gate: the next MoE layer's router applied to this layer's MoE input, *n_scored rows of it, or NULL when it
   cannot be had (the first ubatch, before the next router has been seen; a router it cannot follow). */
static const float *next_layer_scores(struct guanaco_hook *hook, const struct ggml_tensor *topk, int layer,
                                      int n_tokens, int *n_scored) {
    struct guanaco_engine *engine = hook->engine;
    const struct ggml_tensor *input = guanaco_router_gate_learn(engine->router_gate, layer, topk);
    uint32_t next = guanaco_predictor_next_layer(engine->predictor, (uint32_t)layer);
    if (!input || next == UINT32_MAX) {
        return NULL;
    }
    /* a larger ubatch (a prompt's) is scored on evenly spaced tokens: the hook runs while the compute threads
       wait, and a prompt's tokens share most of their experts */
    const int stride = (n_tokens + (int)GUANACO_GATE_MAX_TOKENS - 1) / (int)GUANACO_GATE_MAX_TOKENS;
    *n_scored = (n_tokens + stride - 1) / stride;
    if (!hook->next_scores) {
        hook->next_scores = malloc((size_t)GUANACO_GATE_MAX_TOKENS * (size_t)engine->manifest.n_expert * sizeof(float));
        if (!hook->next_scores) {
            return NULL;
        }
    }
    if (grow(&hook->gate_scratch, &hook->gate_scratch_bytes,
             guanaco_router_gate_scratch_bytes(engine->router_gate, input->ne[0])) < 0) {
        return NULL;
    }
    return guanaco_router_gate_scores(engine->router_gate, (int)next, input, *n_scored, stride, hook->next_scores,
                                      hook->gate_scratch, hook->gate_scratch_bytes) == 0
               ? hook->next_scores
               : NULL;
}

/* Hands the engine this layer's ids and the context's previous layer's, then keeps these for the next one. */
static void read_ahead(struct guanaco_hook *hook, const struct ggml_tensor *topk, int layer, int k, int n_tokens) {
    const size_t n_ids = (size_t)k * (size_t)n_tokens;
    bool same_tokens = hook->previous_layer >= 0 && hook->previous_tokens == n_tokens;
    /* off: no router scores either, so that off costs what --guanaco-prefetch none costs */
    int n_scored = 0;
    const float *scores = hook->engine->router_gate && hook->read_ahead_on
                              ? next_layer_scores(hook, topk, layer, n_tokens, &n_scored)
                              : NULL;
    guanaco_engine_read_ahead(hook->engine, same_tokens ? hook->previous_layer : -1, hook->previous_ids, layer,
                              hook->ids, k, n_tokens, scores, n_scored, atomic_load(&hook->engine->tokens_done),
                              hook->read_ahead_on);
    if (grow((void **)&hook->previous_ids, &hook->previous_capacity, n_ids * sizeof(int32_t)) == 0) {
        memcpy(hook->previous_ids, hook->ids, n_ids * sizeof(int32_t));
        hook->previous_layer = layer;
        hook->previous_tokens = n_tokens;
    } else {
        hook->previous_layer = -1;
    }
}

/* Marks the graph failed and stops its split: false at ask=false makes the scheduler skip the split's
   remaining nodes, so nothing reads the experts that could not be made resident. */
static bool fail(struct guanaco_hook *hook, int err) {
    int none = 0;
    atomic_compare_exchange_strong(&hook->error, &none, err);
    fflush(stderr);
    return false;
}

static bool guanaco_eval_callback(struct ggml_tensor *t, bool ask, void *user_data) {
    struct guanaco_hook *hook = user_data;
    const int layer = router_layer(hook->engine, t);
    const bool user_wants = hook->user_callback && hook->user_callback(t, true, hook->user_data);
    if (ask) {
        return (layer >= 0 && guanaco_engine_needs_router_ids(hook->engine)) || user_wants;
    }
    if (layer >= 0) {
        if (atomic_load(&hook->error)) {
            return false; /* this graph already failed: compute nothing more of it */
        }
        const uint64_t hook_start = guanaco_now_ns();
        int k = 0, n_tokens = 0;
        int err = read_router_ids(hook, t, &k, &n_tokens);
        if (err < 0) {
            guanaco_log_error("layer %d: cannot read the router's expert ids (%s): this batch fails", layer,
                              strerror(-err));
            return fail(hook, err);
        }
        {
            if (hook->engine->replay.n_records && k == hook->engine->manifest.n_expert_used) {
                overwrite_router_ids(hook, t, layer, k, n_tokens);
            }
            if (layer == hook->engine->first_moe_layer && hook->engine->predictor) {
                uint64_t now = guanaco_now_ns();
                report_timed(hook, now); /* first: it may end an epoch, and so decide this ubatch */
                hook->read_ahead_on = guanaco_engine_read_ahead_allowed(hook->engine, n_tokens);
                hook->ubatch_started_ns = now;
                hook->ubatch_tokens = n_tokens;
            }
            err = guanaco_engine_prepare_layer(hook->engine, layer, hook->ids, (size_t)k * (size_t)n_tokens,
                                               atomic_load(&hook->engine->tokens_done));
            if (err < 0) {
                /* The experts of this layer are not all readable: computing would use bytes we could not
                 * read (or fault on them). Stopping the split leaves them untouched, and the error reaches
                 * llama_decode through guanaco_hook_take_error. */
                guanaco_log_error("layer %d cannot be computed without its experts (%s): this batch fails", layer,
                                  strerror(-err));
                return fail(hook, err);
            }
            if (hook->engine->predictor) {
                read_ahead(hook, t, layer, k, n_tokens);
                if (layer == hook->engine->last_moe_layer && hook->ubatch_started_ns && !hook->ubatch_moe_end_ns) {
                    hook->ubatch_moe_end_ns = guanaco_now_ns();
                }
            }
            guanaco_engine_count_routing(hook->engine, layer, hook->ids, k, n_tokens);
            guanaco_engine_record_routing(hook->engine, hook->context_id, (uint32_t)hook->rows_seen[layer], layer,
                                          hook->ids, k, n_tokens);
            hook->rows_seen[layer] += (uint64_t)n_tokens;
        }
        atomic_fetch_add(&hook->engine->router_hook_ns, guanaco_now_ns() - hook_start);
    }
    /* false at ask=false makes the scheduler skip the rest of the split: only the user may say that. */
    return user_wants ? hook->user_callback(t, false, hook->user_data) : true;
}

int guanaco_hook_install(struct guanaco_engine *engine, ggml_backend_sched_eval_callback *callback,
                         void **user_data) {
    if (!engine) {
        return 0;
    }
    if (engine->repack && atomic_load(&engine->hooks) > 0) {
        /* an evicted arena slice reads as zeros, and the other context may be computing it (residency.h) */
        guanaco_log_error("experts that run repacked serve one context at a time; for several contexts at once "
                          "start with --guanaco-repack off");
        return -EBUSY;
    }
    struct guanaco_hook *hook = calloc(1, sizeof(*hook));
    if (!hook) {
        return -ENOMEM;
    }
    hook->engine = engine;
    hook->previous_layer = -1;
    hook->rows_seen = calloc((size_t)engine->manifest.n_layer, sizeof(*hook->rows_seen));
    if (!hook->rows_seen) {
        free(hook);
        return -ENOMEM;
    }
    hook->context_id = atomic_fetch_add(&engine->contexts_seen, 1);
    hook->user_callback = *callback;
    hook->user_data = *user_data;
    *callback = guanaco_eval_callback;
    *user_data = hook;
    if (atomic_fetch_add(&engine->hooks, 1) == 1 && engine->residency) {
        guanaco_residency_set_shared(engine->residency, true); /* before this context computes */
    }
    return 0;
}

void guanaco_hook_remove(ggml_backend_sched_eval_callback callback, void *user_data) {
    if (callback != guanaco_eval_callback || !user_data) {
        return;
    }
    struct guanaco_hook *hook = user_data;
    report_timed(hook, 0); /* the context's last ubatch: its MoE part */
    if (atomic_fetch_sub(&hook->engine->hooks, 1) == 2 && hook->engine->residency) {
        guanaco_residency_set_shared(hook->engine->residency, false); /* one context is left */
    }
    free(hook->ids);
    free(hook->rows_seen);
    free(hook->device_copy);
    free(hook->previous_ids);
    free(hook->next_scores);
    free(hook->gate_scratch);
    free(hook);
}

int guanaco_hook_take_error(ggml_backend_sched_eval_callback callback, void *user_data) {
    if (callback != guanaco_eval_callback || !user_data) {
        return 0;
    }
    struct guanaco_hook *hook = user_data;
    int finish_error = guanaco_engine_finish_graph(hook->engine); /* a call whose reads may still be landing */
    if (finish_error < 0) {
        guanaco_log_error("the last layer's reads or evictions failed while it computed (%s): this batch fails",
                          strerror(-finish_error));
        fflush(stderr);
    }
    int err = atomic_exchange(&hook->error, 0);
    err = err ? err : finish_error;
    if (atomic_load(&hook->engine->mapping_faulted)) {
        /* the graph read zeros where the file's bytes were: this result, and every later one, is void */
        if (!atomic_exchange(&hook->engine->told_mapping_faulted, 1)) {
            guanaco_log_error("the model file %s could not be read while running (it shrank, or the disk failed a "
                              "read the matmuls waited for; the fault was caught): this batch and every later one "
                              "fail; restart to use the file again",
                              hook->engine->manifest.shard_paths[0]);
            fflush(stderr);
        }
        return -EIO;
    }
    /* A trace the user asked for is broken (a full disk): fail one batch, so the run does not end with
       exit 0 as if the trace were whole. Decoding goes on afterwards, unrecorded, if the caller goes on. */
    int trace_error = atomic_load(&hook->engine->trace_error);
    if (err == 0 && trace_error && !atomic_exchange(&hook->engine->trace_error_returned, 1)) {
        guanaco_log_error("this batch fails because the routing trace could not be written");
        fflush(stderr);
        return trace_error;
    }
    return err;
}
