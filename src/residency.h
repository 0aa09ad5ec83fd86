/*
 * residency.h - owns which experts' bytes are actually in RAM: the residency
 * engine. llama.cpp maps each GGUF shard read-only (MAP_SHARED, PROT_READ) and
 * the expert tensors are zero-copy views into that mapping. Before layer L's
 * MUL_MAT_ID runs, the engine is told the router's ids for L; it reads the
 * experts that are missing at high queue depth through io.h into the page
 * cache, maps them into the process (MADV_POPULATE_READ), and evicts what the
 * replacement policy (policy.h) chooses, dropping both the page-table entries
 * (MADV_DONTNEED) and the page cache (POSIX_FADV_DONTNEED), so the budget is
 * real RAM and not a hope.
 *
 * The unit of residency is one expert of one MoE layer: the slices
 * [file_offset + e*stride, +stride) of every expert tensor of that layer
 * (gate, up, down or fused gate_up, biases). Slices are not page aligned
 * (GGUF aligns to 32 bytes), so neighbouring experts share edge pages:
 *   - loading maps the slice rounded outward to whole pages;
 *   - evicting drops a page only when no resident expert's slice touches it
 *     and the whole page lies inside the expert tensor: bytes outside the
 *     tensor (other weights, the header) are never dropped, so up to one page
 *     at each end of each expert tensor may stay cached after its edge
 *     expert leaves.
 *
 * Memory bound. W = one layer's working set: the distinct experts the ubatch
 * routes to in that layer times the layer's expert bytes. Resident expert
 * bytes (the accounting) after prepare_layer are <= max(budget, W of the
 * layer just prepared). During a call the missing experts are read before
 * eviction, so the peak is max(budget, W) + W with W the largest layer's
 * working set: budget + W whenever the budget holds one working set. A
 * prompt's read-ahead of the next layer (streamed, below) adds one more W of
 * page cache while the current one computes; with stream_direct both Ws are
 * anonymous instead (two buffers of the largest layer's expert tensors, held
 * from a prompt's first streamed call to the next call that does not stream),
 * and direct loading's spares are given back meanwhile. Page
 * rounding adds at most 2 pages per resident slice, plus the 2 pages per
 * expert tensor above. PAGE_CACHE reads have no destination: the kernel
 * fills the page cache directly (POSIX_FADV_WILLNEED, no copy through user
 * memory), and mapping the pages waits for them.
 *
 * A read error, a short file (-ENODATA) or a failed populate returns the
 * error from prepare_layer and leaves that expert non-resident (in the
 * policy's accounting and in the mapping); the others of the call are fine
 * and a later call retries it. The caller must not let the layer compute.
 * If the policy refuses the call (guanaco_policy_access fails), its error is
 * returned and every expert the call read is dropped again: the policy's
 * resident set is the one truth, and is_resident, the accounting and the
 * mapping all follow it.
 *
 * File-change guard: each shard's size and mtime are recorded at create and
 * re-checked (one fstat per shard) on every prepare_layer; a change fails
 * with -ESTALE from then on, because the mapping may now SIGBUS or hold
 * different weights.
 *
 * Side effects: POSIX_FADV_RANDOM is set on each fd and MADV_RANDOM on each
 * expert tensor's mapped range, because the reads are exact, and readahead,
 * read-around or fault-around would pull or map non-resident experts. Hand
 * the engine fds of its own. It never closes them.
 *
 * Thread-safe: one internal mutex serialises prepare_layer, get_stats, audit.
 * Eviction only ever replaces pages by the file's own bytes, so a context
 * computing while another context's call evicts its experts takes page
 * faults, never wrong weights.
 */
#ifndef GUANACO_RESIDENCY_H
#define GUANACO_RESIDENCY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io.h"
#include "policy.h"

/* Reads are cut into chunks of this size. */
#define GUANACO_RESIDENCY_CHUNK_BYTES (1u << 20)
/* queue_depth when the config leaves it 0. */
#define GUANACO_RESIDENCY_DEFAULT_QUEUE_DEPTH 16u
/* An expert loaded again within this many tokens of its eviction counts as churn. */
#define GUANACO_RESIDENCY_CHURN_TOKENS 16u
/* The folio page-cache loading reads a slice's middle in: the PMD size of x86-64 and arm64 with 4 KiB pages. */
#define GUANACO_HUGE_FOLIO_BYTES (2u << 20)

/* The whole huge folios inside file bytes [a, b): [*begin, *end), empty (begin >= end) where there are none.
   Page-cache loading reads them through a huge mapping and the rest of [a, b) in 4 KiB pages; the simulator
   charges the 4 KiB part's first touches from the same rule. */
static inline void guanaco_huge_middle(uint64_t a, uint64_t b, uint64_t *begin, uint64_t *end) {
    *begin = (a + GUANACO_HUGE_FOLIO_BYTES - 1) / GUANACO_HUGE_FOLIO_BYTES * GUANACO_HUGE_FOLIO_BYTES;
    *end = b / GUANACO_HUGE_FOLIO_BYTES * GUANACO_HUGE_FOLIO_BYTES;
}

/*
 * How a missing expert becomes resident.
 *
 * PAGE_CACHE: the kernel reads its slices into the page cache (io.h
 * requests without a destination: WILLNEED, no copy), then
 * MADV_POPULATE_READ maps them, waiting for the disk; eviction is
 * MADV_DONTNEED + FADV_DONTNEED.
 *
 * DIRECT: the whole pages inside each slice are read with O_DIRECT (no page
 * cache, no copy) into an anonymous buffer, which is made read-only and
 * moved over the slice's pages in the mapping with mremap(MREMAP_FIXED).
 * Eviction moves the copy out again and maps the file back over those pages
 * (mmap MAP_FIXED|MAP_SHARED). The copy is kept as a spare, and the next
 * read goes into a spare when one is big enough, so its pages are neither
 * allocated nor zeroed again; spares hold at most max(budget / 8, 64 MiB)
 * and one layer's count of slices, which adds to the memory bound above.
 * Both swaps are atomic for other threads: a reader sees the file's bytes or
 * the fully read copy, never a partial one, so a concurrent context's worst
 * case is a page fault. The partial pages at slice edges, shared with the
 * neighbours, stay file-backed and go through the page cache as above.
 * Every resident slice costs up to two VMAs; when the worst case would not
 * fit under vm.max_map_count, create falls back to PAGE_CACHE and says so.
 * With fixed_slots (and overlap_layer) the copy is never moved: each slice is
 * read whole, edge pages included, into an anonymous slot of
 * page_up(stride) + 1 page, and MUL_MAT_ID asks guanaco_residency_expert_data
 * for its address. Loading and evicting then change no page table: the
 * placing and restoring above cost 2 us per page on a guest whose hypervisor
 * keeps shadow page tables (bench/PIPELINE.md, Dec 4), most of the decode
 * stall. An evicted slot is a spare for the next read. Slots are carved
 * from 2 MiB-aligned chunks advised MADV_HUGEPAGE (slot_pool.h): a fresh
 * slot then costs a fault per 2 MiB instead of per page. One given back
 * beyond the spares returns its memory and keeps its range for the next slot.
 *
 * A tensor with an arena (guanaco_residency_tensor.arena) computes from the
 * arena, not from the mapping. Its slices are read as in PAGE_CACHE, then
 * copied out of the page cache (pread) through the tensor's transform into
 * the arena, and their pages leave the page cache at once. Eviction drops
 * the arena's pages (MADV_DONTNEED), with the edge-page rule applied to the
 * arena's pages. DIRECT falls back to PAGE_CACHE when any tensor has an
 * arena, except with fixed_slots: then an arena tensor's slice is read whole
 * into a slot like any other and transformed there (through a scratch copy:
 * a transform reads its source rows after writing; a demand load's on the
 * io thread that completes its job, as the reads behind it land), and
 * guanaco_residency_expert_data finds it by the arena's address, which is
 * what ggml holds as the tensor's data. The arena then stays untouched,
 * except by the warm start's adoption (guanaco_residency_adopt_cached),
 * which fills it from the page cache as before. A slot's pages were touched
 * before, where an arena's fresh pages cost a first access each (about 10
 * us on a guest with shadow page tables: most of a repacked miss).
 * An evicted arena slice reads as zeros, not as the file's bytes, so a
 * context computing while another context's call evicts its experts would
 * compute wrong weights: the caller must not use arenas with concurrent
 * contexts (set_shared).
 */
enum guanaco_residency_load {
    GUANACO_RESIDENCY_LOAD_PAGE_CACHE = 0,
    GUANACO_RESIDENCY_LOAD_DIRECT = 1,
};

struct guanaco_residency_tensor {   /* one expert tensor of one MoE layer */
    int fd;                 /* the shard, opened O_RDONLY by the caller */
    int direct_fd;          /* the shard opened O_RDONLY|O_DIRECT, for LOAD_DIRECT; -1 otherwise */
    uint64_t file_offset;   /* first byte of the tensor in the shard */
    uint64_t expert_stride; /* bytes of one expert */
    const char *mapped;     /* the tensor's first byte in the process's mapping of that shard */
    uint64_t file_size;     /* of the shard, for bounds */
    /* Optional, for experts that compute in another layout than the file's (expert_repack.h): where they
       compute, page aligned, expert e at arena + e * expert_stride, reserved and not committed; and how the
       file's bytes of expert e become that layout. NULL: the tensor computes from the mapping. */
    char *arena;
    int (*transform)(void *context, uint32_t expert, const void *source, void *destination);
    void *transform_context;
    /* With an arena: a file that holds the arena's layout at the model's offsets (a repack cache,
       repack_cache.h), opened as layout_fd and, for LOAD_DIRECT, layout_direct_fd. Every read of the tensor's
       experts then comes from it and is used as it lands: transform never runs. fd stays the model's, for all
       that maps the file (the edge pages of a slice hold its neighbours' bytes). */
    bool file_in_arena_layout;
    int layout_fd, layout_direct_fd;
};

struct guanaco_residency_config {
    uint32_t n_layer, n_expert;
    const struct guanaco_residency_tensor *const *tensors_of_layer; /* n_layer arrays */
    const uint32_t *tensors_in_layer;                                /* 0 for dense layers */
    uint64_t budget_bytes;          /* expert bytes allowed resident */
    uint32_t max_experts_per_layer; /* 0 = no cap; the tighter of both wins */
    enum guanaco_policy_kind policy;
    enum guanaco_io_backend io_backend;
    unsigned queue_depth;           /* 0 = GUANACO_RESIDENCY_DEFAULT_QUEUE_DEPTH */
    enum guanaco_residency_load load;
    uint64_t prefetch_bytes;        /* most bytes read ahead at once, inside the budget; 0 = no read-ahead */
    /* A call that needs at least half of its layer (a prompt's ubatch) streams the layer: what it reads is
       used by that call and dropped after it, never kept, so the resident set stays what decoding chose.
       Read-ahead for such a call reads each run's 2 MiB-aligned middle through a mapping of just that range,
       advised MADV_HUGEPAGE and unmapped once read, in 2 MiB folios. With DIRECT too: such a call reads
       through the page cache, as PAGE_CACHE does, and only decode's calls read into copies. Ignored where a
       tensor has an arena. */
    bool stream_prompts;
    bool huge_folios;               /* read 2 MiB-aligned ranges in huge folios where the kernel allows (page cache) */
    /* A layer's resident experts compute while its misses read. PAGE_CACHE, tensors without an arena: a call
       returns once its reads are issued, without mapping what it read; the matmuls then fault each page in,
       waiting in the kernel for the reads still in flight. The reads go in the order of the layer's tensors
       (give them in the order they compute) and, within one, by expert number, the order MUL_MAT_ID takes.
       DIRECT: a call returns with each missing expert's reads in flight as one job; the matmul asks
       guanaco_residency_expert_data for each expert before it computes with it, and the call ends (the
       policy hears of it and evicts) at the next call or guanaco_residency_finish. Not with several contexts
       (set_shared), nor for a streamed call or the preload: those wait for their reads as without it. */
    bool overlap_layer;
    /* DIRECT with overlap_layer: each copy stays in the anonymous slot it was read into, and the matmul asks
       guanaco_residency_expert_data for its address. No page table changes when it loads or leaves: eviction
       makes the slot a spare for the next read. Each slice is read whole into its slot, edge pages included.
       With several contexts (set_shared) new copies go into the mapping as without slots, and an evicted slot
       gets the file's bytes mapped over it until one context is left. */
    bool fixed_slots;
    /* DIRECT with fixed_slots and stream_prompts: a streamed layer's missing experts are read with O_DIRECT into
       one of two layer-sized anonymous buffers (the layer that computes and the one read ahead), in the file's
       layout, and guanaco_residency_expert_data hands MUL_MAT_ID their addresses there. Through the page cache
       each streamed page was mapped afresh, and its first read cost about 1 us more than a page that stays
       mapped on a guest with shadow page tables (bench/PIPELINE.md). The buffers are mapped at a prompt's first
       streamed call, in 2 MiB pages, and given back at the first call that neither streams nor serves
       GUANACO_PROMPT_MIN_TOKENS tokens (n_expert_used): 2 W of anonymous memory in place of the 2 W of page cache
       above, while a prompt streams; or kept from then on where they fit beside the budget
       (guanaco_residency_set_stream_keep). Where they do not fit beside the budget, the budget lends them what is
       missing while they are mapped (guanaco_residency_set_stream_loan), and where that would be more than half of it the engine
       turns them off (set_stream_direct). Not with several contexts (set_shared): page cache as before, and
       buffers mapped when a second context came stay as they are (the first may be computing from one) until
       one context is left and calls again. */
    bool stream_direct;
    /* The router's top-k: a call of n ids serves n / n_expert_used tokens, and the policy's duel counts its
       misses per token (guanaco_policy_access_batch). A call of GUANACO_PROMPT_MIN_TOKENS tokens or more is a
       prompt's ubatch: where it does not stream (its layer needs less than half of its experts, as skewed
       routing often does) it keeps the stream buffers for the prompt's layers that do. Given back and mapped
       again around such layers, every ubatch faulted up to 1.2 GiB of fresh 2 MiB pages in, a fifth of a
       prompt's CPU samples zeroing them (Dec 5, own routing at 25%, bench/PIPELINE.md). 0: every call counts as
       one token, and every call that does not stream gives the buffers back. */
    uint32_t n_expert_used;
};

struct guanaco_residency_stats {
    uint64_t accesses, hits;        /* distinct (layer, expert) accesses, and those that needed no read */
    uint64_t bytes_read, reads_issued, evictions, expert_loads;
    uint64_t load_failures;         /* accesses whose read or populate failed: accesses = hits + loads + failures */
    uint64_t invalid_ids;           /* ids outside [0, n_expert): counted, never used */
    uint64_t stall_ns;              /* time spent inside prepare_layer, of which: */
    uint64_t read_ns, populate_ns, evict_ns; /* the reads (PAGE_CACHE: until mapped, as mapping waits for the
                                                disk), DIRECT's placing and mapping, dropping victims */
    uint64_t transform_ns;          /* inside populate_ns: arena tensors' transforms (expert_repack.h) */
    uint64_t arrival_transform_ns;  /* not in populate_ns: transforms the io thread did as an expert's reads landed
                                       (fixed slots), overlapping the reads behind it */
    uint64_t transformed_bytes;     /* bytes that went through a transform */
    uint64_t resident_bytes;        /* accounting */
    uint64_t peak_resident_bytes;   /* highest accounting, reached between the reads and the eviction */
    uint64_t budget_bytes;          /* the budget now (--guanaco-ram auto may resize it) */
    uint64_t churn_loads;           /* loads of an expert evicted at most GUANACO_RESIDENCY_CHURN_TOKENS before */
    uint64_t pinned_hits;           /* hits on experts the policy holds in its pinned hot set */
    /* read-ahead (guanaco_residency_prefetch): experts and bytes started, claimed by the layer's next
       call (used), dropped unclaimed (wasted); used bytes whose reads were done before the call (hidden) */
    uint64_t prefetch_issued_experts, prefetch_used_experts, prefetch_wasted_experts;
    uint64_t prefetch_issued_bytes, prefetch_used_bytes, prefetch_wasted_bytes, prefetch_hidden_bytes;
    uint64_t prefetch_wait_ns;           /* inside stall_ns: waiting for read-ahead still in flight */
    uint64_t settle_wake_ns;             /* inside stall_ns: a compute thread that slept on an expert another one
                                            settled, from the settle to its wake-up */
    uint64_t prefetch_outstanding_bytes; /* read ahead and not yet claimed, now */
    uint64_t prediction_checked, predicted_needed; /* distinct experts of predicted calls, and how many were named */
    uint64_t streamed_bytes;        /* loaded for a streamed call and dropped after it (inside the loads) */
    uint64_t streamed_huge_bytes;   /* read ahead for streamed calls through the MADV_HUGEPAGE mapping */
    uint64_t streamed_direct_bytes; /* streamed calls' experts read with O_DIRECT into the stream buffers */
    uint64_t slices_before_settled; /* a deferred call's slices computed from their slot before their expert had landed whole */
    uint64_t stream_buffer_bytes;   /* the stream buffers' memory (stream_direct), held while a prompt streams */
    uint64_t stream_memory_bytes;   /* now: the stream buffers' memory mapped (0 when given back) */
    uint64_t loaded_huge_bytes;     /* demand loads' bytes read through the MADV_HUGEPAGE mapping */
    uint64_t spare_reused_bytes;    /* DIRECT copies read into an evicted copy's pages (spares), not into fresh
                                       ones the kernel allocates and zeroes */
    uint64_t spare_bytes;           /* now: evicted DIRECT copies kept for the next reads, beyond the budget (at
                                       most max(budget / 8, 64 MiB); none while a prompt streams) */
    uint64_t huge_pages_rebuilt;    /* DIRECT's slot pool: 2 MiB pages a prompt's evictions split, rebuilt (MADV_COLLAPSE)
                                       at the first decode call after it */
    uint64_t rebuild_ns;            /* inside stall_ns: rebuilding them */
    uint64_t loads_settled_computing; /* DIRECT with overlap_layer: loads a matmul asked for while its layer
                                         computed (guanaco_residency_expert_data), settled then or computed a
                                         slice at a time as they landed */
    enum guanaco_io_backend io_backend;
    enum guanaco_residency_load load; /* in force: DIRECT may have fallen back to PAGE_CACHE */
    bool overlap_layer;               /* in force: config.overlap_layer */
    bool stream_prompts;              /* in force: config.stream_prompts, where arenas allow */
    bool fixed_slots;                 /* in force: config.fixed_slots, where DIRECT and overlap_layer are */
    bool stream_direct;               /* in force: config.stream_direct, where fixed slots and streaming are */
};

struct guanaco_residency;

/*
 * Checks every tensor (inside its file, stride > 0, mapping page-congruent
 * with the file offset), records each shard's size and mtime, and allocates
 * everything prepare_layer needs. 0, -EINVAL (bad config, with a message),
 * -ENOMEM, -errno of fstat, or -ENOSYS when io_uring was asked for and is not
 * available (no message: the caller falls back to GUANACO_IO_THREADS).
 */
int guanaco_residency_create(const struct guanaco_residency_config *config, struct guanaco_residency **out);

/*
 * Makes every expert in ids (n_ids entries, any order, repeats allowed) of
 * `layer` resident, then evicts by policy, protecting `layer`. `token` is the
 * policy's clock. With page-cache loading and no arenas, the victims' pages
 * leave the page cache during the next call's reads (at once after the last
 * MoE layer); the audit drops them first. A dense layer is a no-op. Returns
 * 0, -EINVAL (layer out of range), -ESTALE (a shard changed on disk), or the
 * first read/populate/drop error; every failure prints a message.
 */
int guanaco_residency_prepare_layer(struct guanaco_residency *r, uint32_t layer, const int32_t *ids, size_t n_ids,
                                    uint64_t token);

/* prepare_layer at the policy's clock 0 for the preload, which never streams: what it reads stays resident even
   when it names half of the layer or more (a budget of 50% and up), where a prompt's call would use its reads
   once and drop them. Not counted as stall. */
int guanaco_residency_preload_layer(struct guanaco_residency *r, uint32_t layer, const int32_t *ids, size_t n_ids);

/*
 * Starts reading, in the background, experts of `layer` that a predictor
 * expects its next call to need (most likely first). It never waits. Each
 * among the first n_read is read, only if it is neither resident nor
 * already being read, and only while all bytes read ahead stay within
 * config.prefetch_bytes and, with
 * the resident experts, within the budget: the policy first evicts its
 * least wanted experts to make room (never protect_layer's, whose experts
 * are computing now), and what still does not fit is not read. A streamed
 * read-ahead (half the layer or more: a prompt's) takes no room in the
 * budget and evicts nothing, as its call's own reads take none: its pages
 * are used once and dropped at the call after. The layer's
 * next prepare_layer claims what it needs, waiting only for reads still in
 * flight, and drops the rest. The prediction is scored there too (stats:
 * prediction_checked, predicted_needed). A wrong guess costs bytes, never
 * correctness: nothing read ahead is mapped until a call claims it.
 * With DIRECT loading each run is one expert, read into anonymous copies
 * that the claiming call moves into place.
 * 0, or the first eviction error. No-op without read-ahead (prefetch_bytes
 * 0), except for scoring the prediction.
 */
int guanaco_residency_prefetch(struct guanaco_residency *r, uint32_t layer, const uint32_t *experts, size_t n,
                               size_t n_read, uint32_t protect_layer, uint64_t token);

/*
 * overlap_layer with DIRECT loading: whether expert `expert` of the tensor
 * whose expert 0 is mapped at `weights` can be computed with now, and where.
 * Without `wait` it answers at once (true for anything not being read); with
 * `wait` it returns true once the expert's reads are done and its copies
 * placed. *data is then its first byte in a fixed slot (fixed_slots), or NULL
 * when it computes from the mapping at weights + expert * stride (not ours,
 * not in a slot, or several contexts placed it there); the address stays good
 * until the next call of a context, which may evict it. A failed read leaves
 * the file's own mapping there, so a matmul that goes on faults the bytes in
 * through the page cache; the call then fails at its end. Any thread, any
 * number at once; lock-free when no call is under way.
 */
bool guanaco_residency_expert_data(struct guanaco_residency *r, const void *weights, uint32_t expert, bool wait,
                                   const void **data);

/*
 * Ends a call that returned with its reads in flight (overlap_layer with
 * DIRECT): waits for them, tells the policy, evicts. Call it once the graph
 * has computed, so that between graphs only the budget is resident. 0, or the
 * call's first read, map or drop error (prepare_layer's errors). Any later
 * entry point ends such a call too.
 */
int guanaco_residency_finish(struct guanaco_residency *r);

void guanaco_residency_get_stats(const struct guanaco_residency *r, struct guanaco_residency_stats *out);

/* Whether every expert of every MoE layer is resident in the accounting and the budget keeps them all: then no
   router decision can make a read or an eviction until the budget changes. */
bool guanaco_residency_holds_every_expert(const struct guanaco_residency *r);

/* Whether (layer, expert) is resident in the accounting; false when out of range. */
bool guanaco_residency_is_resident(const struct guanaco_residency *r, uint32_t layer, uint32_t expert);
/* absent[e] = 1 for each expert e of `layer` that is not resident (n_expert flags; all 1 for a bad layer). */
void guanaco_residency_mark_absent(const struct guanaco_residency *r, uint32_t layer, uint8_t *absent);

/*
 * mincore over every expert tensor's mapped range (rounded outward to pages,
 * pages shared by two tensors counted once), and over every fixed slot's
 * copy: bytes of expert pages actually resident, page granularity. On a shared file mapping mincore reports the
 * page cache, so this is the RAM the experts really hold. *file_page_bytes (may be NULL) gets the part that is the
 * file's page cache, the rest being the engine's own memory (arenas, slot copies): with direct loading the experts
 * live in the latter, and the former is whatever the kernel read around faults on the other weights. 0 or -errno.
 */
int guanaco_residency_audit(struct guanaco_residency *r, uint64_t *mapped_resident_bytes, uint64_t *file_page_bytes);

/*
 * Drops the cached pages of every expert slice that is not resident, which
 * the accounting does not know about: readahead around faults on the weights
 * next to an expert tensor, or reads from before the engine started. The
 * engine calls it at start and at the first ubatch's last MoE layer, before
 * that layer computes: a layer whose call streamed keeps its pages until the
 * next call, as streamed layers always do. 0 or the first -errno of
 * madvise/fadvise (with a message).
 */
int guanaco_residency_drop_unaccounted(struct guanaco_residency *r);

/*
 * A warm start: adopts, in each MoE layer, up to `per_layer` experts whose
 * every page is already in the page cache (a second run, a restarted
 * server), in ascending order, as resident without reading them: they are
 * mapped and the policy is told. Call it before drop_unaccounted, which then
 * drops only what was not adopted. *adopted is the number of experts.
 * 0, or the policy's error. DIRECT loading adopts into the page cache path.
 */
int guanaco_residency_adopt_cached(struct guanaco_residency *r, uint32_t per_layer, uint64_t *adopted);

/* Tests only: arm io.h's one-shot fault (guanaco_io_inject_fault) on the engine's reader. */
void guanaco_residency_inject_io_fault(struct guanaco_residency *r, uint64_t after_bytes, int error);

/* Tests only: the next prepare_layer's guanaco_policy_access fails with `error` (< 0) instead of running, as a
   refusal does: the policy changes nothing. 0 disarms. */
void guanaco_residency_inject_policy_fault(struct guanaco_residency *r, int error);

/* Tests only: the warm start asks mincore, as it does where cachestat(2) is missing. */
void guanaco_residency_adopt_by_mincore(struct guanaco_residency *r);

/* Frees the engine; NULL is accepted. Drops nothing: the mapping's owner unmaps it. */
void guanaco_residency_destroy(struct guanaco_residency *r);

/* Seeds the policy's counts of `layer` with a routing prior (guanaco_policy_seed: n_expert rates, each the
   expected share of a token's routings that go to the expert), under the engine's lock. */
void guanaco_residency_seed_policy(struct guanaco_residency *r, uint32_t layer, const double *rate);

/*
 * Whether several contexts compute from the mappings at once. DIRECT's spare
 * copies are moved out of the mapping before the file is mapped back, which
 * leaves the range unmapped for a moment; with shared, eviction maps the file
 * over the copy in one step instead (and frees it), as another context may be
 * reading there. Takes the lock, so no eviction is under way when it returns.
 */
void guanaco_residency_set_shared(struct guanaco_residency *r, bool shared);

/* Turns stream_direct on (where create laid the buffers out) or off, from the next call on: the engine's rule
   of whether the buffers fit in memory (budget.h). Safe while a context computes (a second context's creation
   calls it): the buffers' memory goes back only at the next call that does not stream into them, and only once
   one context is left (set_shared). */
void guanaco_residency_set_stream_direct(struct guanaco_residency *r, bool on);

/* How much of the budget the stream buffers borrow while they are mapped, a prompt streaming (0: none, the
   default): when they are mapped the policy gives up that many bytes of its least wanted experts, and takes them
   back as decode wants them once the buffers go. The engine's rule of what memory leaves (budget.h). */
void guanaco_residency_set_stream_loan(struct guanaco_residency *r, uint64_t bytes);

/* Whether the stream buffers stay mapped between prompts (false, the default: they go at the first call that does
   not stream). The engine's rule: where they fit beside the budget with nothing lent, decoding never needs their
   memory, and mapping them afresh for every prompt costs its 2 MiB pages' faults and zeroing again. Kept buffers
   go all the same when a loan is held, with several contexts, or when stream_direct is off. */
void guanaco_residency_set_stream_keep(struct guanaco_residency *r, bool keep);

/* Changes the budget (and the read-ahead allowance, half of it, when read-ahead is on). Nothing is
   evicted now: the next prepare_layer brings the resident bytes under it. */
void guanaco_residency_set_budget(struct guanaco_residency *r, uint64_t budget_bytes);

#endif
