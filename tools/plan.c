/*
 * plan.c - guanaco-plan: answers "with this much RAM, what will I get, and
 * what should I set?" for a MoE model. It reads the expert geometry from the
 * GGUF, replays routing (a recorded trace, or else a synthetic one from the
 * preset closest to the model's shape) through the engine's default policy
 * and through Belady's optimum over a sweep of budgets, and prints per budget
 * the RAM it needs, the share of expert accesses served from RAM, and the
 * expected tokens per second from the disk bandwidth and compute time per
 * token, which it measures when they are not given: serially (compute +
 * reads) and overlapped, as the engine's pipeline reads ahead while a layer
 * computes (guanaco_simulate_pipeline, the model guanaco-sim uses too).
 * Then it recommends a --guanaco-ram value.
 *
 * This file owns the command line, the two quick measurements (disk and
 * memory bandwidth) and the output. The replays are the library's
 * (offline/simulate.h, offline/belady.h), the synthetic routing is
 * offline/routing_synth.h's, and the trace-to-requests glue is
 * tools/replay_input.h's, shared with guanaco-sim.
 */
#include "belady.h"
#include "budget.h"
#include "io.h"
#include "manifest.h"
#include "policy.h"
#include "predictor.h"
#include "residency.h"
#include "routing_synth.h"
#include "simulate.h"
#include "trace.h"
#include "cli.h"
#include "replay_input.h"
#include "guanaco.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROG "guanaco-plan"
#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)
#define SWEEP_STEPS 10
#define DISK_SAMPLE_BYTES (256ull << 20)
#define DISK_BATCH_BYTES (64ull << 20)
#define DISK_QUEUE_DEPTH GUANACO_RESIDENCY_DEFAULT_QUEUE_DEPTH
#define DISK_CHUNK_BYTES GUANACO_RESIDENCY_CHUNK_BYTES
#define DIRECT_ALIGNMENT ((uint64_t)GUANACO_IO_DIRECT_ALIGNMENT)
#define MEMORY_SAMPLE_BYTES (256ull << 20)

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " MODEL.gguf [MORE-SHARDS.gguf ...] [--trace FILE ...] [--ram SIZE]\n"
            "                    [--disk-gbps X] [--compute-ms Y] [--policy NAME] [--predictor KIND] [--tokens N]\n"
            "                    [--seed S]\n"
            "\n"
            "  MODEL.gguf          the model; list every shard of a split model\n"
            "  --trace FILE        routing recorded with --guanaco-trace-out (or converted); several are replayed\n"
            "                      back to back. Without it, a synthetic trace from the preset closest to the\n"
            "                      model's shape is used, and the output says so\n"
            "  --ram SIZE          the machine's RAM for this model, as --guanaco-ram takes sizes: 16G, 12288M\n"
            "                      (binary units); adds its budget to the table and recommends it\n"
            "  --disk-gbps X       disk read speed in GB/s; otherwise measured by reading 256 MiB of the model's\n"
            "                      expert slices at queue depth %u (O_DIRECT where the file system allows)\n"
            "  --compute-ms Y      compute time per token in ms, 0 or more; otherwise estimated from the bytes of\n"
            "                      weights a token touches and a measured memory read bandwidth\n"
            "  --policy NAME       the replacement policy to predict: %s (default %s,\n"
            "                      the engine's default)\n"
            "  --predictor KIND    the read-ahead to predict, as --guanaco-prefetch: %s (default %s, the\n"
            "                      engine's default); none makes the overlapped estimate the serial one\n"
            "  --tokens N          tokens per sequence of the synthetic trace (default: the preset's)\n"
            "  --seed S            seed of the synthetic trace (default: the preset's)\n",
            DISK_QUEUE_DEPTH, guanaco_policy_kind_names(), guanaco_policy_kind_name(GUANACO_POLICY_DEFAULT),
            guanaco_predictor_kind_names(), guanaco_predictor_kind_name(GUANACO_PREDICTOR_DEFAULT));
}

struct plan_options {
    const char **models;
    size_t n_models;
    const char **traces;
    size_t n_traces;
    double disk_gbps, compute_ms;
    bool have_disk_gbps, have_compute_ms;
    uint64_t ram_bytes; /* 0 = not given */
    enum guanaco_policy_kind policy;
    enum guanaco_predictor_kind predictor;
    unsigned long tokens;
    uint64_t seed;
    bool have_seed;
    bool keeps_spares; /* the engine will load directly (GUANACO_LOAD, or auto's rule): room for spare copies */
};

/* "16G", "12288M", "512K", "1073741824", with an optional "iB" or "B": binary units, as --guanaco-ram. */
static int parse_ram(const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    double bytes = strtod(text, &end);
    const char *units = "KMGT", *unit = end && *end ? strchr(units, *end & ~0x20) : NULL;
    if (unit) {
        bytes *= pow(1024.0, (double)(unit - units + 1));
        end++;
    }
    bool suffix_ok = end && (*end == '\0' || strcmp(end, "B") == 0 || (unit && strcmp(end, "iB") == 0));
    if (errno != 0 || end == text || !suffix_ok || !isfinite(bytes) || bytes < MIB || bytes > GIB * 1024 * 1024) {
        fprintf(stderr, PROG ": --ram needs a size from 1M to 1024T such as 16G or 12288M, not \"%s\"\n", text);
        return -EINVAL;
    }
    *out = (uint64_t)bytes;
    return 0;
}

/* 0 on success, 2 for a usage error (after its message), -1 when --help was printed. */
static int parse_options(int argc, char **argv, struct plan_options *o) {
    o->models = calloc((size_t)argc, sizeof(*o->models));
    o->traces = calloc((size_t)argc, sizeof(*o->traces));
    o->policy = GUANACO_POLICY_DEFAULT;
    o->predictor = GUANACO_PREDICTOR_DEFAULT;
    if (!o->models || !o->traces) {
        fprintf(stderr, PROG ": out of memory\n");
        return 2;
    }
    static const char *const with_value[] = {"--trace", "--ram", "--disk-gbps", "--compute-ms",
                                             "--policy", "--predictor", "--tokens", "--seed"};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            print_usage(stdout);
            return -1;
        }
        if (arg[0] != '-') {
            o->models[o->n_models++] = arg;
            continue;
        }
        const char *value = NULL;
        int err = guanaco_cli_flag_value(PROG, argc, argv, &i, with_value, sizeof(with_value) / sizeof(with_value[0]),
                                         &value);
        if (err != 0) {
            if (err == -ENOENT) print_usage(stderr);
            return 2;
        }
        if (strcmp(arg, "--trace") == 0) {
            o->traces[o->n_traces++] = value;
        } else if (strcmp(arg, "--ram") == 0) {
            err = parse_ram(value, &o->ram_bytes);
        } else if (strcmp(arg, "--disk-gbps") == 0) {
            err = guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, true, &o->disk_gbps);
            o->have_disk_gbps = true;
        } else if (strcmp(arg, "--compute-ms") == 0) {
            err = guanaco_cli_parse_real(PROG, arg, value, 0, INFINITY, false, &o->compute_ms);
            o->have_compute_ms = true;
        } else if (strcmp(arg, "--policy") == 0) {
            err = guanaco_policy_kind_from_name(value, &o->policy);
            if (err != 0) {
                fprintf(stderr, PROG ": unknown --policy \"%s\": expected one of %s\n", value,
                        guanaco_policy_kind_names());
            }
        } else if (strcmp(arg, "--predictor") == 0) {
            err = guanaco_predictor_kind_from_name(value, &o->predictor);
            if (err != 0) {
                fprintf(stderr, PROG ": unknown --predictor \"%s\": expected one of %s\n", value,
                        guanaco_predictor_kind_names());
            }
        } else if (strcmp(arg, "--tokens") == 0) {
            err = guanaco_cli_parse_whole(PROG, arg, value, 1u << 24, &o->tokens);
        } else if (strcmp(arg, "--seed") == 0) {
            err = guanaco_cli_parse_seed(PROG, arg, value, &o->seed);
            o->have_seed = true;
        }
        if (err != 0) {
            return 2;
        }
    }
    if (o->n_models == 0) {
        fprintf(stderr, PROG ": no model given\n");
        print_usage(stderr);
        return 2;
    }
    if (o->n_traces > 0 && (o->tokens || o->have_seed)) {
        fprintf(stderr, PROG ": --tokens and --seed shape the synthetic trace; they do not apply with --trace\n");
        return 2;
    }
    return 0;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- disk: reading expert slices the way the engine does ---- */

struct disk_speed {
    double gbps;
    uint64_t bytes;
    size_t slices;
    bool direct;
    enum guanaco_io_backend backend;
};

struct disk_slice {
    int shard;
    uint64_t offset, length;
};

/* The expert slices of the model in a pseudo-random order: the engine reads scattered experts, never
   the file from start to end, and a sequential sample would flatter the disk. */
static struct disk_slice *shuffled_slices(const struct guanaco_manifest *m, size_t *n_out, uint64_t *largest) {
    size_t n = m->n_tensors * (size_t)m->n_expert;
    struct disk_slice *slices = malloc((n ? n : 1) * sizeof(*slices));
    if (!slices) {
        return NULL;
    }
    size_t i = 0;
    *largest = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        *largest = m->tensors[t].expert_stride > *largest ? m->tensors[t].expert_stride : *largest;
        for (int e = 0; e < m->n_expert; e++) {
            const struct guanaco_expert_tensor *tensor = &m->tensors[t];
            slices[i++] = (struct disk_slice){tensor->shard, tensor->file_offset + (uint64_t)e * tensor->expert_stride,
                                              tensor->expert_stride};
        }
    }
    /* a new order each run: a second run must not find the first one's slices in a VM host's or drive's cache */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t state = (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20);
    for (size_t j = n; j > 1; j--) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = (size_t)((state >> 33) % j);
        struct disk_slice swap = slices[j - 1];
        slices[j - 1] = slices[k];
        slices[k] = swap;
    }
    *n_out = n;
    return slices;
}

/* Reads up to DISK_SAMPLE_BYTES of slices with fds[] in batches; -EINVAL from an O_DIRECT fd means the
   file system refused it. */
static int read_sample(struct guanaco_io *io, const int *fds, bool direct, const uint64_t *shard_sizes,
                       const struct disk_slice *slices, size_t n_slices, unsigned char *buffer,
                       uint64_t buffer_bytes, struct disk_speed *out) {
    struct guanaco_io_request *requests = calloc(n_slices ? n_slices : 1, sizeof(*requests));
    if (!requests) {
        return -ENOMEM;
    }
    double seconds = 0;
    int err = 0;
    out->bytes = 0;
    out->slices = 0;
    size_t next = 0;
    while (err == 0 && next < n_slices && out->bytes < DISK_SAMPLE_BYTES) {
        size_t n = 0;
        uint64_t used = 0;
        for (; next < n_slices && out->bytes + used < DISK_SAMPLE_BYTES; next++) {
            const struct disk_slice *s = &slices[next];
            uint64_t start = s->offset, end = s->offset + s->length;
            if (direct) {
                /* whole blocks around the slice, as O_DIRECT needs; a slice whose last block passes the end
                   of the file is skipped rather than read short */
                start -= start % DIRECT_ALIGNMENT;
                end = (end + DIRECT_ALIGNMENT - 1) / DIRECT_ALIGNMENT * DIRECT_ALIGNMENT;
                if (end > shard_sizes[s->shard]) {
                    continue;
                }
            }
            if (used + (end - start) > buffer_bytes) {
                break;
            }
            requests[n++] = (struct guanaco_io_request){
                .fd = fds[s->shard], .offset = start, .length = end - start, .destination = buffer + used};
            used += (end - start + DIRECT_ALIGNMENT - 1) / DIRECT_ALIGNMENT * DIRECT_ALIGNMENT;
            if (!direct) {
                /* buffered: what is already cached would be counted as disk speed */
                posix_fadvise(fds[s->shard], (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
            }
        }
        if (n == 0) {
            break;
        }
        double start = seconds_now();
        err = guanaco_io_read_batch(io, requests, n);
        seconds += seconds_now() - start;
        for (size_t i = 0; i < n && err == 0; i++) {
            out->bytes += requests[i].length;
            if (!direct) {
                posix_fadvise(requests[i].fd, (off_t)requests[i].offset, (off_t)requests[i].length,
                              POSIX_FADV_DONTNEED); /* leave the page cache as it was */
            }
        }
        out->slices += err == 0 ? n : 0;
    }
    free(requests);
    out->gbps = seconds > 0 && out->bytes > 0 ? (double)out->bytes / seconds / 1e9 : 0;
    return err;
}

static void close_all(int *fds, int n) {
    for (int s = 0; s < n; s++) {
        if (fds[s] >= 0) close(fds[s]);
        fds[s] = -1;
    }
}

static int open_all(const struct guanaco_manifest *m, int flags, int *fds) {
    for (int s = 0; s < m->n_shards; s++) {
        fds[s] = open(m->shard_paths[s], O_RDONLY | O_CLOEXEC | flags);
        if (fds[s] < 0) {
            int err = -errno;
            close_all(fds, s);
            return err;
        }
        if (!(flags & O_DIRECT)) {
            fdatasync(fds[s]); /* dirty pages of a freshly written model cannot be dropped from the cache */
        }
    }
    return 0;
}

static int measure_disk(const struct guanaco_manifest *m, struct disk_speed *out) {
    size_t n_slices = 0;
    uint64_t largest = 0;
    struct disk_slice *slices = shuffled_slices(m, &n_slices, &largest);
    /* a batch holds at least one slice, whole blocks on both sides, however large one expert is */
    uint64_t buffer_bytes = largest + 2 * DIRECT_ALIGNMENT > DISK_BATCH_BYTES ? largest + 2 * DIRECT_ALIGNMENT
                                                                             : DISK_BATCH_BYTES;
    int *fds = malloc((size_t)m->n_shards * sizeof(*fds));
    unsigned char *buffer = NULL;
    struct guanaco_io *io = NULL;
    int err = -ENOMEM;
    if (!slices || !fds || posix_memalign((void **)&buffer, DIRECT_ALIGNMENT, buffer_bytes) != 0) {
        buffer = NULL;
        goto done;
    }
    memset(buffer, 0, buffer_bytes); /* fault the destination in now, not inside the timed reads */
    out->backend = GUANACO_IO_URING;
    err = guanaco_io_create(out->backend, DISK_QUEUE_DEPTH, DISK_CHUNK_BYTES, &io);
    if (err == -ENOSYS) {
        out->backend = GUANACO_IO_THREADS;
        err = guanaco_io_create(out->backend, DISK_QUEUE_DEPTH, DISK_CHUNK_BYTES, &io);
    }
    if (err != 0) {
        goto done;
    }
    out->direct = open_all(m, O_DIRECT, fds) == 0;
    if (out->direct) {
        err = read_sample(io, fds, true, m->shard_sizes, slices, n_slices, buffer, buffer_bytes, out);
        close_all(fds, m->n_shards);
        if (err == -EINVAL) {
            out->direct = false; /* the file system took the flag at open but refuses the reads (tmpfs, some FUSE) */
        }
    }
    if (!out->direct) {
        err = open_all(m, 0, fds);
        if (err == 0) {
            err = read_sample(io, fds, false, m->shard_sizes, slices, n_slices, buffer, buffer_bytes, out);
            close_all(fds, m->n_shards);
        }
    }
    if (err == 0 && out->gbps <= 0) {
        err = -ENODATA;
    }
done:
    guanaco_io_destroy(io);
    free(buffer);
    free(fds);
    free(slices);
    return err;
}

/* ---- memory: how fast one thread streams weights ---- */

/* Best of a few passes summing a buffer that was written first, so its pages exist: GB/s, or 0. */
static double measure_memory_gbps(void) {
    size_t words = MEMORY_SAMPLE_BYTES / sizeof(uint64_t);
    uint64_t *buffer = malloc(words * sizeof(*buffer));
    if (!buffer) {
        return 0;
    }
    for (size_t i = 0; i < words; i++) {
        buffer[i] = i;
    }
    double best = 0;
    volatile uint64_t sink = 0; /* keeps the sums, so the compiler cannot drop the reads */
    for (int pass = 0; pass < 3; pass++) {
        uint64_t a = 0, b = 0, c = 0, d = 0;
        double start = seconds_now();
        for (size_t i = 0; i + 4 <= words; i += 4) {
            a += buffer[i];
            b += buffer[i + 1];
            c += buffer[i + 2];
            d += buffer[i + 3];
        }
        double seconds = seconds_now() - start;
        sink += a + b + c + d;
        double gbps = seconds > 0 ? (double)MEMORY_SAMPLE_BYTES / seconds / 1e9 : 0;
        best = gbps > best ? gbps : best;
    }
    (void)sink;
    free(buffer);
    return best;
}

/* ---- the sweep ---- */

struct plan_row {
    uint64_t budget_bytes;
    bool from_ram;          /* the budget --ram leads to */
    struct guanaco_replay_stats expected, optimal;
    double expected_percent, optimal_percent, mb_per_token, tokens_per_second;
    double overlapped_tokens_per_second; /* the pipeline replay */
};

static double hit_percent(const struct guanaco_replay_stats *s) {
    return s->accesses ? 100.0 * (double)s->hits / (double)s->accesses : 0.0;
}

/* The RAM at which the engine's automatic budget equals `budget`: budget + non-expert + 1 GiB + 10% of RAM,
   and direct loading's spare copies. */
static double ram_needed_bytes(uint64_t budget, uint64_t non_expert, bool keeps_spares) {
    return guanaco_auto_budget_memory_needed(budget, non_expert, keeps_spares);
}

/* The engine's automatic budget for `ram` bytes, and whether it fell to the engine's floor of a quarter layer. */
static uint64_t budget_for_ram(uint64_t ram, const struct guanaco_manifest *m, bool keeps_spares, bool *at_floor) {
    struct guanaco_auto_budget rule;
    guanaco_auto_budget(ram, m, 0, false, keeps_spares, &rule);
    *at_floor = rule.at_floor;
    return rule.budget;
}

static int compare_rows(const void *a, const void *b) {
    const struct plan_row *x = a, *y = b;
    return x->budget_bytes < y->budget_bytes ? -1 : x->budget_bytes > y->budget_bytes;
}

/*
 * The knee of expected resident % against budget (Kneedle): with both axes
 * scaled to 0..1 over the sweep, the budget whose point lies farthest above
 * the straight line from the smallest to the largest budget. Past it, each
 * GiB buys fewer hits than the average GiB. -1 when no point lies above the
 * line (the curve has no knee: every GiB helps as much as the last).
 */
static int knee_row(const struct plan_row *rows, int n) {
    int first = -1, last = -1;
    for (int i = 0; i < n; i++) {
        if (rows[i].from_ram) continue;
        if (first < 0) first = i;
        last = i;
    }
    if (first < 0 || last == first) {
        return -1;
    }
    double x0 = (double)rows[first].budget_bytes, x1 = (double)rows[last].budget_bytes;
    double y0 = rows[first].expected_percent, y1 = rows[last].expected_percent;
    if (y1 <= y0) {
        return -1;
    }
    int best = -1;
    double best_height = 1e-9;
    for (int i = first; i <= last; i++) {
        if (rows[i].from_ram) continue;
        double x = ((double)rows[i].budget_bytes - x0) / (x1 - x0), y = (rows[i].expected_percent - y0) / (y1 - y0);
        if (y - x > best_height) {
            best_height = y - x;
            best = i;
        }
    }
    return best;
}

/* ---- the run, one step per function; main calls them in order ---- */

/* Reads the model's manifest and expert geometry; a dense model has nothing to plan. 0, or -1 after a message. */
static int load_model(const struct plan_options *options, struct guanaco_manifest *manifest, bool *have_manifest,
                      struct replay_geometry *geometry) {
    int err = guanaco_manifest_load(options->models[0], options->n_models > 1 ? options->models : NULL,
                                    options->n_models > 1 ? options->n_models : 0, manifest);
    if (err != 0) {
        fprintf(stderr, PROG ": cannot read the model %s: %s\n", options->models[0], strerror(-err));
        return -1;
    }
    *have_manifest = true;
    if (manifest->n_tensors == 0) {
        fprintf(stderr, PROG ": %s is a dense model (no expert tensors): Guanaco passes it through to plain "
                        "llama.cpp, so there is no budget to plan\n", options->models[0]);
        return -1;
    }
    return replay_geometry_from_manifest(PROG, manifest, options->models[0], geometry) != 0 ? -1 : 0;
}

static void print_model(const struct replay_geometry *geometry, uint64_t non_expert) {
    printf("model        %s: %u layers, %u with experts, %u experts each, top-%u\n", geometry->description,
           geometry->n_layer, geometry->n_moe_layers, geometry->n_expert, geometry->top_k);
    printf("weights      experts %.3f GiB, other weights a token reads %.3f GiB\n",
           (double)geometry->total_expert_bytes / GIB, (double)non_expert / GIB);
}

/* Appends a synthetic trace of the model's own shape, from the preset closest to it, and says that the routing
 * is not the model's. 0, or -1 after a message. */
static int add_synthetic_routing(const struct plan_options *options, const struct guanaco_manifest *manifest,
                                 const struct replay_geometry *geometry, struct replay_requests *requests) {
    uint8_t *moe_layer = calloc(geometry->n_layer, 1);
    if (!moe_layer) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    const struct guanaco_synth_preset *preset = guanaco_synth_preset_closest(geometry->n_expert, geometry->top_k);
    struct guanaco_synth_params params = preset->params;
    params.n_layer = geometry->n_layer;
    params.n_expert = geometry->n_expert;
    params.top_k = geometry->top_k;
    for (uint32_t l = 0; l < geometry->n_layer; l++) {
        moe_layer[l] = geometry->expert_bytes[l] > 0;
    }
    params.moe_layer = moe_layer;
    if (options->tokens) params.tokens = (uint32_t)options->tokens;
    if (options->have_seed) params.seed = options->seed;
    struct guanaco_trace trace;
    int err = guanaco_synth_trace(&params, manifest->arch, preset->name, &trace);
    free(moe_layer);
    if (err != 0) {
        fprintf(stderr, PROG ": cannot generate the synthetic routing: %s\n", strerror(-err));
        return -1;
    }
    err = replay_append_trace(PROG, requests, &trace, "the synthetic trace", geometry, false);
    guanaco_trace_free(&trace);
    if (err != 0) {
        return -1;
    }
    printf("routing      SYNTHETIC, not this model's own: preset %s, the closest to %u experts top-%u "
           "(%u x %u tokens, seed %llu).\n"
           "             For a prediction from real routing, record some with --guanaco-trace-out FILE and pass "
           "--trace FILE.\n",
           preset->name, geometry->n_expert, geometry->top_k, params.sequences, params.tokens,
           (unsigned long long)params.seed);
    return 0;
}

/* The routing to replay: the recorded traces, or else a synthetic one of the model's own shape. 0, or -1 after
 * a message. */
static int load_routing(const struct plan_options *options, const struct guanaco_manifest *manifest,
                        const struct replay_geometry *geometry, struct replay_requests *requests) {
    requests->start = calloc(1, sizeof(*requests->start));
    if (!requests->start) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    for (size_t t = 0; t < options->n_traces; t++) {
        char source[256];
        if (replay_add_trace_file(PROG, options->traces[t], geometry, requests, source, sizeof(source), false) != 0) {
            return -1;
        }
        printf("routing      %s: recorded (%s)\n", options->traces[t], source);
    }
    if (options->n_traces == 0 && add_synthetic_routing(options, manifest, geometry, requests) != 0) {
        return -1;
    }
    if (requests->n_requests == 0) {
        fprintf(stderr, PROG ": the traces hold no routing decisions: nothing to replay\n");
        return -1;
    }
    return 0;
}

/* Disk and compute speeds: given, or measured. */
struct plan_speeds {
    double disk_gbps, compute_ms;
};

/* --disk-gbps, or a measurement of reading the model's expert slices; says which. 0, or -1 after a message. */
static int resolve_disk_gbps(const struct plan_options *options, const struct guanaco_manifest *manifest,
                             double *gbps) {
    if (options->have_disk_gbps) {
        *gbps = options->disk_gbps;
        printf("disk         %.2f GB/s, given by --disk-gbps\n", *gbps);
        return 0;
    }
    struct disk_speed speed = {0};
    int err = measure_disk(manifest, &speed);
    if (err != 0) {
        fprintf(stderr, PROG ": measuring the disk failed (%s): give --disk-gbps X instead\n", strerror(-err));
        return -1;
    }
    *gbps = speed.gbps;
    printf("disk         %.2f GB/s, measured: %.0f MiB in %zu expert slices in random order, queue depth %u, "
           "%s, %s%s\n",
           *gbps, (double)speed.bytes / MIB, speed.slices, DISK_QUEUE_DEPTH,
           guanaco_io_backend_name(speed.backend),
           speed.direct ? "O_DIRECT" : "buffered (O_DIRECT refused by the file system; the slices were dropped "
                                       "from the page cache first)",
           speed.bytes < DISK_SAMPLE_BYTES ? "; that is all of the model's expert slices" : "");
    return 0;
}

/* --compute-ms, or an estimate from the weights a token touches and the memory bandwidth; says which. 0, or -1
 * after a message. */
static int resolve_compute_ms(const struct plan_options *options, const struct replay_geometry *geometry,
                              uint64_t non_expert, double *ms) {
    if (options->have_compute_ms) {
        *ms = options->compute_ms;
        printf("compute      %.2f ms per token, given by --compute-ms\n", *ms);
        return 0;
    }
    uint64_t touched = non_expert;
    for (uint32_t l = 0; l < geometry->n_layer; l++) {
        touched += (uint64_t)geometry->top_k * geometry->expert_bytes[l];
    }
    double memory_gbps = measure_memory_gbps();
    if (memory_gbps <= 0) {
        fprintf(stderr, PROG ": measuring the memory bandwidth failed: give --compute-ms Y instead\n");
        return -1;
    }
    *ms = (double)touched / (memory_gbps * 1e9) * 1e3;
    printf("compute      %.2f ms per token, an ESTIMATE: %.2f GiB of weights touched per token (non-expert + "
           "top-%u experts per layer) / %.1f GB/s read by one thread; give --compute-ms for a measured value\n",
           *ms, (double)touched / GIB, geometry->top_k, memory_gbps);
    return 0;
}

/* The budgets replayed: every tenth of the expert bytes, and the one --ram leads to. */
struct plan_sweep {
    struct plan_row rows[SWEEP_STEPS + 1];
    int n_rows;
    uint64_t ram_budget; /* with --ram: the engine's automatic budget, at most every expert */
    bool ram_at_floor;   /* that budget is the engine's floor of a quarter layer */
    bool all_exact;      /* Belady's replays were all exact, not heuristic */
};

/* The sweep's budgets in increasing order, none replayed yet. */
static void make_sweep(const struct plan_options *options, const struct guanaco_manifest *manifest,
                       const struct replay_geometry *geometry, struct plan_sweep *sweep) {
    sweep->n_rows = 0;
    for (int step = 1; step <= SWEEP_STEPS; step++) {
        sweep->rows[sweep->n_rows++] = (struct plan_row){
            .budget_bytes = (uint64_t)((double)geometry->total_expert_bytes * step / SWEEP_STEPS)};
    }
    sweep->ram_at_floor = false;
    sweep->ram_budget = 0;
    if (options->ram_bytes) {
        sweep->ram_budget = budget_for_ram(options->ram_bytes, manifest, options->keeps_spares, &sweep->ram_at_floor);
        if (sweep->ram_budget > geometry->total_expert_bytes) {
            sweep->ram_budget = geometry->total_expert_bytes;
        }
        sweep->rows[sweep->n_rows++] = (struct plan_row){.budget_bytes = sweep->ram_budget, .from_ram = true};
        qsort(sweep->rows, (size_t)sweep->n_rows, sizeof(sweep->rows[0]), compare_rows);
    }
}

/* Replays the routing at every budget of the sweep through the policy, Belady's optimum and the engine's
 * pipeline, and fills in each row's figures. 0, or -1 after a message. */
static int replay_sweep(const struct plan_options *options, const struct replay_geometry *geometry,
                        const struct replay_requests *requests, const struct plan_speeds *speeds,
                        struct plan_sweep *sweep) {
    struct guanaco_request_trace replay = replay_request_trace(geometry, requests);
    struct guanaco_request_rows replay_rows = replay_request_rows(requests, NULL);
    struct guanaco_pipeline_config pipeline = {
        .predictor = options->predictor,
        .bytes_per_second = speeds->disk_gbps * 1e9,
        .token_seconds = speeds->compute_ms / 1e3,
        .prompt_token_seconds = speeds->compute_ms / 1e3, /* every pass here is one token */
        .stream_prompts = true,                          /* the engine's default (--guanaco-stream-prompts) */
    };
    sweep->all_exact = true;
    for (int r = 0; r < sweep->n_rows; r++) {
        struct plan_row *row = &sweep->rows[r];
        struct guanaco_policy_config config = {.kind = options->policy, .budget_bytes = row->budget_bytes};
        bool exact = true;
        struct guanaco_pipeline_stats timed;
        int err = guanaco_simulate(&replay, &replay_rows, &config, false, &row->expected);
        if (err == 0) {
            err = guanaco_belady(&replay, row->budget_bytes, &row->optimal, &exact);
        }
        if (err == 0) {
            err = guanaco_simulate_pipeline(&replay, &replay_rows, &config, false, &pipeline, &timed);
        }
        if (err != 0) {
            fprintf(stderr, PROG ": replaying at %.2f GiB failed: %s\n", (double)row->budget_bytes / GIB,
                    strerror(-err));
            return -1;
        }
        sweep->all_exact = sweep->all_exact && exact;
        row->expected_percent = hit_percent(&row->expected);
        row->optimal_percent = hit_percent(&row->optimal);
        row->mb_per_token = (double)row->expected.bytes_read / (double)requests->n_tokens / 1e6;
        double read_ms = row->mb_per_token * 1e6 / (speeds->disk_gbps * 1e9) * 1e3;
        row->tokens_per_second = 1000.0 / (speeds->compute_ms + read_ms);
        double seconds = timed.decode.overlapped_seconds + timed.prompt.overlapped_seconds;
        row->overlapped_tokens_per_second =
            seconds > 0 ? (double)(timed.decode.tokens + timed.prompt.tokens) / seconds : INFINITY;
    }
    return 0;
}

/* The unit budgets print in: small models in MiB, so the budgets do not all print as 0.00. */
static double size_unit(const struct replay_geometry *geometry, const char **name) {
    bool in_mib = geometry->total_expert_bytes < (4ull << 30);
    *name = in_mib ? "MiB" : "GiB";
    return in_mib ? MIB : GIB;
}

/* The table, one row per budget, and what its columns mean. */
static void print_table(const struct plan_options *options, const struct plan_sweep *sweep,
                        const struct replay_geometry *geometry, uint64_t non_expert, uint64_t n_tokens,
                        const struct plan_speeds *speeds) {
    const char *unit = NULL;
    double scale = size_unit(geometry, &unit);
    printf("\n%10s %9s %14s %11s %11s %13s %10s %11s\n", "budget", "experts", "RAM needed", "expected", "optimal",
           "read", "expected", "overlapped");
    printf("%10s %9s %14s %11s %11s %13s %10s %11s\n", unit, "%", unit, "resident %", "resident %", "MB/token",
           "tok/s", "tok/s");
    for (int r = 0; r < sweep->n_rows; r++) {
        const struct plan_row *row = &sweep->rows[r];
        printf("%10.2f %9.1f %14.2f %11.2f %11.2f %13.2f %10.2f %11.2f%s\n", (double)row->budget_bytes / scale,
               100.0 * (double)row->budget_bytes / (double)geometry->total_expert_bytes,
               ram_needed_bytes(row->budget_bytes, non_expert, options->keeps_spares) / scale, row->expected_percent, row->optimal_percent,
               row->mb_per_token, row->tokens_per_second, row->overlapped_tokens_per_second,
               row->from_ram ? "   <- --ram" : "");
    }
    char margin_rule[32];
    guanaco_auto_budget_margin_rule(false, margin_rule, sizeof(margin_rule));
    const char *caveat = guanaco_simulate_predictor_caveat(options->predictor);
    printf("\nresident %% = expert accesses served from RAM over %llu tokens, cold start included; RAM needed = "
           "budget + other weights + %s%s (the engine's --guanaco-ram auto rule);\n"
           "tok/s = 1000 / (%.2f ms compute + MB/token read at %.2f GB/s), compute and reads one after the other;\n"
           "overlapped tok/s = the engine's pipeline with %s read-ahead%s%s%s: each MoE layer takes its share of the "
           "compute plus the reads it still waits for (offline/simulate.h)\n",
           (unsigned long long)n_tokens, margin_rule,
           options->keeps_spares ? " + direct loading's spare copies (an eighth of the budget, at least 64 MiB)" : "",
           speeds->compute_ms, speeds->disk_gbps, guanaco_predictor_kind_name(options->predictor),
           caveat ? " (" : "", caveat ? caveat : "", caveat ? ")" : "");
    if (!sweep->all_exact) {
        printf("note: expert sizes differ between layers, so \"optimal\" (farthest next use) is a strong heuristic "
               "there, not a bound\n");
    }
}

/* The budget to recommend, and why: with --ram the largest that fits it, else the knee of the curve. */
static uint64_t choose_budget(const struct plan_options *options, const struct plan_sweep *sweep,
                              const struct replay_geometry *geometry, uint64_t non_expert, char *why, size_t size) {
    if (options->ram_bytes) {
        if (sweep->ram_budget >= geometry->total_expert_bytes) {
            snprintf(why, size, "--ram %.2f GiB holds every expert: the residency engine is not needed, "
                     "and this budget keeps them all resident", (double)options->ram_bytes / GIB);
        } else if (sweep->ram_at_floor) {
            snprintf(why, size, "WARNING: --ram %.2f GiB leaves nothing for experts after %.2f GiB of "
                     "other weights and the margin; this is the engine's floor of a quarter layer, and nearly "
                     "every expert will come from disk", (double)options->ram_bytes / GIB, (double)non_expert / GIB);
        } else {
            char margin_rule[32];
            guanaco_auto_budget_margin_rule(false, margin_rule, sizeof(margin_rule));
            snprintf(why, size, "the largest budget that fits --ram %.2f GiB: minus %.2f GiB of other "
                     "weights and a margin of %s%s, as --guanaco-ram auto would compute",
                     (double)options->ram_bytes / GIB, (double)non_expert / GIB, margin_rule,
                     options->keeps_spares ? ", with room for direct loading's spare copies beside the budget" : "");
        }
        return sweep->ram_budget;
    }
    int knee = knee_row(sweep->rows, sweep->n_rows);
    if (knee >= 0) {
        snprintf(why, size, "the knee of the expected resident %% curve: the budget farthest above "
                 "the straight line from the smallest to the largest budget, with both axes scaled to 0..1; "
                 "past it each GiB buys fewer hits than the average GiB. Give --ram for the largest that fits");
        return sweep->rows[knee].budget_bytes;
    }
    snprintf(why, size, "the curve has no knee (every GiB helps as much as the last), so all the "
             "experts. Give --ram for the largest budget that fits");
    return geometry->total_expert_bytes;
}

/* The recommendation, in the form --guanaco-ram takes: whole MiB, rounded down. */
static void print_recommendation(const struct plan_options *options, const struct plan_sweep *sweep,
                                 const struct replay_geometry *geometry, uint64_t non_expert) {
    char why[400];
    uint64_t recommended = choose_budget(options, sweep, geometry, non_expert, why, sizeof(why));
    const char *unit = NULL;
    double scale = size_unit(geometry, &unit);
    /* a budget that must fit --ram is rounded down; a knee to the nearest MiB */
    uint64_t recommended_mib = options->ram_bytes ? recommended >> 20 : (recommended + (1ull << 19)) >> 20;
    printf("\nrecommended  --guanaco-ram %lluM  (%.2f %s: %s)\n",
           (unsigned long long)(recommended_mib ? recommended_mib : 1), (double)recommended / scale, unit, why);
}

int main(int argc, char **argv) {
    struct plan_options options = {0};
    int status = parse_options(argc, argv, &options);
    if (status != 0) {
        free(options.models);
        free(options.traces);
        return status < 0 ? 0 : status;
    }
    status = 1;
    struct guanaco_manifest manifest = {0};
    bool have_manifest = false;
    struct replay_geometry geometry = {0};
    struct replay_requests requests = {0};
    if (load_model(&options, &manifest, &have_manifest, &geometry) != 0) {
        goto done;
    }
    uint64_t non_expert = guanaco_hot_non_expert_bytes(&manifest); /* as the engine's auto rule counts them */
    struct guanaco_options engine_options;
    if (guanaco_options_get(&engine_options) == 0) {
        options.keeps_spares = engine_options.load != GUANACO_LOAD_PAGE_CACHE; /* auto is direct */
    }
    print_model(&geometry, non_expert);
    struct plan_speeds speeds = {0};
    if (load_routing(&options, &manifest, &geometry, &requests) != 0 ||
        resolve_disk_gbps(&options, &manifest, &speeds.disk_gbps) != 0 ||
        resolve_compute_ms(&options, &geometry, non_expert, &speeds.compute_ms) != 0) {
        goto done;
    }
    printf("policy       %s, against Belady's optimum (\"optimal\") over the same routing\n",
           guanaco_policy_kind_name(options.policy));
    struct plan_sweep sweep;
    make_sweep(&options, &manifest, &geometry, &sweep);
    if (replay_sweep(&options, &geometry, &requests, &speeds, &sweep) != 0) {
        goto done;
    }
    print_table(&options, &sweep, &geometry, non_expert, requests.n_tokens, &speeds);
    print_recommendation(&options, &sweep, &geometry, non_expert);
    status = 0;
done:
    replay_requests_free(&requests);
    free(geometry.expert_bytes);
    free(geometry.small_page_share);
    if (have_manifest) guanaco_manifest_free(&manifest);
    free(options.models);
    free(options.traces);
    return status;
}
