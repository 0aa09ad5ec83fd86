/*
 * residency.c - owns the residency engine behind residency.h: the per-call
 * path (distinct ids, reads of what is missing, populate, policy access,
 * eviction), the edge-page rule for dropping pages, the file-change guard and
 * the audit; and, in sections of their own below, what makes the calls
 * overlap the disk: read-ahead runs for the next layer, a prompt's stream
 * buffers, and the call whose experts arrive while its layer computes
 * (overlap_layer), whose matmuls ask for each expert (expert_data). One file,
 * because all of them change the one resident set under one lock.
 *
 * Order of one call, and why:
 *   1. read the missing experts, then populate them;
 *   2. tell the policy about the experts that are now really resident (the
 *      hits and the loads that succeeded);
 *   3. evict by policy. The victims' pages are dropped in the next call,
 *      once its reads are submitted: a page-cache drop costs CPU time
 *      (25-36 ms of a ~250 ms decode stall), which then runs while the disk
 *      reads. A victim wanted again by then keeps its pages.
 * The policy has no way to forget an expert it was told about, so it is told
 * only after the reads: an expert whose read failed never enters its
 * accounting, and its pages are dropped again. The price is the transient
 * overshoot of one layer's working set described in residency.h.
 *
 * What is resident has one source of truth, the policy's resident set; the
 * engine asks it (guanaco_policy_is_resident) and keeps no copy. Only the
 * call under way holds more: read_call marks the experts it read and mapped
 * before the policy hears of them, so the edge-page rule keeps their pages.
 * If the policy refuses the call, those are dropped again, and the mapping
 * agrees with the policy.
 */
#include "residency.h"
#include "budget.h"
#include "log.h"
#include "monotonic_clock.h"
#include "predictor.h"
#include "slot_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Victims taken per guanaco_policy_evict call; more continue with another call. */
#define VICTIM_CAPACITY 256
/* mincore vector entries per call in the audit. */
#define AUDIT_PAGES 4096
/* A populate interrupted this many times in a row is reported, not retried forever. */
#define POPULATE_RETRIES 100
/* cachestat(2), Linux 6.5: one number on every architecture but alpha; older C library headers lack it. */
#if !defined(SYS_cachestat) && !defined(__alpha__)
#define SYS_cachestat 451
#endif
/* Pages per edge read slot: a slice with no whole page inside spans at most two. */
#define EDGE_SLOT_PAGES 2
/* fixed_slots' chunks (slot_pool.h): 32 huge pages, so that a budget of gigabytes takes tens of mappings */
#define SLOT_CHUNK_BYTES (64ull << 20)
/* Most bytes one read-ahead run spans in one tensor (it is cut into GUANACO_IO_ADVISE_BYTES requests). */
#define PREFETCH_SPAN_BYTES (8u << 20)
/* The same for a streamed layer's read-ahead: its runs are cut into 2 MiB-aligned pieces for the huge
   mapping, and only the pieces at a run's two ends go the 4 KiB way. */
#define STREAM_SPAN_BYTES (32u << 20)
/* stream_direct: the layer that computes and the one read ahead of it. */
#define STREAM_BUFFERS 2
/* VMAs left to the rest of the process when LOAD_DIRECT sizes its worst case against vm.max_map_count. */
#define VMA_RESERVE 8192

struct tensor {
    int fd;
    int direct_fd; /* -1 unless LOAD_DIRECT */
    /* where reads of the experts' bytes go: fd and direct_fd, or a repack cache's (in_arena_layout) */
    int read_fd, read_direct_fd;
    uint32_t shard;
    uint32_t layer, index_in_layer;
    uint64_t begin;  /* file offset of expert 0 */
    uint64_t end;    /* one past the last expert's last byte */
    uint64_t stride;
    uint64_t stream_offset; /* stream_direct: where file byte page_down(begin) lies in a stream buffer */
    const char *mapped;
    char *arena; /* NULL: computes from the mapping */
    int (*transform)(void *context, uint32_t expert, const void *source, void *destination);
    void *transform_context;
};

/* Whether t's reads come from a repack cache (guanaco_residency_tensor.file_in_arena_layout): they land in the
   layout t computes from, and no transform runs. */
static inline bool in_arena_layout(const struct tensor *t) {
    return t->read_fd != t->fd;
}

/*
 * Where in its slot an expert that starts at file offset `a` computes from. An expert repacked in the slot (through
 * the scratch copy) is written at the slot's first byte: cache-line aligned, as ggml's own repacked buffer is
 * (plain llama.cpp's repacked experts sit at 64 mod 4096). At the file offset's place in its page, 32 mod 64 for
 * every GGUF measured here, each 64-byte AVX-512 load of a Q4_K block (1152 bytes) spans two cache lines; 12
 * alternating rounds on the 8-layer Q4_K, everything resident, gave aligned / unaligned 1.034 prompts and 1.044
 * decode by the median, better in 8 of 12 (bench/COMPUTE_PARITY.md). Everything else, a repack cache's experts
 * included (read with O_DIRECT, so only whole pages move), keeps the file offset's place.
 */
static inline char *computed_in_slot(char *slot, const struct tensor *t, uint64_t a, uint64_t page) {
    return slot + (t->arena && !in_arena_layout(t) ? 0 : a % page);
}

struct layer {
    uint32_t first_tensor, n_tensors;
    uint64_t expert_bytes; /* sum of the tensors' strides: one expert's bytes in this layer */
};

struct shard {
    int fd;
    off_t size;
    struct timespec mtime;
    char name[256];
};

/* Experts of one layer read ahead in one job: into the page cache, or with LOAD_DIRECT into anonymous copies. */
struct prefetch_run {
    bool active;
    uint32_t layer, first_expert, n_experts;
    uint64_t bytes;
    struct guanaco_io_job job;
    struct guanaco_io_request *requests; /* max_run_requests */
    const char **addresses;              /* max_run_requests: where each request's first byte is mapped */
    size_t n_requests;
    /* A streamed run's MADV_HUGEPAGE mappings, one per tensor: exactly the 2 MiB-aligned middle it populates,
       and only while it reads, so that no other range of the file is ever mapped for huge folios. */
    void **huge_maps;        /* max_tensors_in_layer */
    uint64_t *huge_lengths;  /* max_tensors_in_layer */
    uint32_t n_huge_maps;
    /* LOAD_DIRECT: a run is one expert, read into anonymous copies as a demand load is (direct_slice_requests):
       per tensor the copy of its whole pages, and two EDGE_SLOT_PAGES slots for its partial edge pages. */
    char **staging;          /* max_tensors_in_layer */
    char *edges;             /* max_tensors_in_layer * 2 * EDGE_SLOT_PAGES pages */
    bool copies;             /* read into staging; else into the page cache (PAGE_CACHE, or a streamed layer's) */
    bool streamed;           /* a prompt's layer: used once by its call, outside the budget as the call's reads */
};

/* overlap_layer with DIRECT: a call that returned with its demand reads in flight, one job per missing expert.
   MUL_MAT_ID asks for each expert as it reaches it (guanaco_residency_expert_data), and whatever comes next
   (the next call, the end of the graph) finishes the call: the policy hears of it, and evicts. */
struct deferred_call { /* in force while guanaco_residency.deferred_active */
    uint32_t layer;
    size_t n_missing, n_distinct, n_requests;
    uint64_t token;
    uint32_t tokens; /* the call's, for the policy */
    int pending_error;
    uint64_t transformed_before, wasted_before; /* prepare_locked's, for finish_call */
};

/* A missing expert's slot of one tensor, repacked by the io thread as its reads landed (repack_arrived). */
struct slot_arrival {
    bool repacked;
    int error; /* the repack's, which may have left the slot half written */
    uint64_t transform_ns;
};

/* A deferred call's missing expert: its reads in flight, one thread waiting and mapping it, or mapped. */
enum expert_state { EXPERT_READING, EXPERT_SETTLING, EXPERT_SETTLED };

/* How long a compute thread spins for an expert another one is settling before it sleeps (settle_expert): about a
   1 MiB read at this project's disks' rates, so a decode's short waits never sleep, and a long one costs one core
   that long at most. */
#define SETTLE_SPIN_NS 2000000ull

/* stream_direct: one of the buffers a streamed layer's missing experts are read into, each tensor's experts in
   the file's layout at its stream_offset. */
struct stream_buffer {
    char *at;
    _Atomic uint32_t layer;        /* the layer it holds or is reading; UINT32_MAX: none */
    atomic_bool serving;           /* its layer's call took it: expert_data answers from it until the next call */
    unsigned char *has;            /* n_expert: read or being read into it, for `layer` */
    uint32_t read_ahead_experts;   /* how many of them the read-ahead named, for the used and wasted counts */
    struct guanaco_io_job jobs[2]; /* the read-ahead's, and the call's own for what the guess left out */
    bool reading[2];               /* submitted, not yet waited for or cancelled */
    struct guanaco_io_request *requests[2]; /* stream_request_capacity each */
    size_t n_requests[2];
};

/* Victims chosen but whose pages are not dropped yet (evict_by_policy's `later`). */
struct victim_list {
    uint32_t *layers, *experts;
    size_t n, capacity;
};

struct guanaco_residency {
    pthread_mutex_t lock;
    uint32_t n_layer, n_expert;
    uint64_t page;
    unsigned queue_depth;
    uint64_t budget_bytes;

    struct tensor *tensors;
    uint32_t n_tensors;
    struct layer *layers;
    struct shard *shards;
    uint32_t n_shards;

    struct guanaco_policy *policy;
    struct guanaco_io *io;
    enum guanaco_io_backend io_backend;
    enum guanaco_residency_load load;
    uint32_t max_tensors_in_layer;

    uint64_t *evicted_at; /* n_layer * n_expert: token + 1 of the last eviction, 0 = never; for churn */

    /* per-call scratch, sized at create */
    uint64_t call;
    uint32_t read_layer;      /* the layer of the call under way while read_call counts; UINT32_MAX otherwise */
    uint64_t *read_call;      /* n_expert: the call that read and mapped the expert, until the policy hears of it */
    uint64_t *seen_call;      /* n_expert: the call that last saw the id, for distinct ids */
    uint64_t *hit_call;       /* n_expert: the call that found the expert resident */
    uint32_t *distinct;       /* n_expert */
    uint32_t *missing;        /* n_expert */
    int *missing_error;       /* n_expert: the first error of each missing expert, 0 when loaded */
    uint32_t *accessed;       /* n_expert: handed to the policy */
    uint32_t *policy_missing; /* n_expert: the policy's answer, unused beyond the call */
    struct guanaco_io_request *requests;
    uint32_t *request_missing; /* which missing expert (index into missing) each request belongs to */
    size_t request_capacity;
    size_t max_expert_requests; /* the most requests one expert's slices take (add_layer), a DIRECT run's */
    /* LOAD_DIRECT: per (missing expert, tensor) the anonymous buffer its interior pages are read into, and
       two EDGE_SLOT_PAGES slots each for its partial edge pages (content discarded: the page cache is the point) */
    char **staging;
    char *edge_scratch;
    /* LOAD_DIRECT: evicted copies kept for the next reads (take_spare), at most spare_limit bytes */
    struct spare_copy {
        char *at;
        uint64_t length;
    } *spares;
    size_t n_spares, spare_capacity, spare_count_limit;
    uint64_t spare_bytes, spare_limit;
    bool streaming; /* since the last streamed call or read-ahead, until the next call that is neither: no spares */
    /* fixed_slots (config): a copy stays where it was read, and MUL_MAT_ID computes from it. Per (layer, expert,
       tensor) the copy's first byte (file byte page_down(slice start)), NULL where the slice computes from the
       mapping. Read without the lock by guanaco_residency_expert_data. */
    bool slots;
    struct guanaco_slot_pool slot_pool; /* where slots come from while one context computes */
    _Atomic(char *) *slot_copy; /* n_layer * n_expert * max_tensors_in_layer */
    uint32_t *tensors_by_address; /* n_tensors: indices into tensors, by mapped address (tensor_at) */
    /* Copies evicted while several contexts computed: the file is mapped over them, so that a context still
       computing from one reads the file's bytes; unmapped at the first call with one context left. */
    struct spare_copy *retired;
    size_t n_retired, retired_capacity;
    /* arena tensors: one expert slice of the file, read out of the page cache for its transform */
    char *transform_source;
    uint64_t transform_source_bytes;
    uint32_t victim_layers[VICTIM_CAPACITY];
    uint32_t victim_experts[VICTIM_CAPACITY];
    unsigned char *audit_vector;

    /* prefetch: reads ahead of a layer's next call, outside the policy until that call claims them */
    struct prefetch_run *runs; /* n_runs slots; a run is one io job over consecutive experts of one layer */
    uint32_t n_runs;
    uint32_t *run_of_slot;     /* n_layer * n_expert: index + 1 of the active run reading the expert, 0 = none */
    size_t max_run_requests;
    uint64_t prefetch_allowance;   /* most bytes read ahead at once; 0 = prefetch off */
    uint64_t prefetch_outstanding; /* bytes of active runs, against the allowance */
    uint64_t stream_outstanding;   /* the part of it that streamed runs read: not in the policy's reserve */
    uint32_t *prediction_stamp;    /* n_layer * n_expert: the prediction that last named the slot */
    uint32_t *layer_prediction;    /* n_layer: the prediction for the layer's next call, 0 = none */
    uint32_t *prefetch_wanted;     /* n_expert: prefetch_locked's experts to read (a deferred call holds missing) */
    uint32_t predictions;

    /* stream_prompts (config): prompt-sized calls use their reads once and drop them */
    bool stream;
    bool stream_huge;     /* the kernel takes MADV_HUGEPAGE on a file mapping: streamed runs span STREAM_SPAN_BYTES */
    bool *stream_ahead;   /* n_layer: read ahead as a streamed layer, so its call streams (huge folios) */
    bool *stream_pending; /* n_layer: a streamed call's pages, dropped with the next call's reads */
    /* stream_direct (config): streamed calls read into two buffers instead, mapped while a prompt streams */
    /* in force (guanaco_residency_set_stream_direct); expert_data reads it without the lock */
    atomic_bool stream_direct;
    bool stream_quarantined; /* several contexts came while mapped: untouched until one is left (set_shared) */
    uint64_t stream_loan;    /* what the budget lends the buffers while they are mapped (set_stream_loan) */
    uint32_t n_expert_used;  /* config.n_expert_used: ids per token */
    bool stream_loan_held;   /* lent now: the policy keeps it free (reserved_room) */
    bool stream_keep;        /* the engine's rule: they fit beside the budget, nothing lent (set_stream_keep) */
    bool stream_direct_capable;   /* the buffers are laid out: config.stream_direct, DIRECT, slots, streaming */
    struct stream_buffer stream_buffers[STREAM_BUFFERS];
    char *stream_memory;          /* both buffers, 2 MiB aligned; NULL while no prompt streams */
    uint64_t stream_memory_bytes;
    bool pool_split_by_prompt;    /* a prompt gave slots back since the pool's huge pages were last rebuilt */
    uint64_t stream_buffer_bytes; /* the largest layer's expert tensors, each rounded out to whole pages */
    size_t stream_request_capacity;
    uint32_t *stream_list;        /* n_expert: scratch for the experts one fill reads */

    /* Demand loads in huge folios (page-cache loading): each missing slice's 2 MiB-aligned middle is read through
       its own MADV_HUGEPAGE mapping, unmapped once the call's reads are done (the same rule as streamed runs). */
    bool demand_huge;
    void **demand_huge_maps;      /* n_expert * max_tensors_in_layer */
    uint64_t *demand_huge_lengths;
    uint32_t n_demand_huge_maps;

    struct victim_list pending_drops; /* the last call's victims, dropped once the next call's reads run */
    uint32_t last_expert_layer;       /* its victims are dropped at once: nothing stays over budget between tokens */

    int policy_fault;       /* tests only: the next call's policy access fails with it (0 = none) */
    bool stale;             /* a shard changed on disk: every later call fails */
    bool populate_by_touch; /* MADV_POPULATE_READ is missing: touch one byte per page instead */
    bool overlap_layer;     /* config: a call returns once its reads are issued; the matmuls fault the pages in
                               (PAGE_CACHE) or wait for each expert (DIRECT: struct deferred_call) */
    uint32_t last_layer;    /* the layer of the last call: with overlap_layer, its reads may still be landing */
    bool shared;            /* several contexts compute: an eviction swaps the file in atomically, no spare */
    bool preloading;        /* the preload maps what it reads: nothing computes from it soon, and this VM's
                               DAMON pages out cold unmapped file pages */
    bool no_cachestat;      /* cachestat(2) is missing or failed once: the warm start asks mincore */
    struct guanaco_residency_stats stats;

    /* DIRECT with overlap_layer: one job per missing expert and tensor, so that a matmul waits only for its own
       slices. They are read tensor by tensor in the order the layer's matmuls run (every missing expert's first
       tensor, then every one's second...), so the first matmul waits for a third of the bytes and the next ones
       compute while the rest lands (settle_slice). */
    struct deferred_call deferred;
    atomic_bool deferred_active;   /* a deferred call is under way; read without the lock by expert_data */
    struct guanaco_io_job *expert_jobs; /* n_expert * max_tensors_in_layer: missing expert i's tensor k at i * max + k */
    size_t *job_first_request;          /* n_expert * max_tensors_in_layer + 1: each job's requests in r->requests,
                                           so missing expert i's are those of jobs i * max to (i + 1) * max */
    /* ... and with repacked experts in fixed slots: the io thread that completes missing expert i's job repacks
       its slots there (repack_arrived), while the reads behind it land and the matmuls compute what is ready,
       where the matmul that asked for it used to repack it with the other threads waiting */
    struct slot_arrival *arrivals; /* n_expert * max_tensors_in_layer, indexed as staging */
    char *arrival_source;          /* transform_source_bytes: those repacks' scratch */
    pthread_mutex_t arrival_lock;  /* arrival_source: the threads backend may complete two jobs at once */
    uint32_t arrival_layer;        /* the layer whose demand jobs are in flight */
    unsigned char *expert_state;        /* n_expert: enum expert_state of missing expert i */
    unsigned char *computed_early;      /* n_expert: a matmul computed a slice of missing expert i (settle_slice) */
    uint32_t slice_waiters;             /* threads waiting in settle_slice now: the stall counts the time any does */
    uint64_t slice_wait_since;          /* when the first of them began */
    pthread_cond_t expert_settled;
    _Atomic uint32_t settled_count;     /* bumped with each expert_settled broadcast: what settle_expert spins on */
    uint64_t last_settled_ns;           /* when the last expert_settled broadcast went out */
};

static uint64_t page_down(const struct guanaco_residency *r, uint64_t x) {
    return x - x % r->page;
}

static uint64_t page_up(const struct guanaco_residency *r, uint64_t x) {
    return page_down(r, x + r->page - 1);
}

/* The mapped address of file offset `offset` of tensor t. */
static const char *address_of(const struct tensor *t, uint64_t offset) {
    return t->mapped + (offset - t->begin);
}

/* Where ggml finds expert 0 of t: its arena when it has one (a repacked tensor's data), else the mapping. */
static const char *compute_base(const struct tensor *t) {
    return t->arena ? t->arena : t->mapped;
}

/* fixed_slots: the bytes of one copy of a slice of t, its pages rounded outward at any alignment, so that every
   copy of t's slices fits every slot of t's length. */
static uint64_t slot_length(const struct guanaco_residency *r, const struct tensor *t) {
    return page_up(r, t->stride) + r->page;
}

static size_t slot_index(const struct guanaco_residency *r, const struct tensor *t, uint32_t e) {
    return ((size_t)t->layer * r->n_expert + e) * r->max_tensors_in_layer + t->index_in_layer;
}

/* The tensor of slot_copy entry i (slot_index's inverse). */
static const struct tensor *tensor_of_slot(const struct guanaco_residency *r, size_t i) {
    const struct layer *l = &r->layers[i / r->max_tensors_in_layer / r->n_expert];
    return &r->tensors[l->first_tensor + i % r->max_tensors_in_layer];
}

/* Consecutive experts one read-ahead run may span: as many as fit in span_bytes of the widest slice. */
static uint32_t run_experts(const struct guanaco_residency *r, uint32_t layer, uint64_t span_bytes) {
    uint64_t widest = 0;
    const struct layer *l = &r->layers[layer];
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        uint64_t stride = r->tensors[l->first_tensor + k].stride;
        widest = stride > widest ? stride : widest;
    }
    uint64_t n = widest ? span_bytes / widest : 1;
    return n ? (uint32_t)(n < r->n_expert ? n : r->n_expert) : 1;
}

static uint32_t prefetch_run_experts(const struct guanaco_residency *r, uint32_t layer) {
    return run_experts(r, layer, PREFETCH_SPAN_BYTES);
}

/* A streamed layer's runs: STREAM_SPAN_BYTES, cut into 2 MiB pieces for the huge mapping. */
static uint32_t stream_run_experts(const struct guanaco_residency *r, uint32_t layer) {
    return run_experts(r, layer, STREAM_SPAN_BYTES);
}

/* File bytes [offset, offset + length) mapped for populating in huge folios, or NULL where the kernel refuses. */
static void *map_huge(int fd, uint64_t offset, uint64_t length) {
    void *map = mmap(NULL, (size_t)length, PROT_READ, MAP_SHARED, fd, (off_t)offset);
    if (map == MAP_FAILED) {
        return NULL;
    }
    /* RANDOM too: a fault reads its own folio and nothing after it */
    if (madvise(map, (size_t)length, MADV_HUGEPAGE) != 0 || madvise(map, (size_t)length, MADV_RANDOM) != 0) {
        munmap(map, (size_t)length);
        return NULL;
    }
    return map;
}

/* Whether the kernel takes MADV_HUGEPAGE on a mapping of the model file (where --guanaco-huge-folios allows):
   a probe of one folio's range, which reads nothing. */
static bool huge_mappings_work(const struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    if (!config->huge_folios || !r->n_shards || r->shards[0].size < (off_t)GUANACO_HUGE_FOLIO_BYTES) {
        return false;
    }
    void *probe = map_huge(r->shards[0].fd, 0, GUANACO_HUGE_FOLIO_BYTES);
    if (probe) {
        munmap(probe, GUANACO_HUGE_FOLIO_BYTES);
    }
    return probe != NULL;
}

/* The 2 MiB-aligned middle [*begin, *end) of t's file bytes [a, b), mapped for populating in huge folios when
   `wanted` and not empty. NULL otherwise, with *begin = *end = b: all of [a, b) then goes the 4 KiB way, as the
   two ends always do. */
static const char *map_huge_middle(const struct tensor *t, uint64_t a, uint64_t b, bool wanted, uint64_t *begin,
                                   uint64_t *end) {
    guanaco_huge_middle(a, b, begin, end);
    const char *huge = wanted && *begin < *end ? map_huge(t->fd, *begin, *end - *begin) : NULL;
    if (!huge) {
        *begin = *end = b;
    }
    return huge;
}

/* Called once the run's job is done (waited or cancelled): no populate can still be using the mappings. */
static void unmap_huge(struct prefetch_run *run) {
    for (uint32_t k = 0; k < run->n_huge_maps; k++) {
        munmap(run->huge_maps[k], (size_t)run->huge_lengths[k]);
    }
    run->n_huge_maps = 0;
}

/* Whether the call under way read and mapped expert e of `layer`, which the policy has not heard of yet. */
static bool read_by_call(const struct guanaco_residency *r, uint32_t layer, uint32_t e) {
    return layer == r->read_layer && r->read_call[e] == r->call;
}

/* Whether the call under way names the expert (a hit, or a read in flight). A deferred call's policy hears of it
   only at its end, so until then an eviction protecting its layer can still name its hits: their pages stay,
   since a matmul may be reading them, and the policy takes them back when it hears of the call (tell_policy). */
static bool used_by_call(const struct guanaco_residency *r, uint32_t layer, uint32_t e) {
    return layer == r->read_layer && r->seen_call[e] == r->call;
}

/* Whether the expert's pages are wanted: resident (the policy's answer), read (or being read) by the call under
   way, or being read ahead. */
static bool holds(const struct guanaco_residency *r, uint32_t layer, uint32_t e) {
    size_t slot = (size_t)layer * r->n_expert + e;
    return guanaco_policy_is_resident(r->policy, layer, e) || read_by_call(r, layer, e) ||
           used_by_call(r, layer, e) || (r->run_of_slot && r->run_of_slot[slot]);
}

static int prefetch_create(struct guanaco_residency *r, const struct guanaco_residency_config *config);
static int stream_create(struct guanaco_residency *r, const struct guanaco_residency_config *config);
static int demand_huge_create(struct guanaco_residency *r, const struct guanaco_residency_config *config);
static int stream_direct_create(struct guanaco_residency *r, const struct guanaco_residency_config *config);
static bool stream_read_ahead(struct guanaco_residency *r, uint32_t layer, const uint32_t *experts, size_t n,
                              uint32_t protect_layer, uint64_t token);
static size_t stream_serve(struct guanaco_residency *r, uint32_t layer, size_t n, uint64_t token);
static void stream_buffer_stop(struct guanaco_residency *r, struct stream_buffer *b);
static bool stream_buffers_mapped(struct guanaco_residency *r, uint32_t protect_layer, uint64_t token);
static void stream_buffers_release(struct guanaco_residency *r);
static int drop_pending(struct guanaco_residency *r, bool streamed_too);
static int finish_deferred(struct guanaco_residency *r, bool evict);
static void free_spares(struct guanaco_residency *r);
static void unmap_retired(struct guanaco_residency *r);
static void discard_copies(struct guanaco_residency *r, const struct layer *l, uint32_t e, char **staging);

/* ---- create / destroy ---- */

static long read_long_file(const char *path) {
    FILE *f = fopen(path, "r");
    long value = -1;
    if (f) {
        if (fscanf(f, "%ld", &value) != 1) {
            value = -1;
        }
        fclose(f);
    }
    return value;
}

/*
 * LOAD_DIRECT needs an O_DIRECT fd per tensor and room for its VMAs: each
 * resident slice can split the file mapping into two more. The worst case
 * is every expert of every layer resident at once; when that does not fit
 * under vm.max_map_count the engine uses PAGE_CACHE, which adds none.
 */
static int choose_load(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    r->load = GUANACO_RESIDENCY_LOAD_PAGE_CACHE;
    if (r->transform_source_bytes &&
        !(r->transform_source = malloc(r->transform_source_bytes))) {
        return -ENOMEM;
    }
    if (config->load != GUANACO_RESIDENCY_LOAD_DIRECT) {
        return 0;
    }
    /* Repacked experts need a place of their own to be repacked into: a fixed slot, or their arena, which only
       the page-cache path fills. */
    if (r->transform_source && !(config->fixed_slots && config->overlap_layer)) {
        guanaco_log_info("residency: repacked experts without fixed slots load through the page cache: using "
                         "page-cache loading");
        return 0;
    }
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        if (r->tensors[i].direct_fd < 0) {
            guanaco_log_error("residency: direct loading needs an O_DIRECT fd for every expert tensor");
            return -EINVAL;
        }
    }
    long max_map_count = read_long_file("/proc/sys/vm/max_map_count");
    /* each resident slice, and one layer's worth of spare copies (keep_spare) */
    uint64_t worst_vmas = 2ull * r->n_tensors * r->n_expert + (uint64_t)r->n_expert * r->max_tensors_in_layer;
    if (max_map_count > 0 && worst_vmas + VMA_RESERVE > (uint64_t)max_map_count) {
        guanaco_log_info("residency: direct loading could need %llu memory mappings, more than vm.max_map_count "
                         "(%ld) allows: using page-cache loading",
                         (unsigned long long)worst_vmas, max_map_count);
        return 0;
    }
    size_t slots = (size_t)r->n_expert * r->max_tensors_in_layer;
    /* enough for the next call's reads, which take them; a decode call reads a few experts */
    r->spare_limit = guanaco_spare_limit(config->budget_bytes);
    r->spare_count_limit = slots;
    r->staging = calloc(slots ? slots : 1, sizeof(*r->staging));
    r->edge_scratch = malloc((slots ? slots : 1) * 2 * EDGE_SLOT_PAGES * r->page);
    if (!r->staging || !r->edge_scratch) {
        return -ENOMEM;
    }
    r->load = GUANACO_RESIDENCY_LOAD_DIRECT;
    if (config->fixed_slots && config->overlap_layer) { /* MUL_MAT_ID asks for each expert's address */
        r->slot_copy = calloc((size_t)r->n_layer * r->n_expert * r->max_tensors_in_layer, sizeof(*r->slot_copy));
        if (!r->slot_copy) {
            return -ENOMEM;
        }
        r->tensors_by_address = malloc((r->n_tensors ? r->n_tensors : 1) * sizeof(*r->tensors_by_address));
        if (!r->tensors_by_address) {
            return -ENOMEM;
        }
        for (uint32_t i = 0; i < r->n_tensors; i++) { /* insertion: a few hundred, once, and qsort takes no context */
            uint32_t j = i;
            for (; j > 0 && (uintptr_t)compute_base(&r->tensors[r->tensors_by_address[j - 1]]) >
                              (uintptr_t)compute_base(&r->tensors[i]);
                 j--) {
                r->tensors_by_address[j] = r->tensors_by_address[j - 1];
            }
            r->tensors_by_address[j] = i;
        }
        r->slots = true;
        guanaco_slot_pool_init(&r->slot_pool, SLOT_CHUNK_BYTES);
    }
    return 0;
}

static int add_shard(struct guanaco_residency *r, int fd, uint32_t *index) {
    for (uint32_t s = 0; s < r->n_shards; s++) {
        if (r->shards[s].fd == fd) {
            *index = s;
            return 0;
        }
    }
    struct shard *sh = &r->shards[r->n_shards];
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = -errno;
        guanaco_log_error("residency: fd %d of an expert tensor: %s", fd, strerror(-err));
        return err;
    }
    sh->fd = fd;
    sh->size = st.st_size;
    sh->mtime = st.st_mtim;
    /* The name only serves messages; a missing /proc leaves the fd number. */
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, sh->name, sizeof(sh->name) - 1);
    if (n <= 0) {
        n = snprintf(sh->name, sizeof(sh->name), "fd %d", fd);
    }
    sh->name[n] = '\0';
    /* Our reads are exact: readahead would only pull non-resident experts into the page cache. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    *index = r->n_shards++;
    return 0;
}

static int check_tensor(const struct guanaco_residency *r, uint32_t layer, uint32_t index,
                        const struct guanaco_residency_tensor *t) {
    uint64_t span = 0;
    bool overflow = t->expert_stride == 0 || __builtin_mul_overflow(t->expert_stride, (uint64_t)r->n_expert, &span) ||
                    t->file_offset > UINT64_MAX - span;
    if (t->fd < 0 || !t->mapped || overflow || t->file_offset + span > t->file_size ||
        t->file_offset + span > (uint64_t)INT64_MAX) {
        guanaco_log_error("residency: expert tensor %u of layer %u is invalid: fd %d, offset %llu, %u experts of %llu "
                          "bytes in a file of %llu bytes",
                          index, layer, t->fd, (unsigned long long)t->file_offset, r->n_expert,
                          (unsigned long long)t->expert_stride, (unsigned long long)t->file_size);
        return -EINVAL;
    }
    /* Page boundaries of the mapping and of the file must coincide, or madvise and fadvise would name different pages. */
    if (((uintptr_t)t->mapped - t->file_offset) % r->page != 0) {
        guanaco_log_error("residency: expert tensor %u of layer %u: mapped address %p is not page-congruent with file "
                          "offset %llu (the shard must be mapped from offset 0)",
                          index, layer, (const void *)t->mapped, (unsigned long long)t->file_offset);
        return -EINVAL;
    }
    return 0;
}

void guanaco_residency_destroy(struct guanaco_residency *r) {
    if (!r) {
        return;
    }
    if (atomic_load(&r->deferred_active)) { /* no read may land after the copies go */
        pthread_mutex_lock(&r->lock);
        (void)finish_deferred(r, true);
        pthread_mutex_unlock(&r->lock);
    }
    for (uint32_t i = 0; r->io && i < r->n_runs; i++) {
        if (r->runs[i].active) {
            (void)guanaco_io_cancel(r->io, &r->runs[i].job); /* no read may land after the buffers go */
            unmap_huge(&r->runs[i]);
            if (r->runs[i].staging) { /* to the spares, which free_spares frees below */
                discard_copies(r, &r->layers[r->runs[i].layer], r->runs[i].first_expert, r->runs[i].staging);
            }
        }
    }
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) { /* no read may land after the buffers go */
        if (r->io) {
            stream_buffer_stop(r, &r->stream_buffers[b]);
        }
        free(r->stream_buffers[b].has);
        free(r->stream_buffers[b].requests[0]);
        free(r->stream_buffers[b].requests[1]);
    }
    if (r->stream_memory) {
        munmap(r->stream_memory, r->stream_memory_bytes);
    }
    free(r->stream_list);
    /* the slots, while the tables that size them are here */
    for (size_t i = 0; r->slot_copy && i < (size_t)r->n_layer * r->n_expert * r->max_tensors_in_layer; i++) {
        char *copy = atomic_load(&r->slot_copy[i]);
        if (copy && !guanaco_slot_pool_owns(&r->slot_pool, copy)) { /* the pool's go with it */
            munmap(copy, slot_length(r, tensor_of_slot(r, i)));
        }
    }
    free(r->slot_copy);
    free(r->tensors_by_address);
    unmap_retired(r);
    free(r->retired);
    for (uint32_t i = 0; r->runs && i < r->n_runs; i++) {
        free(r->runs[i].staging);
        free(r->runs[i].edges);
        free(r->runs[i].requests);
        free(r->runs[i].addresses);
        free(r->runs[i].huge_maps);
        free(r->runs[i].huge_lengths);
    }
    free(r->runs);
    free(r->run_of_slot);
    free(r->stream_ahead);
    free(r->stream_pending);
    free(r->demand_huge_maps);
    free(r->demand_huge_lengths);
    free(r->prediction_stamp);
    free(r->layer_prediction);
    free(r->prefetch_wanted);
    guanaco_io_destroy(r->io);
    guanaco_policy_free(r->policy);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->arrival_lock);
    pthread_cond_destroy(&r->expert_settled);
    free(r->expert_jobs);
    free(r->arrivals);
    free(r->arrival_source);
    free(r->job_first_request);
    free(r->expert_state);
    free(r->computed_early);
    free(r->tensors);
    free(r->layers);
    free(r->shards);
    free(r->read_call);
    free(r->pending_drops.layers);
    free(r->pending_drops.experts);
    free(r->evicted_at);
    free(r->staging); /* load_experts never leaves a buffer in it */
    free_spares(r);
    guanaco_slot_pool_destroy(&r->slot_pool); /* after everything that gives slots back */
    free(r->edge_scratch);
    free(r->transform_source);
    free(r->seen_call);
    free(r->hit_call);
    free(r->distinct);
    free(r->missing);
    free(r->missing_error);
    free(r->accessed);
    free(r->policy_missing);
    free(r->requests);
    free(r->request_missing);
    free(r->audit_vector);
    free(r);
}

/* The configuration's own limits, checked before anything is allocated. -EINVAL with a message, or 0. */
static int check_config(const struct guanaco_residency_config *config) {
    if (!config || config->n_layer == 0 || config->n_expert == 0 || !config->tensors_of_layer ||
        !config->tensors_in_layer || config->queue_depth > GUANACO_IO_MAX_QUEUE_DEPTH ||
        (uint64_t)config->n_layer * config->n_expert > UINT32_MAX / 2) {
        guanaco_log_error("residency: invalid configuration (%u layers, %u experts, queue depth %u)",
                          config ? config->n_layer : 0, config ? config->n_expert : 0,
                          config ? config->queue_depth : 0);
        return -EINVAL;
    }
    for (uint32_t l = 0; l < config->n_layer; l++) {
        if (config->tensors_in_layer[l] && !config->tensors_of_layer[l]) {
            guanaco_log_error("residency: layer %u has %u expert tensors but no array", l, config->tensors_in_layer[l]);
            return -EINVAL;
        }
    }
    return 0;
}

/* The tables sized by the model (tensors, layers, shards, per-slot and per-call arrays). 0 or -ENOMEM. */
static int allocate_tables(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    uint64_t n_tensors = 0;
    for (uint32_t l = 0; l < r->n_layer; l++) {
        n_tensors += config->tensors_in_layer[l];
    }
    size_t slots = (size_t)r->n_layer * r->n_expert;
    r->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*r->tensors));
    r->layers = calloc(r->n_layer, sizeof(*r->layers));
    r->shards = calloc(n_tensors ? n_tensors : 1, sizeof(*r->shards));
    r->read_call = calloc(r->n_expert, sizeof(*r->read_call));
    r->evicted_at = calloc(slots, sizeof(*r->evicted_at));
    r->seen_call = calloc(r->n_expert, sizeof(*r->seen_call));
    r->hit_call = calloc(r->n_expert, sizeof(*r->hit_call));
    r->distinct = calloc(r->n_expert, sizeof(*r->distinct));
    r->missing = calloc(r->n_expert, sizeof(*r->missing));
    r->missing_error = calloc(r->n_expert, sizeof(*r->missing_error));
    r->accessed = calloc(r->n_expert, sizeof(*r->accessed));
    r->policy_missing = calloc(r->n_expert, sizeof(*r->policy_missing));
    r->audit_vector = malloc(AUDIT_PAGES);
    bool ok = r->tensors && r->layers && r->shards && r->read_call && r->evicted_at && r->seen_call &&
              r->hit_call && r->distinct && r->missing && r->missing_error && r->accessed && r->policy_missing &&
              r->audit_vector;
    return ok ? 0 : -ENOMEM;
}

/* Layer l's expert tensors: each checked, its shard recorded; *requests is the most one call on it can need. */
static int add_layer(struct guanaco_residency *r, const struct guanaco_residency_config *config, uint32_t l,
                     uint64_t *requests) {
    struct layer *layer = &r->layers[l];
    layer->first_tensor = r->n_tensors;
    layer->n_tensors = config->tensors_in_layer[l];
    uint64_t requests_per_expert = 0;
    for (uint32_t i = 0; i < layer->n_tensors; i++) {
        const struct guanaco_residency_tensor *t = &config->tensors_of_layer[l][i];
        int err = check_tensor(r, l, i, t);
        if (err) {
            return err;
        }
        struct tensor *own = &r->tensors[r->n_tensors++];
        if ((err = add_shard(r, t->fd, &own->shard)) != 0) {
            return err;
        }
        const struct shard *sh = &r->shards[own->shard];
        own->fd = t->fd;
        own->layer = l;
        own->index_in_layer = i;
        own->direct_fd = config->load == GUANACO_RESIDENCY_LOAD_DIRECT ? t->direct_fd : -1;
        own->begin = t->file_offset;
        own->stride = t->expert_stride;
        own->end = t->file_offset + t->expert_stride * r->n_expert;
        own->mapped = t->mapped;
        own->arena = t->arena;
        own->transform = t->transform;
        own->transform_context = t->transform_context;
        const bool layout_file = t->arena && t->file_in_arena_layout;
        own->read_fd = layout_file ? t->layout_fd : own->fd;
        own->read_direct_fd = layout_file && own->direct_fd >= 0 ? t->layout_direct_fd : own->direct_fd;
        if (layout_file && (own->read_fd < 0 || own->read_fd == own->fd ||
                            (own->direct_fd >= 0 && own->read_direct_fd < 0))) {
            guanaco_log_error("residency: expert tensor %u of layer %u: a repack cache needs its descriptors", i, l);
            return -EINVAL;
        }
        if (t->arena && (!t->transform || (uintptr_t)t->arena % r->page)) {
            guanaco_log_error("residency: expert tensor %u of layer %u: an arena needs a transform and page alignment",
                              i, l);
            return -EINVAL;
        }
        if (t->arena && t->expert_stride > r->transform_source_bytes) {
            r->transform_source_bytes = t->expert_stride;
        }
        if (own->end > (uint64_t)sh->size) {
            guanaco_log_error("residency: expert tensor %u of layer %u ends at byte %llu but %s has %lld bytes", i, l,
                              (unsigned long long)own->end, sh->name, (long long)sh->size);
            return -EINVAL;
        }
        layer->expert_bytes += t->expert_stride;
        /* the chunks, plus LOAD_DIRECT's two edge reads */
        requests_per_expert += (t->expert_stride + GUANACO_RESIDENCY_CHUNK_BYTES - 1) / GUANACO_RESIDENCY_CHUNK_BYTES + 2;
    }
    if (layer->n_tensors > r->max_tensors_in_layer) {
        r->max_tensors_in_layer = layer->n_tensors;
    }
    *requests = requests_per_expert;
    return 0;
}

/* Every layer, then the request table for the largest call. 0, -EINVAL (with a message), -ENOMEM or -errno. */
static int add_layers(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    uint64_t most_per_expert = 0;
    for (uint32_t l = 0; l < r->n_layer; l++) {
        uint64_t requests = 0;
        int err = add_layer(r, config, l, &requests);
        if (err) {
            return err;
        }
        most_per_expert = requests > most_per_expert ? requests : most_per_expert;
        r->last_expert_layer = r->layers[l].n_tensors ? l : r->last_expert_layer;
    }
    /* every expert of a layer missing at once */
    uint64_t most_requests = most_per_expert * r->n_expert;
    if (most_requests > SIZE_MAX / sizeof(struct guanaco_io_request)) {
        return -ENOMEM;
    }
    r->max_expert_requests = (size_t)most_per_expert;
    r->request_capacity = (size_t)most_requests;
    r->requests = calloc(most_requests ? most_requests : 1, sizeof(*r->requests));
    r->request_missing = calloc(most_requests ? most_requests : 1, sizeof(*r->request_missing));
    return r->requests && r->request_missing ? 0 : -ENOMEM;
}

/*
 * Faults on expert pages must read only the faulted page: read-around would
 * pull non-resident neighbours into the page cache (say when the kernel
 * reclaimed a page between our read and the populate), and fault-around
 * would map cached neighbours. MADV_RANDOM turns both off. Rounding outward
 * only touches the advice of a neighbour's edge page.
 */
static void advise_random(const struct guanaco_residency *r) {
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        const struct tensor *t = &r->tensors[i];
        uintptr_t a = (uintptr_t)t->mapped, b = a + (uintptr_t)(t->end - t->begin);
        a -= a % r->page;
        b = (b + r->page - 1) / r->page * r->page;
        (void)madvise((void *)a, b - a, MADV_RANDOM);
    }
}

/* Maps t's file bytes [start, end) (page-aligned) over their place in the mapping, from our own descriptor. */
static int map_file_range(struct guanaco_residency *r, const struct tensor *t, uint64_t start, uint64_t end) {
    void *at = (void *)(uintptr_t)address_of(t, start);
    void *mapped = mmap(at, end - start, PROT_READ, MAP_SHARED | MAP_FIXED, t->fd, (off_t)start);
    if (mapped == MAP_FAILED) {
        int err = -errno;
        guanaco_log_error("residency: mapping %s bytes %llu..%llu from the file: %s", r->shards[t->shard].name,
                          (unsigned long long)start, (unsigned long long)end, strerror(-err));
        return err;
    }
    (void)madvise(mapped, end - start, MADV_RANDOM); /* a new mapping starts without the advice; see create */
    return 0;
}

/*
 * LOAD_DIRECT maps each expert tensor's pages again from our own descriptor
 * before any copy is placed. Evicting a copy maps the file back from that
 * descriptor, and the kernel merges a mapping only with neighbours of the same
 * open file; over llama.cpp's mapping every restored slice stayed a mapping of
 * its own. A run of non-resident experts is then one mapping, so a streamed
 * prompt's 2 MiB folios in it can be mapped whole (a PMD needs one mapping
 * around its 2 MiB); cut into pieces they were mapped a page at a time, and
 * direct loading's 1024-token prompts computed 0.91x page-cache loading's.
 */
static int map_experts_from_own_descriptor(struct guanaco_residency *r) {
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        const struct tensor *t = &r->tensors[i];
        int err = map_file_range(r, t, page_down(r, t->begin), page_up(r, t->end));
        if (err) {
            return err;
        }
    }
    return 0;
}

static int create_policy(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    uint64_t *expert_bytes = calloc(r->n_layer, sizeof(*expert_bytes));
    if (!expert_bytes) {
        return -ENOMEM;
    }
    for (uint32_t l = 0; l < r->n_layer; l++) {
        expert_bytes[l] = r->layers[l].expert_bytes;
    }
    struct guanaco_policy_config policy_config = {
        .kind = config->policy,
        .n_layer = r->n_layer,
        .n_expert = r->n_expert,
        .expert_bytes = expert_bytes,
        .budget_bytes = config->budget_bytes,
        .max_per_layer = config->max_experts_per_layer,
    };
    int err = guanaco_policy_create(&policy_config, &r->policy);
    free(expert_bytes);
    if (err) {
        guanaco_log_error("residency: cannot create the %s policy: %s", guanaco_policy_kind_name(config->policy),
                          strerror(-err));
    }
    return err;
}

static int create_reader(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    /* Demand reads are cut to GUANACO_RESIDENCY_CHUNK_BYTES here, read-ahead to GUANACO_IO_ADVISE_BYTES. */
    int err = guanaco_io_create(config->io_backend, r->queue_depth, GUANACO_RESIDENCY_CHUNK_BYTES, &r->io);
    if (err && err != -ENOSYS) { /* -ENOSYS is the caller's cue to fall back to threads, not an error */
        guanaco_log_error("residency: cannot create the %s reader: %s", guanaco_io_backend_name(config->io_backend),
                          strerror(-err));
    }
    r->io_backend = config->io_backend;
    return err;
}

int guanaco_residency_create(const struct guanaco_residency_config *config, struct guanaco_residency **out) {
    *out = NULL;
    int err = check_config(config);
    if (err) {
        return err;
    }
    struct guanaco_residency *r = calloc(1, sizeof(*r));
    if (!r) {
        return -ENOMEM;
    }
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->arrival_lock, NULL);
    pthread_cond_init(&r->expert_settled, NULL);
    r->n_layer = config->n_layer;
    r->n_expert = config->n_expert;
    long page = sysconf(_SC_PAGESIZE);
    r->page = page > 0 ? (uint64_t)page : 4096;
    r->queue_depth = config->queue_depth ? config->queue_depth : GUANACO_RESIDENCY_DEFAULT_QUEUE_DEPTH;
    r->n_expert_used = config->n_expert_used;
    r->budget_bytes = config->budget_bytes;
    r->read_layer = UINT32_MAX;
    r->last_layer = UINT32_MAX;

    /* in this order: the load choice needs the tensors, read-ahead needs the load choice */
    err = allocate_tables(r, config);
    err = err ? err : add_layers(r, config);
    err = err ? err : choose_load(r, config);
    if (!err && r->load == GUANACO_RESIDENCY_LOAD_DIRECT) {
        err = map_experts_from_own_descriptor(r); /* its new mappings carry the advice already */
    } else if (!err) {
        advise_random(r);
    }
    /* PAGE_CACHE: the matmuls fault the pages in. DIRECT places whole copies, so the matmuls ask for each
       expert (guanaco_residency_expert_data); it never has arenas (choose_load). */
    r->overlap_layer = config->overlap_layer;
    if (!err && r->overlap_layer && r->load == GUANACO_RESIDENCY_LOAD_DIRECT) {
        const size_t n_jobs = (size_t)r->n_expert * r->max_tensors_in_layer;
        r->expert_jobs = calloc(n_jobs, sizeof(*r->expert_jobs));
        r->job_first_request = calloc(n_jobs + 1, sizeof(*r->job_first_request));
        r->expert_state = calloc(r->n_expert, sizeof(*r->expert_state));
        r->computed_early = calloc(r->n_expert, sizeof(*r->computed_early));
        err = r->expert_jobs && r->job_first_request && r->expert_state && r->computed_early ? 0 : -ENOMEM;
        if (!err && r->slot_copy && r->transform_source) {
            r->arrivals = calloc((size_t)r->n_expert * r->max_tensors_in_layer, sizeof(*r->arrivals));
            r->arrival_source = malloc(r->transform_source_bytes);
            err = r->arrivals && r->arrival_source ? 0 : -ENOMEM;
        }
    }
    err = err ? err : create_policy(r, config);
    err = err ? err : prefetch_create(r, config);
    err = err ? err : stream_create(r, config);
    err = err ? err : demand_huge_create(r, config);
    err = err ? err : stream_direct_create(r, config);
    err = err ? err : create_reader(r, config);
    if (err) {
        guanaco_residency_destroy(r);
        return err;
    }
    r->stats.io_backend = r->io_backend;
    r->stats.load = r->load;
    r->stats.overlap_layer = r->overlap_layer;
    r->stats.stream_prompts = r->stream;
    r->stats.fixed_slots = r->slots;
    r->stats.stream_direct = r->stream_direct;
    *out = r;
    return 0;
}

/*
 * Read-ahead with page-cache loading fills the page cache, and the claiming
 * call maps it. With DIRECT each run reads one expert into anonymous copies,
 * as a demand load does, and the claiming call moves them into place: no
 * page-cache work on the cores that compute, which made page-cache
 * read-ahead cost more than it hid on 2 cores (bench/PIPELINE.md).
 */
static int prefetch_create(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    size_t slots = (size_t)r->n_layer * r->n_expert;
    r->prediction_stamp = calloc(slots, sizeof(*r->prediction_stamp));
    r->layer_prediction = calloc(r->n_layer, sizeof(*r->layer_prediction));
    r->prefetch_wanted = calloc(r->n_expert, sizeof(*r->prefetch_wanted));
    if (!r->prediction_stamp || !r->layer_prediction || !r->prefetch_wanted) {
        return -ENOMEM;
    }
    if (config->prefetch_bytes == 0) {
        return 0;
    }
    const bool direct = r->load == GUANACO_RESIDENCY_LOAD_DIRECT;
    /* A run's requests: each tensor's span of the run in GUANACO_IO_ADVISE_BYTES pieces (see settle_issued), or
       DIRECT's one expert as direct_slice_requests cuts it. */
    r->max_run_requests = direct ? r->max_expert_requests : 0;
    for (uint32_t l = 0; l < r->n_layer && (!direct || config->stream_prompts); l++) {
        const struct layer *layer = &r->layers[l];
        uint32_t run_experts = prefetch_run_experts(r, l);
        size_t requests = 0;
        for (uint32_t k = 0; k < layer->n_tensors; k++) {
            uint64_t span = r->tensors[layer->first_tensor + k].stride * run_experts;
            requests += (size_t)((span + GUANACO_IO_ADVISE_BYTES - 1) / GUANACO_IO_ADVISE_BYTES);
        }
        if (config->stream_prompts) {
            /* a streamed run: two ends of under a huge folio each in advise pieces, the middle in populate ones */
            size_t streamed = 0;
            for (uint32_t k = 0; k < layer->n_tensors; k++) {
                uint64_t span = r->tensors[layer->first_tensor + k].stride * stream_run_experts(r, l);
                streamed += 2 * (GUANACO_HUGE_FOLIO_BYTES / GUANACO_IO_ADVISE_BYTES + 1) + span / GUANACO_IO_POPULATE_BYTES + 1;
            }
            requests = streamed > requests ? streamed : requests;
        }
        r->max_run_requests = requests > r->max_run_requests ? requests : r->max_run_requests;
    }
    /* one layer ahead for every expert, twice over: two contexts may read ahead different layers */
    r->n_runs = 2 * r->n_expert;
    r->runs = calloc(r->n_runs, sizeof(*r->runs));
    r->run_of_slot = calloc(slots, sizeof(*r->run_of_slot));
    if (!r->runs || !r->run_of_slot) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < r->n_runs; i++) {
        r->runs[i].requests = calloc(r->max_run_requests ? r->max_run_requests : 1, sizeof(*r->runs[i].requests));
        r->runs[i].addresses = calloc(r->max_run_requests ? r->max_run_requests : 1, sizeof(*r->runs[i].addresses));
        r->runs[i].huge_maps = calloc(r->max_tensors_in_layer + 1, sizeof(*r->runs[i].huge_maps));
        r->runs[i].huge_lengths = calloc(r->max_tensors_in_layer + 1, sizeof(*r->runs[i].huge_lengths));
        if (!r->runs[i].requests || !r->runs[i].addresses || !r->runs[i].huge_maps || !r->runs[i].huge_lengths) {
            return -ENOMEM;
        }
        if (direct) {
            r->runs[i].staging = calloc(r->max_tensors_in_layer + 1, sizeof(*r->runs[i].staging));
            r->runs[i].edges = malloc((r->max_tensors_in_layer + 1) * 2 * EDGE_SLOT_PAGES * r->page);
            if (!r->runs[i].staging || !r->runs[i].edges) {
                return -ENOMEM;
            }
        }
    }
    r->prefetch_allowance = config->prefetch_bytes;
    return 0;
}

/*
 * Streaming needs the page-cache path without arenas: an arena would hold a
 * copy that the next call throws away (but see the repack cache below, which
 * streams into the stream buffers instead). The huge mappings are only address
 * space; without them (no THP, or mmap refused) streaming still works, in
 * 4 KiB folios.
 *
 * Each streamed run maps just the 2 MiB-aligned middle it populates, and
 * unmaps it once its reads are done. A mapping of the whole file advised
 * MADV_HUGEPAGE would let khugepaged (kernels with
 * CONFIG_READ_ONLY_THP_FOR_FS) collapse any 2 MiB range around a cached
 * page into one folio, reading non-resident experts' bytes in beyond the
 * budget, in folios that a resident neighbour then keeps.
 */
static int stream_create(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    if (!config->stream_prompts) {
        return 0;
    }
    /* A repacked tensor streams only from a repack cache into the stream buffers, whose bytes are then ready for
       its kernels: a streamed page-cache mapping would hand them the file's layout, and repacking a prompt's whole
       layer per ubatch costs more than the faster kernels save. Without the cache, its prompts go through the
       budget, as before; with it, a prompt no longer evicts decode's experts to pass through (streams_now). */
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        const struct tensor *t = &r->tensors[i];
        if (t->arena && !(in_arena_layout(t) && config->stream_direct && r->slots &&
                          r->load == GUANACO_RESIDENCY_LOAD_DIRECT)) {
            return 0;
        }
    }
    r->stream_ahead = calloc(r->n_layer, sizeof(*r->stream_ahead));
    r->stream_pending = calloc(r->n_layer, sizeof(*r->stream_pending));
    if (!r->stream_ahead || !r->stream_pending) {
        return -ENOMEM;
    }
    r->stream = true;
    r->stream_huge = r->prefetch_allowance && huge_mappings_work(r, config);
    return 0;
}

/* Whether a call may stream now (stream_prompts): repacked tensors only into the stream buffers, so only while
   they are in force and one context computes (with several, a streamed call goes through the page cache). */
static inline bool streams_now(const struct guanaco_residency *r) {
    return r->stream && ((r->stream_direct && !r->shared) || !r->transform_source); /* transform_source: arenas */
}

/*
 * Demand loads read the 2 MiB-aligned middle of every slice that has one in
 * huge folios, through a mapping made for that call alone: the page cache's
 * work per byte read and dropped falls with the folio count. Mixtral-8x7B
 * Q4_0 at 25% (33 MB slices, 4.5 GB read per token) spent 1.69x warm compute
 * outside the stall with 4 KiB folios, the kernel's reads and drops taking
 * the compute's cores. A slice under 4 MiB may have no such middle, and reads
 * as before; so does everything where the kernel refuses MADV_HUGEPAGE on a
 * file mapping. The middle holds no other expert's byte, so no resident
 * neighbour can keep a folio alive, and dropping the expert drops its folios.
 */
static int demand_huge_create(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    if (!huge_mappings_work(r, config)) {
        return 0;
    }
    size_t n = (size_t)r->n_expert * r->max_tensors_in_layer;
    r->demand_huge_maps = calloc(n ? n : 1, sizeof(*r->demand_huge_maps));
    r->demand_huge_lengths = calloc(n ? n : 1, sizeof(*r->demand_huge_lengths));
    if (!r->demand_huge_maps || !r->demand_huge_lengths) {
        return -ENOMEM;
    }
    r->demand_huge = true;
    return 0;
}

/* Called once the demand job is done (waited): no populate can still be using the mappings. */
static void unmap_demand_huge(struct guanaco_residency *r) {
    for (uint32_t k = 0; k < r->n_demand_huge_maps; k++) {
        munmap(r->demand_huge_maps[k], (size_t)r->demand_huge_lengths[k]);
    }
    r->n_demand_huge_maps = 0;
}

/* ---- the file-change guard ---- */

static int check_files(struct guanaco_residency *r) {
    if (r->stale) {
        return -ESTALE;
    }
    for (uint32_t s = 0; s < r->n_shards; s++) {
        struct shard *sh = &r->shards[s];
        struct stat st;
        if (fstat(sh->fd, &st) != 0) {
            int err = -errno;
            guanaco_log_error("residency: %s: %s", sh->name, strerror(-err));
            return err;
        }
        if (st.st_size != sh->size || st.st_mtim.tv_sec != sh->mtime.tv_sec || st.st_mtim.tv_nsec != sh->mtime.tv_nsec) {
            /* The mapping may now SIGBUS past the new end, or hold other weights: nothing can be trusted. */
            r->stale = true;
            guanaco_log_error("model file %s changed on disk while running (size %lld -> %lld bytes, mtime %s): "
                              "stopping; restart to use the new file",
                              sh->name, (long long)sh->size, (long long)st.st_size,
                              st.st_mtim.tv_sec != sh->mtime.tv_sec || st.st_mtim.tv_nsec != sh->mtime.tv_nsec
                                  ? "changed"
                                  : "unchanged");
            return -ESTALE;
        }
    }
    return 0;
}

/* ---- dropping pages: the edge-page rule ---- */

/*
 * Whether the page starting at file offset `page` of tensor t (of `layer`)
 * may be dropped: it lies wholly inside the expert tensor, and no resident
 * expert's slice touches it. Bytes outside the tensor belong to other weights
 * or the header, which are never ours to drop.
 */
static bool page_droppable(const struct guanaco_residency *r, uint32_t layer, const struct tensor *t, uint64_t page) {
    if (page < t->begin || page + r->page > t->end) {
        return false;
    }
    uint64_t first = (page - t->begin) / t->stride;
    uint64_t last = (page + r->page - 1 - t->begin) / t->stride;
    for (uint64_t e = first; e <= last; e++) {
        if (holds(r, layer, (uint32_t)e)) {
            return false;
        }
    }
    return true;
}

static int drop_range(struct guanaco_residency *r, const struct tensor *t, uint64_t start, uint64_t end) {
    /* MADV_DONTNEED drops our page-table entries; the page cache would keep the data without the fadvise, and
       the fadvise alone skips pages still mapped. Both, in this order, free the RAM. */
    if (madvise((void *)(uintptr_t)address_of(t, start), end - start, MADV_DONTNEED) != 0) {
        int err = -errno;
        guanaco_log_error("residency: madvise(MADV_DONTNEED) on %s bytes %llu..%llu: %s", r->shards[t->shard].name,
                          (unsigned long long)start, (unsigned long long)end, strerror(-err));
        return err;
    }
    int ret = posix_fadvise(t->fd, (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
    if (ret != 0) {
        guanaco_log_error("residency: posix_fadvise(DONTNEED) on %s bytes %llu..%llu: %s", r->shards[t->shard].name,
                          (unsigned long long)start, (unsigned long long)end, strerror(ret));
        return -ret;
    }
    return 0;
}

/*
 * LOAD_DIRECT's spare copies: an evicted expert's anonymous pages, moved out of the mapping and kept for the
 * next read instead of freed. A fresh buffer's pages are allocated and zeroed by the kernel on every read (in
 * this VM, 1.1 ms per MB with the host's faults); a spare's are there already, and compute finds them warm
 * too. The next call's reads take them (best fit, the excess unmapped); beyond spare_limit they are freed.
 */
/* Gives an anonymous copy's memory back: to the slot pool where it came from there (with `remapped`, the file
   was mapped over it since), else to the kernel. */
static void free_copy(struct guanaco_residency *r, char *at, uint64_t length, bool remapped) {
    if (!r->slots || !guanaco_slot_pool_owns(&r->slot_pool, at)) {
        munmap(at, length);
        return;
    }
    int err = guanaco_slot_pool_give(&r->slot_pool, at, length, remapped);
    if (err) {
        guanaco_log_error("residency: giving a slot of %llu bytes back: %s; its memory stays until the end",
                          (unsigned long long)length, strerror(-err));
    }
}

static char *take_spare(struct guanaco_residency *r, uint64_t length) {
    size_t best = r->n_spares;
    for (size_t i = 0; i < r->n_spares; i++) {
        if (r->spares[i].length >= length && (best == r->n_spares || r->spares[i].length < r->spares[best].length)) {
            best = i;
        }
    }
    if (best == r->n_spares) {
        return NULL;
    }
    struct spare_copy spare = r->spares[best];
    r->spares[best] = r->spares[--r->n_spares];
    r->spare_bytes -= spare.length;
    if (spare.length > length) {
        free_copy(r, spare.at + length, spare.length - length, false);
    }
    r->stats.spare_reused_bytes += length;
    return spare.at; /* writable since keep_spare */
}

/* Whether the spares have room for one more copy of `length` bytes. */
static bool spare_room(struct guanaco_residency *r, uint64_t length) {
    if (r->streaming || r->spare_bytes + length > r->spare_limit || r->n_spares >= r->spare_count_limit) {
        return false;
    }
    if (r->n_spares == r->spare_capacity) {
        size_t capacity = r->spare_capacity ? 2 * r->spare_capacity : 64;
        struct spare_copy *grown = realloc(r->spares, capacity * sizeof(*grown));
        if (!grown) {
            return false;
        }
        r->spares = grown;
        r->spare_capacity = capacity;
    }
    return true;
}

static void add_spare(struct guanaco_residency *r, char *at, uint64_t length) {
    r->spares[r->n_spares++] = (struct spare_copy){.at = at, .length = length};
    r->spare_bytes += length;
}

/*
 * Moves the anonymous pages at [at, at + length) out to a new spare, if there is room. The range stays mapped
 * (MREMAP_DONTUNMAP leaves it empty, zero-filled on a touch) until the caller maps the file over it: a range
 * left unmapped even for a moment is a hole any other thread's mmap can land in (a thread stack, ASan's own
 * bookkeeping), which the file's MAP_FIXED mapping then overwrote; seen as a SIGSEGV in a test's matmul thread
 * and in ASan's thread teardown. Where the kernel refuses the flag (before 5.7) the copy is simply freed.
 */
static void keep_spare(struct guanaco_residency *r, char *at, uint64_t length) {
#ifdef MREMAP_DONTUNMAP
    if (!spare_room(r, length)) {
        return;
    }
    void *spare = mmap(NULL, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (spare == MAP_FAILED) {
        return;
    }
    if (mremap(at, length, length, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, spare) == MAP_FAILED) {
        munmap(spare, length);
        return;
    }
    /* A placed copy is read-only and becomes writable for the next read. The file's own mapping (an expert whose
       load failed before its copy was placed) cannot: it is not a copy, and goes. */
    if (mprotect(spare, length, PROT_READ | PROT_WRITE) != 0) {
        munmap(spare, length);
        return;
    }
    add_spare(r, spare, length);
#else
    (void)r, (void)at, (void)length;
#endif
}

/* Copies read and never placed (a failed expert's, a guess nobody claimed) become spares, or go back to the
   kernel; each staging[tensor] is NULL after. No read may still be landing in them. */
static void discard_copies(struct guanaco_residency *r, const struct layer *l, uint32_t e, char **staging) {
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        if (staging[k]) {
            const struct tensor *t = &r->tensors[l->first_tensor + k];
            uint64_t a = t->begin + (uint64_t)e * t->stride;
            uint64_t length = r->slots ? slot_length(r, t) : page_down(r, a + t->stride) - page_up(r, a);
            if (!r->shared && spare_room(r, length)) {
                add_spare(r, staging[k], length);
            } else {
                free_copy(r, staging[k], length, false);
            }
            staging[k] = NULL;
        }
    }
}

static void unmap_spares(struct guanaco_residency *r) {
    for (size_t i = 0; i < r->n_spares; i++) {
        free_copy(r, r->spares[i].at, r->spares[i].length, false);
    }
    r->n_spares = 0;
    r->spare_bytes = 0;
}

static void free_spares(struct guanaco_residency *r) {
    unmap_spares(r);
    free(r->spares);
}

/*
 * A prompt reads through the page cache (stream_prompts) and takes no
 * spare, so while it streams the spares go back to the kernel: up to an
 * eighth of the budget in anonymous memory that the prompt's page cache, a
 * layer read and the next one reading ahead, would otherwise have to be
 * reclaimed from under a memory limit. Decode's next evictions make new ones.
 */
static void set_streaming(struct guanaco_residency *r, bool streaming) {
    if (streaming && !r->streaming) {
        unmap_spares(r);
    }
    r->streaming = streaming;
}

/*
 * LOAD_DIRECT's eviction: the anonymous copy moves out to a spare (if there is
 * room; else the mapping frees it), and the file mapping goes back over
 * [start, end). A concurrent reader faults the file's bytes back in.
 */
static int restore_file_pages(struct guanaco_residency *r, const struct tensor *t, uint64_t start, uint64_t end) {
    void *at = (void *)(uintptr_t)address_of(t, start);
    if (!r->shared) {
        keep_spare(r, at, end - start); /* leaves the range mapped, empty, for the mmap below to replace */
    }
    return map_file_range(r, t, start, end);
}

/* Whether no expert held in `layer` has bytes on the arena page at arena offset `page`. */
static bool arena_page_droppable(const struct guanaco_residency *r, uint32_t layer, const struct tensor *t,
                                 uint64_t page) {
    uint64_t first = page / t->stride, last = (page + r->page - 1) / t->stride;
    for (uint64_t e = first; e <= last && e < r->n_expert; e++) {
        if (holds(r, layer, (uint32_t)e)) {
            return false;
        }
    }
    return true;
}

/* An arena tensor's share of drop_expert: the slice's arena pages, edges by arena_page_droppable. */
static int drop_arena_slice(struct guanaco_residency *r, uint32_t layer, const struct tensor *t, uint32_t e) {
    uint64_t a = (uint64_t)e * t->stride, b = a + t->stride, length = page_up(r, t->end - t->begin);
    uint64_t start = page_up(r, a), end = page_down(r, b);
    if (a % r->page && arena_page_droppable(r, layer, t, page_down(r, a))) {
        start = page_down(r, a);
    }
    if (b % r->page && arena_page_droppable(r, layer, t, page_down(r, b))) {
        end = page_down(r, b) + r->page < length ? page_down(r, b) + r->page : length;
    }
    if (start < end && madvise(t->arena + start, end - start, MADV_DONTNEED) != 0) {
        int err = -errno;
        guanaco_log_error("residency: madvise(MADV_DONTNEED) on the arena of %s bytes %llu..%llu: %s",
                          r->shards[t->shard].name, (unsigned long long)(t->begin + start),
                          (unsigned long long)(t->begin + end), strerror(-err));
        return err;
    }
    return 0;
}

/* Unmaps the copies retired while several contexts computed; only once one context is left, between its
   matmuls, can no one be computing from them. */
static void unmap_retired(struct guanaco_residency *r) {
    for (size_t i = 0; i < r->n_retired; i++) {
        free_copy(r, r->retired[i].at, r->retired[i].length, true);
    }
    r->n_retired = 0;
}

/*
 * fixed_slots' eviction of expert e's copy of t: the slot becomes a spare for the next read, with no page-table
 * change. With several contexts another one may be computing from it, so the file's own bytes are mapped over it
 * instead (atomic for a reader, as restore_file_pages is), and it is unmapped once one context is left.
 */
static void release_slot(struct guanaco_residency *r, const struct tensor *t, uint32_t e, char *copy) {
    uint64_t length = slot_length(r, t), a = t->begin + (uint64_t)e * t->stride;
    if (!r->shared) {
        if (spare_room(r, length)) {
            add_spare(r, copy, length);
        } else {
            free_copy(r, copy, length, false);
        }
        return;
    }
    if (mmap(copy, length, PROT_READ, MAP_SHARED | MAP_FIXED, t->fd, (off_t)page_down(r, a)) == MAP_FAILED) {
        guanaco_log_error("residency: mapping %s bytes %llu.. over an evicted copy: %s; it stays until one context "
                          "is left", r->shards[t->shard].name, (unsigned long long)page_down(r, a), strerror(errno));
    }
    if (r->n_retired == r->retired_capacity) {
        size_t capacity = r->retired_capacity ? 2 * r->retired_capacity : 64;
        struct spare_copy *grown = realloc(r->retired, capacity * sizeof(*grown));
        if (!grown) {
            return; /* its address space stays taken: unmapping it could fault a reader */
        }
        r->retired = grown;
        r->retired_capacity = capacity;
    }
    r->retired[r->n_retired++] = (struct spare_copy){.at = copy, .length = length};
}

/*
 * Drops the pages of expert e of `layer` that nothing resident needs. The
 * expert must already be marked non-resident. Its interior pages always go;
 * each edge page goes when page_droppable says so. The result is one
 * contiguous range per slice, and for an arena tensor one in the arena too.
 * DIRECT's copies, where `copies_placed`, move out to the spares first; a
 * copy never placed (a guess nobody claimed) left the mapping the file's.
 */
static int drop_expert_pages(struct guanaco_residency *r, uint32_t layer, uint32_t e, bool copies_placed) {
    const struct layer *l = &r->layers[layer];
    int first_error = 0;
    for (uint32_t i = 0; i < l->n_tensors; i++) {
        const struct tensor *t = &r->tensors[l->first_tensor + i];
        uint64_t a = t->begin + (uint64_t)e * t->stride, b = a + t->stride;
        uint64_t start = page_up(r, a), end = page_down(r, b);
        if (a % r->page && page_droppable(r, layer, t, page_down(r, a))) {
            start = page_down(r, a);
        }
        if (b % r->page && page_droppable(r, layer, t, page_down(r, b))) {
            end = page_down(r, b) + r->page;
        }
        char *copy = r->slots ? atomic_exchange(&r->slot_copy[slot_index(r, t, e)], NULL) : NULL;
        if (copy) {
            release_slot(r, t, e, copy); /* the mapping never held it */
        } else if (copies_placed && r->load == GUANACO_RESIDENCY_LOAD_DIRECT && page_up(r, a) < page_down(r, b)) {
            int err = restore_file_pages(r, t, page_up(r, a), page_down(r, b));
            if (err && !first_error) {
                first_error = err;
            }
        }
        if (start < end) {
            int err = drop_range(r, t, start, end);
            if (err && !first_error) {
                first_error = err;
            }
        }
        if (t->arena && !copy) { /* a slot's transform never touched the arena */
            int err = drop_arena_slice(r, layer, t, e);
            first_error = first_error ? first_error : err;
        }
    }
    return first_error;
}

static int drop_expert(struct guanaco_residency *r, uint32_t layer, uint32_t e) {
    return drop_expert_pages(r, layer, e, true);
}

/*
 * Drops the pages of `layer`'s expert tensors that no held expert needs, one
 * range per run of experts not held: a folio larger than a page (the huge
 * mapping's) is dropped only when a range covers it whole.
 */
static int drop_free_runs(struct guanaco_residency *r, uint32_t layer) {
    int first_error = 0;
    const struct layer *l = &r->layers[layer];
    for (uint32_t i = 0; i < l->n_tensors; i++) {
        const struct tensor *t = &r->tensors[l->first_tensor + i];
        for (uint32_t e = 0; e < r->n_expert;) {
            if (holds(r, layer, e)) {
                e++;
                continue;
            }
            uint32_t run_end = e;
            while (run_end < r->n_expert && !holds(r, layer, run_end)) {
                run_end++;
            }
            uint64_t a = t->begin + (uint64_t)e * t->stride, b = t->begin + (uint64_t)run_end * t->stride;
            uint64_t start = page_up(r, a), end = page_down(r, b);
            if (a % r->page && page_droppable(r, layer, t, page_down(r, a))) {
                start = page_down(r, a);
            }
            if (b % r->page && page_droppable(r, layer, t, page_down(r, b))) {
                end = page_down(r, b) + r->page;
            }
            if (start < end) {
                int err = drop_range(r, t, start, end);
                first_error = first_error ? first_error : err;
            }
            e = run_end;
        }
    }
    return first_error;
}

/*
 * Drops every cached page of the expert tensors that no resident expert
 * needs. Pages get cached without us: readahead around faults on the weights
 * next to an expert tensor, or anything that read the file before the engine
 * started. Only the page cache and the page tables are touched, never a
 * DIRECT copy.
 */
static int drop_unaccounted_locked(struct guanaco_residency *r) {
    int first_error = 0;
    for (uint32_t layer = 0; layer < r->n_layer; layer++) {
        if (r->stream && r->stream_pending[layer]) {
            continue; /* its call streamed and it may not have computed yet: its next call drops these */
        }
        int err = drop_free_runs(r, layer);
        first_error = first_error ? first_error : err;
    }
    return first_error;
}

int guanaco_residency_drop_unaccounted(struct guanaco_residency *r) {
    pthread_mutex_lock(&r->lock);
    int deferred_error = finish_deferred(r, true);
    /* The engine drops at the last layer's router, before that layer computes. If its call streamed, the layer
       computes from pages the policy does not hold: dropped now, its matmuls would read them from the disk again,
       and they would stay cached outside the accounting (a whole layer's working set). So streamed layers keep
       their pages here, as in the audit, and lose them at the next call, as always. */
    int pending_error = drop_pending(r, false);
    pending_error = pending_error ? pending_error : deferred_error;
    int err = drop_unaccounted_locked(r);
    pthread_mutex_unlock(&r->lock);
    return err ? err : pending_error;
}

/* ---- loading ---- */

static const char *shard_name(const struct guanaco_residency *r, int fd) {
    for (uint32_t s = 0; s < r->n_shards; s++) {
        if (r->shards[s].fd == fd) {
            return r->shards[s].name;
        }
    }
    for (uint32_t i = 0; i < r->n_tensors; i++) { /* an O_DIRECT read's */
        if (r->tensors[i].direct_fd == fd) {
            return r->shards[r->tensors[i].shard].name;
        }
    }
    return "?";
}

static int populate(struct guanaco_residency *r, const char *start, uint64_t length) {
    for (unsigned tries = 0; !r->populate_by_touch; tries++) {
        if (madvise((void *)(uintptr_t)start, length, MADV_POPULATE_READ) == 0) {
            return 0;
        }
        int err = errno;
        if (err == EINVAL || err == ENOSYS) {
            r->populate_by_touch = true; /* before Linux 5.14 */
            break;
        }
        if ((err != EINTR && err != EAGAIN) || tries >= POPULATE_RETRIES) {
            return -err;
        }
    }
    for (uint64_t at = 0; at < length; at += r->page) {
        (void)*(const volatile char *)(start + at);
    }
    return 0;
}

/*
 * An arena tensor's expert e: its bytes, read into the page cache already (or
 * now, from the disk), are copied out and transformed into the arena. The
 * page cache lets go of them at the end of the call (drop_arena_file_pages).
 */
static int transform_slice(struct guanaco_residency *r, const struct tensor *t, uint32_t e) {
    uint64_t a = t->begin + (uint64_t)e * t->stride;
    /* a repack cache's bytes are the arena's already: read straight into it */
    char *into = in_arena_layout(t) ? t->arena + (a - t->begin) : r->transform_source;
    uint64_t first = page_down(r, a - t->begin), last = page_up(r, a - t->begin + t->stride);
    if (in_arena_layout(t)) {
        (void)madvise(t->arena + first, last - first, MADV_POPULATE_WRITE); /* as below */
    }
    for (uint64_t done = 0; done < t->stride;) {
        ssize_t got = pread(t->read_fd, into + done, t->stride - done, (off_t)(a + done));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return got < 0 ? -errno : -ENODATA;
        }
        done += (uint64_t)got;
    }
    if (in_arena_layout(t)) {
        return 0;
    }
    uint64_t start = guanaco_now_ns();
    /* One call faults the slice's fresh pages in, where the transform's stores would take one fault per page:
       repacking 14.8 -> 11.9 ms per token for Q4_0 at a 25% budget (README, --guanaco-repack). */
    (void)madvise(t->arena + first, last - first, MADV_POPULATE_WRITE); /* best effort: without it, faults */
    int err = t->transform(t->transform_context, e, r->transform_source, t->arena + (a - t->begin));
    r->stats.transform_ns += guanaco_now_ns() - start;
    if (err) {
        return err;
    }
    r->stats.transformed_bytes += t->stride;
    return 0;
}

/*
 * fixed_slots: an arena tensor's expert e, read whole into its slot at the
 * file offset's place in the page, is transformed to where it computes in
 * the same slot (computed_in_slot; through transform_source: ggml's repack
 * reads every row of an interleave group before it writes the group). The slot's
 * pages were touched by an earlier copy or by the read, so this is ggml's
 * repack alone, where the arena paid a first touch per page, every time.
 */
static int transform_in_slot(struct guanaco_residency *r, const struct tensor *t, uint32_t e, char *slot,
                             struct slot_arrival *arrival) {
    if (in_arena_layout(t)) {
        return 0; /* read from a repack cache: already in the layout it computes from */
    }
    if (arrival && (arrival->repacked || arrival->error)) { /* done by the io thread as it landed */
        int err = arrival->error;
        r->stats.arrival_transform_ns += arrival->transform_ns;
        r->stats.transformed_bytes += err ? 0 : t->stride;
        *arrival = (struct slot_arrival){0};
        return err;
    }
    uint64_t start = guanaco_now_ns(), a = t->begin + (uint64_t)e * t->stride;
    memcpy(r->transform_source, slot + (a - page_down(r, a)), t->stride);
    int err = t->transform(t->transform_context, e, r->transform_source, computed_in_slot(slot, t, a, r->page));
    r->stats.transform_ns += guanaco_now_ns() - start;
    r->stats.transformed_bytes += err ? 0 : t->stride;
    return err;
}

/* Bytes beyond an arena tensor's ends that its page-cache drop covers too: a large folio the kernel read
   around the first or last slice can reach past the tensor, and a drop skips a folio it does not cover whole. */
#define ARENA_DROP_MARGIN_BYTES (2u << 20)

/*
 * Once a call is done, the file's pages of `layer`'s arena tensors are needed
 * by no one: the arenas hold the experts. So the whole of each such tensor
 * leaves the page cache, by one fadvise. Not while read-ahead is in flight,
 * whose pages a later call will copy out. Mapped pages are skipped by the
 * kernel, so a neighbour that computes from the mapping keeps what it uses.
 */
static void drop_arena_file_pages(struct guanaco_residency *r, uint32_t layer) {
    const struct layer *l = &r->layers[layer];
    if (!r->transform_source || r->prefetch_outstanding) {
        return;
    }
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        if (t->arena) {
            /* read-ahead that was waited for by mapping it (settle_issued) left page-table entries, which keep the
               pages: only the tensor's own whole pages, as the edge pages may be a neighbour's that computes */
            if (page_up(r, t->begin) < page_down(r, t->end)) {
                (void)madvise((void *)(uintptr_t)address_of(t, page_up(r, t->begin)),
                              page_down(r, t->end) - page_up(r, t->begin), MADV_DONTNEED);
            }
            uint64_t a = t->begin > ARENA_DROP_MARGIN_BYTES ? page_down(r, t->begin - ARENA_DROP_MARGIN_BYTES) : 0;
            uint64_t b = page_up(r, t->end + ARENA_DROP_MARGIN_BYTES);
            (void)posix_fadvise(t->fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
            if (t->read_fd != t->fd) {
                (void)posix_fadvise(t->read_fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
            }
        }
    }
}

/* Maps expert e's slice of t in the file mapping, rounded outward to pages (the edge pages hold its bytes
   too), waiting for reads in flight. */
static int map_slice(struct guanaco_residency *r, const struct tensor *t, uint32_t e) {
    uint64_t a = t->begin + (uint64_t)e * t->stride, b = a + t->stride;
    return populate(r, address_of(t, page_down(r, a)), page_up(r, b) - page_down(r, a));
}

/* Expert e's slice of t where it computes: the arena's transformed copy, or the mapping's pages (populate,
   rounded outward: the edge pages hold its bytes too). With overlap_layer the pages are read or being read,
   and the matmul that needs them faults them in: the kernel waits for a page still reading. */
static int place_slice(struct guanaco_residency *r, const struct tensor *t, uint32_t e) {
    if (t->arena) {
        return transform_slice(r, t, e);
    }
    return r->overlap_layer && r->load == GUANACO_RESIDENCY_LOAD_PAGE_CACHE && !r->preloading ? 0 : map_slice(r, t, e);
}

/* File bytes [a, b) of t in pieces of `piece`: WILLNEED, or populate through `huge`, where byte a is mapped. */
static void add_slice_requests(struct guanaco_residency *r, size_t *n_requests, const struct tensor *t, uint64_t a,
                               uint64_t b, const char *huge, uint64_t piece, size_t missing_index) {
    for (uint64_t at = a; at < b; at += piece) {
        uint64_t length = b - at < piece ? b - at : piece;
        r->requests[*n_requests] = (struct guanaco_io_request){
            .fd = t->read_fd, .offset = at, .length = length,
            .populate = huge && !in_arena_layout(t) ? huge + (at - a) : NULL}; /* huge maps fd */
        r->request_missing[(*n_requests)++] = (uint32_t)missing_index;
    }
}

/* PAGE_CACHE: every slice in chunks, all in one job, with no destination: the kernel reads them into the
 * page cache (WILLNEED) without a copy to user memory, and mapping them (populate) waits for the disk.
 * With overlap_layer they go tensor by tensor (r->missing is sorted), the order the matmuls fault them in, so
 * the disk answers about when compute gets there. */
static size_t page_cache_requests(struct guanaco_residency *r, const struct layer *l, size_t n) {
    size_t n_requests = 0;
    const bool by_tensor = r->overlap_layer;
    for (size_t outer = 0; outer < (by_tensor ? l->n_tensors : n); outer++) {
        for (size_t inner = 0; inner < (by_tensor ? n : l->n_tensors); inner++) {
            size_t i = by_tensor ? inner : outer;
            uint32_t k = (uint32_t)(by_tensor ? outer : inner);
            const struct tensor *t = &r->tensors[l->first_tensor + k];
            uint64_t a = t->begin + (uint64_t)r->missing[i] * t->stride, b = a + t->stride;
            /* the middle in huge folios (demand_huge_create) */
            uint64_t huge_begin, huge_end;
            const char *huge = map_huge_middle(t, a, b, r->demand_huge, &huge_begin, &huge_end);
            if (huge) {
                r->demand_huge_maps[r->n_demand_huge_maps] = (void *)(uintptr_t)huge;
                r->demand_huge_lengths[r->n_demand_huge_maps++] = huge_end - huge_begin;
                r->stats.loaded_huge_bytes += huge_end - huge_begin;
            }
            /* at most ceil(stride / chunk) + 2 requests, as add_layer counted: each end is under 2 MiB, and the
               middle's pieces are 8 MiB */
            add_slice_requests(r, &n_requests, t, a, huge_begin, NULL, GUANACO_RESIDENCY_CHUNK_BYTES, i);
            add_slice_requests(r, &n_requests, t, huge_begin, huge_end, huge, GUANACO_IO_POPULATE_BYTES, i);
            add_slice_requests(r, &n_requests, t, huge_end, b, NULL, GUANACO_RESIDENCY_CHUNK_BYTES, i);
        }
    }
    return n_requests;
}

/* An evicted copy's pages of at least `length` bytes (take_spare), else fresh ones: a slot from the pool while one
   context computes, else a mapping of its own (with several, place_slot moves its pages into the file mapping, which
   a pool's range must not lend). MAP_FAILED with errno when none. */
static char *copy_buffer(struct guanaco_residency *r, uint64_t length) {
    char *buffer = take_spare(r, length);
    if (!buffer && r->slots && !r->shared) {
        buffer = guanaco_slot_pool_take(&r->slot_pool, length);
        return buffer ? buffer : MAP_FAILED;
    }
    return buffer ? buffer : mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

/* Where an O_DIRECT read of t's bytes up to `end` stops: `end` rounded up to a page, or down where that page would
   pass the file's end, which O_DIRECT cannot read to; the rest is read buffered. */
static uint64_t direct_read_end(const struct guanaco_residency *r, const struct tensor *t, uint64_t end) {
    uint64_t up = page_up(r, end);
    return up > (uint64_t)r->shards[t->shard].size ? page_down(r, end) : up;
}

/* O_DIRECT requests for file bytes [from, to) of t (page aligned) into `buffer`, in chunks; returns their count. */
static long direct_chunks(const struct tensor *t, uint64_t from, uint64_t to, char *buffer,
                          struct guanaco_io_request *out) {
    long n = 0;
    for (uint64_t at = from; at < to; at += GUANACO_RESIDENCY_CHUNK_BYTES) {
        uint64_t left = to - at;
        out[n++] = (struct guanaco_io_request){
            .fd = t->read_direct_fd, .offset = at,
            .length = left < GUANACO_RESIDENCY_CHUNK_BYTES ? left : GUANACO_RESIDENCY_CHUNK_BYTES,
            .destination = buffer + (at - from)};
    }
    return n;
}

/* fixed_slots: the slice [a, a + stride) of t read whole into a slot (a spare, or fresh), file byte x at slot +
 * x - page_down(a): its pages rounded outward with O_DIRECT, the neighbours' bytes on its edge pages included,
 * and only a last partial page of the file, which O_DIRECT cannot end on, buffered. */
static long slot_requests(struct guanaco_residency *r, const struct tensor *t, uint64_t a, char **staging,
                          struct guanaco_io_request *out) {
    uint64_t length = slot_length(r, t), b = a + t->stride, start = page_down(r, a);
    char *slot = copy_buffer(r, length);
    if (slot == MAP_FAILED) {
        return -errno;
    }
    *staging = slot;
    uint64_t direct_end = direct_read_end(r, t, b);
    long n = direct_chunks(t, start, direct_end, slot, out);
    uint64_t tail = direct_end > a ? direct_end : a;
    if (tail < b) {
        out[n++] = (struct guanaco_io_request){.fd = t->read_fd, .offset = tail, .length = b - tail,
                                               .destination = slot + (tail - start)};
    }
    return n;
}

/* DIRECT: expert e's slice of t as requests at out[0...]: its whole pages O_DIRECT into a spare copy or a fresh
 * anonymous buffer (*staging, which the caller owns from here), its partial edge pages buffered into the two
 * slots at `edges` (content discarded: the page cache is the point), like PAGE_CACHE's. Returns the request
 * count (at most ceil(stride / chunk) + 2, as add_layer counted), or -errno with nothing allocated. */
static long direct_slice_requests(struct guanaco_residency *r, const struct tensor *t, uint32_t e, char **staging,
                                  char *edges, struct guanaco_io_request *out) {
    uint64_t a = t->begin + (uint64_t)e * t->stride, b = a + t->stride;
    if (r->slots) {
        return slot_requests(r, t, a, staging, out);
    }
    uint64_t inner_start = page_up(r, a), inner_end = page_down(r, b);
    long n = 0;
    if (inner_start >= inner_end) { /* no whole page inside: all of it is edge */
        out[n++] = (struct guanaco_io_request){.fd = t->fd, .offset = a, .length = b - a, .destination = edges};
        return n;
    }
    char *buffer = copy_buffer(r, inner_end - inner_start);
    if (buffer == MAP_FAILED) {
        return -errno;
    }
    *staging = buffer;
    n += direct_chunks(t, inner_start, inner_end, buffer, out + n);
    if (a < inner_start) {
        out[n++] = (struct guanaco_io_request){.fd = t->fd, .offset = a, .length = inner_start - a, .destination = edges};
    }
    if (inner_end < b) {
        out[n++] = (struct guanaco_io_request){
            .fd = t->fd, .offset = inner_end, .length = b - inner_end, .destination = edges + EDGE_SLOT_PAGES * r->page};
    }
    return n;
}

/* DIRECT: every missing expert's slices, in one job (direct_slice_requests). */
/* Where tensor k of missing expert i of a direct call is kept: its job in expert_jobs, its copy in staging, its
   arrival, and its requests' start in job_first_request (expert i's requests run to job_index(r, i + 1, 0)'s). */
static inline size_t job_index(const struct guanaco_residency *r, size_t i, uint32_t k) {
    return i * r->max_tensors_in_layer + k;
}

static size_t direct_requests(struct guanaco_residency *r, uint32_t layer, const struct layer *l, size_t n) {
    size_t n_requests = 0;
    for (size_t i = 0; i < n; i++) {
        for (uint32_t k = 0; k < r->max_tensors_in_layer; k++) {
            size_t slot = job_index(r, i, k);
            if (r->job_first_request) {
                r->job_first_request[slot] = n_requests;
            }
            if (k >= l->n_tensors) {
                continue; /* an empty job: a layer with fewer tensors than the largest */
            }
            const struct tensor *t = &r->tensors[l->first_tensor + k];
            char *edges = r->edge_scratch + slot * 2 * EDGE_SLOT_PAGES * r->page;
            if (r->arrivals) {
                r->arrivals[slot] = (struct slot_arrival){0};
            }
            long added = direct_slice_requests(r, t, r->missing[i], &r->staging[slot], edges, r->requests + n_requests);
            if (added < 0) {
                if (r->missing_error[i] == 0) {
                    r->missing_error[i] = (int)added;
                    guanaco_log_error("residency: no memory for expert %u of layer %u (%llu bytes): %s", r->missing[i],
                                      layer, (unsigned long long)t->stride, strerror((int)-added));
                }
                continue;
            }
            for (long q = 0; q < added; q++) {
                r->request_missing[n_requests++] = (uint32_t)i;
            }
        }
    }
    if (r->job_first_request) {
        r->job_first_request[job_index(r, n, 0)] = n_requests;
    }
    return n_requests;
}

/* Records each missing expert's first failed request among requests [from, to) in missing_error; returns the
   first error of all. */
static int collect_read_results(struct guanaco_residency *r, uint32_t layer, size_t from, size_t to) {
    int first_error = 0;
    for (size_t q = from; q < to; q++) {
        const struct guanaco_io_request *req = &r->requests[q];
        uint32_t i = r->request_missing[q];
        if (req->result == 0) {
            r->stats.bytes_read += req->length;
        } else if (r->missing_error[i] == 0) {
            r->missing_error[i] = req->result;
            if (!first_error) {
                first_error = req->result;
                guanaco_log_error("residency: cannot read expert %u of layer %u (%s, bytes %llu..%llu): %s%s",
                                  r->missing[i], layer, shard_name(r, req->fd),
                                  (unsigned long long)req->offset, (unsigned long long)(req->offset + req->length),
                                  strerror(-req->result), req->result == -ENODATA ? " (the file ends early)" : "");
            }
        }
    }
    return first_error;
}

/* DIRECT: the read copy, made read-only, replaces the slice's whole pages in one mremap. */
static int move_into_place(struct guanaco_residency *r, const struct tensor *t, uint64_t a, char **staging) {
    uint64_t inner_start = page_up(r, a), inner_end = page_down(r, a + t->stride);
    if (!*staging) {
        return 0; /* no whole page inside the slice */
    }
    void *target = (void *)(uintptr_t)address_of(t, inner_start);
    uint64_t length = inner_end - inner_start;
    if (mprotect(*staging, length, PROT_READ) != 0 ||
        mremap(*staging, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, target) == MAP_FAILED) {
        int err = -errno;
        guanaco_log_error("residency: placing %s bytes %llu..%llu: %s", r->shards[t->shard].name,
                          (unsigned long long)inner_start, (unsigned long long)inner_end, strerror(-err));
        return err;
    }
    *staging = NULL; /* it is the mapping's now */
    return 0;
}

/*
 * fixed_slots: a slot's copy (slot_requests) stays in its slot, where MUL_MAT_ID computes from it (*kept). With
 * several contexts, which need no address of ours, its whole pages go into the mapping as move_into_place's
 * do, and the rest of the slot goes back to the kernel. *staging is NULL after either.
 */
static int place_slot(struct guanaco_residency *r, const struct tensor *t, uint32_t e, char **staging,
                      struct slot_arrival *arrival, bool *kept) {
    uint64_t a = t->begin + (uint64_t)e * t->stride, b = a + t->stride, length = slot_length(r, t);
    char *slot = *staging;
    *kept = !r->shared;
    if (*kept && t->arena) {
        int err = transform_in_slot(r, t, e, slot, arrival);
        if (err) {
            return err; /* the caller discards the slot with the copies it did not place */
        }
    }
    if (*kept) {
        atomic_store(&r->slot_copy[slot_index(r, t, e)], slot);
        *staging = NULL;
        return 0;
    }
    if (t->arena) {
        guanaco_log_error("residency: repacked experts serve one context at a time");
        return -EBUSY;
    }
    if (guanaco_slot_pool_owns(&r->slot_pool, slot)) {
        /* read ahead while one context computed: its pages leave for the mapping below, and the pool's range
           must not, so they move through a copy */
        char *moved = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (moved == MAP_FAILED) {
            return -errno; /* the caller discards the slot with the copies it did not place */
        }
        memcpy(moved, slot, length);
        free_copy(r, slot, length, false);
        slot = *staging = moved;
    }
    uint64_t head = page_up(r, a) - page_down(r, a), inner = page_up(r, a) < page_down(r, b) ? page_down(r, b) - page_up(r, a) : 0;
    if (inner) {
        char *interior = slot + head;
        if (mprotect(interior, inner, PROT_READ) != 0 ||
            mremap(interior, inner, inner, MREMAP_MAYMOVE | MREMAP_FIXED,
                   (void *)(uintptr_t)address_of(t, page_up(r, a))) == MAP_FAILED) {
            int err = -errno;
            guanaco_log_error("residency: placing %s bytes %llu..%llu: %s", r->shards[t->shard].name,
                              (unsigned long long)page_up(r, a), (unsigned long long)page_down(r, b), strerror(-err));
            munmap(slot, length); /* its interior may be read-only now: never a spare */
            *staging = NULL;
            return err;
        }
    }
    if (head) {
        munmap(slot, head);
    }
    if (head + inner < length) {
        munmap(slot + head + inner, length - head - inner);
    }
    *staging = NULL;
    return 0;
}

/* fixed_slots: expert e's slots of l's first n tensors go back to the spares: an expert placed in part is not
   resident, and no slot may outlive it. */
static void unplace_slots(struct guanaco_residency *r, const struct layer *l, uint32_t e, uint32_t n) {
    for (uint32_t k = 0; r->slots && k < n; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        char *copy = atomic_exchange(&r->slot_copy[slot_index(r, t, e)], NULL);
        if (copy) {
            release_slot(r, t, e, copy);
        }
    }
}

/* Maps expert e's slices, moving the copies read into staging[tensor] in first where staging is not NULL (with
   arrivals[tensor] saying which were repacked as they landed, or NULL); 0 or the first error. */
static int map_expert(struct guanaco_residency *r, const struct layer *l, uint32_t e, char **staging,
                      struct slot_arrival *arrivals) {
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        uint64_t a = t->begin + (uint64_t)e * t->stride, b = a + t->stride;
        int err = 0;
        if (staging) {
            bool kept = false;
            if ((err = r->slots ? place_slot(r, t, e, &staging[k], arrivals ? &arrivals[k] : NULL, &kept)
                                : move_into_place(r, t, a, &staging[k])) != 0) {
                unplace_slots(r, l, e, k);
                return err;
            }
            if (kept) {
                continue; /* computes from the slot: the mapping's edge pages are not its */
            }
            /* the edge pages, now in the page cache; the interior is already mapped */
            uint64_t inner_start = page_up(r, a), inner_end = page_down(r, b);
            if (inner_start >= inner_end) {
                err = populate(r, address_of(t, page_down(r, a)), page_up(r, b) - page_down(r, a));
            } else {
                if (!err && a < inner_start) {
                    err = populate(r, address_of(t, page_down(r, a)), r->page);
                }
                if (!err && inner_end < b) {
                    err = populate(r, address_of(t, inner_end), r->page);
                }
            }
        } else {
            err = place_slice(r, t, e);
        }
        if (err) {
            guanaco_log_error("residency: cannot map expert %u of layer %u (%s, bytes %llu..%llu): %s", e,
                              (unsigned)(l - r->layers), r->shards[t->shard].name, (unsigned long long)a,
                              (unsigned long long)b, strerror(-err));
            return err;
        }
    }
    return 0;
}

/* Maps every slice of expert e, edge pages included, which waits for reads in flight; with `place`, an arena
   tensor's slice is transformed into the arena instead. Its bytes are in the page cache already. */
static int populate_slices(struct guanaco_residency *r, const struct layer *l, uint32_t e, bool place) {
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        int err = place ? place_slice(r, t, e) : map_slice(r, t, e);
        if (err) {
            return err;
        }
    }
    return 0;
}

/* An expert of the call under way is now really mapped; the policy hears of it at the end of the call. */
static void admit_loaded(struct guanaco_residency *r, uint32_t e) {
    r->read_call[e] = r->call;
}

/*
 * guanaco_io_submit_then's `then` for missing expert i's job, on the io
 * thread that completed it (or a thread inside a wait): where every read of
 * the expert succeeded, its repacked tensors are repacked in their slots,
 * through arrival_source, and arrivals[] says so for place_slot. It takes
 * only arrival_lock: a thread waiting for the job may hold r->lock.
 */
static void repack_arrived(struct guanaco_io_job *job, void *context) {
    struct guanaco_residency *r = context;
    const size_t slot = (size_t)(job - r->expert_jobs), i = slot / r->max_tensors_in_layer;
    const uint32_t k = (uint32_t)(slot % r->max_tensors_in_layer);
    for (size_t q = 0; q < job->n; q++) {
        if (job->requests[q].result != 0) {
            return; /* the expert fails as a whole; its slots are discarded unread */
        }
    }
    if (r->missing_error[i] != 0) {
        return;
    }
    const struct layer *l = &r->layers[r->arrival_layer];
    uint32_t e = r->missing[i];
    const struct tensor *t = k < l->n_tensors ? &r->tensors[l->first_tensor + k] : NULL; /* this job's one tensor */
    if (!t || !t->arena || !r->staging[slot] || in_arena_layout(t)) {
        return;
    }
    pthread_mutex_lock(&r->arrival_lock);
    uint64_t a = t->begin + (uint64_t)e * t->stride, start = guanaco_now_ns();
    char *slice = r->staging[slot] + (a - page_down(r, a));
    memcpy(r->arrival_source, slice, t->stride);
    char *target = computed_in_slot(r->staging[slot], t, a, r->page);
    int err = t->transform(t->transform_context, e, r->arrival_source, target);
    r->arrivals[slot] = (struct slot_arrival){
        .repacked = err == 0, .error = err, .transform_ns = guanaco_now_ns() - start};
    pthread_mutex_unlock(&r->arrival_lock);
}

/* Starts the reads of the n missing experts of `layer` in one urgent job, into copies where `direct`, else into
   the page cache; returns the request count. */
static size_t submit_demand(struct guanaco_residency *r, uint32_t layer, size_t n, bool direct,
                            struct guanaco_io_job *job) {
    const struct layer *l = &r->layers[layer];
    for (size_t i = 0; i < n; i++) {
        r->missing_error[i] = 0;
    }
    size_t n_requests = direct ? direct_requests(r, layer, l, n) : page_cache_requests(r, l, n);
    if (r->expert_jobs && direct) { /* tensor by tensor, each expert in MUL_MAT_ID's order, each waited for alone */
        r->arrival_layer = layer;
        const size_t per_expert = r->max_tensors_in_layer;
        for (size_t k = 0; k < per_expert; k++) {
            for (size_t i = 0; i < n; i++) {
                size_t j = job_index(r, i, k);
                size_t first = r->job_first_request[j], count = r->job_first_request[j + 1] - first;
                (void)guanaco_io_submit_then(r->io, &r->expert_jobs[j], r->requests + first, count, 1,
                                             r->arrivals ? repack_arrived : NULL, r);
            }
        }
        return n_requests;
    }
    (void)guanaco_io_submit(r->io, job, r->requests, n_requests, 1); /* per-request results below */
    return n_requests;
}

/* Waits for every read of missing expert i of a direct call (lock released by the caller). */
static void wait_expert(struct guanaco_residency *r, size_t i) {
    for (uint32_t k = 0; k < r->max_tensors_in_layer; k++) {
        (void)guanaco_io_wait(r->io, &r->expert_jobs[job_index(r, i, k)]);
    }
}

/* Waits for every read submit_demand started for the n missing experts. */
static void wait_demand(struct guanaco_residency *r, size_t n, bool direct, struct guanaco_io_job *job) {
    const bool per_expert = r->expert_jobs && direct;
    for (size_t i = 0; per_expert && i < n; i++) {
        wait_expert(r, i);
    }
    if (!per_expert) {
        (void)guanaco_io_wait(r->io, job);
    }
}

/*
 * Waits for submit_demand's job, then maps each expert whose reads all
 * succeeded. Marks the successes read (read_call) and sets missing_error[i] for each
 * failure. A failed expert's DIRECT copies are freed unseen: nothing
 * partial is ever placed in the mapping. Returns the first error.
 */
static int finish_demand(struct guanaco_residency *r, uint32_t layer, size_t n, size_t n_requests, bool direct,
                         struct guanaco_io_job *job, uint64_t read_start) {
    const struct layer *l = &r->layers[layer];
    wait_demand(r, n, direct, job);
    unmap_demand_huge(r);
    uint64_t read_end = guanaco_now_ns(), transform_before = r->stats.transform_ns;
    r->stats.read_ns += read_end - read_start;
    r->stats.reads_issued += n_requests;
    int first_error = collect_read_results(r, layer, 0, n_requests);
    /* A failed expert's other pieces were issued as WILLNEED and may still be reading: their pages stay locked
       until the disk answers, and the drop that follows the failure skips locked pages, which then stay cached
       beyond the budget. Mapping them waits for those reads (its own error does not matter: the drop follows). */
    for (size_t i = 0; first_error && !direct && i < n; i++) {
        if (r->missing_error[i]) {
            (void)populate_slices(r, l, r->missing[i], false);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (r->missing_error[i] && !first_error) {
            first_error = r->missing_error[i]; /* a staging buffer that could not be had */
        }
        if (r->missing_error[i] == 0) {
            r->missing_error[i] =
                map_expert(r, l, r->missing[i], direct ? r->staging + job_index(r, i, 0) : NULL,
                           direct && r->arrivals ? r->arrivals + job_index(r, i, 0) : NULL);
            if (r->missing_error[i] && !first_error) {
                first_error = r->missing_error[i];
            }
        }
        if (r->missing_error[i] == 0) {
            admit_loaded(r, r->missing[i]);
        } else {
            r->stats.load_failures++;
        }
        if (direct) {
            discard_copies(r, l, r->missing[i], r->staging + job_index(r, i, 0));
        }
    }
    /* PAGE_CACHE: the job only issued the reads; mapping waited for the disk, so that is read time too */
    uint64_t transforms = r->stats.transform_ns - transform_before;
    if (direct) {
        r->stats.populate_ns += guanaco_now_ns() - read_end;
    } else {
        r->stats.read_ns += guanaco_now_ns() - read_end - transforms;
        r->stats.populate_ns += transforms;
    }
    return first_error;
}

/* Reads and maps the n missing experts of `layer` (r->missing), into copies where `direct`, and waits for them. */
static int load_experts(struct guanaco_residency *r, uint32_t layer, size_t n, bool direct) {
    struct guanaco_io_job job;
    uint64_t start = guanaco_now_ns();
    size_t n_requests = submit_demand(r, layer, n, direct, &job);
    return finish_demand(r, layer, n, n_requests, direct, &job, start);
}

/* ---- read-ahead ---- */

static bool expert_cached(struct guanaco_residency *r, uint32_t layer, uint32_t e, bool reading_counts);

/* The room the policy keeps beside its resident set: for read-ahead in flight, and what the budget lends the
   stream buffers while they are mapped (set_stream_loan). A streamed run is left out: its call uses its pages
   once and drops them, like the streamed call's own reads, which take no room either. Made room for, a prompt's
   read-ahead evicted up to a layer of what decoding keeps, and decode read it all again (own routing at 25%:
   pilot 0.90 of none; bench/PIPELINE.md). */
static uint64_t reserved_room(const struct guanaco_residency *r) {
    return r->prefetch_outstanding - r->stream_outstanding + (r->stream_loan_held ? r->stream_loan : 0);
}

/*
 * Waits for every read-ahead piece the run issued, so that the drop which
 * follows finds no page still reading. A WILLNEED returns once its reads are
 * submitted; the pages sit in the page cache locked until the disk answers,
 * and both MADV_DONTNEED and FADV_DONTNEED skip a locked page, which then
 * stays cached after the drop. mincore cannot tell which pages those are (it
 * reports only pages already read), so each request is exactly one io piece
 * (GUANACO_IO_ADVISE_BYTES, see prefetch_locked): after guanaco_io_cancel a
 * request was either never issued (-ECANCELED) or issued whole, and mapping
 * the issued ones waits for their reads. A request that failed may have been
 * issued too; mapping it at worst reads what the drop then drops.
 */
static void settle_issued(struct guanaco_residency *r, const struct prefetch_run *run) {
    for (size_t q = 0; q < run->n_requests; q++) {
        const struct guanaco_io_request *req = &run->requests[q];
        if (req->result != -ECANCELED && req->length) {
            uint64_t a = page_down(r, (uint64_t)(uintptr_t)run->addresses[q]);
            uint64_t b = page_up(r, (uint64_t)(uintptr_t)run->addresses[q] + req->length);
            (void)populate(r, (const char *)(uintptr_t)a, b - a);
        }
    }
}

/* DIRECT: a run nobody claimed, once its job is over. Its copies become spares, and the pages it read buffered
   (its edges; O_DIRECT left the interior out of the page cache) go where no held expert shares them. */
static void discard_direct_run(struct guanaco_residency *r, struct prefetch_run *run) {
    discard_copies(r, &r->layers[run->layer], run->first_expert, run->staging);
    (void)drop_expert_pages(r, run->layer, run->first_expert, false);
}

static void release_run(struct guanaco_residency *r, struct prefetch_run *run) {
    for (uint32_t e = run->first_expert; e < run->first_expert + run->n_experts; e++) {
        r->run_of_slot[(size_t)run->layer * r->n_expert + e] = 0;
    }
    r->prefetch_outstanding -= run->bytes;
    r->stream_outstanding -= run->streamed ? run->bytes : 0;
    run->active = false;
    unmap_huge(run);
    guanaco_policy_set_reserve(r->policy, reserved_room(r));
}

/*
 * Settles the read-ahead of `layer` at its call (`call` stamps the experts
 * the call needs): a run that holds no needed expert is cancelled; the
 * others are waited for, and each needed expert in them is mapped and
 * admitted like a load. Experts read for nothing are dropped again. A needed
 * expert whose read-ahead failed goes to r->missing[*n_missing...] so the
 * demand path reads it again; so does one read into copies when the call
 * streams (a decode's guess before a prompt's ubatch): a streamed call's
 * experts must stay the file's pages, which its end drops as pages.
 * Returns the number of experts admitted.
 */
static size_t claim_prefetch(struct guanaco_residency *r, uint32_t layer, uint64_t call, bool stream,
                             size_t *n_missing) {
    size_t admitted = 0;
    const struct layer *l = &r->layers[layer];
    for (uint32_t i = 0; i < r->n_runs; i++) {
        struct prefetch_run *run = &r->runs[i];
        if (!run->active || run->layer != layer) {
            continue;
        }
        bool needed = false;
        for (uint32_t e = run->first_expert; e < run->first_expert + run->n_experts && !needed; e++) {
            needed = r->seen_call[e] == call;
        }
        if (!needed) {
            r->stats.prefetch_wasted_bytes += guanaco_io_cancel(r->io, &run->job);
            r->stats.prefetch_wasted_experts += run->n_experts;
            release_run(r, run);
            if (run->copies) {
                discard_direct_run(r, run);
                continue;
            }
            settle_issued(r, run);
            for (uint32_t e = run->first_expert; e < run->first_expert + run->n_experts; e++) {
                (void)drop_expert(r, layer, e);
            }
            continue;
        }
        uint64_t wait_start = guanaco_now_ns();
        const bool landed = guanaco_io_poll(r->io, &run->job); /* DIRECT's copies: all read before the call */
        int err = guanaco_io_wait(r->io, &run->job);
        r->stats.prefetch_wait_ns += guanaco_now_ns() - wait_start;
        release_run(r, run);
        uint64_t per_expert = l->expert_bytes;
        /* What nobody needs goes first. Its drop may cut a 2 MiB folio that it shares with a needed neighbour,
           and a file folio's PMD splits by unmapping the whole folio: dropped after the neighbour was mapped,
           it left the neighbour's pages to the matmul's faults (direct loading's file mapping, cut by its
           copies, then maps them back 16 pages a fault). */
        for (uint32_t e = run->first_expert; e < run->first_expert + run->n_experts; e++) {
            if (r->seen_call[e] != call) {
                r->stats.prefetch_wasted_bytes += per_expert;
                r->stats.prefetch_wasted_experts++;
                (void)populate_slices(r, l, e, false); /* waits for its reads, so the drop finds nothing in flight */
                (void)drop_expert(r, layer, e);
            }
        }
        for (uint32_t e = run->first_expert; e < run->first_expert + run->n_experts; e++) {
            if (r->seen_call[e] != call) {
                continue;
            }
            /* the page cache's reads were issued at once; whether the disk had answered shows in the page cache */
            bool hidden = run->copies ? landed : expert_cached(r, layer, e, false);
            if (run->copies && stream) {
                r->stats.prefetch_wasted_bytes += per_expert;
                r->stats.prefetch_wasted_experts++;
                r->missing[(*n_missing)++] = e;
            } else if (err == 0 &&
                       (run->copies ? map_expert(r, l, e, run->staging, NULL) : populate_slices(r, l, e, true)) == 0) {
                admit_loaded(r, e);
                r->stats.prefetch_used_bytes += per_expert;
                r->stats.prefetch_used_experts++;
                r->stats.prefetch_hidden_bytes += hidden ? per_expert : 0;
                admitted++;
            } else {
                r->missing[(*n_missing)++] = e; /* read it the ordinary way */
            }
        }
        if (run->copies) {
            discard_copies(r, l, run->first_expert, run->staging); /* what a failure or a streamed call left unplaced */
        }
    }
    return admitted;
}

/* Drops the victims' pages, except those wanted again since they were chosen (holds(): only a victim whose
   drop waited can be); 0 or the first drop error. */
static int drop_victims(struct guanaco_residency *r, const uint32_t *layers, const uint32_t *experts, size_t n) {
    int drop_error = 0;
    for (size_t v = 0; v < n; v++) {
        if (!holds(r, layers[v], experts[v])) {
            int e = drop_expert(r, layers[v], experts[v]);
            drop_error = drop_error ? drop_error : e;
        }
    }
    return drop_error;
}

/* Keeps a round's victims for a later drop_victims; false (nothing kept) when the list cannot grow. */
static bool defer_victims(struct victim_list *later, const uint32_t *layers, const uint32_t *experts, size_t n) {
    if (n == 0) {
        return true;
    }
    if (later->n + n > later->capacity) {
        size_t capacity = (later->n + n) * 2;
        uint32_t *l = realloc(later->layers, capacity * sizeof(*l));
        later->layers = l ? l : later->layers;
        uint32_t *e = l ? realloc(later->experts, capacity * sizeof(*e)) : NULL;
        later->experts = e ? e : later->experts;
        if (!l || !e) {
            return false;
        }
        later->capacity = capacity;
    }
    memcpy(later->layers + later->n, layers, n * sizeof(*layers));
    memcpy(later->experts + later->n, experts, n * sizeof(*experts));
    later->n += n;
    return true;
}

/* Asks the policy for victims until it fits its budget beside its reserve, never from `layer`, and drops
   their pages, or with `later` (not NULL) only chooses them: the caller then drops them when the disk is
   busy with what it submitted meanwhile. */
static int evict_by_policy(struct guanaco_residency *r, uint32_t layer, uint64_t token, struct victim_list *later) {
    uint64_t evict_start = guanaco_now_ns();
    int drop_error = 0;
    for (;;) {
        size_t n_victims = 0;
        int ret = guanaco_policy_evict(r->policy, layer, r->victim_layers, r->victim_experts, VICTIM_CAPACITY,
                                       &n_victims);
        /* The policy has forgotten all of the round's victims already, so a page two of them share goes
           with the second. */
        for (size_t v = 0; v < n_victims; v++) {
            r->evicted_at[(size_t)r->victim_layers[v] * r->n_expert + r->victim_experts[v]] = token + 1;
        }
        if (!later || !defer_victims(later, r->victim_layers, r->victim_experts, n_victims)) {
            int e = drop_victims(r, r->victim_layers, r->victim_experts, n_victims);
            drop_error = drop_error ? drop_error : e;
        }
        r->stats.evictions += n_victims;
        if (ret != -ENOBUFS) {
            break;
        }
    }
    r->stats.evict_ns += guanaco_now_ns() - evict_start;
    r->stats.resident_bytes = guanaco_policy_resident_bytes(r->policy);
    return drop_error;
}

/* Drops the pages of the victims whose drop waited (evict_by_policy's `later`); 0 or the first drop error. */
static int drop_pending(struct guanaco_residency *r, bool streamed_too) {
    uint64_t start = guanaco_now_ns();
    int drop_error = 0;
    if (r->pending_drops.n) {
        drop_error = drop_victims(r, r->pending_drops.layers, r->pending_drops.experts, r->pending_drops.n);
        r->pending_drops.n = 0;
    }
    /* A streamed layer's pages go only once its compute is over: at the next prepare call, never from the
       read-ahead that follows the layer's own call. */
    for (uint32_t layer = 0; r->stream && streamed_too && layer < r->n_layer; layer++) {
        if (r->stream_pending[layer]) {
            r->stream_pending[layer] = false;
            int err = drop_free_runs(r, layer); /* whole runs: a huge folio goes only with both its experts */
            drop_error = drop_error ? drop_error : err;
        }
    }
    r->stats.evict_ns += guanaco_now_ns() - start;
    return drop_error;
}

static int compare_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Requests for file bytes [a, b) of t in pieces of `piece`: WILLNEED, or populate through `huge`, where byte a
   is mapped. One io piece per request: settle_issued relies on a request being issued whole or not at all. */
static void add_run_requests(struct guanaco_residency *r, struct prefetch_run *run, const struct tensor *t,
                             uint64_t a, uint64_t b, const char *huge, uint64_t piece) {
    for (uint64_t at = a; at < b && run->n_requests < r->max_run_requests; at += piece) {
        uint64_t length = b - at < piece ? b - at : piece;
        run->addresses[run->n_requests] = address_of(t, at);
        run->requests[run->n_requests++] = (struct guanaco_io_request){
            .fd = t->read_fd, .offset = at, .length = length, .destination = NULL,
            .populate = huge && !in_arena_layout(t) ? huge + (at - a) : NULL}; /* huge maps fd */
    }
}

/* DIRECT: the run's one expert as direct_slice_requests cuts it, each tensor's copy in run->staging. 0, or -errno
   with no copy left. */
static int direct_run_requests(struct guanaco_residency *r, struct prefetch_run *run) {
    const struct layer *l = &r->layers[run->layer];
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        long added = direct_slice_requests(r, t, run->first_expert, &run->staging[k],
                                           run->edges + (size_t)k * 2 * EDGE_SLOT_PAGES * r->page,
                                           run->requests + run->n_requests);
        if (added < 0) {
            discard_copies(r, l, run->first_expert, run->staging);
            return (int)added;
        }
        for (long q = 0; q < added; q++) {
            run->addresses[run->n_requests + q] = address_of(t, run->requests[run->n_requests + q].offset);
        }
        run->n_requests += (size_t)added;
    }
    return 0;
}

static int prefetch_locked(struct guanaco_residency *r, uint32_t layer, const uint32_t *experts, size_t n,
                           size_t n_read, uint32_t protect_layer, uint64_t token) {
    /* a deferred call's own layer is being read: its next call is this one's end, nothing to guess */
    if (layer >= r->n_layer || r->layers[layer].n_tensors == 0 || n == 0 || r->stale ||
        (atomic_load(&r->deferred_active) && r->deferred.layer == layer)) {
        return 0;
    }
    /* the prediction is scored at the layer's next call, whether or not anything is read */
    uint32_t stamp = ++r->predictions ? r->predictions : ++r->predictions;
    r->layer_prediction[layer] = stamp;
    size_t wanted = 0, named = 0;
    const uint64_t expert_bytes = r->layers[layer].expert_bytes;
    for (size_t i = 0; i < n; i++) {
        if (experts[i] >= r->n_expert) {
            continue;
        }
        size_t slot = (size_t)layer * r->n_expert + experts[i];
        if (r->prediction_stamp[slot] == stamp) {
            continue; /* named twice */
        }
        r->prediction_stamp[slot] = stamp;
        named++;
        /* most likely first: what the allowance cuts off is the least likely */
        if (i < n_read && r->prefetch_allowance && !holds(r, layer, experts[i]) &&
            r->prefetch_outstanding + (wanted + 1) * expert_bytes <= r->prefetch_allowance) {
            r->prefetch_wanted[wanted++] = experts[i];
        }
    }
    if (wanted == 0) {
        return 0;
    }
    /* A prompt's layer streams (stream_prompts): its call uses these reads once, and they come in huge folios.
       DIRECT goes by what the guess names, held or not, as the call will: a prompt's call streams, and copies
       read ahead for it would be read again through the page cache (claim_prefetch). */
    const bool streamed = streams_now(r) && (guanaco_streams_layer(wanted, r->n_expert) ||
                                        (r->load == GUANACO_RESIDENCY_LOAD_DIRECT &&
                                         guanaco_streams_layer(named, r->n_expert)));
    if (streamed) {
        r->stream_ahead[layer] = true;
        set_streaming(r, true);
    }
    if (streamed && r->stream_direct &&
        stream_read_ahead(r, layer, experts, n_read < n ? n_read : n, protect_layer, token)) {
        return drop_pending(r, false); /* as below: the last call's victims, while the layer computes */
    }
    /* Room inside the budget, for decode's guesses: the policy gives up its least wanted experts, never the
       protected layer's. The victims' pages are dropped once the runs are submitted: the disk starts on them
       first. The runs' neighbours keep their shared edge pages (holds() counts runs). A streamed layer takes
       no room (reserved_room): with the current one, two layers' pages are cached until the next call. */
    int err = 0;
    if (!streamed) {
        guanaco_policy_set_reserve(r->policy, reserved_room(r) + wanted * expert_bytes);
        err = evict_by_policy(r, protect_layer, token, &r->pending_drops);
        uint64_t used = guanaco_policy_resident_bytes(r->policy) + reserved_room(r);
        uint64_t budget = r->budget_bytes;
        size_t fits = used < budget ? (size_t)((budget - used) / expert_bytes) : 0;
        wanted = fits < wanted ? fits : wanted;
        guanaco_policy_set_reserve(r->policy, reserved_room(r) + wanted * expert_bytes);
    }
    /* ascending ids: consecutive experts are consecutive bytes of every tensor, so they share requests */
    qsort(r->prefetch_wanted, wanted, sizeof(*r->prefetch_wanted), compare_u32);
    const struct layer *l = &r->layers[layer];
    /* DIRECT reads decode's guesses into copies; a streamed layer's runs go to the page cache as they would
       without it, since its call drops them as pages */
    const bool copies = r->load == GUANACO_RESIDENCY_LOAD_DIRECT && !streamed;
    const uint32_t run_limit = copies                       ? 1
                               : streamed && r->stream_huge ? stream_run_experts(r, layer)
                                                            : prefetch_run_experts(r, layer);
    for (size_t i = 0; i < wanted;) {
        struct prefetch_run *run = NULL;
        for (uint32_t j = 0; j < r->n_runs && !run; j++) {
            run = r->runs[j].active ? NULL : &r->runs[j];
        }
        if (!run) {
            break; /* every run is busy: the rest is read on demand */
        }
        uint32_t first = r->prefetch_wanted[i], count = 1;
        while (i + count < wanted && count < run_limit && r->prefetch_wanted[i + count] == first + count) {
            count++;
        }
        *run = (struct prefetch_run){.active = true, .layer = layer, .first_expert = first, .n_experts = count,
                                     .bytes = (uint64_t)count * expert_bytes, .requests = run->requests,
                                     .addresses = run->addresses, .huge_maps = run->huge_maps,
                                     .huge_lengths = run->huge_lengths, .staging = run->staging, .edges = run->edges,
                                     .copies = copies, .streamed = streamed};
        if (copies && direct_run_requests(r, run) != 0) {
            run->active = false;
            break; /* no memory for the copies: the rest is read on demand */
        }
        for (uint32_t k = 0; k < l->n_tensors && !copies; k++) {
            const struct tensor *t = &r->tensors[l->first_tensor + k];
            uint64_t a = t->begin + (uint64_t)first * t->stride, b = a + (uint64_t)count * t->stride;
            /* a streamed run's whole 2 MiB pieces go through a huge mapping */
            uint64_t huge_begin, huge_end;
            const char *huge = map_huge_middle(t, a, b, streamed && r->stream_huge, &huge_begin, &huge_end);
            if (huge) {
                run->huge_maps[run->n_huge_maps] = (void *)(uintptr_t)huge;
                run->huge_lengths[run->n_huge_maps++] = huge_end - huge_begin;
            }
            add_run_requests(r, run, t, a, huge_begin, NULL, GUANACO_IO_ADVISE_BYTES);
            add_run_requests(r, run, t, huge_begin, huge_end, huge, GUANACO_IO_POPULATE_BYTES);
            add_run_requests(r, run, t, huge_end, b, NULL, GUANACO_IO_ADVISE_BYTES);
            r->stats.streamed_huge_bytes += huge_end - huge_begin;
        }
        for (uint32_t e = first; e < first + count; e++) {
            r->run_of_slot[(size_t)layer * r->n_expert + e] = (uint32_t)(run - r->runs) + 1;
        }
        r->prefetch_outstanding += run->bytes;
        r->stream_outstanding += streamed ? run->bytes : 0;
        r->stats.prefetch_issued_bytes += run->bytes;
        r->stats.prefetch_issued_experts += count;
        (void)guanaco_io_submit(r->io, &run->job, run->requests, run->n_requests, 0);
        i += count;
    }
    guanaco_policy_set_reserve(r->policy, reserved_room(r));
    int drop_error = drop_pending(r, false); /* these victims and any the last call left; the layer computes */
    return err ? err : drop_error;
}

int guanaco_residency_prefetch(struct guanaco_residency *r, uint32_t layer, const uint32_t *experts, size_t n,
                               size_t n_read, uint32_t protect_layer, uint64_t token) {
    pthread_mutex_lock(&r->lock);
    int err = prefetch_locked(r, layer, experts, n, n_read, protect_layer, token);
    r->stats.prefetch_outstanding_bytes = r->prefetch_outstanding;
    pthread_mutex_unlock(&r->lock);
    return err;
}

/* ---- stream_direct: a prompt's streamed layers read with O_DIRECT into two buffers ---- */

/*
 * Lays each layer's expert tensors out in a buffer, in the file's layout, and sizes the buffers by the largest
 * layer. Nothing is mapped yet: a run that never streams a prompt never holds them.
 */
static int stream_direct_create(struct guanaco_residency *r, const struct guanaco_residency_config *config) {
    if (!config->stream_direct || !r->stream || !r->slots || r->load != GUANACO_RESIDENCY_LOAD_DIRECT) {
        return 0;
    }
    for (uint32_t l = 0; l < r->n_layer; l++) {
        const struct layer *layer = &r->layers[l];
        uint64_t at = 0;
        for (uint32_t k = 0; k < layer->n_tensors; k++) {
            struct tensor *t = &r->tensors[layer->first_tensor + k];
            t->stream_offset = at;
            at += page_up(r, t->end) - page_down(r, t->begin);
        }
        r->stream_buffer_bytes = at > r->stream_buffer_bytes ? at : r->stream_buffer_bytes;
    }
    /* per tensor, each run of consecutive experts is one O_DIRECT request and perhaps one for the file's last
       partial page; runs are at most n_expert */
    r->stream_request_capacity = (size_t)r->max_tensors_in_layer * 2 * ((size_t)r->n_expert + 1);
    r->stream_list = calloc(r->n_expert, sizeof(*r->stream_list));
    if (!r->stream_list) {
        return -ENOMEM;
    }
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        struct stream_buffer *buffer = &r->stream_buffers[b];
        atomic_store(&buffer->layer, UINT32_MAX);
        buffer->has = calloc(r->n_expert, 1);
        buffer->requests[0] = calloc(r->stream_request_capacity, sizeof(struct guanaco_io_request));
        buffer->requests[1] = calloc(r->stream_request_capacity, sizeof(struct guanaco_io_request));
        if (!buffer->has || !buffer->requests[0] || !buffer->requests[1]) {
            return -ENOMEM;
        }
    }
    r->stream_direct = r->stream_direct_capable = r->stream_buffer_bytes > 0;
    uint64_t each = (r->stream_buffer_bytes + GUANACO_HUGE_FOLIO_BYTES - 1) / GUANACO_HUGE_FOLIO_BYTES * GUANACO_HUGE_FOLIO_BYTES;
    r->stats.stream_buffer_bytes = r->stream_direct ? STREAM_BUFFERS * each : 0;
    return 0;
}

/* The buffers, mapped at the first streamed call: 2 MiB aligned and advised MADV_HUGEPAGE, so that filling them
   faults once per 2 MiB, and kept from then on. false (and stream_direct off) when they cannot be mapped. Where
   the budget lends them room, its least wanted experts (never protect_layer's) go now, before the buffers fill. */
static bool stream_buffers_mapped(struct guanaco_residency *r, uint32_t protect_layer, uint64_t token) {
    if (r->stream_memory || !r->stream_direct) {
        return r->stream_memory != NULL;
    }
    uint64_t each = (r->stream_buffer_bytes + GUANACO_HUGE_FOLIO_BYTES - 1) / GUANACO_HUGE_FOLIO_BYTES * GUANACO_HUGE_FOLIO_BYTES;
    uint64_t wanted = STREAM_BUFFERS * each, mapped = wanted + GUANACO_HUGE_FOLIO_BYTES;
    char *at = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) {
        guanaco_log_error("residency: no memory for the stream buffers (%.2f GiB): %s; prompts stream through the "
                          "page cache", (double)wanted / (double)(1ull << 30), strerror(errno));
        r->stream_direct = r->stream_direct_capable = false;
        r->stats.stream_direct = false;
        r->stats.stream_buffer_bytes = 0; /* the engine's line says what was chosen from this */
        return false;
    }
    char *aligned = at + (GUANACO_HUGE_FOLIO_BYTES - (uintptr_t)at % GUANACO_HUGE_FOLIO_BYTES) % GUANACO_HUGE_FOLIO_BYTES;
    if (aligned > at) {
        munmap(at, (size_t)(aligned - at));
    }
    if (aligned + wanted < at + mapped) {
        munmap(aligned + wanted, (size_t)(at + mapped - (aligned + wanted)));
    }
    (void)madvise(aligned, wanted, MADV_HUGEPAGE); /* without it: small pages, more faults on the first fill */
    r->stream_memory = aligned;
    r->stream_memory_bytes = wanted;
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        r->stream_buffers[b].at = aligned + b * each;
    }
    if (r->stream_loan) {
        r->stream_loan_held = true;
        guanaco_policy_set_reserve(r->policy, reserved_room(r));
        (void)evict_by_policy(r, protect_layer, token, NULL); /* a failed drop was logged; the call goes on */
    }
    return true;
}

/* Streaming is over (a decode call): the buffers' memory goes back, and comes again with the next prompt, so that
   decoding keeps the memory it had before the prompt. Where they fit beside the budget with nothing lent, decoding
   never needed it, and they stay mapped, emptied: mapped afresh, each prompt faulted and zeroed their 2 MiB pages
   again (on the 48-layer Q4_0 model, 32-token prompts and 16-token decodes alternating: 7.9-8.5 tok/s against
   9.6-10.0 kept, bench/PIPELINE.md). */
static void stream_buffers_release(struct guanaco_residency *r) {
    if (!r->stream_memory) {
        return;
    }
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        stream_buffer_stop(r, &r->stream_buffers[b]);
    }
    /* the one caller runs for one context only; quarantined buffers go whatever the rule */
    if (r->stream_keep && r->stream_direct && !r->stream_loan_held && !r->stream_quarantined) {
        return;
    }
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        r->stream_buffers[b].at = NULL;
    }
    munmap(r->stream_memory, r->stream_memory_bytes);
    r->stream_memory = NULL;
    if (r->stream_loan_held) {
        r->stream_loan_held = false; /* decode may fill the whole budget again */
        guanaco_policy_set_reserve(r->policy, reserved_room(r));
    }
}

/* The first decode call after a prompt: the prompt gave back most of the budget's slots (the stream buffers'
   loan, the spares, its streamed layers' evictions), splitting the huge pages their neighbours share, and decode
   would compute from those neighbours 4 KiB at a time. Rebuilt here, once the loan is back (the buffers' memory
   gone), so that the pool's chunks fit where they did before the prompt (slot_pool.h has the numbers). */
static void rebuild_huge_pages(struct guanaco_residency *r) {
    uint64_t start = guanaco_now_ns();
    long rebuilt = guanaco_slot_pool_collapse(&r->slot_pool);
    r->pool_split_by_prompt = false;
    if (rebuilt == -EOPNOTSUPP) {
        guanaco_log_info("residency: this kernel cannot rebuild huge pages (MADV_COLLAPSE, Linux 6.1); decode after "
                         "a prompt computes from small pages where the prompt's evictions split them");
        return;
    }
    r->stats.huge_pages_rebuilt += rebuilt > 0 ? (uint64_t)rebuilt : 0;
    r->stats.rebuild_ns += guanaco_now_ns() - start;
}

/* Stops the buffer's reads and empties it: what a read-ahead read for no call counts as wasted. */
static void stream_buffer_stop(struct guanaco_residency *r, struct stream_buffer *b) {
    /* the read-ahead's bytes count as wasted read-ahead, the call's own as reads (the status line's sum) */
    if (b->reading[0]) {
        r->stats.prefetch_wasted_bytes += guanaco_io_cancel(r->io, &b->jobs[0]);
        r->stats.prefetch_wasted_experts += b->read_ahead_experts;
        b->reading[0] = false;
    }
    if (b->reading[1]) {
        r->stats.bytes_read += guanaco_io_cancel(r->io, &b->jobs[1]);
        b->reading[1] = false;
    }
    b->read_ahead_experts = 0;
    atomic_store(&b->serving, false);
    atomic_store(&b->layer, UINT32_MAX);
    if (b->has) {
        memset(b->has, 0, r->n_expert);
    }
}

/* The buffer for `layer`: the one that holds it, else one whose layer has computed (not serving), emptied. NULL
   when the one that holds it serves (a read-ahead of the layer computing now). */
static struct stream_buffer *stream_buffer_for(struct guanaco_residency *r, uint32_t layer) {
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        if (atomic_load(&r->stream_buffers[b].layer) == layer) {
            return atomic_load(&r->stream_buffers[b].serving) ? NULL : &r->stream_buffers[b];
        }
    }
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        struct stream_buffer *buffer = &r->stream_buffers[b];
        if (!atomic_load(&buffer->serving)) {
            stream_buffer_stop(r, buffer);
            atomic_store(&buffer->layer, layer);
            return buffer;
        }
    }
    return NULL;
}

/* Requests for experts list[0...n) (ascending) of `layer` into b, at out[0...]: per tensor each run of
   consecutive experts as one request of its pages rounded outward, with O_DIRECT (io cuts it into chunks), and
   the file's last partial page, which O_DIRECT cannot end on, buffered. Runs whose rounded pages meet are one
   request: two reads must never write the same page at once (the gap's bytes come along, unused). Returns the
   count. */
static size_t stream_requests(struct guanaco_residency *r, const struct stream_buffer *b, uint32_t layer,
                              const uint32_t *list, size_t n, struct guanaco_io_request *out) {
    const struct layer *l = &r->layers[layer];
    size_t count = 0;
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        char *origin = b->at + t->stream_offset; /* file byte page_down(t->begin) */
        const uint64_t first_page = page_down(r, t->begin);
        const size_t first_of_tensor = count;
        for (size_t i = 0; i < n;) {
            size_t j = i + 1;
            while (j < n && list[j] == list[j - 1] + 1) {
                j++;
            }
            uint64_t a = page_down(r, t->begin + (uint64_t)list[i] * t->stride);
            uint64_t end = t->begin + (uint64_t)(list[j - 1] + 1) * t->stride;
            uint64_t direct_end = direct_read_end(r, t, end);
            struct guanaco_io_request *last = count > first_of_tensor ? &out[count - 1] : NULL;
            if (direct_end > a && last && last->fd == t->read_direct_fd && last->offset + last->length >= a) {
                last->length = direct_end - last->offset; /* meets the last run's pages: one request */
            } else if (direct_end > a) {
                out[count++] = (struct guanaco_io_request){.fd = t->read_direct_fd, .offset = a, .length = direct_end - a,
                                                           .destination = origin + (a - first_page)};
            }
            uint64_t tail = direct_end > a ? direct_end : a;
            last = count > first_of_tensor ? &out[count - 1] : NULL;
            if (tail < end && last && last->fd == t->read_fd && last->offset + last->length >= tail) {
                last->length = end - last->offset; /* two runs in the file's last page: one buffered request */
            } else if (tail < end) {
                out[count++] = (struct guanaco_io_request){.fd = t->read_fd, .offset = tail, .length = end - tail,
                                                           .destination = origin + (tail - first_page)};
            }
            i = j;
        }
    }
    return count;
}

/* Reads list[0...n) into b, as job j (the call's own is urgent). */
static void stream_submit(struct guanaco_residency *r, struct stream_buffer *b, int j, uint32_t layer, size_t n) {
    qsort(r->stream_list, n, sizeof(*r->stream_list), compare_u32);
    b->n_requests[j] = stream_requests(r, b, layer, r->stream_list, n, b->requests[j]);
    (void)guanaco_io_submit(r->io, &b->jobs[j], b->requests[j], b->n_requests[j], j == 1);
    b->reading[j] = true;
}

/* A streamed layer's read-ahead (prefetch_locked): the named experts that are not held, into a buffer. false when
   the buffers cannot be had: the page cache reads it ahead instead. */
static bool stream_read_ahead(struct guanaco_residency *r, uint32_t layer, const uint32_t *experts, size_t n,
                              uint32_t protect_layer, uint64_t token) {
    if (r->shared || r->stream_quarantined || !stream_buffers_mapped(r, protect_layer, token)) {
        return false;
    }
    struct stream_buffer *b = stream_buffer_for(r, layer);
    if (!b || b->reading[0]) {
        return true; /* it computes now, or is being read ahead already */
    }
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = experts[i];
        if (e < r->n_expert && !b->has[e] && !holds(r, layer, e)) {
            b->has[e] = 1;
            r->stream_list[count++] = e;
        }
    }
    if (count) {
        stream_submit(r, b, 0, layer, count);
        b->read_ahead_experts += (uint32_t)count;
        r->stats.prefetch_issued_experts += count;
        r->stats.prefetch_issued_bytes += count * r->layers[layer].expert_bytes;
    }
    return true;
}

/* Waits for b's job j; the call's own bytes (j 1) are counted as read, the read-ahead's as used or wasted by the
   caller. 0 or the first failed request's error (logged). */
static int stream_wait(struct guanaco_residency *r, struct stream_buffer *b, int j, uint32_t layer) {
    if (!b->reading[j]) {
        return 0;
    }
    int err = guanaco_io_wait(r->io, &b->jobs[j]);
    b->reading[j] = false;
    bool logged = false;
    for (size_t q = 0; q < b->n_requests[j]; q++) {
        const struct guanaco_io_request *req = &b->requests[j][q];
        if (req->result == 0) {
            r->stats.bytes_read += j == 1 ? req->length : 0;
        } else if (!logged) {
            guanaco_log_error("residency: cannot read layer %u into a stream buffer (%s, bytes %llu..%llu): %s; its "
                              "experts are read through the page cache", layer, shard_name(r, req->fd),
                              (unsigned long long)req->offset, (unsigned long long)(req->offset + req->length),
                              strerror(-req->result));
            logged = true;
        }
    }
    return err;
}

/*
 * A streamed call's missing experts, r->missing[0...n), from a buffer: what the read-ahead did not name is read
 * now, then the call waits for every read of the buffer. From here to the next call MUL_MAT_ID computes them from
 * it (guanaco_residency_expert_data). Returns n, or 0 when a read failed: the caller reads them through the page
 * cache instead, whose errors reach the call.
 */
static size_t stream_serve(struct guanaco_residency *r, uint32_t layer, size_t n, uint64_t token) {
    if (r->shared || r->stream_quarantined || !stream_buffers_mapped(r, layer, token)) {
        return 0;
    }
    struct stream_buffer *b = stream_buffer_for(r, layer);
    if (!b) {
        return 0; /* cannot happen: no buffer serves during a call */
    }
    size_t extra = 0;
    for (size_t i = 0; i < n; i++) {
        if (!b->has[r->missing[i]]) {
            b->has[r->missing[i]] = 1;
            r->stream_list[extra++] = r->missing[i];
        }
    }
    const bool landed = !b->reading[0] || guanaco_io_poll(r->io, &b->jobs[0]);
    /* the read-ahead first: an expert it left out may share an edge page with one it reads, and two reads must
       never write the same page at once */
    uint64_t wait_start = guanaco_now_ns();
    int err = stream_wait(r, b, 0, layer);
    r->stats.prefetch_wait_ns += guanaco_now_ns() - wait_start;
    if (extra && !err) {
        stream_submit(r, b, 1, layer, extra); /* after a failed read-ahead the page cache reads them all */
    }
    int extra_err = stream_wait(r, b, 1, layer);
    r->stats.read_ns += guanaco_now_ns() - wait_start;
    if (err || extra_err) {
        r->stats.prefetch_wasted_experts += b->read_ahead_experts;
        r->stats.prefetch_wasted_bytes += (uint64_t)b->read_ahead_experts * r->layers[layer].expert_bytes;
        b->read_ahead_experts = 0;
        stream_buffer_stop(r, b);
        return 0;
    }
    const uint64_t expert_bytes = r->layers[layer].expert_bytes;
    size_t used = n - extra < b->read_ahead_experts ? n - extra : b->read_ahead_experts;
    r->stats.prefetch_used_experts += used;
    r->stats.prefetch_used_bytes += used * expert_bytes;
    r->stats.prefetch_hidden_bytes += landed ? used * expert_bytes : 0;
    r->stats.prefetch_wasted_experts += b->read_ahead_experts - used;
    r->stats.prefetch_wasted_bytes += (uint64_t)(b->read_ahead_experts - used) * expert_bytes;
    b->read_ahead_experts = 0;
    r->stats.expert_loads += n;
    r->stats.streamed_bytes += n * expert_bytes;
    r->stats.streamed_direct_bytes += n * expert_bytes;
    atomic_store_explicit(&b->serving, true, memory_order_release);
    return n;
}

/* Where expert e of t lies in the buffer that serves t's layer, or NULL. Without the lock (expert_data): a
   buffer's contents and marks change only in a call, never while its layer computes. */
static const char *stream_address(const struct guanaco_residency *r, const struct tensor *t, uint32_t e) {
    for (uint32_t b = 0; b < STREAM_BUFFERS; b++) {
        const struct stream_buffer *buffer = &r->stream_buffers[b];
        if (atomic_load_explicit(&buffer->serving, memory_order_acquire) && atomic_load(&buffer->layer) == t->layer &&
            buffer->has[e]) {
            return buffer->at + t->stream_offset + (t->begin + (uint64_t)e * t->stride - page_down(r, t->begin));
        }
    }
    return NULL;
}

/* ---- one call ---- */

/*
 * Tells the policy which of the call's n_distinct experts are really resident
 * now: those it held (the hits) and those the call read and mapped. Then the
 * reads are counted, as loads (maybe churn), or, when the policy refused the
 * call, as failures: nothing entered its accounting, and the caller drops
 * them. Ends the call's read marks. 0 or the policy's error.
 */
static int tell_policy(struct guanaco_residency *r, uint32_t layer, size_t n_distinct, uint64_t token,
                       uint32_t tokens, bool stream) {
    size_t n_accessed = 0;
    for (size_t i = 0; i < n_distinct; i++) {
        uint32_t e = r->distinct[i];
        /* a streamed call's reads are used once: the policy hears of its hits only. A hit that an eviction named
           while the call was deferred kept its pages (used_by_call): the policy takes it back here. */
        if (guanaco_policy_is_resident(r->policy, layer, e) || (!stream && read_by_call(r, layer, e)) ||
            (layer == r->read_layer && r->hit_call[e] == r->call)) {
            r->accessed[n_accessed++] = e;
        }
    }
    size_t n_policy_missing = 0;
    int err;
    if (r->policy_fault) {
        err = r->policy_fault; /* as a refusal: nothing changes in the policy (policy.h) */
        r->policy_fault = 0;
    } else {
        err = guanaco_policy_access_batch(r->policy, layer, r->accessed, n_accessed, token, tokens,
                                          r->policy_missing, &n_policy_missing);
    }
    if (err) {
        guanaco_log_error("residency: policy refused layer %u: %s; the experts read for it are dropped", layer,
                          strerror(-err));
    }
    for (size_t i = 0; i < n_distinct; i++) {
        uint32_t e = r->distinct[i];
        if (!read_by_call(r, layer, e)) {
            continue;
        }
        size_t slot = (size_t)layer * r->n_expert + e;
        if (err) {
            r->stats.load_failures++;
        } else {
            r->stats.expert_loads++;
            r->stats.churn_loads +=
                r->evicted_at[slot] && token + 1 - r->evicted_at[slot] <= GUANACO_RESIDENCY_CHURN_TOKENS;
            r->stats.streamed_bytes += stream ? r->layers[layer].expert_bytes : 0;
        }
    }
    r->read_layer = UINT32_MAX;
    return err;
}

/* ---- a call whose experts arrive while its layer computes (DIRECT with overlap_layer) ---- */

static int finish_call(struct guanaco_residency *r, uint32_t layer, size_t n_distinct, uint64_t token,
                       uint32_t tokens, bool stream, int first_error, int pending_error,
                       uint64_t transformed_before, uint64_t wasted_before, bool evict);

/* Whether this call returns with its demand reads in flight. Not with several contexts (one of them could
   compute the layer before the reads land, without asking), a streamed call, or the preload (nothing asks). */
static bool defers(const struct guanaco_residency *r, bool stream) {
    return r->expert_jobs && !r->shared && !stream && !r->preloading;
}

/* The last call's victims go now, while this call's reads land or once its layer is done: CPU work a matmul would
   otherwise idle for, and their copies are spares again before the next call's reads take copies (else those take
   fresh memory). */
static void drop_last_victims(struct guanaco_residency *r) {
    if (r->pending_drops.n) {
        int drop_error = drop_pending(r, false);
        r->deferred.pending_error = r->deferred.pending_error ? r->deferred.pending_error : drop_error;
    }
}

/* Whether every read of missing expert i of the deferred call has landed. */
static bool expert_landed(struct guanaco_residency *r, size_t i) {
    for (uint32_t k = 0; k < r->max_tensors_in_layer; k++) {
        if (!guanaco_io_poll(r->io, &r->expert_jobs[job_index(r, i, k)])) {
            return false;
        }
    }
    return true;
}

/*
 * Tensor k of missing expert i of the deferred call, before the whole expert is settled: where its slice lies
 * once its own job has landed whole and needs nothing more (a fixed slot the reads went into, repacked as they
 * landed where it runs repacked), so that a matmul computes it while the expert's later tensors are read. NULL
 * when that is not so now; with `wait` it first waits for that job (lock released). Lock held. The slot stays
 * the slot once the expert settles (place_slot keeps it). A failed expert's copies go when it settles, and that
 * never happens while a matmul computes one of its slices from here: every thread of this matmul gets the slice
 * the same way (the conditions below hold for all or none), and the matmuls of the slices before it are over
 * (each MUL_MAT_ID ends in a barrier).
 */
static const char *settle_slice(struct guanaco_residency *r, size_t i, uint32_t k, const struct tensor *t,
                                bool wait, bool *wait_longer) {
    const size_t j = job_index(r, i, k);
    *wait_longer = false;
    if (!r->slots || r->shared || r->missing_error[i] || !r->staging[j] ||
        (t->arena && !in_arena_layout(t) && !r->arrivals)) {
        return NULL;
    }
    int failed = 0;
    if (guanaco_io_poll(r->io, &r->expert_jobs[j])) {
        failed = guanaco_io_wait(r->io, &r->expert_jobs[j]); /* landed: at once, with its first failure */
    } else {
        if (!wait) {
            *wait_longer = true;
            return NULL;
        }
        if (r->slice_waiters++ == 0) {
            r->slice_wait_since = guanaco_now_ns();
        }
        drop_last_victims(r);
        pthread_mutex_unlock(&r->lock);
        failed = guanaco_io_wait(r->io, &r->expert_jobs[j]);
        pthread_mutex_lock(&r->lock);
        if (--r->slice_waiters == 0) { /* both threads waiting at once is one wait for the layer */
            uint64_t waited = guanaco_now_ns() - r->slice_wait_since;
            r->stats.read_ns += waited;
            r->stats.stall_ns += waited;
        }
        if (r->expert_state[i] != EXPERT_READING) {
            return NULL; /* settled (or being settled) meanwhile: its slot, the usual way */
        }
    }
    if (failed) {
        return NULL; /* the usual way finds the failure */
    }
    if (t->arena && !in_arena_layout(t) && !r->arrivals[j].repacked) {
        return NULL; /* not repacked as it landed: place_slot repacks it */
    }
    uint64_t a = t->begin + (uint64_t)r->missing[i] * t->stride;
    r->stats.slices_before_settled++;
    r->computed_early[i] = 1;
    return computed_in_slot(r->staging[j], t, a, r->page);
}

/*
 * Makes missing expert i of the deferred call ready: its reads done, its
 * copies placed (or, when a read failed, left to the file mapping, which the
 * matmul then faults in through the page cache; the call fails at its end).
 * Without `wait` it only says whether that is so now, settling it when its
 * reads have landed. Called with the lock held; the lock is released while
 * waiting for the disk, so another thread can ask about the other experts.
 * from_matmul: a matmul asks (guanaco_residency_expert_data); the thread that settles the expert counts it,
 * and, when it waited, the wait as stall.
 */
static bool settle_expert(struct guanaco_residency *r, size_t i, bool wait, bool from_matmul) {
    bool slept = false;
    for (;;) {
        if (r->expert_state[i] == EXPERT_SETTLED) {
            if (slept && from_matmul) {
                /* The settling thread counted its wait for the disk, not this thread's wake-up after it, and the
                   layer's end waits for this thread's share all the same: 2.5 ms per token on the gpt-oss shape at
                   25% with reads capped at 1.0 GB/s (bench/COMPUTE_PARITY.md, Dec 6). */
                uint64_t lag = guanaco_now_ns() - r->last_settled_ns;
                r->stats.settle_wake_ns += lag;
                r->stats.stall_ns += lag;
            }
            return true;
        }
        if (r->expert_state[i] == EXPERT_SETTLING) {
            if (!wait) {
                return false;
            }
            /* Another compute thread waits for the disk and settles it. Spin a little before sleeping: a sleeping
               thread's wake-up took 0.6 ms on average in this project's VM (perf sched, the gpt-oss shape at
               25%), about ten times per token, while this thread had nothing else to do. */
            const uint32_t seen = atomic_load(&r->settled_count);
            pthread_mutex_unlock(&r->lock);
            const uint64_t give_up = guanaco_now_ns() + SETTLE_SPIN_NS;
            while (atomic_load(&r->settled_count) == seen && guanaco_now_ns() < give_up) {
                sched_yield();
            }
            pthread_mutex_lock(&r->lock);
            if (r->expert_state[i] == EXPERT_SETTLING) {
                pthread_cond_wait(&r->expert_settled, &r->lock);
                slept = true;
            }
            continue;
        }
        if (!wait && !expert_landed(r, i)) {
            return false;
        }
        r->expert_state[i] = EXPERT_SETTLING;
        uint64_t wait_start = guanaco_now_ns();
        if (wait && r->pending_drops.n && !expert_landed(r, i)) {
            drop_last_victims(r); /* the disk is not done */
        }
        pthread_mutex_unlock(&r->lock);
        uint64_t io_start = guanaco_now_ns();
        wait_expert(r, i);
        uint64_t read_end = guanaco_now_ns();
        pthread_mutex_lock(&r->lock);
        r->stats.read_ns += read_end - io_start;
        uint32_t layer = r->deferred.layer;
        const struct layer *l = &r->layers[layer];
        char **staging = r->staging + job_index(r, i, 0);
        int err = collect_read_results(r, layer, r->job_first_request[job_index(r, i, 0)],
                                       r->job_first_request[job_index(r, i + 1, 0)]);
        if (!err && !r->missing_error[i]) {
            r->missing_error[i] = map_expert(r, l, r->missing[i], staging,
                                             r->arrivals ? r->arrivals + job_index(r, i, 0) : NULL);
        } else if (!r->missing_error[i]) {
            r->missing_error[i] = err;
        }
        if (r->missing_error[i] == 0) {
            admit_loaded(r, r->missing[i]);
            r->stats.loads_settled_computing += from_matmul || r->computed_early[i];
        } else {
            r->stats.load_failures++;
        }
        discard_copies(r, l, r->missing[i], staging);
        r->last_settled_ns = guanaco_now_ns();
        r->stats.populate_ns += r->last_settled_ns - read_end;
        r->stats.stall_ns += wait && from_matmul ? r->last_settled_ns - wait_start : 0;
        r->expert_state[i] = EXPERT_SETTLED;
        atomic_fetch_add(&r->settled_count, 1);
        pthread_cond_broadcast(&r->expert_settled);
        return true;
    }
}

/* Finishes the deferred call, if any (lock held): waits for what no matmul asked for, then finish_call, which
   evicts only with `evict` (else the caller does, protecting its own layer). */
static int finish_deferred(struct guanaco_residency *r, bool evict) {
    if (!atomic_load(&r->deferred_active)) {
        return 0;
    }
    int first_error = 0;
    /* its matmuls may never have waited (settle_slice computes each slice as it lands) */
    drop_last_victims(r);
    for (size_t i = 0; i < r->deferred.n_missing; i++) {
        (void)settle_expert(r, i, true, false);
        first_error = first_error ? first_error : r->missing_error[i];
    }
    struct deferred_call d = r->deferred; /* after the waits: they may have dropped victims (pending_error) */
    atomic_store_explicit(&r->deferred_active, false, memory_order_release);
    r->stats.reads_issued += d.n_requests;
    return finish_call(r, d.layer, d.n_distinct, d.token, d.tokens, false, first_error, d.pending_error,
                       d.transformed_before, d.wasted_before, evict);
}

/* The expert tensor whose expert 0 is mapped at `weights`, or NULL: a binary search of tensors_by_address, as
   every thread of every MUL_MAT_ID asks for every expert it computes. */
static const struct tensor *tensor_at(const struct guanaco_residency *r, const void *weights) {
    size_t low = 0, high = r->n_tensors;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        const struct tensor *t = &r->tensors[r->tensors_by_address[middle]];
        if (compute_base(t) == (const char *)weights) {
            return t;
        }
        if ((uintptr_t)compute_base(t) < (uintptr_t)weights) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    return NULL;
}

bool guanaco_residency_expert_data(struct guanaco_residency *r, const void *weights, uint32_t expert, bool wait,
                                   const void **data) {
    *data = NULL;
    if (atomic_load_explicit(&r->deferred_active, memory_order_acquire)) {
        if (!wait && pthread_mutex_trylock(&r->lock) != 0) {
            return false; /* another thread is placing an expert or dropping victims: ask again when it must wait */
        }
        if (wait) {
            pthread_mutex_lock(&r->lock);
        }
        bool ready = true;
        const struct layer *l = atomic_load(&r->deferred_active) ? &r->layers[r->deferred.layer] : NULL;
        const struct tensor *ours = NULL;
        for (uint32_t k = 0; l && k < l->n_tensors && !ours; k++) {
            const struct tensor *t = &r->tensors[l->first_tensor + k];
            ours = compute_base(t) == (const char *)weights ? t : NULL;
        }
        for (size_t i = 0; ours && i < r->deferred.n_missing; i++) {
            if (r->missing[i] == expert) {
                bool wait_longer = false;
                const char *slice = r->expert_state[i] == EXPERT_READING
                                        ? settle_slice(r, i, ours->index_in_layer, ours, wait, &wait_longer)
                                        : NULL;
                if (slice || wait_longer) {
                    pthread_mutex_unlock(&r->lock);
                    *data = slice;
                    return slice != NULL;
                }
                ready = settle_expert(r, i, wait, true);
                break;
            }
        }
        pthread_mutex_unlock(&r->lock);
        if (!ready) {
            return false;
        }
    }
    /* Without a lock: a slot changes only in a call of this context's, never while its layer computes (several
       contexts leave a retired slot the file's bytes, release_slot). */
    const struct tensor *t = r->slots && expert < r->n_expert ? tensor_at(r, weights) : NULL;
    if (t) {
        const char *slot = atomic_load(&r->slot_copy[slot_index(r, t, expert)]);
        uint64_t a = t->begin + (uint64_t)expert * t->stride;
        *data = slot ? computed_in_slot((char *)slot, t, a, r->page)
                     : r->stream_direct ? stream_address(r, t, expert) : NULL;
    }
    return true;
}

int guanaco_residency_finish(struct guanaco_residency *r) {
    if (!atomic_load_explicit(&r->deferred_active, memory_order_acquire)) {
        return 0;
    }
    uint64_t start = guanaco_now_ns();
    pthread_mutex_lock(&r->lock);
    int err = finish_deferred(r, true);
    r->stats.stall_ns += guanaco_now_ns() - start;
    pthread_mutex_unlock(&r->lock);
    return err;
}

/* The tokens a call of n_ids ids serves (its ubatch's rows), at least 1: the policy's duel counts misses per token. */
static uint32_t call_tokens(const struct guanaco_residency *r, size_t n_ids) {
    size_t tokens = r->n_expert_used ? (n_ids + r->n_expert_used - 1) / r->n_expert_used : 1;
    return tokens == 0 ? 1 : tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)tokens;
}

static int prepare_locked(struct guanaco_residency *r, uint32_t layer, const int32_t *ids, size_t n_ids,
                          uint64_t token, bool may_stream) {
    if (layer >= r->n_layer || (n_ids > 0 && !ids)) {
        guanaco_log_error("residency: layer %u out of range (%u layers) or no ids", layer, r->n_layer);
        return -EINVAL;
    }
    if (r->layers[layer].n_tensors == 0) {
        return 0; /* dense: nothing of it is ours */
    }
    /* The last layer has computed: its call ends first, and its error is this one's. Its victims go once this
       call's reads are submitted, as a page-cache call's do: dropping a copy (mremap, mmap) takes CPU time the
       disk need not wait for, and this layer is the one to protect now. */
    const bool evict_last = atomic_load(&r->deferred_active);
    const uint64_t last_token = r->deferred.token;
    int deferred_error = finish_deferred(r, false);
    for (uint32_t b = 0; r->stream_memory && b < STREAM_BUFFERS; b++) {
        atomic_store(&r->stream_buffers[b].serving, false); /* the last layer has computed */
    }
    if (r->n_retired && !r->shared) {
        unmap_retired(r); /* one context, between its matmuls: no one computes from them */
    }
    int err = check_files(r);
    if (err) {
        int drop_error = evict_last ? evict_by_policy(r, layer, last_token, NULL) : 0;
        return deferred_error ? deferred_error : err ? err : drop_error;
    }

    /* distinct valid ids, in order of first appearance */
    uint64_t call = ++r->call;
    /* what this call leaves in the page cache of arena tensors: the slices it repacked, read-ahead it dropped */
    const uint64_t transformed_before = r->stats.transformed_bytes, wasted_before = r->stats.prefetch_wasted_bytes;
    size_t n_distinct = 0;
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || (uint32_t)id >= r->n_expert) {
            r->stats.invalid_ids++;
            continue;
        }
        if (r->seen_call[id] != call) {
            r->seen_call[id] = call;
            r->distinct[n_distinct++] = (uint32_t)id;
        }
    }
    r->stats.accesses += n_distinct;

    /* how good the read-ahead's guess for this call was, whether or not it was read */
    if (r->layer_prediction[layer]) {
        for (size_t i = 0; i < n_distinct; i++) {
            r->stats.predicted_needed +=
                r->prediction_stamp[(size_t)layer * r->n_expert + r->distinct[i]] == r->layer_prediction[layer];
        }
        r->stats.prediction_checked += n_distinct;
        r->layer_prediction[layer] = 0;
    }

    size_t n_missing = 0;
    for (size_t i = 0; i < n_distinct; i++) {
        size_t slot = (size_t)layer * r->n_expert + r->distinct[i];
        if (guanaco_policy_is_resident(r->policy, layer, r->distinct[i])) {
            r->hit_call[r->distinct[i]] = call;
            r->stats.hits++;
            r->stats.pinned_hits += guanaco_policy_is_pinned(r->policy, layer, r->distinct[i]);
        } else if (!r->run_of_slot || !r->run_of_slot[slot]) {
            r->missing[n_missing++] = r->distinct[i];
        }
    }
    int first_error = 0, pending_error = 0;
    /* A prompt's ubatch streams the layer (stream_prompts), and so does a call whose read-ahead streamed: its
       huge folios must go as whole runs. */
    const bool stream = streams_now(r) && may_stream &&
                        (r->stream_ahead[layer] || guanaco_streams_layer(n_distinct, r->n_expert));
    if (r->stream) {
        r->stream_ahead[layer] = false;
        set_streaming(r, stream);
    }
    const uint32_t tokens = call_tokens(r, n_ids);
    /* A prompt's ubatch: where it does not stream it keeps the stream buffers for its layers that do */
    const bool prompt_call = tokens >= GUANACO_PROMPT_MIN_TOKENS; /* never without a top-k: call_tokens is 1 */
    if (!r->shared && (r->stream_quarantined || (r->stream_memory && !((stream || prompt_call) && r->stream_direct)))) {
        /* Streaming into the buffers is over (a decode call, turned off, or several contexts came meanwhile): their
           memory goes back, so that decoding keeps the memory it had before the prompt. Only here, in a call of
           the one context, between its matmuls: with several contexts another may still compute from a buffer. */
        stream_buffers_release(r);
        r->stream_quarantined = false;
    }
    r->read_layer = layer; /* from here to the policy's answer, read_call marks what this call mapped */
    r->last_layer = layer;
    /* What is missing goes first (urgent); the last call's victims are dropped and this layer's read-ahead
       lands while the disk reads it. */
    struct guanaco_io_job job;
    uint64_t start = guanaco_now_ns();
    if (r->slots && !r->shared) {
        if (prompt_call || stream) {
            r->pool_split_by_prompt = true;
        } else if (r->pool_split_by_prompt && !r->stream_loan_held) {
            rebuild_huge_pages(r);
        }
    }
    if (r->overlap_layer) {
        qsort(r->missing, n_missing, sizeof(*r->missing), compare_u32); /* MUL_MAT_ID's order */
    }
    /* DIRECT's copies enter the resident set; a streamed call's reads are the file's pages, dropped after it */
    const bool direct = r->load == GUANACO_RESIDENCY_LOAD_DIRECT && !stream;
    /* stream_direct: a streamed call's missing experts come from a stream buffer (stream_serve, below) */
    const bool buffered = stream && r->stream_direct && !r->shared;
    size_t n_requests = n_missing && !buffered ? submit_demand(r, layer, n_missing, direct, &job) : 0;
    size_t n_demand = buffered ? 0 : n_missing;
    pending_error = drop_pending(r, true); /* this call's experts are held by now; the last layer has computed */
    if (evict_last) {
        /* a call that defers drops them while its matmuls wait for the disk (settle_expert), else at its end */
        int drop_error = evict_by_policy(r, layer, last_token, defers(r, stream) ? &r->pending_drops : NULL);
        pending_error = pending_error ? pending_error : drop_error;
    }
    pending_error = deferred_error ? deferred_error : pending_error;
    (void)claim_prefetch(r, layer, call, stream, &n_missing);
    if (buffered && n_missing && stream_serve(r, layer, n_missing, token) == n_missing) {
        n_missing = 0;
    }
    if (defers(r, stream) && n_demand && n_missing == n_demand) {
        r->deferred = (struct deferred_call){.layer = layer, .n_missing = n_demand,
                                             .n_distinct = n_distinct, .n_requests = n_requests, .token = token,
                                             .tokens = tokens,
                                             .pending_error = pending_error, .transformed_before = transformed_before,
                                             .wasted_before = wasted_before};
        memset(r->expert_state, EXPERT_READING, n_demand);
        memset(r->computed_early, 0, n_demand);
        r->stats.read_ns += guanaco_now_ns() - start; /* issuing; the waits add theirs */
        atomic_store_explicit(&r->deferred_active, true, memory_order_release);
        return 0;
    }
    if (n_demand) {
        first_error = finish_demand(r, layer, n_demand, n_requests, direct, &job, start);
    }
    if (n_missing > n_demand) {
        /* read-ahead that failed: once more, the ordinary way */
        memmove(r->missing, r->missing + n_demand, (n_missing - n_demand) * sizeof(*r->missing));
        err = load_experts(r, layer, n_missing - n_demand, direct);
        first_error = first_error ? first_error : err;
    }
    return finish_call(r, layer, n_distinct, token, tokens, stream, first_error, pending_error, transformed_before,
                       wasted_before, true);
}

/*
 * The end of a call once its experts are mapped or failed (first_error):
 * the policy hears of them, what it does not hold is dropped, and, with
 * `evict`, it evicts (a deferred call's eviction can wait for the next call's
 * reads: prepare_locked).
 */
static int finish_call(struct guanaco_residency *r, uint32_t layer, size_t n_distinct, uint64_t token,
                       uint32_t tokens, bool stream, int first_error, int pending_error,
                       uint64_t transformed_before, uint64_t wasted_before, bool evict) {
    int err = tell_policy(r, layer, n_distinct, token, tokens, stream);
    /* What the policy does not hold is no one's: the pages a failed expert left cached or mapped, and,
       when the policy refused the call, everything the call read. */
    for (size_t i = 0; (first_error || err) && i < n_distinct; i++) {
        if (!guanaco_policy_is_resident(r->policy, layer, r->distinct[i])) {
            (void)drop_expert(r, layer, r->distinct[i]);
        }
    }
    if (err) {
        if (stream) {
            r->stream_pending[layer] = true;
        }
        return err;
    }
    uint64_t resident = guanaco_policy_resident_bytes(r->policy) + reserved_room(r);
    if (resident > r->stats.peak_resident_bytes) {
        r->stats.peak_resident_bytes = resident;
    }
    if (!evict) {
        return first_error ? first_error : pending_error;
    }

    /* The next call drops these while its reads run: dropping took 20-30 ms of a 100-150 ms decode stall when it
       came after the reads (24-layer Qwen3 Q8_0, 25%). Only page-cache pages wait: the kernel can reclaim them
       under a memory limit, where anonymous memory (DIRECT copies, arenas) would count to the end. The last
       expert layer's go at once, so that between tokens nothing but the budget is resident. */
    bool later = r->load == GUANACO_RESIDENCY_LOAD_PAGE_CACHE && !r->transform_source && layer != r->last_expert_layer;
    int drop_error = evict_by_policy(r, layer, token, later ? &r->pending_drops : NULL);
    if (!later) {
        int err = drop_pending(r, true);
        pending_error = pending_error ? pending_error : err;
    }
    if (stream) {
        /* after any drop at once: the layer computes from these pages, which go with the next call's reads (for
           the last layer, the next ubatch's or token's first call) */
        r->stream_pending[layer] = true;
    }
    /* a call that only hit read nothing: no fadvise on that path; slots read with O_DIRECT and leave nothing */
    if (!r->slots && (r->stats.transformed_bytes != transformed_before || r->stats.prefetch_wasted_bytes != wasted_before)) {
        drop_arena_file_pages(r, layer);
    }
    return first_error ? first_error : drop_error ? drop_error : pending_error;
}

int guanaco_residency_prepare_layer(struct guanaco_residency *r, uint32_t layer, const int32_t *ids, size_t n_ids,
                                    uint64_t token) {
    uint64_t start = guanaco_now_ns();
    pthread_mutex_lock(&r->lock);
    int ret = prepare_locked(r, layer, ids, n_ids, token, true);
    r->stats.stall_ns += guanaco_now_ns() - start;
    r->stats.prefetch_outstanding_bytes = r->prefetch_outstanding;
    pthread_mutex_unlock(&r->lock);
    return ret;
}

int guanaco_residency_preload_layer(struct guanaco_residency *r, uint32_t layer, const int32_t *ids, size_t n_ids) {
    pthread_mutex_lock(&r->lock);
    r->preloading = true;
    int ret = prepare_locked(r, layer, ids, n_ids, 0, false);
    r->preloading = false;
    pthread_mutex_unlock(&r->lock);
    return ret;
}

/* Whether every page of t's file bytes [a, b) (whole pages) has been read into the page cache: mincore over the
   shared mapping. */
static bool pages_read(struct guanaco_residency *r, const struct tensor *t, uint64_t a, uint64_t b) {
    for (uint64_t at = a; at < b;) {
        uint64_t pages = (b - at) / r->page;
        pages = pages < AUDIT_PAGES ? pages : AUDIT_PAGES;
        if (mincore((void *)(uintptr_t)address_of(t, at), pages * r->page, r->audit_vector) != 0) {
            return false;
        }
        for (uint64_t p = 0; p < pages; p++) {
            if (!(r->audit_vector[p] & 1)) {
                return false;
            }
        }
        at += pages * r->page;
    }
    return true;
}

/* cachestat over the same pages: 1 when every one is in the page cache, read or still reading; 0 when not; -1
   when cachestat cannot answer (an older kernel, a sandbox that filters it, a file system without it), after
   which this engine asks mincore only: never a reason to read again what is cached. */
static int pages_present(struct guanaco_residency *r, const struct tensor *t, uint64_t a, uint64_t b) {
#ifdef SYS_cachestat
    struct {
        uint64_t offset, length;
    } range = {a, b - a};
    struct {
        uint64_t cached, dirty, writeback, evicted, recently_evicted;
    } counts;
    if (syscall(SYS_cachestat, t->fd, &range, &counts, 0) == 0) {
        return counts.cached >= (b - a) / r->page;
    }
#else
    (void)t;
    (void)a;
    (void)b;
#endif
    r->no_cachestat = true;
    return -1;
}

/*
 * Whether every page of expert e of `layer` is in the page cache. With
 * `reading_counts` (the warm start: adopting waits for a page still reading)
 * cachestat answers where it can: it counts a large folio in one step, where
 * mincore over a range not mapped yet looks up each 4 KiB page (for a 16.6 GB
 * model whose experts a `cat` left cached, 0.004 s against 0.35 s, which was
 * most of a warm start's time to first token above plain llama.cpp's).
 * Without it, only pages already read count (mincore).
 */
static bool expert_cached(struct guanaco_residency *r, uint32_t layer, uint32_t e, bool reading_counts) {
    const struct layer *l = &r->layers[layer];
    for (uint32_t k = 0; k < l->n_tensors; k++) {
        const struct tensor *t = &r->tensors[l->first_tensor + k];
        uint64_t a = page_down(r, t->begin + (uint64_t)e * t->stride);
        uint64_t b = page_up(r, t->begin + (uint64_t)(e + 1) * t->stride);
        int present = reading_counts && !r->no_cachestat ? pages_present(r, t, a, b) : -1;
        if (present < 0) {
            present = pages_read(r, t, a, b);
        }
        if (!present) {
            return false;
        }
    }
    return true;
}

int guanaco_residency_adopt_cached(struct guanaco_residency *r, uint32_t per_layer, uint64_t *adopted) {
    *adopted = 0;
    pthread_mutex_lock(&r->lock);
    int err = finish_deferred(r, true);
    for (uint32_t layer = 0; layer < r->n_layer && !err; layer++) {
        const struct layer *l = &r->layers[layer];
        size_t n = 0;
        for (uint32_t e = 0; e < r->n_expert && n < per_layer && l->n_tensors; e++) {
            if (!guanaco_policy_is_resident(r->policy, layer, e) && expert_cached(r, layer, e, true) &&
                populate_slices(r, l, e, true) == 0) {
                r->accessed[n++] = e;
            }
        }
        if (n == 0) {
            continue;
        }
        size_t n_policy_missing = 0;
        err = guanaco_policy_access(r->policy, layer, r->accessed, n, 0, r->policy_missing, &n_policy_missing);
        if (err) {
            /* the policy holds none of them: neither does the mapping */
            guanaco_log_error("residency: policy refused adopting layer %u: %s", layer, strerror(-err));
            for (size_t i = 0; i < n; i++) {
                (void)drop_expert(r, layer, r->accessed[i]);
            }
            break;
        }
        *adopted += n;
    }
    for (uint32_t layer = 0; layer < r->n_layer; layer++) {
        drop_arena_file_pages(r, layer); /* after every layer's copies: a drop's margin may reach the next layer */
    }
    if (!err) {
        err = evict_by_policy(r, 0, 0, NULL);
    }
    r->stats.resident_bytes = guanaco_policy_resident_bytes(r->policy);
    pthread_mutex_unlock(&r->lock);
    return err;
}

/* ---- queries ---- */

void guanaco_residency_get_stats(const struct guanaco_residency *r, struct guanaco_residency_stats *out) {
    struct guanaco_residency *m = (struct guanaco_residency *)r; /* the lock is not part of the value */
    pthread_mutex_lock(&m->lock);
    *out = r->stats;
    out->budget_bytes = r->budget_bytes;
    out->spare_bytes = r->spare_bytes;
    out->stream_memory_bytes = r->stream_memory ? r->stream_memory_bytes : 0;
    pthread_mutex_unlock(&m->lock);
}

bool guanaco_residency_holds_every_expert(const struct guanaco_residency *r) {
    struct guanaco_residency *m = (struct guanaco_residency *)r;
    pthread_mutex_lock(&m->lock);
    bool holds = guanaco_policy_holds_every_expert(r->policy);
    pthread_mutex_unlock(&m->lock);
    return holds;
}

bool guanaco_residency_is_resident(const struct guanaco_residency *r, uint32_t layer, uint32_t expert) {
    if (layer >= r->n_layer || expert >= r->n_expert) {
        return false;
    }
    struct guanaco_residency *m = (struct guanaco_residency *)r;
    pthread_mutex_lock(&m->lock);
    bool resident = guanaco_policy_is_resident(r->policy, layer, expert);
    pthread_mutex_unlock(&m->lock);
    return resident;
}

void guanaco_residency_mark_absent(const struct guanaco_residency *r, uint32_t layer, uint8_t *absent) {
    struct guanaco_residency *m = (struct guanaco_residency *)r;
    pthread_mutex_lock(&m->lock);
    for (uint32_t e = 0; e < r->n_expert; e++) {
        absent[e] = layer >= r->n_layer || !guanaco_policy_is_resident(r->policy, layer, e);
    }
    pthread_mutex_unlock(&m->lock);
}

struct address_range {
    uintptr_t start, end;
};

static int compare_ranges(const void *a, const void *b) {
    const struct address_range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* mincore over [start, start + pages pages), in AUDIT_PAGES pieces: adds the resident pages to *resident_pages.
   0 or -errno, logged as a mincore over `what`. */
static int count_resident_range(struct guanaco_residency *r, uintptr_t start, size_t pages, const char *what,
                                uint64_t *resident_pages) {
    for (size_t at = 0; at < pages; at += AUDIT_PAGES) {
        size_t count = pages - at < AUDIT_PAGES ? pages - at : AUDIT_PAGES;
        if (mincore((void *)(start + at * r->page), count * r->page, r->audit_vector) != 0) {
            int err = -errno;
            guanaco_log_error("residency: mincore over %s: %s", what, strerror(-err));
            return err;
        }
        for (size_t p = 0; p < count; p++) {
            *resident_pages += r->audit_vector[p] & 1;
        }
    }
    return 0;
}

/* count_resident_range over n page-aligned ranges, sorted and merged first (adjacent tensors of one shard share a
   page: counted once). */
static int count_resident_pages(struct guanaco_residency *r, struct address_range *ranges, uint32_t n,
                                uint64_t *resident_pages) {
    qsort(ranges, n, sizeof(*ranges), compare_ranges);
    for (uint32_t i = 0; i < n;) {
        uintptr_t start = ranges[i].start, end = ranges[i].end;
        for (i++; i < n && ranges[i].start <= end; i++) {
            end = ranges[i].end > end ? ranges[i].end : end;
        }
        int err = count_resident_range(r, start, (end - start) / r->page, "expert pages", resident_pages);
        if (err) {
            return err;
        }
    }
    return 0;
}

int guanaco_residency_audit(struct guanaco_residency *r, uint64_t *mapped_resident_bytes, uint64_t *file_page_bytes) {
    *mapped_resident_bytes = 0;
    if (file_page_bytes) {
        *file_page_bytes = 0;
    }
    struct address_range *ranges = calloc(r->n_tensors ? 2 * r->n_tensors : 1, sizeof(*ranges));
    if (!ranges) {
        return -ENOMEM;
    }
    uint64_t resident_pages = 0;
    pthread_mutex_lock(&r->lock);
    (void)finish_deferred(r, true); /* its error was the caller's to see at the end of its graph */
    /* What the policy let go is not counted as resident; a streamed layer's pages stay, and count, until the
       next call: its compute may still be reading them. */
    (void)drop_pending(r, false);
    /* With overlap_layer the last call's reads may still be landing, and mincore counts only pages read:
       mapping them waits for the disk (the audit is a diagnostic; the layer computes from them anyway). */
    for (uint32_t e = 0; r->overlap_layer && !r->slots && r->last_layer < r->n_layer && e < r->n_expert; e++) {
        const struct layer *l = &r->layers[r->last_layer];
        for (uint32_t k = 0; k < l->n_tensors && guanaco_policy_is_resident(r->policy, r->last_layer, e); k++) {
            const struct tensor *t = &r->tensors[l->first_tensor + k];
            if (!t->arena) {
                (void)map_slice(r, t, e);
            }
        }
    }
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        const struct tensor *t = &r->tensors[i];
        uintptr_t a = (uintptr_t)t->mapped, b = a + (uintptr_t)(t->end - t->begin);
        ranges[i] = (struct address_range){a - a % r->page, (b + r->page - 1) / r->page * r->page};
    }
    /* An arena tensor holds its experts in the arena; its file pages count too, as whatever is cached. */
    uint32_t n_ranges = r->n_tensors;
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        const struct tensor *t = &r->tensors[i];
        if (t->arena) {
            uintptr_t a = (uintptr_t)t->arena;
            ranges[n_ranges++] = (struct address_range){a, a + (uintptr_t)page_up(r, t->end - t->begin)};
        }
    }
    /* The file's pages first, then the arenas': the caller learns how much is page cache. */
    int err = count_resident_pages(r, ranges, r->n_tensors, &resident_pages);
    uint64_t file_pages = resident_pages;
    err = err ? err : count_resident_pages(r, ranges + r->n_tensors, n_ranges - r->n_tensors, &resident_pages);
    /* fixed_slots: the copies, which the mapping does not hold */
    for (size_t i = 0; !err && r->slot_copy && i < (size_t)r->n_layer * r->n_expert * r->max_tensors_in_layer; i++) {
        char *copy = atomic_load(&r->slot_copy[i]);
        size_t pages = copy ? (size_t)(slot_length(r, tensor_of_slot(r, i)) / r->page) : 0;
        err = count_resident_range(r, (uintptr_t)copy, pages, "an expert copy", &resident_pages);
    }
    pthread_mutex_unlock(&r->lock);
    free(ranges);
    *mapped_resident_bytes = resident_pages * r->page;
    if (file_page_bytes) {
        *file_page_bytes = file_pages * r->page;
    }
    return err;
}

void guanaco_residency_inject_io_fault(struct guanaco_residency *r, uint64_t after_bytes, int error) {
    pthread_mutex_lock(&r->lock);
    guanaco_io_inject_fault(r->io, after_bytes, error);
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_inject_policy_fault(struct guanaco_residency *r, int error) {
    pthread_mutex_lock(&r->lock);
    r->policy_fault = error;
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_adopt_by_mincore(struct guanaco_residency *r) {
    pthread_mutex_lock(&r->lock);
    r->no_cachestat = true;
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_set_shared(struct guanaco_residency *r, bool shared) {
    pthread_mutex_lock(&r->lock);
    (void)finish_deferred(r, true); /* its reads' failures were logged; a new context starts before the next call */
    r->shared = shared;
    if (shared) {
        unmap_spares(r); /* place_slot moves a spare's pages into the mapping, which a pool's slot cannot lend */
        /* Contexts would compute different layers from the buffers: none serves or is read into from now on. The
           first context's matmuls may be computing from one it was served, with addresses they already hold, so
           nothing in them changes until one context is left and calls again (prepare_locked gives them back). */
        r->stream_quarantined = r->stream_memory != NULL;
    }
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_set_stream_direct(struct guanaco_residency *r, bool on) {
    if (!r) {
        return;
    }
    /* Nothing is unmapped here: another context may call this while the first computes from a buffer. The next
       call of one context gives the buffers back when they are off (prepare_locked). */
    pthread_mutex_lock(&r->lock);
    r->stream_direct = on && r->stream_direct_capable;
    r->stats.stream_direct = r->stream_direct;
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_set_stream_keep(struct guanaco_residency *r, bool keep) {
    if (!r) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->stream_keep = keep; /* buffers kept so far go at the next call that does not stream (prepare_locked) */
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_set_stream_loan(struct guanaco_residency *r, uint64_t bytes) {
    if (!r) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->stream_loan = bytes;
    guanaco_policy_set_reserve(r->policy, reserved_room(r)); /* the next call's eviction keeps it, if held */
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_set_budget(struct guanaco_residency *r, uint64_t budget_bytes) {
    if (!r) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    r->budget_bytes = budget_bytes;
    guanaco_policy_set_budget(r->policy, budget_bytes);
    if (r->prefetch_allowance) {
        r->prefetch_allowance = guanaco_read_ahead_allowance(budget_bytes);
    }
    r->spare_limit = guanaco_spare_limit(budget_bytes);
    if (r->spare_bytes > r->spare_limit) {
        free_spares(r); /* --guanaco-ram auto counted only the new limit beside the budget */
    }
    pthread_mutex_unlock(&r->lock);
}

void guanaco_residency_seed_policy(struct guanaco_residency *r, uint32_t layer, const double *rate) {
    if (!r || !rate) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    guanaco_policy_seed(r->policy, layer, rate);
    pthread_mutex_unlock(&r->lock);
}
