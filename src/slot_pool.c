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

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older headers lack it, and older kernels answer EINVAL */
#endif

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

static int compare_addresses(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    return x < y ? -1 : x > y;
}

/* Sorts the recorded pages and drops repeats: the list never outgrows the pool's huge pages. */
static void unique_split(struct guanaco_slot_pool *pool) {
    if (pool->n_split < 2) {
        return;
    }
    qsort(pool->split, pool->n_split, sizeof(*pool->split), compare_addresses);
    size_t kept = 0;
    for (size_t i = 0; i < pool->n_split; i++) {
        if (kept == 0 || pool->split[kept - 1] != pool->split[i]) {
            pool->split[kept++] = pool->split[i];
        }
    }
    pool->n_split = kept;
}

/* Records the huge page at `page` as split; without memory for the entry it stays small (only slower). */
static void record_split(struct guanaco_slot_pool *pool, char *page) {
    if (pool->n_split == pool->split_capacity) {
        unique_split(pool);
    }
    if (pool->n_split == pool->split_capacity) {
        size_t wanted = pool->split_capacity ? 2 * pool->split_capacity : 64;
        char **grown = realloc(pool->split, wanted * sizeof(*grown));
        if (!grown) {
            return;
        }
        pool->split = grown;
        pool->split_capacity = wanted;
    }
    pool->split[pool->n_split++] = page;
}

/* The huge pages at either end of [at, at + length) that it covers only in part: emptying it splits them. */
static void record_split_ends(struct guanaco_slot_pool *pool, char *at, uint64_t length) {
    if (!pool->huge || pool->collapse_refused) {
        return;
    }
    uintptr_t begin = (uintptr_t)at, end = begin + length;
    if (begin % HUGE_PAGE_BYTES) {
        record_split(pool, (char *)(begin - begin % HUGE_PAGE_BYTES));
    }
    if (end % HUGE_PAGE_BYTES) {
        record_split(pool, (char *)(end - end % HUGE_PAGE_BYTES));
    }
}

static int compare_ranges(const void *a, const void *b) {
    const struct guanaco_slot_range *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Whether no taken slot has a byte in the huge page at `page`: the empty ranges (sorted by address) and the
   newest chunk's uncarved part cover it. */
static bool page_empty(const struct guanaco_slot_pool *pool, const char *page) {
    const char *page_end = page + HUGE_PAGE_BYTES;
    uint64_t empty = 0;
    if (pool->next && pool->next < page_end && pool->end > page) {
        empty += (uint64_t)((pool->end < page_end ? pool->end : page_end) - (pool->next > page ? pool->next : page));
    }
    size_t low = 0, high = pool->n_empty; /* the first range that ends after the page starts */
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (pool->empty[middle].at + pool->empty[middle].length <= page) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    for (size_t i = low; i < pool->n_empty && pool->empty[i].at < page_end; i++) {
        const char *from = pool->empty[i].at > page ? pool->empty[i].at : page;
        const char *to = pool->empty[i].at + pool->empty[i].length;
        empty += (uint64_t)((to < page_end ? to : page_end) - from);
    }
    return empty >= HUGE_PAGE_BYTES;
}

long guanaco_slot_pool_collapse(struct guanaco_slot_pool *pool) {
    if (pool->collapse_refused) {
        return -EOPNOTSUPP;
    }
    /* An empty range asks only whether the kernel knows the advice. */
    if (pool->n_split && madvise(pool->split[0], 0, MADV_COLLAPSE) != 0) {
        pool->collapse_refused = true;
        pool->n_split = 0;
        return -EOPNOTSUPP;
    }
    unique_split(pool);
    /* take() is best fit whatever the order, so sorting its list in place is free to do */
    if (pool->n_empty > 1) {
        qsort(pool->empty, pool->n_empty, sizeof(*pool->empty), compare_ranges);
    }
    long rebuilt = 0;
    for (size_t i = 0; i < pool->n_split; i++) {
        /* A wholly empty page would come back as 2 MiB of zeros: it is emptied whole instead, which frees its
           page table where the kernel reclaims empty ones (6.14), so that the next slot's first touch there
           faults a 2 MiB page. A page that fails (a read in flight pins it: EAGAIN) stays small; only slower. */
        if (page_empty(pool, pool->split[i])) {
            (void)madvise(pool->split[i], HUGE_PAGE_BYTES, MADV_DONTNEED);
        } else {
            rebuilt += madvise(pool->split[i], HUGE_PAGE_BYTES, MADV_COLLAPSE) == 0;
        }
    }
    pool->n_split = 0;
    return rebuilt;
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
    record_split_ends(pool, at, length); /* either way: the file's mapping split them before, or MADV_DONTNEED now */
    return add_empty(pool, at, length) ? 0 : -ENOMEM;
}

void guanaco_slot_pool_destroy(struct guanaco_slot_pool *pool) {
    for (size_t i = 0; i < pool->n_chunks; i++) {
        munmap(pool->chunks[i].at, (size_t)pool->chunks[i].length);
    }
    free(pool->chunks);
    free(pool->empty);
    free(pool->split);
    memset(pool, 0, sizeof(*pool));
}
