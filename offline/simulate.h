/*
 * simulate.h - owns replaying a recorded routing trace against a replacement
 * policy (policy.h) and the trace format that belady.h shares, and the
 * timing model of the engine's pipeline (reads overlapped with compute) that
 * guanaco-sim and guanaco-plan both use. Pure: no I/O; the caller loads the
 * trace however it likes.
 *
 * A trace is a sequence of requests. A request is the distinct experts one
 * MoE layer needed for one token (or ubatch), all of which must be resident
 * at once; requests appear in execution order, so decode sweeps the layers of
 * token 0, then of token 1, and so on.
 */
#ifndef GUANACO_SIMULATE_H
#define GUANACO_SIMULATE_H

#include "policy.h"
#include "predictor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct guanaco_request_trace {
    uint32_t n_layer;
    uint32_t n_expert;
    const uint64_t *expert_bytes;   /* n_layer entries; 0 = dense layer, which no request may name */
    size_t n_requests;
    const uint64_t *request_token;  /* per request: its token index, never decreasing (the policy's `now`) */
    const uint32_t *request_layer;  /* per request */
    const size_t *request_start;    /* n_requests + 1 offsets: request r is experts[start[r], start[r+1]) */
    const uint32_t *experts;        /* expert ids, distinct within a request */
};

struct guanaco_replay_stats {
    uint64_t requests;
    uint64_t accesses;              /* (request, expert) pairs */
    uint64_t hits;                  /* accesses that needed no read */
    uint64_t misses;
    uint64_t bytes_read;
    uint64_t evictions;
    uint64_t peak_resident_bytes;   /* highest resident bytes after a request's evictions */
    uint64_t worst_overshoot_bytes; /* highest excess over the budget after a request's evictions */
};

/* 0 when the trace is well formed, else -EINVAL. O(accesses); allocates one mark per slot. */
int guanaco_request_trace_check(const struct guanaco_request_trace *trace);

/*
 * Replay `trace` against a policy made from `config`, whose n_layer,
 * n_expert and expert_bytes are taken from the trace. Each request is one
 * access (now = its token) followed by one evict protecting its layer. The
 * access covers as many tokens as `rows` gives the request (the engine's
 * ubatch), so the policy counts a prompt's misses per token as the live
 * residency does; without rows each request is one token.
 * With `preload`, the policy first gets what the engine's --guanaco-preload
 * loads (guanaco_preload_count of budget.h: the lowest-numbered experts of every MoE layer,
 * at token 0), and the stats count only the replay after it.
 * 0, -EINVAL (bad trace or config) or -ENOMEM.
 */
struct guanaco_request_rows; /* below, with the pipeline */
int guanaco_simulate(const struct guanaco_request_trace *trace, const struct guanaco_request_rows *rows,
                     const struct guanaco_policy_config *config, bool preload, struct guanaco_replay_stats *stats);

/* ---- the pipeline: reads overlapped with compute ----
 *
 * The engine reads layer L's misses when L's ids arrive, then starts reading
 * ahead what it expects the next MoE layer L' to need, and returns: L
 * computes while those reads run. At L' it waits only for the reads it
 * needs that are still in flight, plus its own misses that were not read
 * ahead. The model of one layer, with B the disk bandwidth of its phase
 * (decode or prompt: the engine's reads run at different rates for a few
 * experts per call and for a whole layer, so the caller may give two):
 *
 *   window  = the compute time of the layer that issued the read-ahead (0: none)
 *   undone  = max(0, ahead / B - window) / (ahead / B)   the share of the read-ahead not yet read
 *   waited  = (demand + undone * ahead_used) / B          the reads the layer still waits for
 *   stall   = max(waited, drop) + drop_serial             drop: CPU time of dropping the pages of the
 *                                                          previous call's victims, which the engine does
 *                                                          while this call's reads run; drop_serial: the
 *                                                          last MoE layer's own victims, dropped at once
 *   compute = its share of the compute + kernel          kernel: CPU time of the read-ahead issued at the
 *                                                          previous layer in 4 KiB folios, taken from the
 *                                                          cores compute runs on (read CPU / cores), and
 *                                                          the first touches of pages page-cache loading
 *                                                          mapped (below)
 *   map     = direct loading only: CPU time of placing the layer's loaded copies, after their reads
 *   stall  += map
 *   overlapped time = stall + compute
 *   serial time     = (demand + ahead_used) / B + map + compute (the same layer without read-ahead)
 *
 * With overlap_layer (the engine's --guanaco-overlap-layer, off by default) the
 * call returns once its reads are issued and its drops done, and the layer
 * computes while the reads land, waiting only where it reaches a page still
 * reading:
 *   overlapped time = max(drop + compute, waited) + drop_serial + map
 *   stall           = overlapped time - compute
 * which assumes the matmuls keep pace with the disk in the order it reads
 * (the reads go in the order MUL_MAT_ID takes them); the layer's last read
 * still has its own compute after it, which this leaves out.
 *
 * So a layer whose misses were all read ahead takes max(compute of the
 * issuing layer, reads) when the two computes are equal, and a layer with no
 * read-ahead takes their sum. Read-ahead still in flight is assumed to be
 * needed in proportion (ahead_used / ahead); wrong guesses cost disk time
 * inside the window and their kernel CPU, never a stall of their own.
 * Compute is spread evenly over the MoE layers: a pass of n tokens costs
 * n * (compute per token) / (MoE layers) per layer.
 *
 * Streamed prompts (the engine's --guanaco-stream-prompts, on by default):
 * a call that needs half of its layer's experts or more, or whose layer was
 * read ahead that way, uses its reads once. The policy hears of its hits
 * only, so its misses are never admitted and the resident set stays what
 * decoding chose, minus what the read-ahead evicted to make room for the
 * whole layer. Streamed read-ahead goes through 2 MiB folios, whose kernel
 * CPU is about 20x less than 4 KiB folios' (bench/PIPELINE.md), so it is not
 * charged; a streamed call's own misses (4 KiB folios) are charged to drop.
 *
 * Direct loading (the engine's --guanaco-load direct) reads a call's misses
 * and its read-ahead with O_DIRECT into anonymous copies: no 4 KiB folios,
 * so neither read CPU nor drops are charged for them. Instead each loaded
 * copy costs map CPU per byte once its read is done (the move into the
 * mapping and the partial pages at the slice's ends), and every victim costs
 * evict CPU per byte at once, on the thread that computes (the file mapped
 * back over it); the victims of a read-ahead are charged to the next layer.
 * Streamed calls go through the page cache as with page-cache loading. Both
 * rates are inputs measured from the engine's status lines
 * ("mapping" and "eviction" ms), not derived here. The reads themselves cost
 * CPU too on a VM (the virtio notify, the interrupt, the completion: about
 * 0.16 CPU-s per GB here, measured with /proc/stat around fio alone,
 * bench/SIMULATOR.md). direct_read_cpu charges the read-ahead's whole (it
 * runs under the previous layer's compute, as read-ahead's 4 KiB folios do)
 * and the share of a call's own reads that runs while the layer's experts
 * already in memory compute, min(1, that compute / the reads' time), to
 * compute over the cores; the rest runs while the layer waits and the cores
 * are free.
 *
 * Page-cache loading maps what it reads into the model's mapping, and a VM
 * whose hypervisor keeps shadow page tables fills an entry at the first read
 * of every newly mapped 4 KiB page: time no fault the guest counts, spent on
 * the computing thread (about 1.1-1.7 us a page here, and two threads took
 * as long as one: guanaco-page-table-bench, bench/SIMULATOR.md). first_touch
 * charges it to compute, whole, for every byte the layer uses from this
 * call's reads or the read-ahead, in the share small_page_share gives: a
 * slice's 2 MiB-aligned middle is read in huge folios and mapped whole.
 * Direct loading's slots never change page tables, so it is not charged.
 *
 * The CPU costs are per byte in 4 KiB folios, measured with /proc/stat
 * (bench/PIPELINE.md: WILLNEED + MADV_POPULATE_READ about 0.28 CPU-s per GB,
 * dropping about 0.16); 0 leaves them out. What the model still leaves out:
 * the read-ahead throttle (src/read_ahead_throttle.c: decode read-ahead on
 * or off per epoch from live timings; the replay reads ahead whenever the
 * predictor is sure enough), page-cache loading's demand reads' own kernel
 * CPU (it runs while the layer waits, so it binds only when it exceeds the
 * disk's time; direct loading's is charged, above), and compute under the engine being slower than warm compute for reasons
 * other than reads (the hook's graph split per MoE layer, 4 KiB mappings
 * against the warm page cache's large folios).
 */

/* The engine's read-ahead rule is the runtime's (predictor.h: guanaco_read_ahead_choose); the replay below calls
   it. */

struct guanaco_layer_reads {
    double compute_seconds;     /* this layer's compute */
    double window_seconds;      /* compute of the layer that issued this layer's read-ahead; 0 = none */
    uint64_t ahead_bytes;       /* read ahead for this layer, guessed right or wrong */
    uint64_t ahead_used_bytes;  /* of those, the bytes this layer needs (at most ahead_bytes) */
    uint64_t demand_bytes;      /* this layer's misses that were not read ahead */
    double kernel_seconds;      /* CPU the read-ahead's kernel work took from this layer's compute; 0 = none */
    double drop_seconds;        /* CPU time of the previous call's drops, run while this layer's reads run */
    double drop_serial_seconds; /* CPU time of drops after this layer's reads (the last MoE layer's victims) */
    double map_seconds;         /* direct loading: CPU time of placing this layer's loaded copies, after their reads */
    bool overlap_layer;         /* the layer computes while its reads land (--guanaco-overlap-layer) */
};

struct guanaco_layer_time {
    double serial_seconds;      /* compute + every needed byte read after the ids arrive */
    double overlapped_seconds;  /* compute + kernel + stall */
    double stall_seconds;
    double hidden_bytes;        /* needed bytes read ahead and done before the layer started */
};

/* The model above for one layer; bytes_per_second > 0. */
void guanaco_pipeline_layer_time(const struct guanaco_layer_reads *reads, double bytes_per_second,
                                 struct guanaco_layer_time *out);

/* The routed rows behind each request of a guanaco_request_trace, for the predictor. */
struct guanaco_request_rows {
    uint32_t top_k;
    const size_t *request_row_start; /* n_requests + 1: request r is rows [start[r], start[r+1]), at least one */
    const int32_t *ids;              /* top_k ids per row; ids outside [0, n_expert) are padding */
    const uint8_t *request_timed;    /* per request, 0 = replayed but not timed (a warmup); NULL = all timed */
};

struct guanaco_pipeline_config {
    enum guanaco_predictor_kind predictor; /* NONE: nothing is read ahead (--guanaco-prefetch none) */
    double pilot_mass, pilot_half_life;    /* 0 = the predictor's defaults */
    double bytes_per_second;               /* disk read bandwidth, > 0 (decode passes; prompt passes too unless
                                              prompt_bytes_per_second is given) */
    double prompt_bytes_per_second;        /* disk read bandwidth of prompt passes; 0 = bytes_per_second */
    bool stream_prompts;                   /* --guanaco-stream-prompts: prompt-sized calls are not admitted */
    bool overlap_layer;                    /* --guanaco-overlap-layer: a layer computes while its reads land */
    double read_cpu_seconds_per_byte;      /* kernel CPU to read a byte ahead into 4 KiB folios; 0 = free */
    double drop_cpu_seconds_per_byte;      /* kernel CPU to drop a byte of 4 KiB folios; 0 = free */
    uint32_t cpu_cores;                    /* cores compute runs on, which read-ahead's kernel CPU shares; 0 = 1 */
    bool load_direct;                      /* --guanaco-load direct: calls read into anonymous copies (O_DIRECT, no
                                              folios to charge), placed after their reads and evicted at once */
    double map_cpu_seconds_per_byte;       /* direct: CPU to place a loaded byte in the mapping; 0 = free */
    double evict_cpu_seconds_per_byte;     /* direct: CPU to evict a byte (the file mapped back over it); 0 = free */
    double direct_read_cpu_seconds_per_byte; /* direct: CPU an O_DIRECT read costs per byte (submission, interrupt,
                                                completion), taken from compute over cpu_cores; 0 = free */
    double first_touch_seconds_per_byte;   /* page-cache loading: the computing threads' first read of a loaded byte
                                              in a 4 KiB page (a hypervisor filling its shadow page table; wall time,
                                              two threads took as long as one); 0 = free */
    const double *small_page_share;        /* n_layer: the share of an expert's bytes page-cache loading maps in
                                              4 KiB pages, outside its slices' 2 MiB-aligned middles; NULL = all */
    double token_seconds;                  /* compute of one decode token (a pass of one token), >= 0 */
    double prompt_token_seconds;           /* compute of one token of a pass of several tokens, >= 0 */
};

/* One phase of a pipeline replay: decode (passes of one token) or prompt (passes of several). */
struct guanaco_pipeline_phase {
    uint64_t passes, tokens;               /* timed ones */
    double serial_seconds, overlapped_seconds, stall_seconds, compute_seconds;
    double kernel_seconds, drop_seconds;   /* the CPU charges above, summed (drop: all of it, hidden or not) */
    double map_seconds;                    /* direct loading's placing of copies, summed */
    uint64_t demand_bytes, ahead_bytes, ahead_used_bytes;
    uint64_t streamed_passes;              /* timed passes with at least one streamed call */
    double hidden_bytes;
};

struct guanaco_pipeline_stats {
    struct guanaco_pipeline_phase decode, prompt;
    struct guanaco_replay_stats replay;    /* every request, timed or not; bytes_read counts demand + ahead */
};

/*
 * Replays `trace` as guanaco_simulate does, with the engine's read-ahead on
 * top, and times every timed request with guanaco_pipeline_layer_time. A
 * pass is a run of requests with the same token (one ubatch); its phase is
 * prompt when its first request has more than one row. Per request, in the
 * engine's order: the policy serves the layer (read-ahead for it that it
 * needs counts as read ahead, the rest of its misses as demand); the
 * predictor learns the transition from the pass's previous MoE layer (same
 * number of rows) and chooses what to read of the next MoE layer
 * (guanaco_read_ahead_choose: all of it after a prompt's call where it is
 * wide, else the leading guesses that are resident or likely enough); the
 * guesses not resident are
 * read ahead within half the budget, the policy making room as the engine's
 * does (guanaco_policy_set_reserve, never evicting this layer). Read-ahead
 * that the next request does not use is counted as read and dropped. With
 * stream_prompts a request streams as the engine's call does (above): the
 * policy is given only its resident experts.
 * 0, -EINVAL (bad trace, rows or config), -E2BIG (predictor too large) or -ENOMEM.
 */
int guanaco_simulate_pipeline(const struct guanaco_request_trace *trace, const struct guanaco_request_rows *rows,
                              const struct guanaco_policy_config *policy_config, bool preload,
                              const struct guanaco_pipeline_config *config, struct guanaco_pipeline_stats *stats);

/* How the replay's read-ahead differs from the engine's with `predictor`, for the tools to print beside their
   figures: NULL where it does not. gate scores live activations, which a trace does not hold, so its replay is
   pilot's, the fallback it has anyway. */
const char *guanaco_simulate_predictor_caveat(enum guanaco_predictor_kind predictor);

#endif
