/*
 * slot_pool.h - owns the anonymous memory that fixed slots are carved from.
 *
 * Every read of a miss lands in a slot, and a fresh slot's pages are
 * allocated and zeroed by the kernel on the read's first touch: one fault per
 * 4 KiB page, which on this project's VMs (a hypervisor with shadow page
 * tables) costs microseconds each. In 2 MiB pages that is 512 times fewer
 * faults: filling every slot of the 8-layer Q4_0 model (2.54 GiB, preload,
 * repacked) took 3.2-3.6 s against 4.9-5.4 s with the same chunks in small
 * pages (THP "never"; 4 alternating rounds, bench/COMPUTE_PARITY.md). Compute
 * from the slots measured the same in either page size (decode medians 63.7
 * and 65.0 tok/s, 6 rounds), as bench/PIPELINE.md found for anonymous memory.
 * So slots are carved from chunks that are 2 MiB aligned and advised
 * MADV_HUGEPAGE; a slot straddles huge pages freely, its neighbours share them.
 *
 * A slot given back keeps its address range in the pool, empty (MADV_DONTNEED
 * returns its memory to the kernel), and the next slot of a length it fits
 * takes it first: a long run's churn never grows the number of mappings, and
 * the chunks stay as large as the most slots ever held at once. Given back,
 * the part of a huge page a slot used is split into small pages by the kernel,
 * and so are its neighbours' parts of that page: they stay mapped 4 KiB at a
 * time until collapse() rebuilds the page (MADV_COLLAPSE). A prompt gives back
 * most of the budget's slots at once (the stream buffers' loan, the spares);
 * left split, the decode after it computed from 1.5 of 4.2 GiB in huge pages
 * and spent 158-185 ms per token outside the stall, against 114-130 with the
 * about 690 split pages rebuilt at its first call, which took 139-142 ms
 * (48-layer Q4_0, bench/PIPELINE.md). A run that evicts nothing keeps every
 * huge page.
 *
 * Ownership: the pool owns its chunks and unmaps them in destroy; a caller
 * holds a slot from take to give, and never unmaps one itself (owns() says
 * whether an address came from here). Not thread-safe: the residency calls it
 * under its lock.
 */
#ifndef GUANACO_SLOT_POOL_H
#define GUANACO_SLOT_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct guanaco_slot_range {
    char *at;
    uint64_t length;
};

struct guanaco_slot_pool {
    uint64_t chunk_bytes;             /* each new chunk's size, a multiple of 2 MiB (or the slot, if larger) */
    struct guanaco_slot_range *chunks; /* sorted by address, for owns() */
    size_t n_chunks, chunk_capacity;
    struct guanaco_slot_range *empty; /* given-back ranges, to be taken before carving */
    size_t n_empty, empty_capacity;
    char *next, *end;                 /* the newest chunk's uncarved part */
    bool huge;                        /* the kernel took MADV_HUGEPAGE on every chunk so far */
    char **split;                     /* huge pages a give split since the last collapse (repeats allowed) */
    size_t n_split, split_capacity;
    bool collapse_refused;            /* the kernel has no MADV_COLLAPSE (before 6.1): nothing is recorded */
};

/* An empty pool whose chunks are chunk_bytes (rounded up to 2 MiB); nothing is mapped until the first take. */
void guanaco_slot_pool_init(struct guanaco_slot_pool *pool, uint64_t chunk_bytes);

/* A writable slot of `length` bytes (a multiple of the page size), page aligned: a given-back range that fits
   (best fit; its rest stays empty), else carved; NULL with errno set (ENOMEM) when neither. Its pages are
   faulted in by whatever first writes them. */
char *guanaco_slot_pool_take(struct guanaco_slot_pool *pool, uint64_t length);

/* Whether `at` lies in one of the pool's chunks. */
bool guanaco_slot_pool_owns(const struct guanaco_slot_pool *pool, const void *at);

/* Returns [at, at + length), taken from this pool, to it: its memory goes back to the kernel. With `remap`
   the range holds some other mapping now (a file mapped over an evicted copy), and fresh anonymous memory,
   advised as the chunk was, replaces it first. 0, or -errno where the range could not be emptied; it is then
   left out of the pool (its memory stays until destroy). */
int guanaco_slot_pool_give(struct guanaco_slot_pool *pool, char *at, uint64_t length, bool remap);

/* Rebuilds the huge pages that gives split since the last call into 2 MiB pages (MADV_COLLAPSE): the taken
   slots' bytes are kept, and a split page's empty parts come back as zeros and count in its memory again, so call
   it only where the pool may hold all its chunks (never while it lends memory to something else). A page no
   taken slot touches is emptied whole instead, not rebuilt: the kernel would fill it with zeros. Returns how many
   pages were rebuilt (one the kernel could not rebuild now stays small), or -EOPNOTSUPP where the kernel cannot
   (before 6.1; nothing is recorded from then on). */
long guanaco_slot_pool_collapse(struct guanaco_slot_pool *pool);

/* Unmaps every chunk, slots still taken included. */
void guanaco_slot_pool_destroy(struct guanaco_slot_pool *pool);

#endif
