/*
 * slot_pool.c - owns the 2 MiB-aligned, huge-page-advised chunks that fixed
 * slots are carved from, and the given-back ranges taken again before new
 * carving (slot_pool.h says why).
 */
#include "slot_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES (2u << 20)

static uint64_t round_up(uint64_t x, uint64_t to) {
    return (x + to - 1) / to * to;
}

void guanaco_slot_pool_init(struct guanaco_slot_pool *pool, uint64_t chunk_bytes) {
    memset(pool, 0, sizeof(*pool));
    pool->chunk_bytes = round_up(chunk_bytes ? chunk_bytes : HUGE_PAGE_BYTES, HUGE_PAGE_BYTES);
    pool->huge = true;
}

static int grow(struct guanaco_slot_range **ranges, size_t *capacity, size_t n) {
    if (n < *capacity) {
        return 0;
    }
    size_t wanted = *capacity ? 2 * *capacity : 16;
    struct guanaco_slot_range *grown = realloc(*ranges, wanted * sizeof(*grown));
    if (!grown) {
        return -ENOMEM;
    }
    *ranges = grown;
    *capacity = wanted;
    return 0;
}

/* Anonymous memory at a huge-page boundary: the mapping is over-allocated by one huge page and trimmed. */
static char *map_chunk(struct guanaco_slot_pool *pool, uint64_t length) {
    char *mapped = mmap(NULL, length + HUGE_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
        return NULL;
    }
    char *aligned = (char *)round_up((uint64_t)(uintptr_t)mapped, HUGE_PAGE_BYTES);
    if (aligned > mapped) {
        munmap(mapped, (size_t)(aligned - mapped));
    }
    char *tail = aligned + length, *mapped_end = mapped + length + HUGE_PAGE_BYTES;
    if (tail < mapped_end) {
        munmap(tail, (size_t)(mapped_end - tail));
    }
    /* Where the kernel has no transparent huge pages the chunk still serves, in small pages. */
    if (madvise(aligned, (size_t)length, MADV_HUGEPAGE) != 0) {
        pool->huge = false;
    }
    return aligned;
}

static int add_chunk(struct guanaco_slot_pool *pool, uint64_t length) {
    if (grow(&pool->chunks, &pool->chunk_capacity, pool->n_chunks) != 0) {
        return -ENOMEM;
    }
    char *chunk = map_chunk(pool, length);
    if (!chunk) {
        return -ENOMEM;
    }
    /* sorted by address, for owns()'s binary search */
    size_t at = pool->n_chunks;
    while (at > 0 && pool->chunks[at - 1].at > chunk) {
        pool->chunks[at] = pool->chunks[at - 1];
        at--;
    }
    pool->chunks[at] = (struct guanaco_slot_range){.at = chunk, .length = length};
    pool->n_chunks++;
    pool->next = chunk;
    pool->end = chunk + length;
    return 0;
}

/* Adds [at, at + length) to the empty ranges; false without memory for the entry. */
static bool add_empty(struct guanaco_slot_pool *pool, char *at, uint64_t length) {
    if (length == 0) {
        return true;
    }
    if (grow(&pool->empty, &pool->empty_capacity, pool->n_empty) != 0) {
        return false;
    }
    pool->empty[pool->n_empty++] = (struct guanaco_slot_range){.at = at, .length = length};
    return true;
}

char *guanaco_slot_pool_take(struct guanaco_slot_pool *pool, uint64_t length) {
    size_t best = pool->n_empty;
    for (size_t i = 0; i < pool->n_empty; i++) {
        if (pool->empty[i].length >= length && (best == pool->n_empty || pool->empty[i].length < pool->empty[best].length)) {
            best = i;
        }
    }
    if (best < pool->n_empty) {
        struct guanaco_slot_range *range = &pool->empty[best];
        char *slot = range->at;
        range->at += length;
        range->length -= length;
        if (range->length == 0) {
            *range = pool->empty[--pool->n_empty];
        }
        return slot;
    }
    if ((uint64_t)(pool->end - pool->next) < length) {
        /* the old chunk's uncarved rest stays empty for a shorter slot */
        if (pool->next && !add_empty(pool, pool->next, (uint64_t)(pool->end - pool->next))) {
            errno = ENOMEM;
            return NULL;
        }
        pool->next = pool->end = NULL;
        if (add_chunk(pool, length > pool->chunk_bytes ? round_up(length, HUGE_PAGE_BYTES) : pool->chunk_bytes) != 0) {
            errno = ENOMEM;
            return NULL;
        }
    }
    char *slot = pool->next;
    pool->next += length;
    return slot;
}

bool guanaco_slot_pool_owns(const struct guanaco_slot_pool *pool, const void *at) {
    const char *p = at;
    size_t low = 0, high = pool->n_chunks;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        const struct guanaco_slot_range *chunk = &pool->chunks[middle];
        if (p < chunk->at) {
            high = middle;
        } else if (p >= chunk->at + chunk->length) {
            low = middle + 1;
        } else {
            return true;
        }
    }
    return false;
}

int guanaco_slot_pool_give(struct guanaco_slot_pool *pool, char *at, uint64_t length, bool remap) {
    if (remap) {
        /* MAP_FIXED replaces the other mapping in one step: no moment with a hole another thread's mmap could
           take. The new mapping merges with the chunk's where the advice matches. */
        if (mmap(at, (size_t)length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
            return -errno;
        }
        if (pool->huge) {
            (void)madvise(at, (size_t)length, MADV_HUGEPAGE);
        }
    } else if (madvise(at, (size_t)length, MADV_DONTNEED) != 0) {
        return -errno;
    }
    return add_empty(pool, at, length) ? 0 : -ENOMEM;
}

void guanaco_slot_pool_destroy(struct guanaco_slot_pool *pool) {
    for (size_t i = 0; i < pool->n_chunks; i++) {
        munmap(pool->chunks[i].at, (size_t)pool->chunks[i].length);
    }
    free(pool->chunks);
    free(pool->empty);
    memset(pool, 0, sizeof(*pool));
}
