/*
 * mkmodel.h - what the parts of guanaco-mkmodel share: the model shape, the
 * architecture/preset/quant tables' row types, the tensor plan, the write job,
 * and the functions each part exports.
 *
 * The parts: tables.c (which GGUF keys, shapes and defaults each
 * architecture has), plan.c (which tensors, with which types and shards),
 * weights.c (deterministic random values), encode.c (a chunk of rows generated
 * and encoded on worker threads), writer.c (the vocab copy and the streaming
 * GGUF shard writer) and main.c (the command line).
 */
#ifndef GUANACO_MKMODEL_H
#define GUANACO_MKMODEL_H

/* PATH_MAX from limits.h */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "ggml.h"
#include "gguf.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROG "guanaco-mkmodel"

/* Limits and enum values from llama.cpp's src/llama-hparams.h. */
#define LLAMA_MAX_LAYERS  512
#define LLAMA_MAX_EXPERTS 1024
#define GATING_SOFTMAX        1u
#define GATING_SIGMOID        2u

/* Upper bound on floats generated at once: keeps memory constant no matter how
 * big the model is, while rows stay long enough for efficient quantization. */
#define CHUNK_FLOATS (2u << 20)

#define MAX_SPLITS 99
#define MAX_THREADS 256

void print_error(const char *fmt, ...);
/* Only for failures before any output file exists: later failures go through
 * the normal return path so partially written shards get removed. */
_Noreturn void die(const char *fmt, ...);

struct model_shape {
    int64_t n_layer;
    int64_t n_embd;
    int64_t n_ff;            /* dense FFN width (leading dense blocks) */
    int64_t n_ff_exp;        /* width of one routed expert */
    int64_t n_expert;
    int64_t n_expert_used;
    int64_t n_expert_shared; /* shared experts, each n_ff_exp wide */
    int64_t n_dense_lead;    /* leading blocks with a dense FFN instead of MoE */
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;
    int64_t n_rot;           /* rotary dims; 0 means the full head */
    /* multi-head latent attention (deepseek2) */
    int64_t q_lora_rank;     /* unused by "lite" variants, see deepseek2_is_lite */
    int64_t kv_lora_rank;
    int64_t qk_nope_dim;
    int64_t qk_rope_dim;
    int64_t v_head_dim;
    /* gated delta net (qwen35moe) */
    int64_t ssm_conv_kernel;
    int64_t ssm_state;
    int64_t ssm_group;
    int64_t ssm_v_heads;
    int64_t full_attn_interval;
    int64_t n_ff_shexp;      /* qwen35moe / nemotron_h_moe shared expert width */
    /* mamba2 (nemotron_h_moe) also uses ssm_conv_kernel, ssm_state, ssm_group;
     * ssm_v_heads is its head count (time_step_rank) */
    int64_t ssm_inner;
    int64_t shortconv_l_cache; /* lfm2moe's short convolution length */

    int64_t n_ctx_train;
    int64_t sliding_window;
    float   rope_freq_base;
    float   rms_eps;
    int64_t n_vocab;         /* from the vocab file */
};

enum arch_feature {
    F_QK_NORM_HEAD    = 1u << 0,  /* attn_{q,k}_norm per head */
    F_QK_NORM_EMBD    = 1u << 1,  /* attn_{q,k}_norm over the whole projection (olmoe) */
    F_QKV_BIAS        = 1u << 2,
    F_ATTN_OUT_BIAS   = 1u << 3,
    F_ATTN_SINKS      = 1u << 4,
    F_MLA             = 1u << 5,  /* deepseek2 latent attention instead of q/k/v */
    F_POST_ATTN_NORM  = 1u << 6,  /* FFN pre-norm is named post_attention_norm */
    F_ROUTER_BIAS     = 1u << 7,
    F_EXPERT_BIAS     = 1u << 8,
    F_EXP_PROBS_B     = 1u << 9,
    F_SHARED_EXPERTS  = 1u << 10, /* *_shexp, n_expert_shared * n_ff_exp wide */
    F_FUSED_OK        = 1u << 11, /* loader accepts ffn_gate_up_exps */
    F_FUSED_DEFAULT   = 1u << 12,
    F_HEADS_FROM_EMBD = 1u << 13, /* q projection must be n_embd wide (olmoe) */
    F_GATED_DELTA     = 1u << 14, /* qwen35moe hybrid layers */
    F_DENSE           = 1u << 15, /* no experts at all: the control case */
    F_SHORTCONV       = 1u << 16, /* lfm2moe: short-convolution layers, attention every full_attn_interval */
    F_MAMBA2          = 1u << 17, /* nemotron_h_moe: separate mamba2, attention and MoE blocks */
    F_SANDWICH_NORM   = 1u << 18, /* afmoe: pre and post norms around attention and FFN */
    F_ATTN_GATE       = 1u << 19, /* afmoe: attn_gate, a sigmoid gate on the attention output */
    F_LFM2_OUT_NORM   = 1u << 20, /* lfm2moe: the final norm is stored as token_embd_norm */
};

struct arch_desc {
    const char *name;        /* --arch value */
    const char *gguf_arch;   /* general.architecture, also the key prefix */
    unsigned     features;
    enum ggml_type default_quant;
    struct model_shape tiny;
    void (*add_kv)(struct gguf_context *g, const char *a, const struct model_shape *s);
};

struct preset_desc {
    const char *name;
    const char *arch;        /* NULL: any arch, shape comes from the arch table */
    const char *vocab_file;  /* looked up in GUANACO_VOCAB_DIR */
    struct model_shape shape;
};

struct quant_desc {
    const char *name;
    enum ggml_type type;
    uint32_t llama_ftype; /* general.file_type, enum llama_ftype */
};

enum tensor_kind {
    T_EMBED,   /* token_embd / output: quant type */
    T_EXPERT,  /* *_exps: quant type */
    T_MATRIX,  /* other 2D weights: quant type (Q8_0 under MXFP4) */
    T_ROUTER,  /* ffn_gate_inp*: F32, as real models keep it */
    T_NORM,    /* F32, values near 1 */
    T_BIAS,    /* F32, small values */
    T_SSM_A,   /* F32, negative decay rates */
    T_CONV,    /* F32 conv kernel: llama-quant never quantizes it */
};

struct tensor_spec {
    char             name[GGML_MAX_NAME];
    int              n_dims;
    int64_t          ne[GGML_MAX_DIMS];
    enum tensor_kind kind;
    enum ggml_type   type;
    size_t           nbytes;
    int              shard;
};

struct tensor_plan {
    struct tensor_spec *v;
    size_t n;
    size_t cap;
};

struct write_job {
    const struct arch_desc *arch;
    const struct quant_desc *quant;
    const struct model_shape *shape;
    char model_name[128];  /* general.name */
    const struct gguf_context *vocab;
    uint64_t seed;
    int split_count;
    int n_threads;
    char prefix[PATH_MAX]; /* OUT without .gguf */
    char out_path[PATH_MAX];
};

/* One chunk of rows: generated as F32 into src, encoded into dst. */
struct chunk_buffer {
    float *src;
    uint8_t *dst;
};

/* One worker's share of a chunk: generate rows, then encode them. */
struct encode_task {
    const struct tensor_spec *t;
    uint64_t tseed;
    int64_t row0;
    int64_t n_rows;
    float *src;
    uint8_t *dst;
    size_t out_size;
};

/* A chunk being encoded in the background. */
struct encode_batch {
    struct encode_task tasks[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    bool   started[MAX_THREADS];
    int    n_workers;
};

/* What one block's mixer is, for the hybrid architectures. */
enum layer_role {
    ROLE_ATTENTION,
    ROLE_RECURRENT, /* shortconv (lfm2moe) or mamba2 (nemotron_h_moe) */
    ROLE_FFN_ONLY,  /* nemotron_h_moe: a block with only the MoE */
};

/* tables.c */
enum layer_role layer_role(unsigned features, const struct model_shape *s, int il);
extern const struct arch_desc ARCHS[];
extern const size_t N_ARCHS;
extern const struct preset_desc PRESETS[];
extern const size_t N_PRESETS;
extern const struct quant_desc QUANTS[];
extern const size_t N_QUANTS;
const struct arch_desc *find_arch(const char *name);
const struct preset_desc *find_preset(const char *name);
const struct quant_desc *find_quant_by_name(const char *name);
const struct quant_desc *find_quant_by_type(enum ggml_type t);
bool deepseek2_is_lite(const struct model_shape *s);

/* plan.c */
void plan_model(struct tensor_plan *p, const struct arch_desc *a, const struct model_shape *s, bool fused);
int assign_types(struct tensor_plan *p, enum ggml_type quant);
void assign_shards(struct tensor_plan *p, int n_shards);

/* weights.c */
uint64_t tensor_seed(uint64_t seed, const char *name);
void fill_rows(float *dst, const struct tensor_spec *t, uint64_t tseed, int64_t row0, int64_t n_rows);

/* encode.c */
void encode_start(struct encode_batch *b, const struct tensor_spec *t, uint64_t tseed,
                  int64_t row0, int64_t n_rows, const struct chunk_buffer *out, int n_threads);
size_t encode_finish(struct encode_batch *b);

/* writer.c */
struct gguf_context *load_vocab(const char *path, int64_t *n_vocab);
int write_model(const struct write_job *job, struct tensor_plan *plan);

#endif
