/*
 * guanaco.h - the public C API of libguanaco.
 *
 * libguanaco lets llama.cpp run Mixture-of-Experts models whose expert weights
 * do not fit in RAM. llama.cpp calls into it from a small patch series at four
 * points, and nowhere else:
 *
 *   1. argument parsing:  guanaco_options_parse_argv() takes the --guanaco-*
 *                         flags out of argv before llama.cpp's parser sees them;
 *   2. model load:        guanaco_engine_open() reads the GGUF's expert layout,
 *                         the loader asks guanaco_engine_is_expert_tensor() to
 *                         mark those tensors lazy and
 *                         guanaco_weight_keeps_file_layout() which tensors it
 *                         must not repack, and guanaco_engine_attach()
 *                         sees where they were mapped;
 *   3. context creation:  guanaco_hook_install() chains an eval callback that
 *                         watches the router's choice (ffn_moe_topk) per layer;
 *   4. teardown:          guanaco_hook_remove() and guanaco_engine_close().
 *
 * Conventions (after liburing): functions that can fail return 0 or a negative
 * errno; objects are created and destroyed by the caller, never implicitly.
 */
#ifndef GUANACO_H
#define GUANACO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml-backend.h" /* ggml_backend_sched_eval_callback */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- options ----------------------------------------------------------- */

/* How expert pages that are not resident get read by the kernel's fault path. */
enum guanaco_readahead {
    GUANACO_READAHEAD_RANDOM = 0,     /* MADV_RANDOM: fault exactly the touched pages */
    GUANACO_READAHEAD_NORMAL = 1,     /* kernel default readahead window */
    GUANACO_READAHEAD_SEQUENTIAL = 2, /* MADV_SEQUENTIAL: aggressive readahead */
};

/* How the residency engine makes a missing expert's bytes resident. */
enum guanaco_load_mode {
    GUANACO_LOAD_PAGE_CACHE = 0, /* buffered reads fill the page cache, MADV_POPULATE_READ maps them */
    GUANACO_LOAD_DIRECT = 1,     /* O_DIRECT reads into anonymous pages moved over the expert's range */
    GUANACO_LOAD_AUTO = 2,       /* direct, with its fallbacks (no O_DIRECT, vm.max_map_count): measured faster */
};

/* Whether resident experts run on llama.cpp's repacked CPU kernels (each repacked as it is read). */
enum guanaco_repack_mode {
    GUANACO_REPACK_OFF = 0,  /* the file's layout: logits equal --guanaco-reference */
    GUANACO_REPACK_ON = 1,   /* every type that has a repacked kernel: logits equal plain llama.cpp's default */
    GUANACO_REPACK_AUTO = 2, /* where it pays: when the budget holds every expert, so nothing is read after load */
};

/* What an explicit --guanaco-ram that holds every expert does with them. */
enum guanaco_when_fits {
    GUANACO_WHEN_FITS_PLAIN = 0,  /* nothing would ever be read: llama.cpp loads the experts as without Guanaco */
    GUANACO_WHEN_FITS_ENGINE = 1, /* the engine holds them, as under any budget (status lines, its own slots) */
};

#define GUANACO_PATH_BYTES 4096
#define GUANACO_DEFAULT_STATUS_EVERY 32u

struct guanaco_options {
    bool streaming;                   /* --guanaco-streaming */
    enum guanaco_readahead readahead; /* --guanaco-readahead */
    bool log;                         /* GUANACO_LOG / --guanaco-log */
    char trace_out[GUANACO_PATH_BYTES];    /* --guanaco-trace-out: "" when not recording */
    char trace_replay[GUANACO_PATH_BYTES]; /* --guanaco-trace-replay: "" when not replaying */
    char imatrix[GUANACO_PATH_BYTES];      /* --guanaco-imatrix: the routing prior's file, "" when none */
    bool residency;        /* a budget was given: --guanaco-ram and/or --guanaco-max-experts */
    uint64_t ram_bytes;    /* --guanaco-ram; 0 = auto (or not given) */
    uint32_t max_experts;  /* --guanaco-max-experts; 0 = no cap */
    int policy;            /* --guanaco-policy: an enum guanaco_policy_kind */
    int io;                /* --guanaco-io: an enum guanaco_io_backend */
    enum guanaco_load_mode load; /* --guanaco-load */
    uint32_t status_every; /* --guanaco-status-every: tokens between status lines */
    bool audit;            /* --guanaco-audit: mincore check on each status line */
    bool preload;          /* --guanaco-preload: fill the budget at load */
    bool stream_prompts;   /* --guanaco-stream-prompts: prompts use their reads once, in huge folios */
    bool huge_folios;      /* --guanaco-huge-folios: 2 MiB-aligned ranges read in huge folios (page cache) */
    bool overlap_layer;    /* --guanaco-overlap-layer: a layer computes once its reads are issued (default: with
                              direct loading) */
    bool overlap_layer_follows_load; /* not given: the engine turns it on exactly where it loads directly */
    bool fixed_slots;      /* --guanaco-fixed-slots: direct loading's copies compute where they were read */
    bool stream_direct;    /* --guanaco-stream-direct: streamed prompts read with O_DIRECT into two layer buffers */
    int prefetch;          /* --guanaco-prefetch: an enum guanaco_predictor_kind; none = no read-ahead */
    bool prefetch_throttle; /* --guanaco-prefetch-throttle: read ahead only where measured faster */
    double pilot_mass;     /* --guanaco-pilot-mass; 0 = the predictor's default */
    bool reference;        /* --guanaco-reference: plain llama.cpp computing as bare streaming does */
    enum guanaco_repack_mode repack; /* --guanaco-repack (expert_repack.h) */
    /* --guanaco-repack-cache (repack_cache.h): on = required, auto = where a valid one exists, off = never */
    enum guanaco_repack_mode repack_cache;
    enum guanaco_when_fits when_fits; /* --guanaco-when-fits */
};

/*
 * Remove every --guanaco-* argument from argv (shifting the rest down and
 * updating *argc), validate it and store it as the process's options. Flags
 * override the environment (GUANACO_X and LLAMA_ARG_GUANACO_X). Seeing -h or
 * --help also prints Guanaco's own flags. Returns 0, or -EINVAL after printing
 * a message that names the flag and the accepted values.
 */
int guanaco_options_parse_argv(int *argc, char **argv);

/*
 * The options in force: defaults, then the environment, then any flags given
 * to guanaco_options_parse_argv(). Returns -EINVAL (with a message) when an
 * environment variable holds an invalid value.
 */
int guanaco_options_get(struct guanaco_options *out);

/* ---- engine: one per loaded model ---------------------------------------- */

struct guanaco_engine;

/*
 * Open the engine for a model being loaded from `path` (and `n_split_paths`
 * shards in `split_paths`, or none for a single file). `dry_run` is for the
 * loader's no-compute memory-fit pass: same decisions, no mapping, no output.
 * `repack_allowed` is llama.cpp's use_extra_bufts (false with --no-repack):
 * whether resident experts may run on the repacked kernels.
 *
 * Returns 0 and sets *out to NULL when streaming is off or the model is dense
 * (no *_exps tensors; it then says so in one line), 0 with an engine, or a
 * negative errno with a message when the file cannot be understood.
 */
int guanaco_engine_open(const char *path, const char *const *split_paths, size_t n_split_paths,
                        bool dry_run, bool repack_allowed, struct guanaco_engine **out);

/* True when `tensor_name` is an expert tensor (blk.N.ffn_*_exps.*) of this model. */
bool guanaco_engine_is_expert_tensor(const struct guanaco_engine *engine, const char *tensor_name);

/*
 * True when the loader must give `tensor_name` llama.cpp's plain CPU buffer
 * type, i.e. keep the file's layout, instead of llama.cpp's choice (on x86 a
 * CPU_REPACK buffer for Q4_0, Q4_K, IQ4_NL, MXFP4): the streamed experts, and
 * with --guanaco-reference every expert tensor. Any other weight keeps
 * llama.cpp's choice, so it is repacked as in plain llama.cpp.
 */
bool guanaco_weight_keeps_file_layout(const struct guanaco_engine *engine, const char *tensor_name);

/*
 * After the loader has created and mapped the tensors: look each expert tensor
 * up through `lookup` and apply the chosen readahead advice to its pages.
 * Returns 0 or a negative errno with a message.
 */
typedef struct ggml_tensor *(*guanaco_tensor_lookup)(const char *name, void *user);
int guanaco_engine_attach(struct guanaco_engine *engine, guanaco_tensor_lookup lookup, void *user);

/* Print the summary line and free the engine. NULL is accepted. */
void guanaco_engine_close(struct guanaco_engine *engine);

/* Accesses counted so far for (layer, expert); 0 when out of range. */
uint64_t guanaco_engine_access_count(const struct guanaco_engine *engine, int layer, int expert);

/* ---- the router hook: one per context ----------------------------------- */

/*
 * Chain Guanaco's eval callback in front of *callback / *user_data, which
 * are replaced. Does nothing (returns 0) when engine is NULL. Returns -ENOMEM.
 */
int guanaco_hook_install(struct guanaco_engine *engine, ggml_backend_sched_eval_callback *callback,
                         void **user_data);

/* A context's host memory (KV cache and compute buffers): +bytes once it has allocated them, -bytes
   before it frees them. With --guanaco-ram auto the budget is sized again around the live contexts.
   NULL engine accepted (streaming off). */
void guanaco_engine_context_memory(struct guanaco_engine *engine, int64_t bytes);

/*
 * After a graph computed with the installed pair: the first error of that graph (a negative errno: the
 * router's ids could not be read, or a layer's experts could not be made resident, which the hook has
 * already printed), clearing it; 0 when there was none or the pair is not Guanaco's. The hook stopped
 * the graph where it failed, so its outputs must not be used: llama.cpp fails the decode.
 */
int guanaco_hook_take_error(ggml_backend_sched_eval_callback callback, void *user_data);

/*
 * llama-server's /metrics: Guanaco's counters of every open engine with a budget, in Prometheus's text
 * format (guanaco_*); "" when there is none (or no memory for the text). The text lives in a buffer of
 * the calling thread, valid until that thread's next call, like strerror's, so the glue is one
 * expression.
 */
const char *guanaco_metrics_prometheus(void);

/* Undo guanaco_hook_install() given the installed pair; other pairs are ignored. */
void guanaco_hook_remove(ggml_backend_sched_eval_callback callback, void *user_data);

#ifdef __cplusplus
}
#endif

#endif /* GUANACO_H */
