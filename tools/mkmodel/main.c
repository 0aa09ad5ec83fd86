/*
 * guanaco-mkmodel: writes synthetic Mixture-of-Experts GGUF models.
 *
 * Guanaco streams MoE expert weights from disk, and its tests need real-shaped
 * MoE models while no weights can be downloaded.  This file owns the command
 * line: parsing, choosing the architecture, quant type and vocab, checking a
 * shape against what the chosen architecture's loader assumes, and running
 * the plan and the writer.  The tables of architectures, presets and quant
 * types live in tables.c, the tensor plan in plan.c, the random weights in
 * weights.c, the threaded encoding in encode.c and the GGUF writer in
 * writer.c.
 *
 * GGUF metadata comes only from ggml's gguf API and tensor data only from
 * ggml's own converters (ggml_quantize_chunk, ggml_fp32_to_fp16), so the files
 * have exactly the layout llama.cpp reads.
 */

#define _POSIX_C_SOURCE 200809L

#include "mkmodel.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void vprint_error(const char *fmt, va_list ap) {
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}

void print_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
}

_Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    exit(1);
}

static void print_usage(FILE *out) {
    fprintf(out,
        "usage: " PROG " --arch ARCH [--preset NAME] [--quant TYPE] [--seed N] [--vocab VOCAB.gguf] -o OUT.gguf\n"
        "                [--n-layer N] [--n-embd N] [--n-ff-exp N] [--n-expert N] [--n-expert-used N]\n"
        "                [--split-count N] [--threads N] [--fused-gate-up | --no-fused-gate-up]\n"
        "       " PROG " --list\n"
        "       " PROG " --help\n"
        "\n"
        "Writes a synthetic MoE GGUF with deterministic random weights that stock llama.cpp runs.\n"
        "\n"
        "  --arch ARCH        architecture (see --list); optional with a real-shape preset\n"
        "  --preset NAME      tiny (default), qwen3-30b-a3b, mixtral-8x7b\n"
        "  --quant TYPE       F16, Q8_0, Q4_0, Q4_K, MXFP4 (default Q4_0; MXFP4 for gpt-oss).\n"
        "                     Applies to experts and large matrices; norms, router, biases stay F32.\n"
        "  --seed N           weights are a pure function of N and the tensor name (default 1)\n"
        "  --vocab FILE       vocab-only GGUF (models/ggml-vocab-*.gguf); default:\n"
        "                     $GUANACO_VOCAB_DIR/<preset vocab file>\n"
        "  -o, --output OUT   output path\n"
        "  --n-layer N        [1, %d]\n"
        "  --n-embd N         [64, 65536], multiple of 32\n"
        "  --n-ff-exp N       [32, 65536], multiple of 32\n"
        "  --n-expert N       [1, %d]\n"
        "  --n-expert-used N  [1, n-expert]\n"
        "  --split-count N    [1, %d]: write OUT-0000k-of-0000N.gguf shards like gguf-split\n"
        "  --threads N        [1, %d] generator threads (default: online CPUs); output is identical\n"
        "  --fused-gate-up    store experts as one ffn_gate_up_exps (archs that accept it)\n"
        "  --no-fused-gate-up store separate ffn_gate_exps / ffn_up_exps\n",
        LLAMA_MAX_LAYERS, LLAMA_MAX_EXPERTS, MAX_SPLITS, MAX_THREADS);
}

static void print_list(void) {
    for (size_t i = 0; i < N_ARCHS; i++) {
        printf("arch %s\n", ARCHS[i].name);
    }
    for (size_t i = 0; i < N_PRESETS; i++) {
        printf("preset %s\n", PRESETS[i].name);
    }
    for (size_t i = 0; i < N_QUANTS; i++) {
        printf("quant %s\n", QUANTS[i].name);
    }
}

static int64_t parse_int(const char *flag, const char *text, int64_t lo, int64_t hi) {
    errno = 0;
    char *end = NULL;
    const long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != 0 || v < lo || v > hi) {
        die("%s: expected an integer in [%" PRId64 ", %" PRId64 "], got '%s'", flag, lo, hi, text);
    }
    return (int64_t)v;
}

static uint64_t parse_seed(const char *text) {
    errno = 0;
    char *end = NULL;
    if (text[0] == '-' || text[0] == 0) {
        die("--seed: expected a non-negative integer, got '%s'", text);
    }
    const unsigned long long v = strtoull(text, &end, 0);
    if (errno != 0 || *end != 0) {
        die("--seed: expected a non-negative integer, got '%s'", text);
    }
    return (uint64_t)v;
}

struct options {
    const char *arch;
    const char *preset;
    const char *quant;
    const char *vocab;
    const char *output;
    uint64_t seed;
    int64_t n_layer, n_embd, n_ff_exp, n_expert, n_expert_used; /* 0: keep */
    int64_t split_count;
    int64_t n_threads; /* 0: one per online CPU */
    int fused;         /* -1: arch default */
};

static struct options parse_args(int argc, char **argv) {
    struct options o = { .seed = 1, .split_count = 1, .fused = -1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_usage(stdout);
            exit(0);
        }
        if (strcmp(a, "--list") == 0) {
            print_list();
            exit(0);
        }
        if (strcmp(a, "--fused-gate-up") == 0)    { o.fused = 1; continue; }
        if (strcmp(a, "--no-fused-gate-up") == 0) { o.fused = 0; continue; }

        const bool takes_value =
            strcmp(a, "--arch") == 0 || strcmp(a, "--preset") == 0 || strcmp(a, "--quant") == 0 ||
            strcmp(a, "--seed") == 0 || strcmp(a, "--vocab") == 0 || strcmp(a, "-o") == 0 ||
            strcmp(a, "--output") == 0 || strcmp(a, "--n-layer") == 0 || strcmp(a, "--n-embd") == 0 ||
            strcmp(a, "--n-ff-exp") == 0 || strcmp(a, "--n-expert") == 0 ||
            strcmp(a, "--n-expert-used") == 0 || strcmp(a, "--split-count") == 0 ||
            strcmp(a, "--threads") == 0;
        if (!takes_value) {
            die("unknown argument '%s' (see --help)", a);
        }
        if (i + 1 >= argc) {
            die("%s needs a value", a);
        }
        const char *v = argv[++i];
        if      (strcmp(a, "--arch") == 0)   o.arch = v;
        else if (strcmp(a, "--preset") == 0) o.preset = v;
        else if (strcmp(a, "--quant") == 0)  o.quant = v;
        else if (strcmp(a, "--vocab") == 0)  o.vocab = v;
        else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) o.output = v;
        else if (strcmp(a, "--seed") == 0)   o.seed = parse_seed(v);
        else if (strcmp(a, "--n-layer") == 0)       o.n_layer       = parse_int(a, v, 1, LLAMA_MAX_LAYERS);
        else if (strcmp(a, "--n-embd") == 0)        o.n_embd        = parse_int(a, v, 64, 65536);
        else if (strcmp(a, "--n-ff-exp") == 0)      o.n_ff_exp      = parse_int(a, v, 32, 65536);
        else if (strcmp(a, "--n-expert") == 0)      o.n_expert      = parse_int(a, v, 1, LLAMA_MAX_EXPERTS);
        else if (strcmp(a, "--n-expert-used") == 0) o.n_expert_used = parse_int(a, v, 1, LLAMA_MAX_EXPERTS);
        else if (strcmp(a, "--split-count") == 0)   o.split_count   = parse_int(a, v, 1, MAX_SPLITS);
        else if (strcmp(a, "--threads") == 0)       o.n_threads     = parse_int(a, v, 1, MAX_THREADS);
    }
    return o;
}

/* Applies size overrides and checks the shape against what the arch's loader
 * and graph assume, so bad combinations fail here instead of inside llama.cpp. */
static void apply_overrides(struct model_shape *s, const struct arch_desc *a, const struct options *o) {
    if (a->features & F_DENSE) {
        if (o->n_ff_exp || o->n_expert || o->n_expert_used) {
            die("%s is a dense architecture: --n-ff-exp, --n-expert and --n-expert-used do not apply", a->name);
        }
        s->n_expert = s->n_expert_used = s->n_ff_exp = 0;
    }
    if (o->n_layer)  s->n_layer = o->n_layer;
    if (o->n_embd)   s->n_embd = o->n_embd;
    if (o->n_ff_exp) s->n_ff_exp = o->n_ff_exp;
    if (o->n_expert) s->n_expert = o->n_expert;
    if (o->n_expert_used) s->n_expert_used = o->n_expert_used;

    if (s->n_embd % 32 != 0) {
        die("--n-embd must be a multiple of 32, got %" PRId64, s->n_embd);
    }
    if (s->n_ff_exp % 32 != 0 && !(a->features & F_DENSE)) {
        die("--n-ff-exp must be a multiple of 32, got %" PRId64, s->n_ff_exp);
    }
    if (s->n_expert_used > s->n_expert) {
        die("--n-expert-used (%" PRId64 ") must not exceed --n-expert (%" PRId64 ")",
            s->n_expert_used, s->n_expert);
    }
    if (a->features & F_HEADS_FROM_EMBD) {
        if (s->n_embd % s->head_dim != 0) {
            die("%s needs --n-embd to be a multiple of the head size %" PRId64, a->name, s->head_dim);
        }
        s->n_head = s->n_head_kv = s->n_embd / s->head_dim;
    }
    if (a->features & F_DENSE) {
        s->n_dense_lead = s->n_layer;
    } else if (s->n_dense_lead >= s->n_layer) {
        /* keep at least one MoE block, otherwise it is not an MoE model */
        s->n_dense_lead = s->n_layer - 1;
    }
    if (s->n_rot == 0) {
        s->n_rot = s->head_dim;
    }
    if (a->features & (F_GATED_DELTA | F_SHORTCONV)) {
        if (s->n_layer < s->full_attn_interval) {
            die("%s needs --n-layer >= %" PRId64 " so that one block has full attention",
                a->name, s->full_attn_interval);
        }
    }
    if ((a->features & F_MAMBA2) && s->n_layer < 3) {
        die("%s needs --n-layer >= 3 so that it has a mamba2, a MoE and an attention block", a->name);
    }
}

/* The preset and the architecture: named, known and agreeing; dies otherwise. */
static const struct arch_desc *choose_arch(const struct options *o, const struct preset_desc **preset_out) {
    const struct preset_desc *preset = find_preset(o->preset ? o->preset : "tiny");
    if (!preset) {
        die("unknown preset '%s' (see --list)", o->preset);
    }
    const char *arch_name = o->arch ? o->arch : preset->arch;
    if (!arch_name) {
        die("--arch is required with preset %s (see --list)", preset->name);
    }
    const struct arch_desc *arch = find_arch(arch_name);
    if (!arch) {
        die("unknown architecture '%s' (see --list)", arch_name);
    }
    if (preset->arch && strcmp(preset->arch, arch->name) != 0) {
        die("preset %s is a %s model, not %s", preset->name, preset->arch, arch->name);
    }
    *preset_out = preset;
    return arch;
}

/* --quant, or the architecture's default; dies on a type mkmodel cannot write. */
static const struct quant_desc *choose_quant(const struct options *o, const struct arch_desc *arch) {
    const struct quant_desc *quant = o->quant ? find_quant_by_name(o->quant)
                                               : find_quant_by_type(arch->default_quant);
    if (!quant) {
        die("unsupported quant type '%s' (supported: F16, Q8_0, Q4_0, Q4_K, MXFP4)", o->quant);
    }
    return quant;
}

/* Whether the experts are stored as one fused ffn_gate_up_exps: the flag, or the architecture's default. */
static bool choose_fused(const struct options *o, const struct arch_desc *arch) {
    bool fused = (arch->features & F_FUSED_DEFAULT) != 0;
    if (o->fused >= 0) {
        if (o->fused && !(arch->features & F_FUSED_OK)) {
            die("%s does not accept a fused ffn_gate_up_exps tensor (deepseek2 and qwen35moe do)", arch->name);
        }
        fused = o->fused != 0;
    }
    return fused;
}

/* --vocab, or the preset's vocab file in $GUANACO_VOCAB_DIR. */
static void vocab_path_for(const struct options *o, const struct preset_desc *preset, char *path, size_t size) {
    if (o->vocab) {
        snprintf(path, size, "%s", o->vocab);
        return;
    }
    const char *dir = getenv("GUANACO_VOCAB_DIR");
    if (!dir || !*dir) {
        die("no vocab: pass --vocab FILE or set GUANACO_VOCAB_DIR to a directory holding %s", preset->vocab_file);
    }
    snprintf(path, size, "%s/%s", dir, preset->vocab_file);
}

/* What the writer needs besides the plan: the output paths, the seed, the shards, the threads and the name. */
static void make_job(const struct options *o, const struct arch_desc *arch, const struct preset_desc *preset,
                     const struct quant_desc *quant, const struct model_shape *shape,
                     const struct gguf_context *vocab, struct write_job *job) {
    *job = (struct write_job){
        .arch = arch, .quant = quant, .shape = shape, .vocab = vocab,
        .seed = o->seed, .split_count = (int)o->split_count, .n_threads = (int)o->n_threads,
    };
    if (job->n_threads == 0) {
        const long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
        job->n_threads = n_cpu < 1 ? 1 : (n_cpu > MAX_THREADS ? MAX_THREADS : (int)n_cpu);
    }
    if (strlen(o->output) >= sizeof(job->out_path) - 32) {
        die("output path too long");
    }
    snprintf(job->out_path, sizeof(job->out_path), "%s", o->output);
    snprintf(job->prefix, sizeof(job->prefix), "%s", o->output);
    const size_t len = strlen(job->prefix);
    if (len > 5 && strcmp(job->prefix + len - 5, ".gguf") == 0) {
        job->prefix[len - 5] = 0;
    }
    snprintf(job->model_name, sizeof(job->model_name), "guanaco synthetic %s %s %s seed %" PRIu64,
             arch->name, preset->name, quant->name, o->seed);
}

/* The tensors, their types (saying which fall back to a wider type) and their shards. */
static void plan_tensors(struct tensor_plan *plan, const struct arch_desc *arch, const struct model_shape *shape,
                         bool fused, const struct quant_desc *quant, int split_count) {
    plan_model(plan, arch, shape, fused);
    const int n_fallback = assign_types(plan, quant->type);
    if (n_fallback > 0) {
        fprintf(stderr, PROG ": note: %d tensor(s) use Q8_0/F16 because their rows do not fit %s blocks\n",
                n_fallback, quant->name);
    }
    if ((size_t)split_count > plan->n) {
        die("--split-count %d exceeds the number of tensors (%zu)", split_count, plan->n);
    }
    assign_shards(plan, split_count);
}

int main(int argc, char **argv) {
    const struct options o = parse_args(argc, argv);
    const struct preset_desc *preset = NULL;
    const struct arch_desc *arch = choose_arch(&o, &preset);
    if (!o.output) {
        die("no output file given (-o OUT.gguf)");
    }
    const struct quant_desc *quant = choose_quant(&o, arch);
    const bool fused = choose_fused(&o, arch);

    struct model_shape shape = preset->arch ? preset->shape : arch->tiny;
    apply_overrides(&shape, arch, &o);

    char vocab_path[PATH_MAX];
    vocab_path_for(&o, preset, vocab_path, sizeof(vocab_path));
    struct gguf_context *vocab = load_vocab(vocab_path, &shape.n_vocab);

    struct write_job job;
    make_job(&o, arch, preset, quant, &shape, vocab, &job);
    struct tensor_plan plan = {0};
    plan_tensors(&plan, arch, &shape, fused, quant, job.split_count);

    const int rc = write_model(&job, &plan);

    free(plan.v);
    gguf_free(vocab);
    ggml_quantize_free();
    return rc;
}
