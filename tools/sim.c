/*
 * sim.c - guanaco-sim: the policy simulator. It replays recorded routing
 * traces (docs/TRACE.md) against every replacement policy (src/policy.h) and
 * against Belady's offline optimum (offline/belady.h) over a sweep of RAM
 * budgets, and reports per (policy, budget) the hit rate, the bytes read per
 * token, the evictions and the distance to the optimum, as a table on stdout,
 * a CSV file and a gnuplot-rendered PNG of miss-ratio curves.
 *
 * This file owns only the command line and the glue: the geometry of a named
 * shape, running the replays on a few threads, and the output. A GGUF's
 * geometry and the replay core's request trace (offline/simulate.h) built from
 * loaded traces come from tools/replay_input.h, shared with guanaco-plan.
 * The replays themselves are the library's, so the numbers here are the
 * ones the live engine's policy would produce.
 *
 * --predictor also replays the traces through an expert predictor
 * (src/predictor.h) token by token, as the engine calls it, and reports how
 * much of each next MoE layer's routing the guesses covered and at what
 * size: the figures that decide whether prefetching pays for its reads.
 *
 * With --disk-gbps and --compute-ms it estimates tokens per second twice:
 * serially (compute + reads, the old estimate) and as the engine's pipeline
 * runs, reads ahead overlapping compute (guanaco_simulate_pipeline in
 * offline/simulate.h, the model guanaco-plan uses too), split into decode and
 * prompt passes. The pipeline replay takes the engine's stream-prompts
 * setting (on by default, as in the engine), a prompt's own disk rate, and
 * the kernel's measured CPU per GB of 4 KiB folios read and dropped; each
 * is an input, never fitted here (bench/SIMULATOR.md).
 */
#include "belady.h"
#include "manifest.h"
#include "policy.h"
#include "predictor.h"
#include "simulate.h"
#include "trace.h"
#include "cli.h"
#include "replay_input.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROG "guanaco-sim"
#define DEFAULT_BUDGETS "10%,25%,50%,100%"
#define GIB (1024.0 * 1024.0 * 1024.0)

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " --trace FILE [--trace FILE ...] (--shape NAME [--quant TYPE] | --model MODEL.gguf ...)\n"
            "                   [--budgets LIST] [--policies LIST] [--per-layer-cap N] [--csv OUT.csv]\n"
            "                   [--plot OUT.png] [--disk-gbps X --compute-ms Y [--prompt-compute-ms Z]] [--threads N]\n"
            "                   [--predictor KIND [--pilot-mass LIST] [--pilot-half-life T] [--verbose]]\n"
            "                   [--ubatches] [--warmup N] [--prompt-disk-gbps X] [--stream-prompts on|off]\n"
            "                   [--overlap-layer on|off]\n"
            "                   [--read-cpu-s-per-gb X] [--drop-cpu-s-per-gb X] [--cpu-cores N]\n"
            "                   [--load direct|page-cache [--map-cpu-s-per-gb X] [--evict-cpu-s-per-gb X]\n"
            "                    [--direct-read-cpu-s-per-gb X]] [--first-touch-cpu-s-per-gb X]\n"
            "\n"
            "  --trace FILE        a routing trace (docs/TRACE.md); several are replayed back to back\n"
            "  --shape NAME        expert sizes of a named model: mixtral-8x7b (32 layers, 8 experts, top-2)\n"
            "                      or qwen3-30b-a3b (48 layers, 128 experts, top-8)\n"
            "  --quant TYPE        weight type for --shape: Q4_0 (default), Q8_0 or F16\n"
            "  --model FILE        expert sizes read from a GGUF; repeat it to list every shard of a split model\n"
            "  --budgets LIST      comma-separated RAM budgets, default %s. Each one is\n"
            "                      N%% of all expert bytes, a size (6GiB, 500MB, 1e9) or Ne experts per layer (2e)\n"
            "  --policies LIST     comma-separated names (%s), or all (default);\n"
            "                      belady, the offline optimum, is always replayed\n"
            "  --per-layer-cap N   most resident experts per layer for the policies (belady is not capped)\n"
            "  --half-life T       tokens over which use counts halve (lfu, guanaco); default 32\n"
            "  --preload           the policies start as the engine's --guanaco-preload leaves them, and only the\n"
            "                      replay after it is counted (belady starts empty)\n"
            "  --csv OUT.csv       also write the table as CSV\n"
            "  --plot OUT.png      also draw miss ratio against budget with gnuplot\n"
            "  --disk-gbps X       with --compute-ms: disk read speed in GB/s, for predicted tokens/s, serial\n"
            "                      (compute + reads) and overlapped (the engine's pipeline, with --predictor's\n"
            "                      read-ahead; without --predictor nothing is read ahead)\n"
            "  --compute-ms Y      with --disk-gbps: compute time of one decode token in ms\n"
            "  --prompt-compute-ms Z  compute time of one token of a prompt ubatch (a pass of several tokens),\n"
            "                      in ms; default Y, which overstates it: batched tokens compute faster\n"
            "  --ubatches          replay the records in recorded order, a ubatch (consecutive rows of one\n"
            "                      layer, as --guanaco-trace-out writes them) as one request: prompts as the\n"
            "                      engine saw them. Without it every token is its own pass\n"
            "  --warmup N          the first N passes (ubatches; a decode token is one) of each sequence are\n"
            "                      replayed but not timed, like llama-bench's warmup run (default 0)\n"
            "  --prompt-disk-gbps X  disk read speed for prompt passes (a whole layer read at once runs\n"
            "                      faster than a decode token's few experts); default --disk-gbps\n"
            "  --stream-prompts on|off  as the engine's --guanaco-stream-prompts (default on): a call that\n"
            "                      needs half of its layer or more uses its reads once; the policy keeps\n"
            "                      only its hits\n"
            "  --overlap-layer on|off  as the engine's --guanaco-overlap-layer: a layer computes while its own\n"
            "                      misses are read, so it takes max(drops + compute, reads). Default off, as\n"
            "                      page-cache loading; the engine's default, direct loading, runs it on\n"
            "  --read-cpu-s-per-gb X  kernel CPU seconds to read one GB ahead into 4 KiB page-cache folios\n"
            "                      (measured: about 0.28 on the bench machine); that read-ahead slows the\n"
            "                      compute it overlaps by X / --cpu-cores per GB. Default 0, not charged\n"
            "  --drop-cpu-s-per-gb X  kernel CPU seconds to drop one GB of 4 KiB folios (about 0.16); the\n"
            "                      engine drops a call's victims while the next call reads, so a layer\n"
            "                      waits max(reads, drop). Default 0, not charged\n"
            "  --cpu-cores N       cores compute runs on (default 1), for --read-cpu-s-per-gb\n"
            "  --load direct|page-cache  as the engine's --guanaco-load (default page-cache here): direct reads\n"
            "                      misses and read-ahead into anonymous copies, so no 4 KiB folios are\n"
            "                      charged for them; streamed calls still go through the page cache\n"
            "  --map-cpu-s-per-gb X  with --load direct: CPU seconds to place one GB of copies in the mapping\n"
            "                      after their reads (the engine's status lines: mapping ms over bytes loaded)\n"
            "  --evict-cpu-s-per-gb X  with --load direct: CPU seconds to evict one GB of copies, at once\n"
            "                      (status lines: eviction ms over bytes evicted). Both default to 0\n"
            "  --direct-read-cpu-s-per-gb X  with --load direct: CPU seconds one GB of O_DIRECT reads costs\n"
            "                      (submission, interrupt, completion), taken from compute over --cpu-cores;\n"
            "                      default 0\n"
            "  --first-touch-cpu-s-per-gb X  with page-cache loading: seconds compute takes for its first read\n"
            "                      of one GB of pages the engine mapped in 4 KiB pages (a hypervisor filling\n"
            "                      its shadow page tables: guanaco-page-table-bench's populated first touch,\n"
            "                      ns per page / 4096), whole, not over the cores. With --model, only the\n"
            "                      bytes outside the slices' 2 MiB-aligned middles; default 0\n"
            "  --threads N         replays run at once (default: the online CPUs)\n"
            "  --predictor KIND    also replay the traces through an expert predictor (%s) as the engine\n"
            "                      calls it, and report its recall, set size and precision\n"
            "  --pilot-mass LIST   comma-separated masses in (0, 1], one replay each (default %g); the\n"
            "                      overlapped tok/s reads ahead with the first\n"
            "  --pilot-half-life T observed ubatches (here tokens) over which pilot's counts halve (default %g)\n"
            "  --verbose           with --predictor: the recall of each MoE layer's guesses too\n",
            DEFAULT_BUDGETS, guanaco_policy_kind_names(), guanaco_predictor_kind_names(), GUANACO_PILOT_DEFAULT_MASS,
            GUANACO_PILOT_DEFAULT_HALF_LIFE);
}

struct sim_named_shape {
    const char *name;
    uint32_t n_layer, n_expert, top_k;
    uint64_t n_embd, n_ff, matrices; /* an expert is `matrices` n_embd x n_ff matrices (gate, up, down) */
};

static const struct sim_named_shape named_shapes[] = {
    {"mixtral-8x7b", 32, 8, 2, 4096, 14336, 3},
    {"qwen3-30b-a3b", 48, 128, 8, 2048, 768, 3},
};

struct sim_quant {
    const char *name;
    uint64_t block_bytes, block_elements; /* ggml's block layout: Q4_0 stores 32 weights in 18 bytes */
};

static const struct sim_quant quants[] = {
    {"Q4_0", 18, 32},
    {"Q8_0", 34, 32},
    {"F16", 2, 1},
};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static int geometry_from_shape(const char *name, const char *quant_name, struct replay_geometry *out) {
    const struct sim_named_shape *shape = NULL;
    for (size_t i = 0; i < COUNT_OF(named_shapes); i++) {
        if (strcmp(named_shapes[i].name, name) == 0) {
            shape = &named_shapes[i];
        }
    }
    if (!shape) {
        fprintf(stderr, PROG ": unknown --shape \"%s\": expected one of mixtral-8x7b|qwen3-30b-a3b\n", name);
        return -EINVAL;
    }
    const struct sim_quant *quant = NULL;
    for (size_t i = 0; i < COUNT_OF(quants); i++) {
        if (strcasecmp(quants[i].name, quant_name) == 0) {
            quant = &quants[i];
        }
    }
    if (!quant) {
        fprintf(stderr, PROG ": unknown --quant \"%s\": expected one of Q4_0|Q8_0|F16\n", quant_name);
        return -EINVAL;
    }
    out->n_layer = shape->n_layer;
    out->n_expert = shape->n_expert;
    out->top_k = shape->top_k;
    out->expert_bytes = malloc(shape->n_layer * sizeof(*out->expert_bytes));
    if (!out->expert_bytes) {
        return -ENOMEM;
    }
    /* every row of these shapes is a whole number of blocks, so this division is exact */
    uint64_t bytes = shape->matrices * shape->n_embd * shape->n_ff / quant->block_elements * quant->block_bytes;
    for (uint32_t l = 0; l < shape->n_layer; l++) {
        out->expert_bytes[l] = bytes;
    }
    snprintf(out->description, sizeof(out->description), "%s %s", shape->name, quant->name);
    replay_geometry_finish(out);
    return 0;
}

static int geometry_from_model(const char *const *paths, size_t n_paths, struct replay_geometry *out) {
    struct guanaco_manifest manifest;
    int err = guanaco_manifest_load(paths[0], n_paths > 1 ? paths : NULL, n_paths > 1 ? n_paths : 0, &manifest);
    if (err != 0) {
        fprintf(stderr, PROG ": cannot read the model %s: %s\n", paths[0], strerror(-err));
        return err;
    }
    err = replay_geometry_from_manifest(PROG, &manifest, paths[0], out);
    guanaco_manifest_free(&manifest);
    return err;
}

/* ---- budgets ---- */

struct sim_budget {
    char text[32];   /* as given, for messages */
    uint64_t bytes;
    double percent;  /* of all expert bytes */
};

/* A budget as N%, Ne (experts per layer) or a size with an optional unit. */
static int parse_budget(const char *text, const struct replay_geometry *geometry, struct sim_budget *out) {
    size_t length = strlen(text);
    double bytes = -1;
    char *end = NULL;
    if (length > 1 && text[length - 1] == '%') {
        errno = 0;
        double percent = strtod(text, &end);
        if (errno == 0 && end == text + length - 1 && isfinite(percent) && percent > 0) {
            bytes = (double)geometry->total_expert_bytes * percent / 100.0;
        }
    } else if (length > 1 && text[length - 1] == 'e' && strspn(text, "0123456789") == length - 1) {
        unsigned long experts = strtoul(text, NULL, 10);
        if (experts == 0 || experts > geometry->n_expert) {
            fprintf(stderr, PROG ": budget \"%s\": experts per layer must be from 1 to %u\n", text,
                    geometry->n_expert);
            return -EINVAL;
        }
        bytes = (double)experts * (double)geometry->one_per_layer_bytes;
    } else {
        static const struct {
            const char *unit;
            double scale;
        } units[] = {{"", 1},          {"B", 1},         {"KB", 1e3},       {"MB", 1e6},
                     {"GB", 1e9},      {"TB", 1e12},     {"KiB", 1024.0},   {"MiB", 1048576.0},
                     {"GiB", GIB},     {"TiB", GIB * 1024.0}};
        errno = 0;
        double value = strtod(text, &end);
        if (errno == 0 && end != text && isfinite(value) && value > 0) {
            for (size_t i = 0; i < COUNT_OF(units); i++) {
                if (strcasecmp(end, units[i].unit) == 0) {
                    bytes = value * units[i].scale;
                }
            }
        }
    }
    if (!(bytes >= 1) || bytes >= 9.2e18) {
        fprintf(stderr,
                PROG ": invalid budget \"%s\": expected N%% of expert bytes (25%%), a size (6GiB, 500MB, 1e9) "
                     "or experts per layer (2e), greater than zero\n",
                text);
        return -EINVAL;
    }
    snprintf(out->text, sizeof(out->text), "%s", text);
    out->bytes = (uint64_t)llround(bytes);
    out->percent = 100.0 * (double)out->bytes / (double)geometry->total_expert_bytes;
    return 0;
}

/* Misses no cache can avoid: the distinct (layer, expert) pairs the trace touches. */
static uint64_t count_compulsory(const struct guanaco_request_trace *trace) {
    size_t n_slots = (size_t)trace->n_layer * trace->n_expert;
    unsigned char *touched = calloc(n_slots, 1);
    if (!touched) {
        return 0;
    }
    uint64_t count = 0;
    for (size_t r = 0; r < trace->n_requests; r++) {
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            size_t slot = (size_t)trace->request_layer[r] * trace->n_expert + trace->experts[i];
            count += !touched[slot];
            touched[slot] = 1;
        }
    }
    free(touched);
    return count;
}

/* ---- replays, a few at a time ---- */

#define SIM_BELADY (-1) /* a job's kind when it is Belady's MIN rather than a policy */

struct sim_job {
    int kind;
    size_t budget;
    struct guanaco_replay_stats stats;
    bool exact;
    bool timed;                           /* pipeline holds the pipeline replay's times */
    struct guanaco_pipeline_stats pipeline;
    int err;
};

struct sim_pool {
    const struct guanaco_request_trace *trace;
    const struct guanaco_request_rows *rows;           /* each request's routed rows: its tokens */
    bool timed;                                        /* the pipeline replay too (a disk speed was given) */
    const struct guanaco_pipeline_config *pipeline;
    const struct sim_budget *budgets;
    uint32_t per_layer_cap;
    double half_life;
    bool preload;
    struct sim_job *jobs;
    size_t n_jobs, next;
    pthread_mutex_t lock;
};

static void run_job(const struct sim_pool *pool, struct sim_job *job) {
    uint64_t budget = pool->budgets[job->budget].bytes;
    if (job->kind == SIM_BELADY) {
        job->err = guanaco_belady(pool->trace, budget, &job->stats, &job->exact);
        return;
    }
    struct guanaco_policy_config config = {
        .kind = (enum guanaco_policy_kind)job->kind,
        .budget_bytes = budget,
        .max_per_layer = pool->per_layer_cap,
        .half_life = pool->half_life,
    };
    job->exact = true;
    job->err = guanaco_simulate(pool->trace, pool->rows, &config, pool->preload, &job->stats);
    if (job->err == 0 && pool->timed) {
        job->err = guanaco_simulate_pipeline(pool->trace, pool->rows, &config, pool->preload, pool->pipeline,
                                             &job->pipeline);
        job->timed = job->err == 0;
    }
}

static void *pool_worker(void *argument) {
    struct sim_pool *pool = argument;
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        size_t j = pool->next < pool->n_jobs ? pool->next++ : pool->n_jobs;
        pthread_mutex_unlock(&pool->lock);
        if (j == pool->n_jobs) {
            return NULL;
        }
        run_job(pool, &pool->jobs[j]);
    }
}

/* Runs every job on up to n_threads threads; the calling thread works too. */
static void run_jobs(struct sim_pool *pool, size_t n_threads) {
    pthread_t threads[63];
    size_t started = 0;
    if (n_threads > pool->n_jobs) n_threads = pool->n_jobs;
    if (n_threads > COUNT_OF(threads) + 1) n_threads = COUNT_OF(threads) + 1;
    for (size_t t = 1; t < n_threads; t++) {
        if (pthread_create(&threads[started], NULL, pool_worker, pool) != 0) {
            break; /* fewer threads only make it slower */
        }
        started++;
    }
    pool_worker(pool);
    for (size_t t = 0; t < started; t++) {
        pthread_join(threads[t], NULL);
    }
}

/* ---- output ---- */

struct sim_row {
    const char *name;
    const struct sim_budget *budget;
    const struct guanaco_replay_stats *stats;
    double hit_percent, megabytes_per_token, gap_points, gap_closed_percent; /* closed: NAN = n/a */
    double tokens_per_second;                                                /* NAN = not asked */
    double overlap_tokens_per_second;                                        /* NAN = not replayed */
    const struct guanaco_pipeline_stats *pipeline;                           /* NULL = not replayed */
};

/* Tokens per second of a phase, serial or overlapped; NAN when the phase has no timed token. */
static double phase_rate(const struct guanaco_pipeline_phase *phase, bool overlapped) {
    double seconds = overlapped ? phase->overlapped_seconds : phase->serial_seconds;
    return phase->tokens && seconds > 0 ? (double)phase->tokens / seconds : NAN;
}

static double hit_percent(const struct guanaco_replay_stats *stats) {
    return stats->accesses ? 100.0 * (double)stats->hits / (double)stats->accesses : 0.0;
}

static struct sim_row make_row(const char *name, const struct sim_budget *budget, const struct sim_job *job,
                               const struct sim_job *belady, const struct sim_job *lru, uint64_t n_tokens,
                               double disk_gbps, double compute_ms) {
    struct sim_row row = {name, budget, &job->stats, hit_percent(&job->stats), 0, 0, NAN, NAN, NAN, NULL};
    row.megabytes_per_token = n_tokens ? (double)job->stats.bytes_read / (double)n_tokens / 1e6 : 0.0;
    double optimum = hit_percent(&belady->stats), baseline = hit_percent(&lru->stats);
    row.gap_points = optimum - row.hit_percent;
    /* compared in hits, not rounded percentages, so "LRU is already optimal" is exact */
    if (belady->stats.hits != lru->stats.hits) {
        row.gap_closed_percent = 100.0 * (row.hit_percent - baseline) / (optimum - baseline);
    }
    if (disk_gbps > 0) {
        double read_ms = row.megabytes_per_token * 1e6 / (disk_gbps * 1e9) * 1000.0;
        row.tokens_per_second = 1000.0 / (compute_ms + read_ms);
    }
    if (job->timed) {
        const struct guanaco_pipeline_stats *p = &job->pipeline;
        double seconds = p->decode.overlapped_seconds + p->prompt.overlapped_seconds;
        uint64_t tokens = p->decode.tokens + p->prompt.tokens;
        row.pipeline = p;
        row.overlap_tokens_per_second = tokens && seconds > 0 ? (double)tokens / seconds : NAN;
    }
    return row;
}

static void print_table_header(bool with_speed) {
    printf("%-10s %8s %8s %8s %10s %10s %10s %9s %9s", "policy", "budget", "GiB", "hit %", "misses",
           "MB/token", "evictions", "gap pts", "closed %");
    if (with_speed) printf(" %9s %13s", "tok/s", "overlap tok/s");
    printf("\n");
}

static void print_table_row(const struct sim_row *row) {
    printf("%-10s %7.2f%% %8.2f %8.2f %10llu %10.1f %10llu %9.2f", row->name, row->budget->percent,
           (double)row->budget->bytes / GIB, row->hit_percent, (unsigned long long)row->stats->misses,
           row->megabytes_per_token, (unsigned long long)row->stats->evictions, row->gap_points);
    if (isnan(row->gap_closed_percent)) {
        printf(" %9s", "n/a");
    } else {
        printf(" %9.1f", row->gap_closed_percent);
    }
    if (!isnan(row->tokens_per_second)) {
        printf(" %9.2f", row->tokens_per_second);
        if (isnan(row->overlap_tokens_per_second)) {
            printf(" %13s", "-");
        } else {
            printf(" %13.2f", row->overlap_tokens_per_second);
        }
    }
    printf("\n");
}

/* Own CSV, not Debian libcsv: every field is a fixed policy name or a number, so nothing ever needs quoting. */
static void print_csv_header(FILE *csv, bool with_speed) {
    fprintf(csv, "policy,budget_percent,budget_bytes,budget_gib,hit_percent,hits,accesses,misses,"
                 "mb_read_per_token,evictions,gap_points,gap_closed_percent%s\n",
            with_speed ? ",tokens_per_second,overlap_tokens_per_second,decode_tokens,decode_serial_tokens_per_second,"
                         "decode_overlap_tokens_per_second,prompt_tokens,prompt_serial_tokens_per_second,"
                         "prompt_overlap_tokens_per_second,read_ahead_mb,read_ahead_used_mb,hidden_mb,"
                         "decode_stall_ms_per_token"
                       : "");
}

static void print_csv_row(FILE *csv, const struct sim_row *row) {
    fprintf(csv, "%s,%.4f,%llu,%.4f,%.4f,%llu,%llu,%llu,%.4f,%llu,%.4f,", row->name, row->budget->percent,
            (unsigned long long)row->budget->bytes, (double)row->budget->bytes / GIB, row->hit_percent,
            (unsigned long long)row->stats->hits, (unsigned long long)row->stats->accesses,
            (unsigned long long)row->stats->misses, row->megabytes_per_token,
            (unsigned long long)row->stats->evictions, row->gap_points);
    if (isnan(row->gap_closed_percent)) {
        fprintf(csv, "n/a");
    } else {
        fprintf(csv, "%.4f", row->gap_closed_percent);
    }
    if (!isnan(row->tokens_per_second)) {
        fprintf(csv, ",%.4f", row->tokens_per_second);
        const struct guanaco_pipeline_stats *p = row->pipeline;
        if (!p) {
            fprintf(csv, ",n/a,n/a,n/a,n/a,n/a,n/a,n/a,n/a,n/a,n/a,n/a");
        } else {
            const struct guanaco_pipeline_phase *phases[2] = {&p->decode, &p->prompt};
            fprintf(csv, ",%.4f", row->overlap_tokens_per_second);
            for (int i = 0; i < 2; i++) {
                fprintf(csv, ",%llu,%.4f,%.4f", (unsigned long long)phases[i]->tokens, phase_rate(phases[i], false),
                        phase_rate(phases[i], true));
            }
            fprintf(csv, ",%.4f,%.4f,%.4f", (double)(p->decode.ahead_bytes + p->prompt.ahead_bytes) / 1e6,
                    (double)(p->decode.ahead_used_bytes + p->prompt.ahead_used_bytes) / 1e6,
                    (p->decode.hidden_bytes + p->prompt.hidden_bytes) / 1e6);
            if (p->decode.tokens) {
                fprintf(csv, ",%.4f", 1000.0 * p->decode.stall_seconds / (double)p->decode.tokens);
            } else {
                fprintf(csv, ",n/a");
            }
        }
    }
    fprintf(csv, "\n");
}

/* The gnuplot executable on PATH, or false when there is none. */
static bool find_gnuplot(char *out, size_t size) {
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t length = strcspn(path, ":");
        if (length > 0 && (size_t)snprintf(out, size, "%.*s/gnuplot", (int)length, path) < size &&
            access(out, X_OK) == 0) {
            return true;
        }
        path += length + (path[length] == ':');
    }
    return false;
}

/* A gnuplot single-quoted string: a quote inside is written twice. */
static void write_gnuplot_string(FILE *script, const char *text) {
    fputc('\'', script);
    for (const char *c = text; *c; c++) {
        if (*c == '\'') fputc('\'', script);
        fputc(*c, script);
    }
    fputc('\'', script);
}

struct sim_curve {
    const char *name;
    const struct sim_job *const *points; /* one job per budget, in budget order */
};

/* Miss ratio against budget, one line per curve, by feeding a script to gnuplot's stdin. */
static int draw_plot(const char *png, const char *title, const struct sim_budget *budgets, size_t n_budgets,
                     const struct sim_curve *curves, size_t n_curves) {
    char gnuplot[4096];
    if (!find_gnuplot(gnuplot, sizeof(gnuplot))) {
        fprintf(stderr, PROG ": gnuplot is not installed (not found on PATH): skipping the plot %s\n", png);
        return 0;
    }
    /* budgets in increasing order, so every line runs left to right */
    size_t order[256];
    size_t n_points = n_budgets < COUNT_OF(order) ? n_budgets : COUNT_OF(order);
    for (size_t i = 0; i < n_points; i++) {
        size_t j = i;
        for (; j > 0 && budgets[order[j - 1]].percent > budgets[i].percent; j--) {
            order[j] = order[j - 1];
        }
        order[j] = i;
    }
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) {
        fprintf(stderr, PROG ": cannot start gnuplot: %s\n", strerror(errno));
        return -errno;
    }
    pid_t child = fork();
    if (child < 0) {
        int err = errno;
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        fprintf(stderr, PROG ": cannot start gnuplot: %s\n", strerror(err));
        return -err;
    }
    if (child == 0) {
        dup2(pipe_fds[0], STDIN_FILENO);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        execl(gnuplot, "gnuplot", (char *)NULL);
        fprintf(stderr, PROG ": cannot run %s: %s\n", gnuplot, strerror(errno));
        _exit(127);
    }
    close(pipe_fds[0]);
    FILE *script = fdopen(pipe_fds[1], "w");
    if (!script) {
        close(pipe_fds[1]);
    } else {
        /* pngcairo draws smoother lines; plain png (libgd) is the fallback some builds have */
        fprintf(script, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                        "    set terminal pngcairo size 960,600 noenhanced\n"
                        "} else {\n"
                        "    set terminal png size 960,600 noenhanced\n"
                        "}\n");
        fprintf(script, "set output ");
        write_gnuplot_string(script, png);
        fprintf(script, "\nset title ");
        write_gnuplot_string(script, title);
        fprintf(script, "\nset xlabel 'RAM budget (%% of expert bytes)'\n"
                        "set ylabel 'miss ratio (1 - hit rate)'\n"
                        "set yrange [0:*]\nset xrange [0:*]\nset grid\nset key top right\n");
        for (size_t c = 0; c < n_curves; c++) {
            fprintf(script, "$curve%zu << EOD\n", c);
            for (size_t i = 0; i < n_points; i++) {
                const struct guanaco_replay_stats *stats = &curves[c].points[order[i]]->stats;
                double miss = stats->accesses ? (double)stats->misses / (double)stats->accesses : 0.0;
                fprintf(script, "%.6f %.6f\n", budgets[order[i]].percent, miss);
            }
            fprintf(script, "EOD\n");
        }
        fprintf(script, "plot ");
        for (size_t c = 0; c < n_curves; c++) {
            /* fixed, distinct colours: gnuplot's default cycle puts a pale yellow fourth */
            static const char *const colours[] = {"#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};
            fprintf(script, "%s$curve%zu using 1:2 with linespoints lw 2 pt 7 lc rgb '%s' %stitle ", c ? ", " : "",
                    c, colours[c % COUNT_OF(colours)], c == 0 ? "dashtype 2 " : "");
            write_gnuplot_string(script, curves[c].name);
        }
        fprintf(script, "\nset output\n");
        fclose(script); /* a write error shows as gnuplot's failure below */
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    struct stat st;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || stat(png, &st) != 0 || st.st_size == 0) {
        fprintf(stderr, PROG ": gnuplot failed to draw %s (exit status %d)\n", png,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -EIO;
    }
    return 0;
}

/* ---- the pipeline ---- */

/* One line per phase that has timed tokens. */
static void print_pipeline_row(const struct sim_row *row) {
    const struct guanaco_pipeline_phase *phases[2] = {&row->pipeline->decode, &row->pipeline->prompt};
    static const char *const names[2] = {"decode", "prompt"};
    for (int i = 0; i < 2; i++) {
        const struct guanaco_pipeline_phase *ph = phases[i];
        if (ph->tokens == 0) continue;
        double per_pass = (double)ph->passes;
        double needed = (double)(ph->demand_bytes + ph->ahead_used_bytes);
        printf("%-10s %7.2f%% %-7s %7llu %8llu %12.2f %13.2f %15.1f %13.1f %14.1f %13.1f %8.1f %14.1f %12.1f %11.1f "
               "%8llu\n",
               row->name, row->budget->percent, names[i], (unsigned long long)ph->passes,
               (unsigned long long)ph->tokens, phase_rate(ph, false), phase_rate(ph, true),
               1000.0 * ph->compute_seconds / per_pass, 1000.0 * ph->stall_seconds / per_pass,
               (double)ph->demand_bytes / 1e6 / per_pass, (double)ph->ahead_bytes / 1e6 / per_pass,
               needed > 0 ? 100.0 * ph->hidden_bytes / needed : 0.0, 1000.0 * ph->kernel_seconds / per_pass,
               1000.0 * ph->drop_seconds / per_pass, 1000.0 * ph->map_seconds / per_pass,
               (unsigned long long)ph->streamed_passes);
    }
}

/* The share of all expert bytes that page-cache loading maps in 4 KiB pages. */
static double small_page_share_of(const struct replay_geometry *geometry) {
    if (!geometry->small_page_share) {
        return 1.0;
    }
    double small = 0;
    for (uint32_t l = 0; l < geometry->n_layer; l++) {
        small += geometry->small_page_share[l] * (double)geometry->expert_bytes[l] * geometry->n_expert;
    }
    return small / (double)geometry->total_expert_bytes;
}

static void print_pipeline_header(const struct guanaco_pipeline_config *config, const struct replay_geometry *geometry,
                                  unsigned long warmup, bool ubatches) {
    uint32_t n_moe_layers = geometry->n_moe_layers;
    printf("\npipeline: reads overlapped with compute, per MoE layer time = compute + the reads it still waits for "
           "(offline/simulate.h);\n");
    if (config->predictor == GUANACO_PREDICTOR_NONE) {
        printf("          nothing read ahead (no --predictor, as --guanaco-prefetch none): overlapped = serial\n");
    } else {
        printf("          read ahead by %s (mass %g), prompts (3/4 of a layer's experts) the whole next layer\n",
               guanaco_predictor_kind_name(config->predictor),
               config->pilot_mass > 0 ? config->pilot_mass : GUANACO_PILOT_DEFAULT_MASS);
        const char *caveat = guanaco_simulate_predictor_caveat(config->predictor);
        if (caveat) {
            printf("          %s %s\n", guanaco_predictor_kind_name(config->predictor), caveat);
        }
    }
    printf("          disk %.3g GB/s; compute %.4g ms per decode token (%.4g ms per MoE layer), %.4g ms per prompt "
           "token; %s; %lu warmup pass%s per sequence not timed\n",
           config->bytes_per_second / 1e9, config->token_seconds * 1e3, config->token_seconds * 1e3 / n_moe_layers,
           config->prompt_token_seconds * 1e3, ubatches ? "ubatches as recorded" : "one token per pass", warmup,
           warmup == 1 ? "" : "es");
    printf("          prompt disk %.3g GB/s; streamed prompts %s; layers compute while their reads land: %s; kernel CPU per GB in 4 KiB folios: read %.3g s "
           "(over %u core%s), drop %.3g s\n",
           (config->prompt_bytes_per_second > 0 ? config->prompt_bytes_per_second : config->bytes_per_second) / 1e9,
           config->stream_prompts ? "on" : "off", config->overlap_layer ? "on" : "off",
           config->read_cpu_seconds_per_byte * 1e9,
           config->cpu_cores ? config->cpu_cores : 1, config->cpu_cores > 1 ? "s" : "",
           config->drop_cpu_seconds_per_byte * 1e9);
    if (config->load_direct) {
        printf("          direct loading: copies (no 4 KiB folios) placed at %.3g CPU-s per GB after their reads, "
               "evicted at once at %.3g CPU-s per GB; the reads cost %.3g CPU-s per GB of compute's cores\n",
               config->map_cpu_seconds_per_byte * 1e9, config->evict_cpu_seconds_per_byte * 1e9,
               config->direct_read_cpu_seconds_per_byte * 1e9);
    } else if (config->first_touch_seconds_per_byte > 0) {
        printf("          page-cache loading: compute's first read of the pages it mapped costs %.3g s per GB, for the "
               "bytes outside the slices' 2 MiB-aligned middles: %.1f%% of the expert bytes%s\n",
               config->first_touch_seconds_per_byte * 1e9, 100 * small_page_share_of(geometry),
               geometry->small_page_share ? "" : " (a named shape: no file offsets, all of them)");
    }
    printf("%-10s %8s %-7s %7s %8s %12s %13s %15s %13s %14s %13s %8s %14s %12s %11s %8s\n", "policy", "budget",
           "phase", "passes", "tokens", "serial tok/s", "overlap tok/s", "compute ms/pass", "stall ms/pass",
           "demand MB/pass", "ahead MB/pass", "hidden %", "kernel ms/pass", "drop ms/pass", "map ms/pass", "streamed");
}

/* ---- expert prediction ---- */

#define MAX_PILOT_MASSES 32

/* What one predictor replay got right; per_layer_* are indexed by the layer the guess was made from. */
struct sim_prediction {
    uint64_t guesses;   /* predict calls whose next MoE layer the trace then routes for the same token */
    uint64_t guessed;   /* experts guessed, over those calls */
    uint64_t routed;    /* experts the next layer then routed to */
    uint64_t hits;      /* guessed and routed */
    uint64_t *per_layer_routed, *per_layer_hits, *per_layer_guessed, *per_layer_guesses;
};

static void prediction_free(struct sim_prediction *prediction) {
    free(prediction->per_layer_routed);
    free(prediction->per_layer_hits);
    free(prediction->per_layer_guessed);
    free(prediction->per_layer_guesses);
}

/*
 * Replays the requests through a fresh predictor, one token at a time as
 * decode runs: at each MoE layer, first learn the transition from the
 * token's previous MoE layer, then guess the next MoE layer from this one,
 * and score the guess against what that layer routes next. Learning before
 * guessing is the engine's order, so no guess ever sees the routing it is
 * scored on. 0, or a negative errno after a message.
 */
static int replay_prediction(const struct replay_geometry *geometry, const struct replay_requests *requests,
                             enum guanaco_predictor_kind kind, double mass, double half_life,
                             struct sim_prediction *result) {
    uint32_t n_layer = geometry->n_layer, n_expert = geometry->n_expert, k = geometry->top_k;
    memset(result, 0, sizeof(*result));
    uint8_t *moe_layer = malloc(n_layer);
    uint32_t *guess = malloc(n_expert * sizeof(*guess));
    uint8_t *guessed = calloc(n_expert, 1);
    result->per_layer_routed = calloc(n_layer, sizeof(uint64_t));
    result->per_layer_hits = calloc(n_layer, sizeof(uint64_t));
    result->per_layer_guessed = calloc(n_layer, sizeof(uint64_t));
    result->per_layer_guesses = calloc(n_layer, sizeof(uint64_t));
    struct guanaco_predictor *predictor = NULL;
    int err = -ENOMEM;
    if (!moe_layer || !guess || !guessed || !result->per_layer_routed || !result->per_layer_hits ||
        !result->per_layer_guessed || !result->per_layer_guesses) {
        fprintf(stderr, PROG ": out of memory for the predictor replay\n");
        goto done;
    }
    for (uint32_t l = 0; l < n_layer; l++) {
        moe_layer[l] = geometry->expert_bytes[l] > 0;
    }
    struct guanaco_predictor_config config = {.kind = kind, .n_layer = n_layer, .n_expert = n_expert, .top_k = k,
                                              .moe_layer = moe_layer, .mass = mass, .half_life = half_life};
    err = guanaco_predictor_create(&config, &predictor);
    if (err != 0) {
        fprintf(stderr, PROG ": cannot create the %s predictor for %s: %s\n", guanaco_predictor_kind_name(kind),
                geometry->description, strerror(-err));
        goto done;
    }
    for (size_t r = 0; r < requests->n_requests; r++) {
        /* the request's routed rows: one for a token, all of a ubatch's with --ubatches */
        const int32_t *current = requests->row_ids + requests->row_start[r] * k;
        uint32_t n_rows = (uint32_t)(requests->row_start[r + 1] - requests->row_start[r]);
        uint32_t layer = requests->layer[r];
        if (r > 0 && requests->token[r - 1] == requests->token[r] &&
            requests->row_start[r] - requests->row_start[r - 1] == n_rows) {
            const int32_t *previous = requests->row_ids + requests->row_start[r - 1] * k;
            err = guanaco_predictor_observe(predictor, requests->layer[r - 1], previous, layer, current, k, n_rows);
            if (err != 0) {
                fprintf(stderr, PROG ": the predictor refused layers %u -> %u: %s\n", requests->layer[r - 1], layer,
                        strerror(-err));
                goto done;
            }
        }
        size_t n_guess = guanaco_predictor_predict(predictor, layer, current, k, n_rows, guess, n_expert);
        uint32_t next = guanaco_predictor_next_layer(predictor, layer);
        if (r + 1 < requests->n_requests && requests->token[r + 1] == requests->token[r] &&
            requests->layer[r + 1] == next) {
            for (size_t i = 0; i < n_guess; i++) guessed[guess[i]] = 1;
            uint64_t hits = 0, routed = requests->start[r + 2] - requests->start[r + 1];
            for (size_t i = requests->start[r + 1]; i < requests->start[r + 2]; i++) {
                hits += guessed[requests->experts[i]];
            }
            for (size_t i = 0; i < n_guess; i++) guessed[guess[i]] = 0;
            result->guesses++;
            result->guessed += n_guess;
            result->routed += routed;
            result->hits += hits;
            result->per_layer_guesses[layer]++;
            result->per_layer_guessed[layer] += n_guess;
            result->per_layer_routed[layer] += routed;
            result->per_layer_hits[layer] += hits;
        }
    }
    err = 0;
done:
    guanaco_predictor_free(predictor);
    free(moe_layer);
    free(guess);
    free(guessed);
    if (err != 0) {
        prediction_free(result);
    }
    return err;
}

static double ratio(uint64_t part, uint64_t whole) {
    return whole ? (double)part / (double)whole : 0.0;
}

/* Replays every mass (one for none) and prints a line each; 0, or a negative errno after a message. */
static int report_prediction(const struct replay_geometry *geometry, const struct replay_requests *requests,
                             enum guanaco_predictor_kind kind, const double *masses, size_t n_masses,
                             double half_life, bool verbose) {
    printf("\npredictor: each MoE layer's routing guesses the next MoE layer's, token by token in the engine's "
           "order (learn the previous transition, then guess)\n");
    printf("%-10s %6s %10s %8s %9s %10s %10s\n", "predictor", "mass", "half-life", "recall", "set size",
           "precision", "guesses");
    double effective_half_life = half_life > 0 ? half_life : GUANACO_PILOT_DEFAULT_HALF_LIFE;
    for (size_t m = 0; m < n_masses; m++) {
        struct sim_prediction result;
        int err = replay_prediction(geometry, requests, kind, masses[m], half_life, &result);
        if (err != 0) {
            return err;
        }
        if (kind == GUANACO_PREDICTOR_PILOT) {
            printf("%-10s %6.3f %10g", guanaco_predictor_kind_name(kind), masses[m], effective_half_life);
        } else {
            printf("%-10s %6s %10s", guanaco_predictor_kind_name(kind), "-", "-");
        }
        printf(" %8.4f %9.2f %10.4f %10llu\n", ratio(result.hits, result.routed),
               ratio(result.guessed, result.guesses), ratio(result.hits, result.guessed),
               (unsigned long long)result.guesses);
        for (uint32_t l = 0; verbose && l < geometry->n_layer; l++) {
            if (result.per_layer_guesses[l] == 0) continue;
            uint32_t next = l + 1;
            while (next < geometry->n_layer && geometry->expert_bytes[next] == 0) next++;
            printf("  layer %3u -> %3u   recall %.4f  set size %6.2f  precision %.4f\n", l, next, ratio(result.per_layer_hits[l], result.per_layer_routed[l]),
                   ratio(result.per_layer_guessed[l], result.per_layer_guesses[l]),
                   ratio(result.per_layer_hits[l], result.per_layer_guessed[l]));
        }
        prediction_free(&result);
    }
    printf("recall = guessed and routed / routed; set size = experts guessed per token and layer; precision = "
           "guessed and routed / guessed\n");
    return 0;
}

/* ---- command line ---- */

struct sim_options {
    const char **traces;
    size_t n_traces;
    const char **models;
    size_t n_models;
    const char *shape, *quant, *budgets, *policies, *csv, *plot;
    uint32_t per_layer_cap;
    double half_life;
    bool preload;
    double disk_gbps, compute_ms;
    bool have_disk_gbps, have_compute_ms;
    unsigned long threads;
    const char *predictor, *pilot_masses;
    double pilot_half_life;
    bool verbose;
    bool ubatches;
    unsigned long warmup;
    double prompt_compute_ms;
    bool have_prompt_compute_ms;
    double prompt_disk_gbps;                 /* 0 = --disk-gbps */
    const char *stream_prompts;              /* on|off; NULL = on, the engine's default */
    const char *overlap_layer;               /* on|off; NULL = off, page-cache loading's default (direct's is on) */
    double read_cpu_s_per_gb, drop_cpu_s_per_gb;
    unsigned long cpu_cores;
    const char *load;                        /* direct|page-cache; NULL = page-cache */
    double map_cpu_s_per_gb, evict_cpu_s_per_gb; /* direct loading's CPU per GB placed and evicted */
    double direct_read_cpu_s_per_gb;             /* direct loading's CPU per GB read with O_DIRECT */
    double first_touch_cpu_s_per_gb;             /* page-cache loading: compute's first read of its 4 KiB pages */
};

static int parse_positive(const char *flag, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) || value <= 0) {
        fprintf(stderr, PROG ": %s needs a number greater than zero, not \"%s\"\n", flag, text);
        return -EINVAL;
    }
    *out = value;
    return 0;
}

/* A flag that takes one of two words: *out = text, or a message and -EINVAL. */
static int parse_choice(const char *flag, const char *text, const char *first, const char *second, const char **out) {
    if (strcmp(text, first) != 0 && strcmp(text, second) != 0) {
        fprintf(stderr, PROG ": %s takes %s or %s, not \"%s\"\n", flag, first, second, text);
        return -EINVAL;
    }
    *out = text;
    return 0;
}

static int parse_whole(const char *flag, const char *text, unsigned long max, unsigned long *out) {
    return guanaco_cli_parse_whole(PROG, flag, text, max, out);
}

/* 0 on success, 2 for a usage error (after its message), -1 when --help was printed. */
static int parse_options(int argc, char **argv, struct sim_options *options) {
    options->traces = calloc((size_t)argc, sizeof(*options->traces));
    options->models = calloc((size_t)argc, sizeof(*options->models));
    if (!options->traces || !options->models) {
        fprintf(stderr, PROG ": out of memory\n");
        return 2;
    }
    static const char *const with_value[] = {"--trace",   "--shape",   "--quant",         "--model",
                                             "--budgets", "--policies", "--per-layer-cap", "--csv",
                                             "--plot",    "--disk-gbps", "--compute-ms",   "--threads",
                                             "--half-life", "--predictor", "--pilot-mass", "--pilot-half-life",
                                             "--warmup", "--prompt-compute-ms", "--prompt-disk-gbps",
                                             "--stream-prompts", "--overlap-layer", "--read-cpu-s-per-gb", "--drop-cpu-s-per-gb",
                                             "--cpu-cores", "--load", "--map-cpu-s-per-gb", "--evict-cpu-s-per-gb",
                                             "--direct-read-cpu-s-per-gb", "--first-touch-cpu-s-per-gb"};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            print_usage(stdout);
            return -1;
        }
        if (strcmp(arg, "--preload") == 0) {
            options->preload = true;
            continue;
        }
        if (strcmp(arg, "--verbose") == 0) {
            options->verbose = true;
            continue;
        }
        if (strcmp(arg, "--ubatches") == 0) {
            options->ubatches = true;
            continue;
        }
        const char *value = NULL;
        int taken = guanaco_cli_flag_value(PROG, argc, argv, &i, with_value, COUNT_OF(with_value), &value);
        if (taken != 0) {
            if (taken == -ENOENT) print_usage(stderr);
            return 2;
        }
        unsigned long whole = 0;
        if (strcmp(arg, "--trace") == 0) {
            options->traces[options->n_traces++] = value;
        } else if (strcmp(arg, "--model") == 0) {
            options->models[options->n_models++] = value;
        } else if (strcmp(arg, "--shape") == 0) {
            options->shape = value;
        } else if (strcmp(arg, "--quant") == 0) {
            options->quant = value;
        } else if (strcmp(arg, "--budgets") == 0) {
            options->budgets = value;
        } else if (strcmp(arg, "--policies") == 0) {
            options->policies = value;
        } else if (strcmp(arg, "--csv") == 0) {
            options->csv = value;
        } else if (strcmp(arg, "--plot") == 0) {
            options->plot = value;
        } else if (strcmp(arg, "--per-layer-cap") == 0) {
            if (parse_whole(arg, value, GUANACO_TRACE_MAX_EXPERTS, &whole) != 0) return 2;
            options->per_layer_cap = (uint32_t)whole;
        } else if (strcmp(arg, "--half-life") == 0) {
            if (parse_positive(arg, value, &options->half_life) != 0) return 2;
        } else if (strcmp(arg, "--predictor") == 0) {
            options->predictor = value;
        } else if (strcmp(arg, "--pilot-mass") == 0) {
            options->pilot_masses = value;
        } else if (strcmp(arg, "--pilot-half-life") == 0) {
            if (parse_positive(arg, value, &options->pilot_half_life) != 0) return 2;
        } else if (strcmp(arg, "--threads") == 0) {
            if (parse_whole(arg, value, 64, &whole) != 0) return 2;
            options->threads = whole;
        } else if (strcmp(arg, "--disk-gbps") == 0) {
            if (parse_positive(arg, value, &options->disk_gbps) != 0) return 2;
            options->have_disk_gbps = true;
        } else if (strcmp(arg, "--warmup") == 0) {
            if (parse_whole(arg, value, 1u << 20, &options->warmup) != 0) return 2;
        } else if (strcmp(arg, "--prompt-compute-ms") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->prompt_compute_ms) != 0) return 2;
            options->have_prompt_compute_ms = true;
        } else if (strcmp(arg, "--prompt-disk-gbps") == 0) {
            if (parse_positive(arg, value, &options->prompt_disk_gbps) != 0) return 2;
        } else if (strcmp(arg, "--stream-prompts") == 0) {
            if (parse_choice(arg, value, "on", "off", &options->stream_prompts) != 0) return 2;
        } else if (strcmp(arg, "--overlap-layer") == 0) {
            if (parse_choice(arg, value, "on", "off", &options->overlap_layer) != 0) return 2;
        } else if (strcmp(arg, "--load") == 0) {
            if (parse_choice(arg, value, "direct", "page-cache", &options->load) != 0) return 2;
        } else if (strcmp(arg, "--map-cpu-s-per-gb") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->map_cpu_s_per_gb) != 0) return 2;
        } else if (strcmp(arg, "--evict-cpu-s-per-gb") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->evict_cpu_s_per_gb) != 0) return 2;
        } else if (strcmp(arg, "--direct-read-cpu-s-per-gb") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->direct_read_cpu_s_per_gb) != 0)
                return 2;
        } else if (strcmp(arg, "--first-touch-cpu-s-per-gb") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->first_touch_cpu_s_per_gb) != 0)
                return 2;
        } else if (strcmp(arg, "--read-cpu-s-per-gb") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->read_cpu_s_per_gb) != 0) return 2;
        } else if (strcmp(arg, "--drop-cpu-s-per-gb") == 0) {
            if (guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &options->drop_cpu_s_per_gb) != 0) return 2;
        } else if (strcmp(arg, "--cpu-cores") == 0) {
            if (parse_whole(arg, value, 4096, &whole) != 0) return 2;
            if (whole == 0) {
                fprintf(stderr, PROG ": --cpu-cores needs at least 1\n");
                return 2;
            }
            options->cpu_cores = whole;
        } else if (strcmp(arg, "--compute-ms") == 0) {
            char *end = NULL;
            errno = 0;
            options->compute_ms = strtod(value, &end);
            if (errno != 0 || end == value || *end != '\0' || !isfinite(options->compute_ms) ||
                options->compute_ms < 0) {
                fprintf(stderr, PROG ": --compute-ms needs a number of milliseconds, 0 or more, not \"%s\"\n",
                        value);
                return 2;
            }
            options->have_compute_ms = true;
        }
    }
    if (options->n_traces == 0) {
        fprintf(stderr, PROG ": no --trace given\n");
        print_usage(stderr);
        return 2;
    }
    if ((options->shape != NULL) == (options->n_models > 0)) {
        fprintf(stderr, PROG ": give exactly one of --shape NAME or --model MODEL.gguf for the expert sizes\n");
        return 2;
    }
    if (options->quant && !options->shape) {
        fprintf(stderr, PROG ": --quant applies to --shape only; --model reads the sizes from the GGUF\n");
        return 2;
    }
    enum guanaco_predictor_kind kind = GUANACO_PREDICTOR_NONE;
    if (options->predictor) {
        if (guanaco_predictor_kind_from_name(options->predictor, &kind) != 0) {
            fprintf(stderr, PROG ": unknown --predictor \"%s\": expected %s\n", options->predictor,
                    guanaco_predictor_kind_names());
            return 2;
        }
    }
    if ((options->pilot_masses || options->pilot_half_life > 0) &&
        kind != GUANACO_PREDICTOR_PILOT) {
        fprintf(stderr, PROG ": --pilot-mass and --pilot-half-life apply to --predictor pilot only\n");
        return 2;
    }
    if (options->verbose && !options->predictor) {
        fprintf(stderr, PROG ": --verbose applies to --predictor only\n");
        return 2;
    }
    if (options->have_disk_gbps != options->have_compute_ms) {
        fprintf(stderr, PROG ": --disk-gbps and --compute-ms go together: predicted tokens/s needs both\n");
        return 2;
    }
    if ((options->have_prompt_compute_ms || options->warmup || options->prompt_disk_gbps > 0 ||
         options->read_cpu_s_per_gb > 0 || options->drop_cpu_s_per_gb > 0 || options->cpu_cores || options->load ||
         options->map_cpu_s_per_gb > 0 || options->evict_cpu_s_per_gb > 0 || options->direct_read_cpu_s_per_gb > 0 ||
         options->first_touch_cpu_s_per_gb > 0) &&
        !options->have_disk_gbps) {
        fprintf(stderr, PROG ": --prompt-compute-ms, --prompt-disk-gbps, --warmup, --read-cpu-s-per-gb, "
                        "--drop-cpu-s-per-gb, --cpu-cores, --load, --map-cpu-s-per-gb, --evict-cpu-s-per-gb and "
                        "--direct-read-cpu-s-per-gb and --first-touch-cpu-s-per-gb time the replay: they need --disk-gbps and "
                        "--compute-ms\n");
        return 2;
    }
    if ((options->map_cpu_s_per_gb > 0 || options->evict_cpu_s_per_gb > 0 || options->direct_read_cpu_s_per_gb > 0) &&
        !(options->load && strcmp(options->load, "direct") == 0)) {
        fprintf(stderr, PROG ": --map-cpu-s-per-gb, --evict-cpu-s-per-gb and --direct-read-cpu-s-per-gb are direct "
                        "loading's costs: they need --load direct\n");
        return 2;
    }
    if (options->first_touch_cpu_s_per_gb > 0 && options->load && strcmp(options->load, "direct") == 0) {
        fprintf(stderr, PROG ": --first-touch-cpu-s-per-gb is page-cache loading's cost; direct loading's slots never "
                        "change page tables\n");
        return 2;
    }
    return 0;
}

/* Splits a comma-separated list in place; every item must be non-empty. */
static int split_list(char *text, const char *flag, char **items, size_t capacity, size_t *n_items) {
    *n_items = 0;
    char *save = NULL;
    size_t length = strlen(text);
    if (length == 0 || text[0] == ',' || text[length - 1] == ',' || strstr(text, ",,")) {
        fprintf(stderr, PROG ": %s has an empty item: \"%s\"\n", flag, text);
        return -EINVAL;
    }
    for (char *item = strtok_r(text, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (*n_items == capacity) {
            fprintf(stderr, PROG ": %s lists more than %zu items\n", flag, capacity);
            return -EINVAL;
        }
        items[(*n_items)++] = item;
    }
    return 0;
}

static double seconds_since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) * 1e-9;
}

#define MAX_BUDGETS 256
#define N_KINDS 4

/* ---- the run, one step per function; main calls them in order ---- */

/* What the command line resolves to before any trace is read: the expert sizes, the budgets, the policies
 * and the predictor, each checked. */
struct sim_setup {
    struct replay_geometry geometry;
    struct sim_budget *budgets;
    size_t n_budgets;
    enum guanaco_policy_kind kinds[N_KINDS]; /* as listed, each once */
    size_t n_kinds;
    enum guanaco_predictor_kind predictor;
    double pilot_masses[MAX_PILOT_MASSES];
    size_t n_pilot_masses;
};

static void setup_free(struct sim_setup *setup) {
    free(setup->geometry.expert_bytes);
    free(setup->geometry.small_page_share);
    free(setup->budgets);
}

/* --budgets, each checked against the geometry; 0, or the exit status after a message. */
static int parse_budgets(const char *list, struct sim_setup *setup) {
    char *text = strdup(list);
    setup->budgets = calloc(MAX_BUDGETS, sizeof(*setup->budgets));
    if (!text || !setup->budgets) {
        free(text);
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    char *items[MAX_BUDGETS];
    int status = split_list(text, "--budgets", items, MAX_BUDGETS, &setup->n_budgets) != 0 ? 2 : 0;
    for (size_t b = 0; status == 0 && b < setup->n_budgets; b++) {
        if (parse_budget(items[b], &setup->geometry, &setup->budgets[b]) != 0) {
            status = 2;
        }
    }
    free(text);
    return status;
}

/* --policies: the kinds in the order listed, each once, "all" for every kind; 0, or the exit status after a
 * message. */
static int parse_policies(const char *list, struct sim_setup *setup) {
    char *text = strdup(list);
    if (!text) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    char *items[MAX_BUDGETS];
    size_t n_items = 0;
    int status = split_list(text, "--policies", items, MAX_BUDGETS, &n_items) != 0 ? 2 : 0;
    for (size_t p = 0; status == 0 && p < n_items; p++) {
        enum guanaco_policy_kind kind = GUANACO_POLICY_LRU;
        bool all = strcmp(items[p], "all") == 0;
        if (!all && guanaco_policy_kind_from_name(items[p], &kind) != 0) {
            fprintf(stderr, PROG ": unknown policy \"%s\" in --policies: expected %s or all%s\n", items[p],
                    guanaco_policy_kind_names(),
                    strcmp(items[p], "belady") == 0 ? " (belady is always replayed)" : "");
            status = 2;
            break;
        }
        for (int k = 0; k < N_KINDS; k++) {
            if (!all && k != (int)kind) continue;
            bool listed = false;
            for (size_t i = 0; i < setup->n_kinds; i++) {
                listed = listed || setup->kinds[i] == (enum guanaco_policy_kind)k;
            }
            if (!listed) setup->kinds[setup->n_kinds++] = (enum guanaco_policy_kind)k;
        }
    }
    free(text);
    return status;
}

/* --predictor (its name was checked with the options) and --pilot-mass; 0, or 2 after a message. */
static int parse_predictor(const struct sim_options *options, struct sim_setup *setup) {
    setup->predictor = GUANACO_PREDICTOR_NONE;
    setup->pilot_masses[0] = GUANACO_PILOT_DEFAULT_MASS;
    setup->n_pilot_masses = 1;
    if (options->predictor) {
        guanaco_predictor_kind_from_name(options->predictor, &setup->predictor);
    }
    if (!options->pilot_masses) {
        return 0;
    }
    char *text = strdup(options->pilot_masses);
    char *items[MAX_PILOT_MASSES];
    int err = text ? split_list(text, "--pilot-mass", items, MAX_PILOT_MASSES, &setup->n_pilot_masses) : -ENOMEM;
    for (size_t m = 0; err == 0 && m < setup->n_pilot_masses; m++) {
        err = guanaco_cli_parse_real(PROG, "--pilot-mass", items[m], 0, 1, true, &setup->pilot_masses[m]);
    }
    free(text);
    return err != 0 ? 2 : 0;
}

/* The geometry, then the budgets, policies and predictor, all before the (possibly long) trace loading; 0, or
 * the exit status after a message. */
static int resolve_setup(const struct sim_options *options, struct sim_setup *setup) {
    int err = options->shape
                  ? geometry_from_shape(options->shape, options->quant ? options->quant : "Q4_0", &setup->geometry)
                  : geometry_from_model(options->models, options->n_models, &setup->geometry);
    if (err != 0) {
        return err == -EINVAL && options->shape ? 2 : 1;
    }
    int status = parse_budgets(options->budgets ? options->budgets : DEFAULT_BUDGETS, setup);
    if (status == 0) {
        status = parse_policies(options->policies ? options->policies : "all", setup);
    }
    if (status == 0) {
        status = parse_predictor(options, setup);
    }
    return status;
}

/* Loads each trace, checks it against the geometry, appends its requests and lets it go; `sources` names the
 * traces for the output. 0, or a negative errno after a message. */
static int load_traces(const struct sim_options *options, const struct replay_geometry *geometry,
                       struct replay_requests *requests, char *sources, size_t size) {
    requests->start = calloc(1, sizeof(*requests->start));
    if (!requests->start) {
        fprintf(stderr, PROG ": out of memory\n");
        return -ENOMEM;
    }
    sources[0] = '\0';
    for (size_t t = 0; t < options->n_traces; t++) {
        char source[256];
        int err = replay_add_trace_file(PROG, options->traces[t], geometry, requests, source, sizeof(source),
                                        options->ubatches);
        if (err != 0) {
            return err;
        }
        size_t used = strlen(sources);
        snprintf(sources + used, size - used, "%s%s", t ? " + " : "", source);
    }
    if (requests->n_requests == 0) {
        fprintf(stderr, PROG ": the traces hold no routing decisions: nothing to replay\n");
        return -ENODATA;
    }
    return 0;
}

static void print_inputs(const struct sim_options *options, const char *sources, const struct replay_requests *requests,
                         const struct replay_geometry *geometry, uint64_t compulsory) {
    printf("traces       %zu (%s): %llu sequences, %llu tokens, %zu records, %zu expert accesses\n",
           options->n_traces, sources, (unsigned long long)requests->n_sequences,
           (unsigned long long)requests->n_tokens, requests->n_records, requests->start[requests->n_requests]);
    printf("model        %s: %u MoE layers of %u, %u experts each, top-%u; %.2f GiB of experts\n",
           geometry->description, geometry->n_moe_layers, geometry->n_layer, geometry->n_expert, geometry->top_k,
           (double)geometry->total_expert_bytes / GIB);
    printf("compulsory   %llu misses (distinct (layer, expert) pairs touched)\n", (unsigned long long)compulsory);
}

/* The replays of every budget: belady, the listed kinds, then lru when it is not listed, because lru is the
 * baseline of "gap closed". */
struct sim_replays {
    struct sim_job *jobs; /* budget b's are jobs[b * per_budget ...] */
    size_t n_jobs, per_budget;
};

/* The jobs of every replay, none run yet; 0, or -ENOMEM after a message. */
static int make_jobs(const struct sim_setup *setup, struct sim_replays *replays) {
    bool lru_listed = false;
    for (size_t i = 0; i < setup->n_kinds; i++) lru_listed = lru_listed || setup->kinds[i] == GUANACO_POLICY_LRU;
    replays->per_budget = setup->n_kinds + 1 + !lru_listed;
    replays->n_jobs = replays->per_budget * setup->n_budgets;
    replays->jobs = calloc(replays->n_jobs, sizeof(*replays->jobs));
    if (!replays->jobs) {
        fprintf(stderr, PROG ": out of memory\n");
        return -ENOMEM;
    }
    for (size_t b = 0; b < setup->n_budgets; b++) {
        struct sim_job *row = &replays->jobs[b * replays->per_budget];
        row[0].kind = SIM_BELADY;
        for (size_t i = 0; i < setup->n_kinds; i++) row[1 + i].kind = (int)setup->kinds[i];
        if (!lru_listed) row[1 + setup->n_kinds].kind = GUANACO_POLICY_LRU;
        for (size_t j = 0; j < replays->per_budget; j++) row[j].budget = b;
    }
    return 0;
}

/* The pipeline replay's timing: with the speeds, each policy job times the replay too. */
static struct guanaco_pipeline_config pipeline_config(const struct sim_options *options,
                                                      const struct sim_setup *setup) {
    return (struct guanaco_pipeline_config){
        .predictor = setup->predictor,
        .pilot_mass = options->pilot_masses ? setup->pilot_masses[0] : 0,
        .pilot_half_life = options->pilot_half_life,
        .bytes_per_second = options->disk_gbps * 1e9,
        .token_seconds = options->compute_ms / 1e3,
        .prompt_token_seconds =
            (options->have_prompt_compute_ms ? options->prompt_compute_ms : options->compute_ms) / 1e3,
        .prompt_bytes_per_second = options->prompt_disk_gbps * 1e9,
        .stream_prompts = !options->stream_prompts || strcmp(options->stream_prompts, "on") == 0,
        .overlap_layer = options->overlap_layer && strcmp(options->overlap_layer, "on") == 0,
        .read_cpu_seconds_per_byte = options->read_cpu_s_per_gb / 1e9,
        .drop_cpu_seconds_per_byte = options->drop_cpu_s_per_gb / 1e9,
        .cpu_cores = (uint32_t)options->cpu_cores,
        .load_direct = options->load && strcmp(options->load, "direct") == 0,
        .map_cpu_seconds_per_byte = options->map_cpu_s_per_gb / 1e9,
        .evict_cpu_seconds_per_byte = options->evict_cpu_s_per_gb / 1e9,
        .direct_read_cpu_seconds_per_byte = options->direct_read_cpu_s_per_gb / 1e9,
        .first_touch_seconds_per_byte = options->first_touch_cpu_s_per_gb / 1e9,
        .small_page_share = setup->geometry.small_page_share,
    };
}

/* Which requests are timed: a warmup pass is replayed, not timed (the first `warmup` passes of each sequence).
 * NULL after a message when out of memory. */
static uint8_t *timed_requests(const struct replay_requests *requests, unsigned long warmup) {
    uint8_t *timed = malloc(requests->n_requests);
    if (!timed) {
        fprintf(stderr, PROG ": out of memory\n");
        return NULL;
    }
    uint64_t passes_in_sequence = 0;
    for (size_t r = 0; r < requests->n_requests; r++) {
        if (r == 0 || requests->sequence[r] != requests->sequence[r - 1]) {
            passes_in_sequence = 0;
        }
        if (r == 0 || requests->token[r] != requests->token[r - 1]) {
            passes_in_sequence++;
        }
        timed[r] = passes_in_sequence > warmup;
    }
    return timed;
}

/* Runs every job on the threads and times it; 0, or -1 after a message when a replay failed. */
static int run_replays(const struct sim_options *options, const struct sim_setup *setup,
                       const struct replay_requests *requests, const struct guanaco_request_trace *replay,
                       const struct guanaco_pipeline_config *pipeline, struct sim_replays *replays,
                       double *seconds) {
    uint8_t *timed = NULL;
    if (options->have_disk_gbps) {
        timed = timed_requests(requests, options->warmup);
        if (!timed) {
            return -ENOMEM;
        }
    }
    struct guanaco_request_rows rows = replay_request_rows(requests, timed);
    struct sim_pool pool = {replay, &rows, options->have_disk_gbps, pipeline, setup->budgets,
                            options->per_layer_cap, options->half_life, options->preload, replays->jobs,
                            replays->n_jobs, 0, PTHREAD_MUTEX_INITIALIZER};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    struct timespec clock_start;
    clock_gettime(CLOCK_MONOTONIC, &clock_start);
    run_jobs(&pool, options->threads ? options->threads : (size_t)(cpus > 0 ? cpus : 1));
    *seconds = seconds_since(&clock_start);
    free(timed);
    for (size_t j = 0; j < replays->n_jobs; j++) {
        const struct sim_job *job = &replays->jobs[j];
        if (job->err != 0) {
            fprintf(stderr, PROG ": replaying %s at budget %s failed: %s\n",
                    job->kind == SIM_BELADY ? "belady" : guanaco_policy_kind_name(job->kind),
                    setup->budgets[job->budget].text, strerror(-job->err));
            return -1;
        }
    }
    return 0;
}

/* The table of every (budget, shown policy), on stdout and in the CSV when there is one, then its notes. */
static void print_results(const struct sim_options *options, const struct sim_setup *setup,
                          const struct sim_replays *replays, uint64_t n_tokens, FILE *csv) {
    bool with_speed = options->have_disk_gbps;
    if (csv) print_csv_header(csv, with_speed);
    printf("\n");
    print_table_header(with_speed);
    bool all_exact = true;
    for (size_t b = 0; b < setup->n_budgets; b++) {
        const struct sim_job *row = &replays->jobs[b * replays->per_budget];
        const struct sim_job *lru = &row[1 + setup->n_kinds];
        for (size_t i = 0; i < setup->n_kinds; i++) {
            if (setup->kinds[i] == GUANACO_POLICY_LRU) lru = &row[1 + i];
        }
        all_exact = all_exact && row[0].exact;
        for (size_t j = 0; j < 1 + setup->n_kinds; j++) {
            const char *name = j == 0 ? "belady" : guanaco_policy_kind_name(setup->kinds[j - 1]);
            struct sim_row line = make_row(name, &setup->budgets[b], &row[j], &row[0], lru, n_tokens,
                                           options->disk_gbps, options->compute_ms);
            print_table_row(&line);
            if (csv) print_csv_row(csv, &line);
        }
    }
    printf("\nhit %% = accesses served from RAM; gap pts = belady's hit %% minus the policy's; closed %% = the "
           "share of the lru-to-belady gap the policy closes (n/a when lru is already optimal)\n");
    if (with_speed) {
        printf("tok/s = 1000 / (%.3g ms compute + MB/token read at %.3g GB/s), serial; overlap tok/s = timed tokens / "
               "their time in the pipeline replay below\n",
               options->compute_ms, options->disk_gbps);
    }
    if (!all_exact) {
        printf("note: expert sizes differ between layers, so belady (farthest next use) is a strong heuristic "
               "there, not a bound\n");
    }
    if (options->per_layer_cap) {
        printf("note: the policies hold at most %u experts per layer; belady is not capped\n",
               options->per_layer_cap);
    }
}

/* The pipeline replay's table: per policy and budget, each phase's passes, rates, stalls and reads. */
static void print_pipeline(const struct sim_options *options, const struct sim_setup *setup,
                           const struct sim_replays *replays, const struct guanaco_pipeline_config *pipeline,
                           uint64_t n_tokens) {
    print_pipeline_header(pipeline, &setup->geometry, options->warmup, options->ubatches);
    for (size_t b = 0; b < setup->n_budgets; b++) {
        const struct sim_job *row = &replays->jobs[b * replays->per_budget];
        for (size_t i = 0; i < setup->n_kinds; i++) {
            struct sim_row line = make_row(guanaco_policy_kind_name(setup->kinds[i]), &setup->budgets[b], &row[1 + i],
                                           &row[0], &row[0], n_tokens, options->disk_gbps, options->compute_ms);
            print_pipeline_row(&line);
        }
    }
    printf("serial = the same reads after each layer's ids arrive; compute and stall per pass are summed over its "
           "MoE layers; hidden %% = needed bytes read ahead and done before their layer;\n"
           "kernel = read-ahead's kernel CPU added to compute (beside compute ms); drop = CPU of "
           "dropping victims (inside the stall where it outlasts the reads); streamed = passes with a streamed call\n");
}

/* Closes the CSV; 0, or -EIO after a message when anything written to it failed. */
static int close_csv(FILE *csv, const char *path) {
    int failed = ferror(csv);
    failed |= fclose(csv);
    if (failed) {
        fprintf(stderr, PROG ": writing %s failed\n", path);
        return -EIO;
    }
    return 0;
}

/* Draws belady's and each shown policy's miss ratio against the budget; 0, or a negative errno after a
 * message. */
static int plot_replays(const char *png, const char *sources, const struct sim_setup *setup,
                        const struct sim_replays *replays) {
    size_t n_curves = 1 + setup->n_kinds, n_budgets = setup->n_budgets;
    const struct sim_job **points = calloc(n_curves * n_budgets, sizeof(*points));
    if (!points) {
        fprintf(stderr, PROG ": out of memory\n");
        return -ENOMEM;
    }
    struct sim_curve curves[1 + N_KINDS];
    for (size_t j = 0; j < n_curves; j++) {
        curves[j].name = j == 0 ? "belady (optimal)" : guanaco_policy_kind_name(setup->kinds[j - 1]);
        curves[j].points = &points[j * n_budgets];
        for (size_t b = 0; b < n_budgets; b++) {
            points[j * n_budgets + b] = &replays->jobs[b * replays->per_budget + j];
        }
    }
    char title[700];
    snprintf(title, sizeof(title), "%s on %s", sources, setup->geometry.description);
    signal(SIGPIPE, SIG_IGN); /* a gnuplot that dies early must fail the write, not kill us */
    fflush(stdout);
    int err = draw_plot(png, title, setup->budgets, n_budgets, curves, n_curves);
    free(points);
    return err;
}

int main(int argc, char **argv) {
    struct sim_options options = {0};
    int status = parse_options(argc, argv, &options);
    if (status != 0) {
        free(options.traces);
        free(options.models);
        return status < 0 ? 0 : status;
    }
    struct sim_setup setup = {0};
    struct replay_requests requests = {0};
    struct sim_replays replays = {0};
    FILE *csv = NULL;
    status = resolve_setup(&options, &setup);
    if (status != 0) {
        goto done;
    }
    status = 1;
    /* an unwritable CSV is found before the (possibly long) loading and replays */
    if (options.csv) {
        csv = fopen(options.csv, "w");
        if (!csv) {
            fprintf(stderr, PROG ": cannot write %s: %s\n", options.csv, strerror(errno));
            goto done;
        }
    }
    struct timespec clock_start;
    clock_gettime(CLOCK_MONOTONIC, &clock_start);
    char sources[512];
    if (load_traces(&options, &setup.geometry, &requests, sources, sizeof(sources)) != 0) {
        goto done;
    }
    struct guanaco_request_trace replay = replay_request_trace(&setup.geometry, &requests);
    double load_seconds = seconds_since(&clock_start);
    print_inputs(&options, sources, &requests, &setup.geometry, count_compulsory(&replay));

    struct guanaco_pipeline_config pipeline = pipeline_config(&options, &setup);
    double replay_seconds = 0;
    if (make_jobs(&setup, &replays) != 0 ||
        run_replays(&options, &setup, &requests, &replay, &pipeline, &replays, &replay_seconds) != 0) {
        goto done;
    }
    print_results(&options, &setup, &replays, requests.n_tokens, csv);
    if (options.have_disk_gbps) {
        print_pipeline(&options, &setup, &replays, &pipeline, requests.n_tokens);
    }
    printf("loaded in %.2f s; %zu replays in %.2f s\n", load_seconds, replays.n_jobs, replay_seconds);
    if (options.predictor &&
        report_prediction(&setup.geometry, &requests, setup.predictor, setup.pilot_masses,
                          setup.predictor == GUANACO_PREDICTOR_PILOT ? setup.n_pilot_masses : 1,
                          options.pilot_half_life, options.verbose) != 0) {
        goto done;
    }
    if (csv) {
        FILE *written = csv;
        csv = NULL;
        if (close_csv(written, options.csv) != 0) {
            goto done;
        }
    }
    if (options.plot && plot_replays(options.plot, sources, &setup, &replays) != 0) {
        goto done;
    }
    status = 0;
done:
    if (csv) fclose(csv);
    free(replays.jobs);
    replay_requests_free(&requests);
    setup_free(&setup);
    free(options.traces);
    free(options.models);
    return status;
}
