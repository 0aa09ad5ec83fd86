/*
 * heap.h - owns the one indexed binary heap of the tree: ids (small
 * integers) ordered by a caller's "before" relation, with the position of
 * every id kept so that an id can be removed or re-ordered in place in
 * O(log n). The policies (one heap of resident slots per layer, the layer
 * heap, guanaco's pins) and Belady's replay (slots by next use) all use it.
 * libc and ggml offer no indexed heap, and a lazy-deletion heap would grow
 * with every re-keying.
 *
 * The heap owns no memory: items (room for every id it will hold at once)
 * and position (one entry per id, GUANACO_HEAP_ABSENT when absent) are the
 * caller's, so heaps over disjoint ids may share one position array.
 */
#ifndef GUANACO_HEAP_H
#define GUANACO_HEAP_H

#include <stdbool.h>
#include <stdint.h>

#define GUANACO_HEAP_ABSENT UINT32_MAX

/* Whether id a comes out before id b. It must be a strict total order on the ids held at once. */
typedef bool (*guanaco_heap_before_fn)(const void *context, uint32_t a, uint32_t b);

struct guanaco_heap {
    uint32_t *items;
    uint32_t count;
    uint32_t *position; /* id -> index in items, GUANACO_HEAP_ABSENT when absent */
    guanaco_heap_before_fn before;
    const void *context;
};

/* The order by (tier, key, id), smallest first: a context for guanaco_heap_key_before. */
struct guanaco_heap_keys {
    const double *keys;   /* id -> key */
    const uint8_t *tiers; /* id -> tier, compared before the key; NULL when unused */
};
bool guanaco_heap_key_before(const void *keys, uint32_t a, uint32_t b);

/* An empty heap; position is left as it is (the caller fills it with GUANACO_HEAP_ABSENT once). */
struct guanaco_heap guanaco_heap_make(uint32_t *items, uint32_t *position, guanaco_heap_before_fn before,
                                      const void *context);

static inline bool guanaco_heap_contains(const struct guanaco_heap *heap, uint32_t id) {
    return heap->position[id] != GUANACO_HEAP_ABSENT;
}

/* The first id, or GUANACO_HEAP_ABSENT when empty. */
static inline uint32_t guanaco_heap_top(const struct guanaco_heap *heap) {
    return heap->count ? heap->items[0] : GUANACO_HEAP_ABSENT;
}

/* id must be absent. */
void guanaco_heap_push(struct guanaco_heap *heap, uint32_t id);
/* id must be present. */
void guanaco_heap_remove(struct guanaco_heap *heap, uint32_t id);
/* Removes and returns the first id; the heap must not be empty. */
uint32_t guanaco_heap_pop(struct guanaco_heap *heap);
/* After the order of a present id changed, wherever it moved. */
void guanaco_heap_update(struct guanaco_heap *heap, uint32_t id);

#endif
