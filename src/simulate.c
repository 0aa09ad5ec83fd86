/*
 * simulate.c - owns the replay of a routing trace through a policy, counting
 * what the live engine would read and evict. It drives the policy exactly as
 * the engine does (access, then evict protecting the layer), so simulated hit
 * rates are the engine's.
 */
#include "simulate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int guanaco_request_trace_check(const struct guanaco_request_trace *trace) {
    if (!trace || trace->n_layer == 0 || trace->n_expert == 0 || !trace->expert_bytes ||
        (uint64_t)trace->n_layer * trace->n_expert > UINT32_MAX / 2 ||
        (trace->n_requests > 0 && (!trace->request_token || !trace->request_layer || !trace->request_start))) {
        return -EINVAL;
    }
    if (trace->n_requests == 0) {
        return 0;
    }
    if (trace->request_start[trace->n_requests] > 0 && !trace->experts) {
        return -EINVAL;
    }
    /* mark[slot] = 1 + the last request that named it: catches repeats inside a request */
    size_t n_slots = (size_t)trace->n_layer * trace->n_expert;
    size_t *mark = calloc(n_slots, sizeof(*mark));
    if (!mark) {
        return -ENOMEM;
    }
    int result = 0;
    for (size_t r = 0; r < trace->n_requests && result == 0; r++) {
        uint32_t layer = trace->request_layer[r];
        if (layer >= trace->n_layer || trace->expert_bytes[layer] == 0 ||
            trace->request_start[r + 1] < trace->request_start[r] ||
            (r > 0 && trace->request_token[r] < trace->request_token[r - 1])) {
            result = -EINVAL;
            break;
        }
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            uint32_t expert = trace->experts[i];
            size_t slot = (size_t)layer * trace->n_expert + expert;
            if (expert >= trace->n_expert || mark[slot] == r + 1) {
                result = -EINVAL;
                break;
            }
            mark[slot] = r + 1;
        }
    }
    free(mark);
    return result;
}

uint32_t guanaco_preload_count(uint64_t budget_bytes, uint64_t total_expert_bytes, uint32_t n_expert,
                               uint32_t max_per_layer) {
    if (total_expert_bytes == 0) {
        return 0;
    }
    double fit = (double)budget_bytes * (double)n_expert / (double)total_expert_bytes;
    uint32_t n = fit >= (double)n_expert ? n_expert : (uint32_t)fit;
    return max_per_layer && n > max_per_layer ? max_per_layer : n;
}

/* The engine's preload: each MoE layer's count of lowest-numbered experts, at token 0. */
static int preload_policy(const struct guanaco_request_trace *trace, const struct guanaco_policy_config *config,
                          struct guanaco_policy *policy, uint32_t *ids, uint32_t *victim_layers,
                          uint32_t *victim_experts, size_t n_slots) {
    uint64_t total = 0;
    for (uint32_t l = 0; l < trace->n_layer; l++) {
        total += trace->expert_bytes[l] * trace->n_expert;
    }
    uint32_t n = guanaco_preload_count(config->budget_bytes, total, trace->n_expert, config->max_per_layer);
    for (uint32_t e = 0; e < n; e++) {
        ids[e] = e;
    }
    for (uint32_t l = 0; l < trace->n_layer && n; l++) {
        size_t n_missing = 0, n_victims = 0;
        if (trace->expert_bytes[l] == 0) {
            continue;
        }
        int err = guanaco_policy_access(policy, l, ids, n, 0, victim_experts, &n_missing);
        if (err == 0) {
            err = guanaco_policy_evict(policy, l, victim_layers, victim_experts, n_slots, &n_victims);
        }
        if (err != 0) {
            return err;
        }
    }
    return 0;
}

int guanaco_simulate(const struct guanaco_request_trace *trace, const struct guanaco_policy_config *config,
                     bool preload, struct guanaco_replay_stats *stats) {
    memset(stats, 0, sizeof(*stats));
    int err = guanaco_request_trace_check(trace);
    if (err != 0 || !config) {
        return err ? err : -EINVAL;
    }
    struct guanaco_policy_config geometry = *config;
    geometry.n_layer = trace->n_layer;
    geometry.n_expert = trace->n_expert;
    geometry.expert_bytes = trace->expert_bytes;
    struct guanaco_policy *policy = NULL;
    err = guanaco_policy_create(&geometry, &policy);
    if (err != 0) {
        return err;
    }
    size_t n_slots = (size_t)trace->n_layer * trace->n_expert;
    uint32_t *missing = malloc(trace->n_expert * sizeof(*missing));
    uint32_t *victim_layers = malloc(n_slots * sizeof(*victim_layers));
    uint32_t *victim_experts = malloc(n_slots * sizeof(*victim_experts));
    if (!missing || !victim_layers || !victim_experts) {
        err = -ENOMEM;
    }
    if (err == 0 && preload) {
        err = preload_policy(trace, &geometry, policy, missing, victim_layers, victim_experts, n_slots);
    }
    for (size_t r = 0; r < trace->n_requests && err == 0; r++) {
        uint32_t layer = trace->request_layer[r];
        size_t start = trace->request_start[r], n = trace->request_start[r + 1] - start;
        size_t n_missing = 0, n_victims = 0;
        err = guanaco_policy_access(policy, layer, trace->experts + start, n, trace->request_token[r], missing,
                                    &n_missing);
        if (err == 0) {
            /* n_slots victims always suffice, so -ENOBUFS cannot happen here */
            err = guanaco_policy_evict(policy, layer, victim_layers, victim_experts, n_slots, &n_victims);
        }
        stats->requests++;
        stats->accesses += n;
        stats->misses += n_missing;
        stats->hits += n - n_missing;
        stats->bytes_read += n_missing * trace->expert_bytes[layer];
        stats->evictions += n_victims;
        uint64_t resident = guanaco_policy_resident_bytes(policy);
        if (resident > stats->peak_resident_bytes) {
            stats->peak_resident_bytes = resident;
        }
        if (resident > geometry.budget_bytes && resident - geometry.budget_bytes > stats->worst_overshoot_bytes) {
            stats->worst_overshoot_bytes = resident - geometry.budget_bytes;
        }
    }
    free(missing);
    free(victim_layers);
    free(victim_experts);
    guanaco_policy_free(policy);
    return err;
}
