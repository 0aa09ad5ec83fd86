/*
 * engine.h - the engine's internals shared by engine.c (lifecycle, mapping,
 * summary) and hook.c (the router callback). Not part of the public API.
 */
#ifndef GUANACO_ENGINE_H
#define GUANACO_ENGINE_H

#include "guanaco.h"
#include "manifest.h"
#include "predictor.h"
#include "read_ahead_throttle.h"
#include "residency.h"
#include "router_gate.h"
#include "trace.h"

#include <pthread.h>
#include <stdatomic.h>

struct guanaco_engine {
    struct guanaco_manifest manifest;
    struct guanaco_options options;
    bool dry_run;                  /* the loader's memory-fit pass: decide, map nothing, say nothing */
    bool repack_allowed;           /* llama.cpp may repack (no --no-repack): see expert_repack.h */
    struct guanaco_expert_repack *repack; /* arenas of the experts that run repacked, or NULL */
    size_t repacked_tensors;       /* expert tensors that compute from an arena */
    struct ggml_tensor **expert_tensors;  /* per manifest tensor: llama.cpp's tensor, or NULL when unused */
    int *moe_layer_of;             /* n_layer entries: 1 when the layer has experts */
    _Atomic uint64_t *access_count; /* n_layer * n_expert: times the router chose (layer, expert) */
    _Atomic uint64_t routed_tokens; /* tokens seen, summed over MoE layers */
    _Atomic uint64_t router_calls;  /* ffn_moe_topk evaluations */
    _Atomic uint64_t invalid_ids;   /* ids outside [0, n_expert): counted, never used */
    /* wall time in the router hook, all contexts: the engine's own work between a MoE layer's router and its
       experts' matmuls, while the other compute threads wait for the next graph split (status lines) */
    _Atomic uint64_t router_hook_ns;
    _Atomic int hooks;              /* contexts currently hooked */
    _Atomic uint32_t contexts_seen; /* numbers the hooks: a recorded trace's sequence id */
    struct guanaco_trace_writer *trace_writer; /* --guanaco-trace-out, or NULL */
    struct guanaco_trace replay;               /* --guanaco-trace-replay: n_records 0 when off */
    size_t **replay_records_of_layer;          /* per layer: indices of the replay's records, in order */
    size_t *replay_records_in_layer;
    _Atomic uint64_t replayed_rows;
    _Atomic uint64_t replay_wraps;  /* times a layer's recorded routing ran out and started over */
    _Atomic int trace_error;        /* first trace write error; reported at close */
    struct guanaco_residency *residency;       /* --guanaco-ram / --guanaco-max-experts, or NULL */
    int *shard_fds;                            /* residency reads: one O_RDONLY fd per shard */
    struct guanaco_residency_tensor **residency_tensors; /* per layer, for the residency config */
    uint32_t *residency_tensors_in_layer;
    int *shard_direct_fds;                     /* --guanaco-load direct: O_DIRECT fds, else -1 */
    int *shard_cache_fds, *shard_cache_direct_fds; /* --guanaco-repack-cache: each shard's cache, else -1 */
    int last_moe_layer;                        /* a token is done when it leaves this layer */
    int first_moe_layer;                       /* a prompt ubatch's progress starts here; -1 before the manifest */
    _Atomic uint64_t prompt_started_ns, prompt_started_bytes; /* the prompt ubatch now reading: its progress line */
    _Atomic uint64_t tokens_done;              /* tokens through the last MoE layer, all contexts */
    pthread_mutex_t status_lock;               /* one status line at a time, and status_last */
    struct guanaco_residency_stats status_last; /* at the previous status line */
    struct guanaco_residency_stats after_preload; /* what the preload did, left out of the closing line */
    uint64_t status_last_tokens, status_last_ns, status_last_hook_ns;
    struct guanaco_predictor *predictor;       /* --guanaco-prefetch, or NULL when there is no read-ahead */
    pthread_mutex_t predictor_lock;            /* the predictor and the scratch arrays below */
    uint32_t *predicted;                       /* n_expert: the guess handed to the residency engine */
    uint8_t *predictor_absent;                 /* n_expert: the next layer's experts not resident, for gate */
    struct guanaco_router_gate *router_gate;   /* --guanaco-prefetch gate: each layer's router, else NULL */
    struct guanaco_read_ahead_throttle throttle[2]; /* decode, prompt ubatches; under predictor_lock */
    bool prompt_read_ahead;                    /* page-cache loading: a prompt reads the next layer ahead */
    bool decode_reads_no_guesses;              /* fixed slots: only prompts read ahead (bench/PIPELINE.md) */
    uint64_t auto_memory;                      /* --guanaco-ram auto: the memory it divides; 0 otherwise */
    uint64_t process_memory;                   /* the cgroup limit or MemAvailable at load, for the stream buffers */
    uint64_t budget_bytes;                     /* the budget in force */
    int stream_direct_told;                    /* -1, or whether the last line said the stream buffers are used */
    uint64_t stream_loan_told;                 /* and what it said the budget lends them */
    _Atomic int64_t context_bytes;             /* host KV cache and compute buffers of the live contexts */
    char **guarded_mappings;                   /* per shard: the mapping mapping_guard watches, or NULL */
    _Atomic bool holds_every_expert;           /* guanaco_engine_needs_router_ids: false while this holds */
    _Atomic int mapping_faulted;               /* a read past the file's end was turned into zeros: fail */
    _Atomic int told_mapping_faulted;
    _Atomic int trace_error_returned;          /* trace_error has failed a graph already */
    bool asks_expert_weights;                  /* ggml-cpu's MUL_MAT_ID asks this engine's residency per expert */
};

/* A graph has computed: the last layer's call, if it returned with reads in flight (--guanaco-overlap-layer
   with direct loading), ends now. 0 or its error, which fails the graph. */
int guanaco_engine_finish_graph(struct guanaco_engine *engine);

/* Record one router decision of context `sequence` to --guanaco-trace-out, if on. */
void guanaco_engine_record_routing(struct guanaco_engine *engine, uint32_t sequence, uint32_t first_token,
                                   int layer, const int32_t *ids, int k, int n_tokens);

/* The replay's expert ids for the `row`-th routing of `layer` in one context
 * (wrapping around when the recording is shorter), or NULL when not replaying. */
const int32_t *guanaco_engine_replay_ids(struct guanaco_engine *engine, int layer, uint64_t row);

/*
 * Whether the hook must stop the graph at each MoE router to read its ids.
 * Not while every expert is resident under a budget that keeps them all
 * (then no decision of the router can cause a read or an eviction) and no
 * replay, trace or audit needs the ids: each stop is a graph split and a
 * thread synchronisation, about 9% of a two-thread MXFP4 prompt
 * (bench/COMPUTE_PARITY.md). Routing counts and status lines pause
 * meanwhile. A budget change asks again.
 */
bool guanaco_engine_needs_router_ids(const struct guanaco_engine *engine);

/* Make every expert in `ids` of `layer` resident before the layer computes (no-op without a budget).
 * On failure it has printed why; the caller must not let the layer compute. */
int guanaco_engine_prepare_layer(struct guanaco_engine *engine, int layer, const int32_t *ids, size_t n_ids,
                                 uint64_t token);

/*
 * After `layer` is prepared: teach the predictor the transition from the
 * context's previous MoE layer (prev_layer < 0: none), then start reading
 * what it predicts for the next MoE layer. A ubatch that needs most of the
 * layer (a prompt) reads the whole next layer ahead instead; a decode guess
 * is read only when it is likely enough to pay for itself. `next_scores`
 * (n_scored x n_expert, or NULL) are the next layer's router scores for
 * these tokens or an even sample of n_scored of them, for the gate
 * predictor. With issue false (the throttle keeps read-ahead off for this
 * ubatch) the predictor only learns.
 */
void guanaco_engine_read_ahead(struct guanaco_engine *engine, int prev_layer, const int32_t *prev_ids, int layer,
                               const int32_t *ids, int k, int n_tokens, const float *next_scores, int n_scored,
                               uint64_t token, bool issue);

/* Whether a ubatch of n_tokens that starts now reads ahead (issue above), as the throttle says; it keeps
   that answer to its end, and reports its time from its first MoE layer through its last one's stall. */
bool guanaco_engine_read_ahead_allowed(struct guanaco_engine *engine, int n_tokens);
void guanaco_engine_read_ahead_timed(struct guanaco_engine *engine, int n_tokens, bool was_on, uint64_t ns);


/* /metrics (metrics.c): an engine with a budget is listed from attach until close. */
void guanaco_metrics_register(struct guanaco_engine *engine);
void guanaco_metrics_unregister(struct guanaco_engine *engine);

/* Count one router decision: `n_tokens` rows of `k` expert ids for `layer`. */
void guanaco_engine_count_routing(struct guanaco_engine *engine, int layer, const int32_t *ids, int k,
                                  int n_tokens);

#endif
