/*
 * simulate.h - owns replaying a recorded routing trace against a replacement
 * policy (policy.h) and the trace format that belady.h shares. Pure: no I/O;
 * the caller loads the trace however it likes.
 *
 * A trace is a sequence of requests. A request is the distinct experts one
 * MoE layer needed for one token (or ubatch), all of which must be resident
 * at once; requests appear in execution order, so decode sweeps the layers of
 * token 0, then of token 1, and so on.
 */
#ifndef GUANACO_SIMULATE_H
#define GUANACO_SIMULATE_H

#include "policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct guanaco_request_trace {
    uint32_t n_layer;
    uint32_t n_expert;
    const uint64_t *expert_bytes;   /* n_layer entries; 0 = dense layer, which no request may name */
    size_t n_requests;
    const uint64_t *request_token;  /* per request: its token index, never decreasing (the policy's `now`) */
    const uint32_t *request_layer;  /* per request */
    const size_t *request_start;    /* n_requests + 1 offsets: request r is experts[start[r], start[r+1]) */
    const uint32_t *experts;        /* expert ids, distinct within a request */
};

struct guanaco_replay_stats {
    uint64_t requests;
    uint64_t accesses;              /* (request, expert) pairs */
    uint64_t hits;                  /* accesses that needed no read */
    uint64_t misses;
    uint64_t bytes_read;
    uint64_t evictions;
    uint64_t peak_resident_bytes;   /* highest resident bytes after a request's evictions */
    uint64_t worst_overshoot_bytes; /* highest excess over the budget after a request's evictions */
};

/* 0 when the trace is well formed, else -EINVAL. O(accesses); allocates one mark per slot. */
int guanaco_request_trace_check(const struct guanaco_request_trace *trace);

/*
 * Replay `trace` against a policy made from `config`, whose n_layer,
 * n_expert and expert_bytes are taken from the trace. Each request is one
 * access (now = its token) followed by one evict protecting its layer.
 * With `preload`, the policy first gets what the engine's --guanaco-preload
 * loads (guanaco_preload_count lowest-numbered experts of every MoE layer,
 * at token 0), and the stats count only the replay after it.
 * 0, -EINVAL (bad trace or config) or -ENOMEM.
 */
int guanaco_simulate(const struct guanaco_request_trace *trace, const struct guanaco_policy_config *config,
                     bool preload, struct guanaco_replay_stats *stats);

/*
 * How many experts --guanaco-preload puts in each MoE layer: the layer's
 * share of the budget in proportion to its expert bytes, in whole experts,
 * which is the same count for every layer (budget * n_expert / all expert
 * bytes), at most n_expert and at most max_per_layer when that is set.
 */
uint32_t guanaco_preload_count(uint64_t budget_bytes, uint64_t total_expert_bytes, uint32_t n_expert,
                               uint32_t max_per_layer);

#endif
