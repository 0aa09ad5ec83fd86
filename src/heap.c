/*
 * heap.c - owns the indexed binary heap behind heap.h: sift up and down with
 * the position of every id kept current, so remove and update work in place.
 */
#include "heap.h"

bool guanaco_heap_key_before(const void *context, uint32_t a, uint32_t b) {
    const struct guanaco_heap_keys *order = context;
    if (order->tiers && order->tiers[a] != order->tiers[b]) {
        return order->tiers[a] < order->tiers[b];
    }
    if (order->keys[a] != order->keys[b]) {
        return order->keys[a] < order->keys[b];
    }
    return a < b; /* ties by id: decisions never depend on history beyond the keys */
}

struct guanaco_heap guanaco_heap_make(uint32_t *items, uint32_t *position, guanaco_heap_before_fn before,
                                      const void *context) {
    return (struct guanaco_heap){.items = items, .position = position, .before = before, .context = context};
}

static void place(struct guanaco_heap *heap, uint32_t index, uint32_t id) {
    heap->items[index] = id;
    heap->position[id] = index;
}

static void sift_up(struct guanaco_heap *heap, uint32_t index) {
    uint32_t id = heap->items[index];
    while (index > 0) {
        uint32_t parent = (index - 1) / 2;
        if (!heap->before(heap->context, id, heap->items[parent])) {
            break;
        }
        place(heap, index, heap->items[parent]);
        index = parent;
    }
    place(heap, index, id);
}

static void sift_down(struct guanaco_heap *heap, uint32_t index) {
    uint32_t id = heap->items[index];
    for (;;) {
        uint32_t child = 2 * index + 1;
        if (child >= heap->count) {
            break;
        }
        if (child + 1 < heap->count && heap->before(heap->context, heap->items[child + 1], heap->items[child])) {
            child++;
        }
        if (!heap->before(heap->context, heap->items[child], id)) {
            break;
        }
        place(heap, index, heap->items[child]);
        index = child;
    }
    place(heap, index, id);
}

void guanaco_heap_push(struct guanaco_heap *heap, uint32_t id) {
    heap->items[heap->count] = id;
    heap->position[id] = heap->count;
    heap->count++;
    sift_up(heap, heap->count - 1);
}

void guanaco_heap_remove(struct guanaco_heap *heap, uint32_t id) {
    uint32_t index = heap->position[id];
    heap->position[id] = GUANACO_HEAP_ABSENT;
    heap->count--;
    if (index == heap->count) {
        return;
    }
    uint32_t moved = heap->items[heap->count];
    place(heap, index, moved);
    sift_up(heap, index);
    sift_down(heap, heap->position[moved]);
}

uint32_t guanaco_heap_pop(struct guanaco_heap *heap) {
    uint32_t top = heap->items[0];
    guanaco_heap_remove(heap, top);
    return top;
}

void guanaco_heap_update(struct guanaco_heap *heap, uint32_t id) {
    sift_up(heap, heap->position[id]);
    sift_down(heap, heap->position[id]);
}
