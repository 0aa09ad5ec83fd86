/*
 * options.c - owns Guanaco's user-facing knobs: the table of --guanaco-*
 * flags, their environment overrides (GUANACO_X and llama.cpp's
 * LLAMA_ARG_GUANACO_X), validation with messages that name the flag and the
 * accepted values, and the process-wide option values that result.
 *
 * The options are process-wide because llama.cpp's tools parse argv once,
 * before any model exists, and llama-bench has a parser of its own: taking our
 * flags out of argv here keeps the patch series to one call per parser.
 */
#include "guanaco.h"
#include "io.h"
#include "log.h"
#include "policy.h"
#include "predictor.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum option_kind { OPTION_BOOL, OPTION_CHOICE, OPTION_PATH, OPTION_SIZE, OPTION_NUMBER, OPTION_FRACTION };

struct option_spec {
    const char *flag;          /* without the leading "--" */
    const char *env;           /* GUANACO_ name; LLAMA_ARG_ is prepended for the other form */
    enum option_kind kind;
    const char *const *choices; /* OPTION_CHOICE: NULL-terminated, index = stored value */
    const char *help;
};

static const char *const readahead_choices[] = {"random", "normal", "sequential", NULL};
/* The policies', predictors' and io backends' names are their modules' lists (policy.h, predictor.h, io.h),
   index = their enum. */
#define CHOICE(name) name,
static const char *const policy_choices[] = {GUANACO_POLICY_KIND_NAMES(CHOICE) NULL};
static const char *const io_choices[] = {GUANACO_IO_BACKEND_NAMES(CHOICE) NULL};
static const char *const prefetch_choices[] = {GUANACO_PREDICTOR_KIND_NAMES(CHOICE) NULL};
/* Index = enum guanaco_load_mode (guanaco.h). */
static const char *const load_choices[] = {"page-cache", "direct", "auto", NULL};
/* Index = enum guanaco_repack_mode (guanaco.h), for --guanaco-repack and --guanaco-repack-cache. */
static const char *const repack_choices[] = {"off", "on", "auto", NULL};
/* Index = enum guanaco_when_fits (guanaco.h). */
static const char *const when_fits_choices[] = {"plain", "engine", NULL};
/* OPTION_FRACTION values are kept in millionths. */
#define FRACTION_SCALE 1000000.0

#define MAX_EXPERTS_LIMIT 65536
#define RAM_MIN_BYTES (1ull << 20)
#define RAM_MAX_BYTES (1ull << 50)

enum option_id {
    OPTION_STREAMING, OPTION_READAHEAD, OPTION_LOG, OPTION_TRACE_OUT, OPTION_TRACE_REPLAY,
    OPTION_RAM, OPTION_MAX_EXPERTS, OPTION_POLICY, OPTION_IO, OPTION_LOAD, OPTION_STATUS_EVERY, OPTION_AUDIT, OPTION_PRELOAD,
    OPTION_STREAM_PROMPTS, OPTION_HUGE_FOLIOS, OPTION_OVERLAP_LAYER, OPTION_FIXED_SLOTS, OPTION_PREFETCH, OPTION_PREFETCH_THROTTLE, OPTION_PILOT_MASS, OPTION_IMATRIX, OPTION_REFERENCE, OPTION_REPACK, OPTION_REPACK_CACHE, OPTION_STREAM_DIRECT, OPTION_WHEN_FITS, OPTION_COUNT
};

static const struct option_spec option_specs[OPTION_COUNT] = {
    [OPTION_STREAMING] = {"guanaco-streaming", "GUANACO_STREAMING", OPTION_BOOL, NULL,
                          "do not read expert tensors at load; fetch them from disk as the router needs them"},
    [OPTION_READAHEAD] = {"guanaco-readahead", "GUANACO_READAHEAD", OPTION_CHOICE, readahead_choices,
                          "kernel readahead advice over expert pages (default: normal, measured fastest)"},
    [OPTION_LOG] = {"guanaco-log", "GUANACO_LOG", OPTION_BOOL, NULL,
                    "print Guanaco's status lines (default: on)"},
    [OPTION_TRACE_OUT] = {"guanaco-trace-out", "GUANACO_TRACE_OUT", OPTION_PATH, NULL,
                          "record every routing decision to FILE (docs/TRACE.md)"},
    [OPTION_TRACE_REPLAY] = {"guanaco-trace-replay", "GUANACO_TRACE_REPLAY", OPTION_PATH, NULL,
                             "overwrite the router's choices with a recorded trace of the same model shape"},
    [OPTION_RAM] = {"guanaco-ram", "GUANACO_RAM", OPTION_SIZE, NULL,
                    "bytes of expert weights kept resident (e.g. 6G, 6144M, auto); turns the residency engine on"},
    [OPTION_MAX_EXPERTS] = {"guanaco-max-experts", "GUANACO_MAX_EXPERTS", OPTION_NUMBER, NULL,
                            "most resident experts per layer; turns the residency engine on"},
    [OPTION_POLICY] = {"guanaco-policy", "GUANACO_POLICY", OPTION_CHOICE, policy_choices,
                       "replacement policy of the residency engine (default: guanaco, measured)"},
    [OPTION_IO] = {"guanaco-io", "GUANACO_IO", OPTION_CHOICE, io_choices,
                   "how expert reads are issued (default: io_uring, measured faster; uring is accepted for "
                   "io_uring; GUANACO_IO_URING=0 means threads)"},
    [OPTION_LOAD] = {"guanaco-load", "GUANACO_LOAD", OPTION_CHOICE, load_choices,
                     "how a missing expert is made resident: page-cache (buffered reads, then mapped) or direct "
                     "(O_DIRECT into anonymous pages placed over the mapping; prompts still stream through the page cache) "
                     "or auto (default: direct, which decoded faster at every expert slice size measured; page-cache "
                     "where O_DIRECT or vm.max_map_count rule direct out: README)"},
    [OPTION_STATUS_EVERY] = {"guanaco-status-every", "GUANACO_STATUS_EVERY", OPTION_NUMBER, NULL,
                             "print a residency status line every N decoded tokens (default: 32)"},
    [OPTION_AUDIT] = {"guanaco-audit", "GUANACO_AUDIT", OPTION_BOOL, NULL,
                      "check the accounting against mincore on each status line (default: off; the walk costs "
                      "about 20 ms per 3 GB of experts)"},
    [OPTION_PRELOAD] = {"guanaco-preload", "GUANACO_PRELOAD", OPTION_BOOL, NULL,
                        "fill the budget at load with large sequential reads, as plain llama.cpp prefetches the "
                        "file (default: on)"},
    [OPTION_STREAM_PROMPTS] = {"guanaco-stream-prompts", "GUANACO_STREAM_PROMPTS", OPTION_BOOL, NULL,
                               "a prompt's ubatch streams each layer: what it reads is used once and dropped, "
                               "read ahead in 2 MiB folios, and the resident experts stay (default: on)"},
    [OPTION_HUGE_FOLIOS] = {"guanaco-huge-folios", "GUANACO_HUGE_FOLIOS", OPTION_BOOL, NULL,
                            "page-cache loading reads each expert slice's 2 MiB-aligned middle in 2 MiB folios, "
                            "where the kernel allows (default: on)"},
    [OPTION_OVERLAP_LAYER] = {"guanaco-overlap-layer", "GUANACO_OVERLAP_LAYER", OPTION_BOOL, NULL,
                              "a layer computes as soon as its missing experts' reads are issued, so its resident "
                              "experts compute while the disk reads: with direct loading the matmul waits for each "
                              "missing expert as it reaches it, with page-cache loading for each page in the kernel "
                              "(default: on with direct loading, off with page-cache loading: measured)"},
    [OPTION_FIXED_SLOTS] = {"guanaco-fixed-slots", "GUANACO_FIXED_SLOTS", OPTION_BOOL, NULL,
                            "with direct loading and --guanaco-overlap-layer: each expert computes from the "
                            "anonymous slot it was read into, and an evicted slot takes the next read, so loading "
                            "and evicting change no page table (default: on, measured: README)"},
    [OPTION_PREFETCH] = {"guanaco-prefetch", "GUANACO_PREFETCH", OPTION_CHOICE, prefetch_choices,
                         "read the next layer's experts while the current one computes, as predicted by: pilot "
                         "(cross-layer statistics), gate (the next layer's router on this layer's input; pilot "
                         "where it cannot run) or none; a prompt reads the whole next layer (default: pilot)"},
    [OPTION_PREFETCH_THROTTLE] = {"guanaco-prefetch-throttle", "GUANACO_PREFETCH_THROTTLE", OPTION_BOOL, NULL,
                                  "measure decode and prompt ubatches with read-ahead off and on, and keep it on only "
                                  "where it is faster; off reads ahead always (default: on)"},
    [OPTION_PILOT_MASS] = {"guanaco-pilot-mass", "GUANACO_PILOT_MASS", OPTION_FRACTION, NULL,
                           "pilot reads the smallest set of experts whose predicted probability reaches this "
                           "share (default: measured, see README)"},
    [OPTION_IMATRIX] = {"guanaco-imatrix", "GUANACO_IMATRIX", OPTION_PATH, NULL,
                        "an llama-imatrix GGUF of this model: its per-expert routing counts choose the experts "
                        "the preload reads (the most-routed of each layer, not the lowest-numbered)"},
    [OPTION_REFERENCE] = {"guanaco-reference", "GUANACO_REFERENCE", OPTION_BOOL, NULL,
                          "without streaming: keep expert tensors in the file's layout (not repacked), every other "
                          "weight as llama.cpp chooses; what bare --guanaco-streaming (no budget) equals bit for bit"},
    [OPTION_REPACK] = {"guanaco-repack", "GUANACO_REPACK", OPTION_CHOICE, repack_choices,
                       "with a budget, run resident experts on llama.cpp's repacked CPU kernels (Q4_0, Q4_K, IQ4_NL, "
                       "MXFP4 on x86), repacking each as it is read: on (the logits equal plain llama.cpp's default), "
                       "off (they equal --guanaco-reference; needed for several contexts at once), or auto: on when "
                       "the budget holds every expert or a repack cache is read, else off, as repacking each miss "
                       "costs more than it saves "
                       "(default: auto, measured; --no-repack turns it off)"},
    [OPTION_REPACK_CACHE] = {"guanaco-repack-cache", "GUANACO_REPACK_CACHE", OPTION_CHOICE, repack_choices,
                             "read repacked experts from <model>.guanaco-repack, written once by guanaco-repack-cache: "
                             "no repack per read, so --guanaco-repack auto turns on under a budget too (Q4_0, Q4_K: "
                             "measured); auto uses it "
                             "where it exists and matches the model and this CPU, on refuses to load without it, off "
                             "never reads it (default: auto)"},
    [OPTION_STREAM_DIRECT] = {"guanaco-stream-direct", "GUANACO_STREAM_DIRECT", OPTION_BOOL, NULL,
                              "with direct loading into fixed slots: a prompt's streamed layers are read with O_DIRECT "
                              "into two layer-sized anonymous buffers, held while the prompt streams, instead of "
                              "through the page cache, where they fit in memory beside the budget (default: on)"},
    [OPTION_WHEN_FITS] = {"guanaco-when-fits", "GUANACO_WHEN_FITS", OPTION_CHOICE, when_fits_choices,
                          "when an explicit --guanaco-ram holds every expert, nothing is ever read: plain leaves the "
                          "experts to llama.cpp, which loads them as without Guanaco (its repacked buffers, its "
                          "speed); engine holds them in Guanaco's own memory as under any budget. Replay, "
                          "--guanaco-trace-out, --guanaco-audit and --guanaco-repack off keep the engine (default: "
                          "plain)"},
};

/* Another name a choice is also accepted under: "uring" was io_uring's spelling on --guanaco-io until the
   flag took the backend's own name, and scripts may still say it. */
static const struct {
    enum option_id id;
    const char *alias;
    int value;
} choice_aliases[] = {
    {OPTION_IO, "uring", GUANACO_IO_URING},
};

struct option_state {
    int value[OPTION_COUNT];
    uint64_t number[OPTION_COUNT]; /* OPTION_SIZE (0 = auto) and OPTION_NUMBER */
    char path[OPTION_COUNT][GUANACO_PATH_BYTES];
    bool set_by_flag[OPTION_COUNT];
};

static struct option_state flag_state;
static pthread_mutex_t flag_mutex = PTHREAD_MUTEX_INITIALIZER;

static int default_value(enum option_id id) {
    switch (id) {
    case OPTION_STREAMING: return 0;
    case OPTION_READAHEAD: return GUANACO_READAHEAD_NORMAL; /* measured fastest: README "Readahead" */
    case OPTION_LOG: return 1;
    case OPTION_AUDIT: return 0; /* a diagnostic: its walk costs 5% of a 32-token decode (README) */
    case OPTION_PRELOAD: return 1;
    case OPTION_HUGE_FOLIOS: return 1; /* Mixtral Q4_0 at 25%: see README's --guanaco-huge-folios row */
    case OPTION_OVERLAP_LAYER: return -1; /* follows the load: README's --guanaco-overlap-layer row */
    case OPTION_FIXED_SLOTS: return 1; /* README's --guanaco-fixed-slots row */
    case OPTION_STREAM_DIRECT: return 1;
    case OPTION_STREAM_PROMPTS: return 1; /* 1024-token prompts 1.07-1.11x plain at 10-50%, 0.74-0.94x off (README) */
    case OPTION_REPACK: return GUANACO_REPACK_AUTO;
    case OPTION_REPACK_CACHE: return GUANACO_REPACK_AUTO;
    case OPTION_PREFETCH_THROTTLE: return 1;
    case OPTION_POLICY: return GUANACO_POLICY_DEFAULT; /* policy_choices is indexed by the enum */
    case OPTION_IO: return GUANACO_IO_URING;
    case OPTION_LOAD: return GUANACO_LOAD_AUTO; /* direct: bench/PIPELINE.md, "Direct loading at every slice size" */
    case OPTION_PREFETCH: return GUANACO_PREDICTOR_DEFAULT;
    default: return 0;
    }
}

static void describe_accepted(const struct option_spec *spec, char *buf, size_t size) {
    if (spec->kind == OPTION_PATH) {
        snprintf(buf, size, "a file path of at most %d bytes", GUANACO_PATH_BYTES - 1);
        return;
    }
    if (spec->kind == OPTION_SIZE) {
        snprintf(buf, size, "auto or a size from 1M to 1024T, e.g. 6G or 6144M");
        return;
    }
    if (spec->kind == OPTION_NUMBER) {
        snprintf(buf, size, "a whole number from 1 to %d", MAX_EXPERTS_LIMIT);
        return;
    }
    if (spec->kind == OPTION_BOOL) {
        snprintf(buf, size, "one of on|off|1|0|true|false");
        return;
    }
    if (spec->kind == OPTION_FRACTION) {
        snprintf(buf, size, "a number above 0 and at most 1, e.g. 0.9");
        return;
    }
    size_t used = (size_t)snprintf(buf, size, "one of ");
    for (int i = 0; spec->choices[i]; i++) {
        int n = snprintf(buf + used, size - used, "%s%s", i ? "|" : "", spec->choices[i]);
        if (n < 0 || (size_t)n >= size - used) {
            break;
        }
        used += (size_t)n;
    }
}

/* Returns 0 and the parsed value, or -EINVAL after naming `source` in a message. */
/* "6G", "6144M", "512K", "1073741824": binary units, as llama.cpp's sizes. 0 on failure. */
static uint64_t parse_size(const char *text) {
    /* strtod also takes " 6G", "nan", "inf" and "0x1p30": a size starts with a digit (or ".5G") */
    if (!((text[0] >= '0' && text[0] <= '9') || (text[0] == '.' && text[1] >= '0' && text[1] <= '9'))) {
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double amount = strtod(text, &end);
    if (end == text || errno != 0 || !(amount > 0) || (text[0] == '0' && (text[1] == 'x' || text[1] == 'X'))) {
        return 0;
    }
    double scale = 1;
    switch (*end) {
    case 'k': case 'K': scale = 1024.0; end++; break;
    case 'm': case 'M': scale = 1024.0 * 1024; end++; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') {
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    }
    double bytes = amount * scale;
    if (*end != '\0' || bytes < (double)RAM_MIN_BYTES || bytes > (double)RAM_MAX_BYTES) {
        return 0;
    }
    return (uint64_t)bytes;
}

/* True, with *value 1 or 0, when `text` is one of the on/off words. */
static bool parse_bool(const char *text, int *value) {
    static const char *const truthy[] = {"1", "on", "true", "yes"};
    static const char *const falsy[] = {"0", "off", "false", "no"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(text, truthy[i]) == 0) { *value = 1; return true; }
        if (strcasecmp(text, falsy[i]) == 0) { *value = 0; return true; }
    }
    return false;
}

static int parse_value(const struct option_spec *spec, const char *source, const char *text, int *value,
                       uint64_t *number) {
    if (spec->kind == OPTION_SIZE) {
        *value = 1;
        *number = strcmp(text, "auto") == 0 ? 0 : parse_size(text);
        if (*number || strcmp(text, "auto") == 0) {
            return 0;
        }
    } else if (spec->kind == OPTION_NUMBER) {
        char *end = NULL;
        errno = 0;
        long long parsed = strtoll(text, &end, 10);
        *value = 1;
        *number = (uint64_t)parsed;
        /* strtoll skips leading white space and takes a sign; a count is digits only */
        if (end != text && *end == '\0' && errno == 0 && parsed >= 1 && parsed <= MAX_EXPERTS_LIMIT &&
            text[0] >= '0' && text[0] <= '9') {
            return 0;
        }
    } else if (spec->kind == OPTION_FRACTION) {
        char *end = NULL;
        errno = 0;
        double parsed = strtod(text, &end);
        *value = 1;
        /* NaN fails both comparisons */
        if (end != text && *end == '\0' && errno == 0 && parsed > 0 && parsed <= 1 && text[0] != ' ') {
            *number = (uint64_t)(parsed * FRACTION_SCALE + 0.5);
            return 0;
        }
    } else if (spec->kind == OPTION_PATH) {
        *value = 1;
        if (text[0] != '\0' && strlen(text) < GUANACO_PATH_BYTES) {
            return 0;
        }
    } else if (spec->kind == OPTION_BOOL) {
        if (parse_bool(text, value)) {
            return 0;
        }
    } else {
        for (int i = 0; spec->choices[i]; i++) {
            if (strcmp(text, spec->choices[i]) == 0) { *value = i; return 0; }
        }
        for (size_t i = 0; i < sizeof(choice_aliases) / sizeof(choice_aliases[0]); i++) {
            if (spec == &option_specs[choice_aliases[i].id] && strcmp(text, choice_aliases[i].alias) == 0) {
                *value = choice_aliases[i].value;
                return 0;
            }
        }
    }
    char accepted[128];
    describe_accepted(spec, accepted, sizeof(accepted));
    guanaco_log_error("invalid value '%s' for %s: expected %s", text, source, accepted);
    return -EINVAL;
}

/* The environment's value for one option: LLAMA_ARG_GUANACO_X wins over GUANACO_X. */
static int read_env(enum option_id id, int *value, uint64_t *number, char *path, bool *found) {
    const struct option_spec *spec = &option_specs[id];
    char llama_name[96];
    snprintf(llama_name, sizeof(llama_name), "LLAMA_ARG_%s", spec->env);
    const char *names[2] = {llama_name, spec->env};
    *found = false;
    for (int i = 0; i < 2; i++) {
        const char *text = getenv(names[i]);
        if (text && text[0]) {
            *found = true;
            int err = parse_value(spec, names[i], text, value, number);
            if (err == 0 && spec->kind == OPTION_PATH) {
                snprintf(path, GUANACO_PATH_BYTES, "%s", text);
            }
            return err;
        }
    }
    return 0;
}

/* GUANACO_IO_URING=0 is the documented switch to the thread pool; GUANACO_IO and the flag win over it. */
static int read_io_uring_switch(int *io) {
    static const struct option_spec spec = {"guanaco-io-uring", "GUANACO_IO_URING", OPTION_BOOL, NULL, ""};
    const char *text = getenv(spec.env);
    int on = 1;
    if (!text || !text[0]) {
        return 0;
    }
    if (parse_value(&spec, spec.env, text, &on, &(uint64_t){0}) < 0) {
        return -EINVAL;
    }
    *io = on ? GUANACO_IO_URING : GUANACO_IO_THREADS;
    return 0;
}

int guanaco_options_get(struct guanaco_options *out) {
    int value[OPTION_COUNT];
    uint64_t number[OPTION_COUNT] = {0};
    static char path[OPTION_COUNT][GUANACO_PATH_BYTES]; /* guarded by flag_mutex */
    int err = 0;
    pthread_mutex_lock(&flag_mutex);
    for (int id = 0; id < OPTION_COUNT; id++) {
        path[id][0] = '\0';
        if (flag_state.set_by_flag[id]) {
            value[id] = flag_state.value[id];
            memcpy(path[id], flag_state.path[id], GUANACO_PATH_BYTES);
            number[id] = flag_state.number[id];
            continue;
        }
        bool found = false;
        int rc = read_env((enum option_id)id, &value[id], &number[id], path[id], &found);
        if (rc < 0) {
            err = rc;
        }
        if (rc < 0 || !found) {
            value[id] = default_value((enum option_id)id);
        }
        if (rc == 0 && !found && id == OPTION_IO && (rc = read_io_uring_switch(&value[id])) < 0) {
            err = rc;
        }
    }
    /* Direct loading overlaps by default: the stall fell by a third there. Page-cache loading does not: its matmuls
       fault 4 KiB at a time what one populate maps, which ate the gain on 2 cores (README). */
    const bool overlap_follows_load = value[OPTION_OVERLAP_LAYER] < 0;
    if (overlap_follows_load) {
        value[OPTION_OVERLAP_LAYER] = value[OPTION_LOAD] != GUANACO_LOAD_PAGE_CACHE; /* auto is direct */
    }
    snprintf(out->trace_out, sizeof(out->trace_out), "%s", path[OPTION_TRACE_OUT]);
    snprintf(out->trace_replay, sizeof(out->trace_replay), "%s", path[OPTION_TRACE_REPLAY]);
    snprintf(out->imatrix, sizeof(out->imatrix), "%s", path[OPTION_IMATRIX]);
    pthread_mutex_unlock(&flag_mutex);
    out->streaming = value[OPTION_STREAMING] != 0;
    out->readahead = (enum guanaco_readahead)value[OPTION_READAHEAD];
    out->log = value[OPTION_LOG] != 0;
    out->residency = value[OPTION_RAM] != 0 || value[OPTION_MAX_EXPERTS] != 0;
    out->ram_bytes = value[OPTION_RAM] ? number[OPTION_RAM] : 0;
    out->max_experts = value[OPTION_MAX_EXPERTS] ? (uint32_t)number[OPTION_MAX_EXPERTS] : 0;
    out->policy = value[OPTION_POLICY];
    out->io = value[OPTION_IO];
    out->load = (enum guanaco_load_mode)value[OPTION_LOAD];
    out->audit = value[OPTION_AUDIT] != 0;
    out->preload = value[OPTION_PRELOAD] != 0;
    out->stream_prompts = value[OPTION_STREAM_PROMPTS] != 0;
    out->huge_folios = value[OPTION_HUGE_FOLIOS] != 0;
    out->overlap_layer = value[OPTION_OVERLAP_LAYER] != 0;
    out->overlap_layer_follows_load = overlap_follows_load;
    out->fixed_slots = value[OPTION_FIXED_SLOTS] != 0;
    out->stream_direct = value[OPTION_STREAM_DIRECT] != 0;
    out->prefetch = value[OPTION_PREFETCH];
    out->prefetch_throttle = value[OPTION_PREFETCH_THROTTLE] != 0;
    out->pilot_mass = value[OPTION_PILOT_MASS] ? (double)number[OPTION_PILOT_MASS] / FRACTION_SCALE : 0.0;
    out->reference = value[OPTION_REFERENCE] != 0;
    out->repack = (enum guanaco_repack_mode)value[OPTION_REPACK];
    out->repack_cache = (enum guanaco_repack_mode)value[OPTION_REPACK_CACHE];
    out->when_fits = (enum guanaco_when_fits)value[OPTION_WHEN_FITS];
    out->status_every = value[OPTION_STATUS_EVERY] ? (uint32_t)number[OPTION_STATUS_EVERY] : GUANACO_DEFAULT_STATUS_EVERY;
    guanaco_log_set_enabled(out->log);
    return err;
}

static void print_help(void) {
    printf("\n----- Guanaco (MoE expert streaming) -----\n\n");
    for (int id = 0; id < OPTION_COUNT; id++) {
        const struct option_spec *spec = &option_specs[id];
        char accepted[128];
        describe_accepted(spec, accepted, sizeof(accepted));
        char usage[160];
        if (spec->kind == OPTION_BOOL) {
            snprintf(usage, sizeof(usage), "--%s[=on|off]", spec->flag);
        } else if (spec->kind == OPTION_PATH) {
            snprintf(usage, sizeof(usage), "--%s FILE", spec->flag);
        } else if (spec->kind == OPTION_SIZE || spec->kind == OPTION_NUMBER || spec->kind == OPTION_FRACTION) {
            snprintf(usage, sizeof(usage), "--%s %s", spec->flag,
                     spec->kind == OPTION_SIZE ? "SIZE|auto" : spec->kind == OPTION_NUMBER ? "N" : "X");
        } else {
            snprintf(usage, sizeof(usage), "--%s {%s}", spec->flag, accepted + strlen("one of "));
        }
        printf("%-48s %s\n%-48s (env: %s, LLAMA_ARG_%s)\n", usage, spec->help, "", spec->env, spec->env);
    }
    printf("\n");
}

static const struct option_spec *find_flag(const char *arg, enum option_id *id, const char **inline_value) {
    if (strncmp(arg, "--", 2) != 0) {
        return NULL;
    }
    const char *name = arg + 2;
    for (int i = 0; i < OPTION_COUNT; i++) {
        size_t len = strlen(option_specs[i].flag);
        if (strncmp(name, option_specs[i].flag, len) == 0 && (name[len] == '\0' || name[len] == '=')) {
            *id = (enum option_id)i;
            *inline_value = name[len] == '=' ? name + len + 1 : NULL;
            return &option_specs[i];
        }
    }
    return NULL;
}

int guanaco_options_parse_argv(int *argc, char **argv) {
    int kept = 1;
    int err = 0;
    bool help = false;
    for (int i = 1; i < *argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0 || strcmp(arg, "--usage") == 0) {
            help = true;
        }
        enum option_id id;
        const char *value_text = NULL;
        const struct option_spec *spec = find_flag(arg, &id, &value_text);
        if (!spec) {
            if (strncmp(arg, "--guanaco-", 10) == 0) {
                guanaco_log_error("unknown flag %s (see --help for Guanaco's flags)", arg);
                err = -EINVAL;
            }
            argv[kept++] = argv[i];
            continue;
        }
        if (!value_text && spec->kind == OPTION_BOOL) {
            /* "--guanaco-audit off" as well as "--guanaco-audit=off": the next argument is the flag's value
               when it is one; otherwise the bare flag means on. */
            int next_value;
            value_text = "on";
            if (i + 1 < *argc && parse_bool(argv[i + 1], &next_value)) {
                value_text = argv[++i];
            }
        } else if (!value_text) {
            if (i + 1 >= *argc) {
                char accepted[128];
                describe_accepted(spec, accepted, sizeof(accepted));
                guanaco_log_error("--%s needs a value: %s", spec->flag, accepted);
                err = -EINVAL;
                continue;
            }
            value_text = argv[++i];
        }
        char source[80];
        snprintf(source, sizeof(source), "--%s", spec->flag);
        int value;
        uint64_t number = 0;
        if (parse_value(spec, source, value_text, &value, &number) < 0) {
            err = -EINVAL;
            continue;
        }
        pthread_mutex_lock(&flag_mutex);
        flag_state.value[id] = value;
        flag_state.number[id] = number;
        if (spec->kind == OPTION_PATH) {
            snprintf(flag_state.path[id], GUANACO_PATH_BYTES, "%s", value_text);
        }
        flag_state.set_by_flag[id] = true;
        pthread_mutex_unlock(&flag_mutex);
    }
    argv[kept] = NULL;
    *argc = kept;
    if (help) {
        print_help();
    }
    if (err == 0) {
        /* Validate the environment now too, so a bad GUANACO_X fails before any work. */
        struct guanaco_options ignored;
        err = guanaco_options_get(&ignored);
    }
    return err;
}
