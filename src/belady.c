/*
 * belady.c - owns the MIN replay behind belady.h. One backward pass records,
 * for every access, the request where the same (layer, expert) is next
 * needed; the forward pass keeps resident slots in an indexed max-heap on
 * that index, updated in place on each hit, so the heap never holds more
 * than the resident slots (a lazy-deletion heap would grow with every hit:
 * gigabytes at 38M accesses).
 */
#include "belady.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NEVER UINT32_MAX /* next use of a slot that is not needed again */
#define ABSENT UINT32_MAX

struct next_use_heap {
    uint32_t *items;
    uint32_t *position; /* slot -> index, ABSENT when not resident */
    const uint32_t *next_use;
    uint32_t count;
};

/* Farthest next use first; ties by slot so the replay is deterministic. */
static int farther(const struct next_use_heap *heap, uint32_t a, uint32_t b) {
    if (heap->next_use[a] != heap->next_use[b]) {
        return heap->next_use[a] > heap->next_use[b];
    }
    return a > b;
}

static void place(struct next_use_heap *heap, uint32_t index, uint32_t slot) {
    heap->items[index] = slot;
    heap->position[slot] = index;
}

static void sift_up(struct next_use_heap *heap, uint32_t index) {
    uint32_t slot = heap->items[index];
    while (index > 0 && farther(heap, slot, heap->items[(index - 1) / 2])) {
        place(heap, index, heap->items[(index - 1) / 2]);
        index = (index - 1) / 2;
    }
    place(heap, index, slot);
}

static void sift_down(struct next_use_heap *heap, uint32_t index) {
    uint32_t slot = heap->items[index];
    for (;;) {
        uint32_t child = 2 * index + 1;
        if (child >= heap->count) {
            break;
        }
        if (child + 1 < heap->count && farther(heap, heap->items[child + 1], heap->items[child])) {
            child++;
        }
        if (!farther(heap, heap->items[child], slot)) {
            break;
        }
        place(heap, index, heap->items[child]);
        index = child;
    }
    place(heap, index, slot);
}

static void push(struct next_use_heap *heap, uint32_t slot) {
    place(heap, heap->count++, slot);
    sift_up(heap, heap->count - 1);
}

static uint32_t pop(struct next_use_heap *heap) {
    uint32_t top = heap->items[0];
    heap->position[top] = ABSENT;
    if (--heap->count > 0) {
        place(heap, 0, heap->items[heap->count]);
        sift_down(heap, 0);
    }
    return top;
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
        position[s] = ABSENT;
    }
    for (size_t r = trace->n_requests; r-- > 0;) {
        size_t base = (size_t)trace->request_layer[r] * trace->n_expert;
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            size_t slot = base + trace->experts[i];
            next_of_access[i] = slot_next[slot];
            slot_next[slot] = (uint32_t)r;
        }
    }

    struct next_use_heap heap = {.items = items, .position = position, .next_use = slot_next};
    uint64_t resident_bytes = 0;
    for (size_t r = 0; r < trace->n_requests; r++) {
        uint32_t layer = trace->request_layer[r];
        uint64_t bytes = trace->expert_bytes[layer];
        size_t base = (size_t)layer * trace->n_expert;
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            uint32_t slot = (uint32_t)(base + trace->experts[i]);
            current[slot] = (uint32_t)r + 1;
            slot_next[slot] = next_of_access[i];
            if (position[slot] != ABSENT) {
                stats->hits++;
                sift_up(&heap, position[slot]); /* its next use only moved later */
            } else {
                stats->misses++;
                stats->bytes_read += bytes;
                resident_bytes += bytes;
                push(&heap, slot);
            }
        }
        stats->requests++;
        stats->accesses += trace->request_start[r + 1] - trace->request_start[r];
        uint32_t n_deferred = 0;
        while (resident_bytes > budget_bytes && heap.count > 0) {
            uint32_t slot = pop(&heap);
            if (current[slot] == r + 1) {
                deferred[n_deferred++] = slot; /* needed by this request */
                continue;
            }
            resident_bytes -= trace->expert_bytes[slot / trace->n_expert];
            stats->evictions++;
        }
        for (uint32_t i = 0; i < n_deferred; i++) {
            push(&heap, deferred[i]);
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
