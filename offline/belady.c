/*
 * belady.c - owns the MIN replay behind belady.h. One backward pass records,
 * for every access, the request where the same (layer, expert) is next
 * needed; the forward pass keeps resident slots in an indexed heap (heap.h),
 * farthest next use first, updated in place on each hit, so the heap never
 * holds more than the resident slots (a lazy-deletion heap would grow with every hit:
 * gigabytes at 38M accesses).
 */
#include "belady.h"
#include "heap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NEVER UINT32_MAX /* next use of a slot that is not needed again */

/* Farthest next use first; ties by slot so the replay is deterministic. */
static bool farther(const void *next_use, uint32_t a, uint32_t b) {
    const uint32_t *next = next_use;
    if (next[a] != next[b]) {
        return next[a] > next[b];
    }
    return a > b;
}

int guanaco_belady(const struct guanaco_request_trace *trace, uint64_t budget_bytes, struct guanaco_replay_stats *stats,
                   bool *exact) {
    memset(stats, 0, sizeof(*stats));
    *exact = true;
    int err = guanaco_request_trace_check(trace);
    if (err != 0) {
        return err;
    }
    if (trace->n_requests >= NEVER) {
        return -EINVAL;
    }
    uint64_t size_seen = 0;
    for (size_t r = 0; r < trace->n_requests; r++) {
        uint64_t bytes = trace->expert_bytes[trace->request_layer[r]];
        if (size_seen != 0 && bytes != size_seen) {
            *exact = false;
        }
        size_seen = bytes;
    }
    size_t n_slots = (size_t)trace->n_layer * trace->n_expert;
    size_t n_accesses = trace->n_requests ? trace->request_start[trace->n_requests] : 0;
    uint32_t *next_of_access = malloc((n_accesses ? n_accesses : 1) * sizeof(*next_of_access));
    uint32_t *slot_next = malloc(n_slots * sizeof(*slot_next)); /* backward: next request; forward: heap key */
    uint32_t *items = malloc(n_slots * sizeof(*items));
    uint32_t *position = malloc(n_slots * sizeof(*position));
    uint32_t *current = calloc(n_slots, sizeof(*current));      /* 1 + the request that needs the slot now */
    uint32_t *deferred = malloc(trace->n_expert * sizeof(*deferred));
    if (!next_of_access || !slot_next || !items || !position || !current || !deferred) {
        err = -ENOMEM;
        goto out;
    }

    for (size_t s = 0; s < n_slots; s++) {
        slot_next[s] = NEVER;
        position[s] = GUANACO_HEAP_ABSENT;
    }
    for (size_t r = trace->n_requests; r-- > 0;) {
        size_t base = (size_t)trace->request_layer[r] * trace->n_expert;
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            size_t slot = base + trace->experts[i];
            next_of_access[i] = slot_next[slot];
            slot_next[slot] = (uint32_t)r;
        }
    }

    struct guanaco_heap heap = guanaco_heap_make(items, position, farther, slot_next);
    uint64_t resident_bytes = 0;
    for (size_t r = 0; r < trace->n_requests; r++) {
        uint32_t layer = trace->request_layer[r];
        uint64_t bytes = trace->expert_bytes[layer];
        size_t base = (size_t)layer * trace->n_expert;
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            uint32_t slot = (uint32_t)(base + trace->experts[i]);
            current[slot] = (uint32_t)r + 1;
            slot_next[slot] = next_of_access[i];
            if (guanaco_heap_contains(&heap, slot)) {
                stats->hits++;
                guanaco_heap_update(&heap, slot); /* its next use only moved later */
            } else {
                stats->misses++;
                stats->bytes_read += bytes;
                resident_bytes += bytes;
                guanaco_heap_push(&heap, slot);
            }
        }
        stats->requests++;
        stats->accesses += trace->request_start[r + 1] - trace->request_start[r];
        uint32_t n_deferred = 0;
        while (resident_bytes > budget_bytes && heap.count > 0) {
            uint32_t slot = guanaco_heap_pop(&heap);
            if (current[slot] == r + 1) {
                deferred[n_deferred++] = slot; /* needed by this request */
                continue;
            }
            resident_bytes -= trace->expert_bytes[slot / trace->n_expert];
            stats->evictions++;
        }
        for (uint32_t i = 0; i < n_deferred; i++) {
            guanaco_heap_push(&heap, deferred[i]);
        }
        if (resident_bytes > stats->peak_resident_bytes) {
            stats->peak_resident_bytes = resident_bytes;
        }
        if (resident_bytes > budget_bytes && resident_bytes - budget_bytes > stats->worst_overshoot_bytes) {
            stats->worst_overshoot_bytes = resident_bytes - budget_bytes;
        }
    }
out:
    free(next_of_access);
    free(slot_next);
    free(items);
    free(position);
    free(current);
    free(deferred);
    return err;
}
