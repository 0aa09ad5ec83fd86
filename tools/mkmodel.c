/*
 * guanaco-mkmodel: writes synthetic Mixture-of-Experts GGUF models.
 *
 * Guanaco streams MoE expert weights from disk, and its tests need real-shaped
 * MoE models while no weights can be downloaded.  This tool owns:
 *   - the table of supported architectures: which GGUF keys and which tensors
 *     (names, shapes, types) stock llama.cpp expects for each of them;
 *   - the presets (tiny test shapes and the real shapes of Qwen3-30B-A3B and
 *     Mixtral-8x7B);
 *   - deterministic random weights (a pure function of --seed and the tensor
 *     name, so write order and chunking never change a byte);
 *   - streaming, constant-memory GGUF writing, optionally as gguf-split shards.
 *
 * GGUF metadata comes only from ggml's gguf API and tensor data only from
 * ggml's own converters (ggml_quantize_chunk, ggml_fp32_to_fp16), so the files
 * have exactly the layout llama.cpp reads.  Generation is split across threads
 * by rows; the bytes do not depend on the thread count.
 */

#define _POSIX_C_SOURCE 200809L

#include "ggml.h"
#include "gguf.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

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

static void vprint_error(const char * fmt, va_list ap) {
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}

static void print_error(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
}

/* Only for failures before any output file exists: later failures go through
 * the normal return path so partially written shards get removed. */
static _Noreturn void die(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    exit(1);
}

/* ------------------------------------------------------------------------ */
/* Model shape                                                               */
/* ------------------------------------------------------------------------ */

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
    int64_t n_ff_shexp;      /* qwen35moe shared expert width */

    int64_t n_ctx_train;
    int64_t sliding_window;
    float   rope_freq_base;
    float   rms_eps;
    int64_t n_vocab;         /* from the vocab file */
};

/* ------------------------------------------------------------------------ */
/* Architecture table                                                        */
/* ------------------------------------------------------------------------ */

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
};

struct arch_desc {
    const char * name;        /* --arch value */
    const char * gguf_arch;   /* general.architecture, also the key prefix */
    unsigned     features;
    enum ggml_type default_quant;
    struct model_shape tiny;
    void (*add_kv)(struct gguf_context * g, const char * a, const struct model_shape * s);
};

static void kv_u32(struct gguf_context * g, const char * arch, const char * key, int64_t v) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    gguf_set_val_u32(g, full, (uint32_t) v);
}

static void kv_f32(struct gguf_context * g, const char * arch, const char * key, float v) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    gguf_set_val_f32(g, full, v);
}

static void kv_bool(struct gguf_context * g, const char * arch, const char * key, bool v) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    gguf_set_val_bool(g, full, v);
}

/* Keys every supported architecture reads the same way. */
static void kv_common(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_u32(g, a, "vocab_size",       s->n_vocab);
    kv_u32(g, a, "context_length",   s->n_ctx_train);
    kv_u32(g, a, "embedding_length", s->n_embd);
    kv_u32(g, a, "block_count",      s->n_layer);
    kv_u32(g, a, "attention.head_count",    s->n_head);
    kv_u32(g, a, "attention.head_count_kv", s->n_head_kv);
    kv_f32(g, a, "attention.layer_norm_rms_epsilon", s->rms_eps);
    kv_f32(g, a, "rope.freq_base",   s->rope_freq_base);
    if (s->n_expert > 0) {
        kv_u32(g, a, "expert_count",      s->n_expert);
        kv_u32(g, a, "expert_used_count", s->n_expert_used);
    }
}

/* Head size is only implied by n_embd / n_head unless written; write it
 * whenever that implication would be wrong. */
static void kv_head_dim_if_needed(struct gguf_context * g, const char * a, const struct model_shape * s) {
    if (s->n_head * s->head_dim != s->n_embd) {
        kv_u32(g, a, "attention.key_length",   s->head_dim);
        kv_u32(g, a, "attention.value_length", s->head_dim);
    }
}

static void kv_qwen3moe(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",        s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "attention.key_length",       s->head_dim);
    kv_u32(g, a, "attention.value_length",     s->head_dim);
}

/* Mixtral GGUFs are plain "llama" files whose FFN width is the expert width. */
static void kv_mixtral(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",   s->n_ff_exp);
    kv_u32(g, a, "rope.dimension_count",  s->head_dim);
    kv_head_dim_if_needed(g, a, s);
}

static void kv_llama_dense(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",   s->n_ff);
    kv_u32(g, a, "rope.dimension_count",  s->head_dim);
    kv_head_dim_if_needed(g, a, s);
}

static bool deepseek2_is_lite(const struct model_shape * s) {
    /* mirrors llama_model_deepseek2::load_arch_hparams: these variants have no q_lora */
    return s->n_layer == 27 || s->n_layer == 26 || (s->n_layer == 48 && s->n_vocab == 128256);
}

/* MLA is stored as MQA over the compressed KV (see conversion/deepseek.py):
 * key_length/value_length describe the latent cache, *_mla the real heads. */
static void kv_deepseek2(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",         s->n_ff);
    kv_u32(g, a, "leading_dense_block_count",   s->n_dense_lead);
    if (!deepseek2_is_lite(s)) {
        kv_u32(g, a, "attention.q_lora_rank",   s->q_lora_rank);
    }
    kv_u32(g, a, "attention.kv_lora_rank",      s->kv_lora_rank);
    kv_u32(g, a, "attention.key_length",        s->kv_lora_rank + s->qk_rope_dim);
    kv_u32(g, a, "attention.value_length",      s->kv_lora_rank);
    kv_u32(g, a, "attention.key_length_mla",    s->qk_nope_dim + s->qk_rope_dim);
    kv_u32(g, a, "attention.value_length_mla",  s->v_head_dim);
    kv_u32(g, a, "rope.dimension_count",        s->qk_rope_dim);
    kv_u32(g, a, "expert_feed_forward_length",  s->n_ff_exp);
    kv_u32(g, a, "expert_shared_count",         s->n_expert_shared);
    kv_f32(g, a, "expert_weights_scale",        1.0f);
    kv_u32(g, a, "expert_gating_func",          GATING_SOFTMAX);
}

static void kv_gptoss(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",        s->n_ff_exp);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "attention.key_length",       s->head_dim);
    kv_u32(g, a, "attention.value_length",     s->head_dim);
    kv_u32(g, a, "attention.sliding_window",   s->sliding_window);
}

static void kv_olmoe(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length", s->n_ff_exp);
}

static void kv_glm4moe(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",        s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "expert_shared_count",        s->n_expert_shared);
    kv_u32(g, a, "leading_dense_block_count",  s->n_dense_lead);
    kv_u32(g, a, "attention.key_length",       s->head_dim);
    kv_u32(g, a, "attention.value_length",     s->head_dim);
    kv_u32(g, a, "rope.dimension_count",       s->n_rot);
    kv_f32(g, a, "expert_weights_scale",       1.0f);
    kv_bool(g, a, "expert_weights_norm",       true);
    kv_u32(g, a, "expert_gating_func",         GATING_SIGMOID);
}

static void kv_qwen35moe(struct gguf_context * g, const char * a, const struct model_shape * s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",               s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length",        s->n_ff_exp);
    kv_u32(g, a, "expert_shared_feed_forward_length", s->n_ff_shexp);
    kv_u32(g, a, "attention.key_length",              s->head_dim);
    kv_u32(g, a, "attention.value_length",            s->head_dim);
    kv_u32(g, a, "rope.dimension_count",              s->n_rot);
    /* text-only positions: all rotary pairs in the first (temporal) section */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
    const int32_t sections[4] = { (int32_t) (s->n_rot / 2), 0, 0, 0 };
    gguf_set_arr_data(g, key, GGUF_TYPE_INT32, sections, 4);
    kv_u32(g, a, "ssm.conv_kernel",        s->ssm_conv_kernel);
    kv_u32(g, a, "ssm.state_size",         s->ssm_state);
    kv_u32(g, a, "ssm.group_count",        s->ssm_group);
    kv_u32(g, a, "ssm.time_step_rank",     s->ssm_v_heads);
    kv_u32(g, a, "ssm.inner_size",         s->ssm_state * s->ssm_v_heads);
    kv_u32(g, a, "full_attention_interval", s->full_attn_interval);
}

/* Tiny shapes: multiples of 256 so every quant type applies without fallback;
 * about 14 MB at Q4_0 (mostly the two 32000-token embedding matrices), written
 * in a fraction of a second. */
#define TINY_SHAPE(kv_heads, rope_base, eps) \
    .n_layer = 4, .n_embd = 256, .n_ff = 512, .n_ff_exp = 256, \
    .n_expert = 8, .n_expert_used = 2, .n_head = 4, .n_head_kv = (kv_heads), .head_dim = 64, \
    .n_ctx_train = 4096, .rope_freq_base = (rope_base), .rms_eps = (eps)

static const struct arch_desc ARCHS[] = {
    { "qwen3moe", "qwen3moe", F_QK_NORM_HEAD, GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 1000000.0f, 1e-6f) }, kv_qwen3moe },
    { "mixtral", "llama", 0, GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 1000000.0f, 1e-5f) }, kv_mixtral },
    { "deepseek2", "deepseek2",
      F_MLA | F_SHARED_EXPERTS | F_FUSED_OK, GGML_TYPE_Q4_0,
      { TINY_SHAPE(1, 10000.0f, 1e-6f), .n_expert_shared = 1, .n_dense_lead = 1,
        .q_lora_rank = 256, .kv_lora_rank = 128, .qk_nope_dim = 64, .qk_rope_dim = 32,
        .v_head_dim = 64 }, kv_deepseek2 },
    { "gpt-oss", "gpt-oss",
      F_QKV_BIAS | F_ATTN_OUT_BIAS | F_ATTN_SINKS | F_POST_ATTN_NORM | F_ROUTER_BIAS | F_EXPERT_BIAS,
      GGML_TYPE_MXFP4,
      { TINY_SHAPE(2, 150000.0f, 1e-5f), .sliding_window = 128 },
      kv_gptoss },
    { "olmoe", "olmoe", F_QK_NORM_EMBD | F_HEADS_FROM_EMBD, GGML_TYPE_Q4_0,
      { TINY_SHAPE(4, 10000.0f, 1e-5f) }, kv_olmoe },
    { "glm4moe", "glm4moe",
      F_QKV_BIAS | F_POST_ATTN_NORM | F_EXP_PROBS_B | F_SHARED_EXPERTS, GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 1000000.0f, 1e-5f), .n_expert_shared = 1, .n_dense_lead = 1, .n_rot = 32 },
      kv_glm4moe },
    /* dense Llama, so tests can check that expert-free models pass through untouched */
    { "llama", "llama", F_DENSE, GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 10000.0f, 1e-5f) }, kv_llama_dense },
    { "qwen35moe", "qwen35moe",
      F_QK_NORM_HEAD | F_POST_ATTN_NORM | F_FUSED_OK | F_FUSED_DEFAULT | F_GATED_DELTA,
      GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 10000000.0f, 1e-6f), .n_rot = 64, .n_ff_shexp = 256,
        .ssm_conv_kernel = 4, .ssm_state = 64, .ssm_group = 2, .ssm_v_heads = 4,
        .full_attn_interval = 4 },
      kv_qwen35moe },
};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

/* ------------------------------------------------------------------------ */
/* Presets                                                                   */
/* ------------------------------------------------------------------------ */

struct preset_desc {
    const char * name;
    const char * arch;        /* NULL: any arch, shape comes from the arch table */
    const char * vocab_file;  /* looked up in GUANACO_VOCAB_DIR */
    struct model_shape shape;
};

static const struct preset_desc PRESETS[] = {
    /* llama-spm keeps tiny models small: 32000 tokens */
    { "tiny", NULL, "ggml-vocab-llama-spm.gguf", { 0 } },
    { "qwen3-30b-a3b", "qwen3moe", "ggml-vocab-qwen2.gguf",
      { .n_layer = 48, .n_embd = 2048, .n_ff = 6144, .n_ff_exp = 768, .n_expert = 128,
        .n_expert_used = 8, .n_head = 32, .n_head_kv = 4, .head_dim = 128,
        .n_ctx_train = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f } },
    { "mixtral-8x7b", "mixtral", "ggml-vocab-llama-spm.gguf",
      { .n_layer = 32, .n_embd = 4096, .n_ff = 14336, .n_ff_exp = 14336, .n_expert = 8,
        .n_expert_used = 2, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
        .n_ctx_train = 32768, .rope_freq_base = 1000000.0f, .rms_eps = 1e-5f } },
};
#define N_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

/* ------------------------------------------------------------------------ */
/* Quantization types                                                        */
/* ------------------------------------------------------------------------ */

struct quant_desc {
    const char *   name;
    enum ggml_type type;
    uint32_t       llama_ftype; /* general.file_type, enum llama_ftype */
};

static const struct quant_desc QUANTS[] = {
    { "F16",   GGML_TYPE_F16,   1 },
    { "Q8_0",  GGML_TYPE_Q8_0,  7 },
    { "Q4_0",  GGML_TYPE_Q4_0,  2 },
    { "Q4_K",  GGML_TYPE_Q4_K,  14 }, /* all Q4_K, i.e. Q4_K_S */
    { "MXFP4", GGML_TYPE_MXFP4, 38 }, /* MXFP4_MOE: experts MXFP4, rest Q8_0 */
};
#define N_QUANTS (sizeof QUANTS / sizeof QUANTS[0])

static const struct quant_desc * find_quant_by_name(const char * name) {
    for (size_t i = 0; i < N_QUANTS; i++) {
        const char * a = QUANTS[i].name;
        const char * b = name;
        while (*a && *b && toupper((unsigned char) *a) == toupper((unsigned char) *b)) { a++; b++; }
        if (*a == 0 && *b == 0) {
            return &QUANTS[i];
        }
    }
    return NULL;
}

static const struct quant_desc * find_quant_by_type(enum ggml_type t) {
    for (size_t i = 0; i < N_QUANTS; i++) {
        if (QUANTS[i].type == t) {
            return &QUANTS[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Tensor plan                                                               */
/* ------------------------------------------------------------------------ */

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
    struct tensor_spec * v;
    size_t n;
    size_t cap;
};

static void plan_add(struct tensor_plan * p, enum tensor_kind kind, int n_dims,
                     int64_t ne0, int64_t ne1, int64_t ne2, const char * fmt, ...) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->v = realloc(p->v, p->cap * sizeof *p->v);
        if (!p->v) {
            die("out of memory");
        }
    }
    struct tensor_spec * t = &p->v[p->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->ne[3] = 1;
    t->kind = kind;
}

static void plan_attention_standard(struct tensor_plan * p, const struct arch_desc * a,
                                    const struct model_shape * s, int il) {
    const int64_t n_q  = s->n_head * s->head_dim;
    const int64_t n_kv = s->n_head_kv * s->head_dim;
    /* qwen35moe packs an output gate next to every query head */
    const int64_t n_q_proj = (a->features & F_GATED_DELTA) ? 2 * n_q : n_q;

    plan_add(p, T_MATRIX, 2, s->n_embd, n_q_proj, 0, "blk.%d.attn_q.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, n_kv,     0, "blk.%d.attn_k.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, n_kv,     0, "blk.%d.attn_v.weight", il);
    if (a->features & F_QKV_BIAS) {
        plan_add(p, T_BIAS, 1, n_q_proj, 0, 0, "blk.%d.attn_q.bias", il);
        plan_add(p, T_BIAS, 1, n_kv,     0, 0, "blk.%d.attn_k.bias", il);
        plan_add(p, T_BIAS, 1, n_kv,     0, 0, "blk.%d.attn_v.bias", il);
    }
    plan_add(p, T_MATRIX, 2, n_q, s->n_embd, 0, "blk.%d.attn_output.weight", il);
    if (a->features & F_ATTN_OUT_BIAS) {
        plan_add(p, T_BIAS, 1, s->n_embd, 0, 0, "blk.%d.attn_output.bias", il);
    }
    if (a->features & F_QK_NORM_HEAD) {
        plan_add(p, T_NORM, 1, s->head_dim, 0, 0, "blk.%d.attn_q_norm.weight", il);
        plan_add(p, T_NORM, 1, s->head_dim, 0, 0, "blk.%d.attn_k_norm.weight", il);
    }
    if (a->features & F_QK_NORM_EMBD) {
        plan_add(p, T_NORM, 1, n_q,  0, 0, "blk.%d.attn_q_norm.weight", il);
        plan_add(p, T_NORM, 1, n_kv, 0, 0, "blk.%d.attn_k_norm.weight", il);
    }
    if (a->features & F_ATTN_SINKS) {
        plan_add(p, T_BIAS, 1, s->n_head, 0, 0, "blk.%d.attn_sinks.weight", il);
    }
}

static void plan_attention_mla(struct tensor_plan * p, const struct model_shape * s, int il) {
    const int64_t head_k = s->qk_nope_dim + s->qk_rope_dim;

    if (deepseek2_is_lite(s)) {
        plan_add(p, T_MATRIX, 2, s->n_embd, s->n_head * head_k, 0, "blk.%d.attn_q.weight", il);
    } else {
        plan_add(p, T_NORM,   1, s->q_lora_rank, 0, 0,                  "blk.%d.attn_q_a_norm.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_embd, s->q_lora_rank, 0,          "blk.%d.attn_q_a.weight", il);
        plan_add(p, T_MATRIX, 2, s->q_lora_rank, s->n_head * head_k, 0, "blk.%d.attn_q_b.weight", il);
    }
    plan_add(p, T_NORM,   1, s->kv_lora_rank, 0, 0, "blk.%d.attn_kv_a_norm.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, s->kv_lora_rank + s->qk_rope_dim, 0, "blk.%d.attn_kv_a_mqa.weight", il);
    /* the absorbed form: kv_b split per head, k_b transposed (conversion/deepseek.py) */
    plan_add(p, T_MATRIX, 3, s->qk_nope_dim, s->kv_lora_rank, s->n_head, "blk.%d.attn_k_b.weight", il);
    plan_add(p, T_MATRIX, 3, s->kv_lora_rank, s->v_head_dim, s->n_head,  "blk.%d.attn_v_b.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_head * s->v_head_dim, s->n_embd, 0,    "blk.%d.attn_output.weight", il);
}

/* qwen35moe's linear-attention layers (llama_model_qwen35moe::load_arch_tensors). */
static void plan_gated_delta(struct tensor_plan * p, const struct model_shape * s, int il) {
    const int64_t key_dim   = s->ssm_state * s->ssm_group;
    const int64_t value_dim = s->ssm_state * s->ssm_v_heads;
    const int64_t conv_dim  = 2 * key_dim + value_dim;

    plan_add(p, T_MATRIX, 2, s->n_embd, conv_dim, 0,        "blk.%d.attn_qkv.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, value_dim, 0,       "blk.%d.attn_gate.weight", il);
    plan_add(p, T_CONV,   2, s->ssm_conv_kernel, conv_dim, 0, "blk.%d.ssm_conv1d.weight", il);
    plan_add(p, T_BIAS,   1, s->ssm_v_heads, 0, 0,          "blk.%d.ssm_dt.bias", il);
    plan_add(p, T_SSM_A,  1, s->ssm_v_heads, 0, 0,          "blk.%d.ssm_a", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, s->ssm_v_heads, 0,  "blk.%d.ssm_beta.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, s->ssm_v_heads, 0,  "blk.%d.ssm_alpha.weight", il);
    plan_add(p, T_NORM,   1, s->ssm_state, 0, 0,            "blk.%d.ssm_norm.weight", il);
    plan_add(p, T_MATRIX, 2, value_dim, s->n_embd, 0,       "blk.%d.ssm_out.weight", il);
}

static void plan_ffn(struct tensor_plan * p, const struct arch_desc * a,
                     const struct model_shape * s, int il, bool fused) {
    if (il < s->n_dense_lead) {
        plan_add(p, T_MATRIX, 2, s->n_embd, s->n_ff, 0, "blk.%d.ffn_gate.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_ff, s->n_embd, 0, "blk.%d.ffn_down.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_embd, s->n_ff, 0, "blk.%d.ffn_up.weight", il);
        return;
    }

    plan_add(p, T_ROUTER, 2, s->n_embd, s->n_expert, 0, "blk.%d.ffn_gate_inp.weight", il);
    if (a->features & F_ROUTER_BIAS) {
        plan_add(p, T_BIAS, 1, s->n_expert, 0, 0, "blk.%d.ffn_gate_inp.bias", il);
    }
    if (a->features & F_EXP_PROBS_B) {
        plan_add(p, T_BIAS, 1, s->n_expert, 0, 0, "blk.%d.exp_probs_b.bias", il);
    }

    if (fused) {
        plan_add(p, T_EXPERT, 3, s->n_embd, 2 * s->n_ff_exp, s->n_expert, "blk.%d.ffn_gate_up_exps.weight", il);
    } else {
        plan_add(p, T_EXPERT, 3, s->n_embd, s->n_ff_exp, s->n_expert, "blk.%d.ffn_gate_exps.weight", il);
        plan_add(p, T_EXPERT, 3, s->n_embd, s->n_ff_exp, s->n_expert, "blk.%d.ffn_up_exps.weight", il);
    }
    plan_add(p, T_EXPERT, 3, s->n_ff_exp, s->n_embd, s->n_expert, "blk.%d.ffn_down_exps.weight", il);
    if (a->features & F_EXPERT_BIAS) {
        plan_add(p, T_BIAS, 2, s->n_ff_exp, s->n_expert, 0, "blk.%d.ffn_gate_exps.bias", il);
        plan_add(p, T_BIAS, 2, s->n_ff_exp, s->n_expert, 0, "blk.%d.ffn_up_exps.bias", il);
        plan_add(p, T_BIAS, 2, s->n_embd,   s->n_expert, 0, "blk.%d.ffn_down_exps.bias", il);
    }

    if (a->features & F_SHARED_EXPERTS) {
        const int64_t n_sh = s->n_ff_exp * s->n_expert_shared;
        plan_add(p, T_MATRIX, 2, s->n_embd, n_sh, 0, "blk.%d.ffn_gate_shexp.weight", il);
        plan_add(p, T_MATRIX, 2, n_sh, s->n_embd, 0, "blk.%d.ffn_down_shexp.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_embd, n_sh, 0, "blk.%d.ffn_up_shexp.weight", il);
    }
    if (a->features & F_GATED_DELTA) {
        plan_add(p, T_ROUTER, 1, s->n_embd, 0, 0,            "blk.%d.ffn_gate_inp_shexp.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_embd, s->n_ff_shexp, 0, "blk.%d.ffn_gate_shexp.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_ff_shexp, s->n_embd, 0, "blk.%d.ffn_down_shexp.weight", il);
        plan_add(p, T_MATRIX, 2, s->n_embd, s->n_ff_shexp, 0, "blk.%d.ffn_up_shexp.weight", il);
    }
}

static bool is_recurrent_layer(const struct arch_desc * a, const struct model_shape * s, int il) {
    return (a->features & F_GATED_DELTA) && (il + 1) % s->full_attn_interval != 0;
}

static void plan_model(struct tensor_plan * p, const struct arch_desc * a,
                       const struct model_shape * s, bool fused) {
    plan_add(p, T_EMBED, 2, s->n_embd, s->n_vocab, 0, "token_embd.weight");
    for (int il = 0; il < s->n_layer; il++) {
        plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.attn_norm.weight", il);
        if (a->features & F_MLA) {
            plan_attention_mla(p, s, il);
        } else if (is_recurrent_layer(a, s, il)) {
            plan_gated_delta(p, s, il);
        } else {
            plan_attention_standard(p, a, s, il);
        }
        if (a->features & F_POST_ATTN_NORM) {
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.post_attention_norm.weight", il);
        } else {
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.ffn_norm.weight", il);
        }
        plan_ffn(p, a, s, il, fused);
    }
    plan_add(p, T_NORM,  1, s->n_embd, 0, 0, "output_norm.weight");
    plan_add(p, T_EMBED, 2, s->n_embd, s->n_vocab, 0, "output.weight");
}

/* A row length the block type cannot divide falls back the way llama-quant's
 * tensor_type_fallback ends up: a 32-wide block type, then F16. */
static enum ggml_type fit_type(enum ggml_type t, int64_t ne0) {
    while (ne0 % ggml_blck_size(t) != 0) {
        t = (t == GGML_TYPE_Q8_0) ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
    }
    return t;
}

static int assign_types(struct tensor_plan * p, enum ggml_type quant) {
    int n_fallback = 0;
    for (size_t i = 0; i < p->n; i++) {
        struct tensor_spec * t = &p->v[i];
        enum ggml_type want;
        switch (t->kind) {
            case T_EXPERT: want = quant; break;
            case T_EMBED:
                /* Q4_K's reference quantizer is ~20x slower than the rest; on
                 * the 32000 x n_embd embeddings it would dominate tiny models */
                want = (quant == GGML_TYPE_MXFP4 || quant == GGML_TYPE_Q4_K) ? GGML_TYPE_Q8_0 : quant;
                break;
            case T_MATRIX:
                /* matches llama-quant's MXFP4_MOE: only experts get MXFP4 */
                want = (quant == GGML_TYPE_MXFP4) ? GGML_TYPE_Q8_0 : quant;
                break;
            default: want = GGML_TYPE_F32; break;
        }
        t->type = fit_type(want, t->ne[0]);
        if (t->type != want) {
            n_fallback++;
        }
        t->nbytes = ggml_row_size(t->type, t->ne[0]) * (size_t) (t->ne[1] * t->ne[2] * t->ne[3]);
    }
    return n_fallback;
}

/* ------------------------------------------------------------------------ */
/* Deterministic weights                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t * state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t tensor_seed(uint64_t seed, const char * name) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (const unsigned char * c = (const unsigned char *) name; *c; c++) {
        h = (h ^ *c) * 0x100000001B3ull;
    }
    uint64_t mix = seed ^ h;
    return splitmix64(&mix);
}

/* Each row gets its own stream, so a row's values never depend on how the
 * tensor is chunked or which thread generates it. Values are
 * offset + scale * u with u uniform in [-1, 1). */
static void random_row(float * dst, int64_t n, uint64_t tseed, int64_t row, float offset, float scale) {
    uint64_t state = tseed ^ ((uint64_t) row * 0xD1B54A32D192ED03ull);
    const float k = scale * (1.0f / 2147483648.0f);
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        const uint64_t r = splitmix64(&state);
        dst[i]     = offset + k * (float) (int32_t) (uint32_t) r;
        dst[i + 1] = offset + k * (float) (int32_t) (uint32_t) (r >> 32);
    }
    if (i < n) {
        dst[i] = offset + k * (float) (int32_t) (uint32_t) splitmix64(&state);
    }
}

static void fill_rows(float * dst, const struct tensor_spec * t, uint64_t tseed,
                      int64_t row0, int64_t n_rows) {
    const int64_t n = t->ne[0];
    float offset = 0.0f;
    float scale;
    switch (t->kind) {
        case T_NORM:  offset = 1.0f;  scale = 0.05f; break;
        case T_BIAS:                  scale = 0.02f; break;
        case T_SSM_A: offset = -0.5f; scale = 0.4f;  break; /* negative: stable decay */
        case T_CONV:                  scale = 0.5f;  break;
        /* uniform with std 1/sqrt(fan_in): activations keep their scale */
        default:                      scale = sqrtf(3.0f / (float) n); break;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        random_row(dst + r * n, n, tseed, row0 + r, offset, scale);
    }
}

/* ------------------------------------------------------------------------ */
/* Vocab                                                                     */
/* ------------------------------------------------------------------------ */

static bool copy_kv(struct gguf_context * dst, const struct gguf_context * src, int64_t id) {
    const char * key = gguf_get_key(src, id);
    switch (gguf_get_kv_type(src, id)) {
        case GGUF_TYPE_UINT8:   gguf_set_val_u8  (dst, key, gguf_get_val_u8  (src, id)); return true;
        case GGUF_TYPE_INT8:    gguf_set_val_i8  (dst, key, gguf_get_val_i8  (src, id)); return true;
        case GGUF_TYPE_UINT16:  gguf_set_val_u16 (dst, key, gguf_get_val_u16 (src, id)); return true;
        case GGUF_TYPE_INT16:   gguf_set_val_i16 (dst, key, gguf_get_val_i16 (src, id)); return true;
        case GGUF_TYPE_UINT32:  gguf_set_val_u32 (dst, key, gguf_get_val_u32 (src, id)); return true;
        case GGUF_TYPE_INT32:   gguf_set_val_i32 (dst, key, gguf_get_val_i32 (src, id)); return true;
        case GGUF_TYPE_FLOAT32: gguf_set_val_f32 (dst, key, gguf_get_val_f32 (src, id)); return true;
        case GGUF_TYPE_UINT64:  gguf_set_val_u64 (dst, key, gguf_get_val_u64 (src, id)); return true;
        case GGUF_TYPE_INT64:   gguf_set_val_i64 (dst, key, gguf_get_val_i64 (src, id)); return true;
        case GGUF_TYPE_FLOAT64: gguf_set_val_f64 (dst, key, gguf_get_val_f64 (src, id)); return true;
        case GGUF_TYPE_BOOL:    gguf_set_val_bool(dst, key, gguf_get_val_bool(src, id)); return true;
        case GGUF_TYPE_STRING:  gguf_set_val_str (dst, key, gguf_get_val_str (src, id)); return true;
        case GGUF_TYPE_ARRAY: {
            const enum gguf_type at = gguf_get_arr_type(src, id);
            const size_t n = gguf_get_arr_n(src, id);
            if (at == GGUF_TYPE_STRING) {
                const char ** strs = malloc((n ? n : 1) * sizeof *strs);
                if (!strs) {
                    print_error("out of memory copying %s", key);
                    return false;
                }
                for (size_t i = 0; i < n; i++) {
                    strs[i] = gguf_get_arr_str(src, id, i);
                }
                gguf_set_arr_str(dst, key, strs, n);
                free(strs);
                return true;
            }
            if (at == GGUF_TYPE_ARRAY) {
                print_error("vocab key %s: nested arrays are not supported", key);
                return false;
            }
            gguf_set_arr_data(dst, key, at, gguf_get_arr_data(src, id), n);
            return true;
        }
        default:
            print_error("vocab key %s has unknown type", key);
            return false;
    }
}

/* Loads the vocab-only GGUF; returns its context and the token count. */
static struct gguf_context * load_vocab(const char * path, int64_t * n_vocab) {
    if (access(path, R_OK) != 0) {
        die("cannot read vocab file %s: %s", path, strerror(errno));
    }
    struct gguf_init_params params = { .no_alloc = true, .ctx = NULL };
    struct gguf_context * v = gguf_init_from_file(path, params);
    if (!v) {
        die("%s is not a valid GGUF file", path);
    }
    const int64_t id = gguf_find_key(v, "tokenizer.ggml.tokens");
    if (id < 0 || gguf_get_kv_type(v, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(v, id) != GGUF_TYPE_STRING) {
        die("%s has no tokenizer.ggml.tokens string array; is it a ggml-vocab-*.gguf?", path);
    }
    *n_vocab = (int64_t) gguf_get_arr_n(v, id);
    if (*n_vocab <= 0) {
        die("%s has an empty token list", path);
    }
    return v;
}

static bool copy_tokenizer_kv(struct gguf_context * dst, const struct gguf_context * vocab) {
    for (int64_t i = 0; i < gguf_get_n_kv(vocab); i++) {
        if (strncmp(gguf_get_key(vocab, i), "tokenizer.", 10) == 0 && !copy_kv(dst, vocab, i)) {
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

struct write_job {
    const struct arch_desc *  arch;
    const struct quant_desc * quant;
    const struct model_shape * shape;
    const char *              model_name;
    const struct gguf_context * vocab;
    uint64_t                  seed;
    int                       split_count;
    int                       n_threads;
    char                      prefix[PATH_MAX]; /* OUT without .gguf */
    char                      out_path[PATH_MAX];
};

static void shard_path(const struct write_job * job, int shard, char * dst, size_t size) {
    if (job->split_count == 1) {
        snprintf(dst, size, "%s", job->out_path);
    } else {
        /* same format as llama_split_path, so the loader finds the siblings */
        snprintf(dst, size, "%s-%05d-of-%05d.gguf", job->prefix, shard + 1, job->split_count);
    }
}

/* Balances shards by expert bytes rather than total bytes: in small models
 * the embeddings outweigh everything else and would leave all experts in one
 * shard, while the point of splitting is expert reads across files.
 * Every shard gets at least one tensor; shard numbers never go down. */
static void assign_shards(struct tensor_plan * p, int n_shards) {
    size_t total = 0;
    for (size_t i = 0; i < p->n; i++) {
        total += p->v[i].kind == T_EXPERT ? p->v[i].nbytes : 0;
    }
    const bool by_experts = total > 0;
    if (!by_experts) {
        for (size_t i = 0; i < p->n; i++) {
            total += p->v[i].nbytes;
        }
    }
    size_t before = 0;
    int prev = 0;
    for (size_t i = 0; i < p->n; i++) {
        int want = (int) ((long double) before * n_shards / (total ? total : 1));
        if (want > n_shards - 1) want = n_shards - 1;
        if (want < prev) want = prev;
        if (want > prev + 1) want = prev + 1;
        const size_t tensors_left = p->n - i;
        const size_t shards_left = (size_t) (n_shards - 1 - prev);
        if (i > 0 && tensors_left == shards_left) {
            want = prev + 1;
        }
        p->v[i].shard = (i == 0) ? 0 : want;
        prev = p->v[i].shard;
        if (!by_experts || p->v[i].kind == T_EXPERT) {
            before += p->v[i].nbytes;
        }
    }
}

static bool write_all(FILE * f, const void * data, size_t n, const char * path) {
    errno = 0;
    if (n && fwrite(data, 1, n, f) != n) {
        print_error("write to %s failed: %s", path, errno ? strerror(errno) : "short write");
        return false;
    }
    return true;
}

/* Two chunk buffers: workers fill one while the main thread writes the other,
 * so generation overlaps with disk I/O.  Memory stays constant. */
struct chunk_buffer {
    float *   src;
    uint8_t * dst;
};

struct stream_buffers {
    struct chunk_buffer chunk[2];
    int n_threads;
};

/* One worker's share of a chunk: generate rows, then encode them. */
struct encode_task {
    const struct tensor_spec * t;
    uint64_t  tseed;
    int64_t   row0;
    int64_t   n_rows;
    float *   src;
    uint8_t * dst;
    size_t    out_size;
};

static int run_encode_task(void * arg) {
    struct encode_task * task = arg;
    const struct tensor_spec * t = task->t;
    const int64_t n_per_row = t->ne[0];
    const int64_t n = task->n_rows * n_per_row;
    if (t->type == GGML_TYPE_F32) {
        fill_rows((float *) task->dst, t, task->tseed, task->row0, task->n_rows);
        task->out_size = (size_t) n * sizeof(float);
        return 0;
    }
    fill_rows(task->src, t, task->tseed, task->row0, task->n_rows);
    if (t->type == GGML_TYPE_F16) {
        ggml_fp16_t * h = (ggml_fp16_t *) task->dst;
        for (int64_t i = 0; i < n; i++) {
            h[i] = ggml_fp32_to_fp16(task->src[i]);
        }
        task->out_size = (size_t) n * sizeof(ggml_fp16_t);
    } else {
        task->out_size = ggml_quantize_chunk(t->type, task->src, task->dst, 0, task->n_rows, n_per_row, NULL);
    }
    return 0;
}

/* Below this many floats a thread costs more than it saves. */
#define MIN_FLOATS_PER_THREAD (1u << 16)

/* A chunk being encoded in the background. */
struct encode_batch {
    struct encode_task tasks[MAX_THREADS];
    thrd_t threads[MAX_THREADS];
    bool   started[MAX_THREADS];
    int    n_workers;
};

/* Starts encoding rows [row0, row0 + n_rows) into out->dst.  Rows are
 * independent, so the bytes do not depend on the thread count. */
static void encode_start(struct encode_batch * b, const struct tensor_spec * t, uint64_t tseed,
                         int64_t row0, int64_t n_rows, const struct chunk_buffer * out, int n_threads) {
    const int64_t n_per_row = t->ne[0];
    const size_t row_size = ggml_row_size(t->type, n_per_row);
    int64_t n_workers = (n_rows * n_per_row) / MIN_FLOATS_PER_THREAD;
    if (n_workers > n_threads) n_workers = n_threads;
    if (n_workers > n_rows)    n_workers = n_rows;
    if (n_workers < 1)         n_workers = 1;

    b->n_workers = (int) n_workers;
    int64_t r = 0;
    for (int w = 0; w < b->n_workers; w++) {
        const int64_t share = n_rows / n_workers + (w < n_rows % n_workers ? 1 : 0);
        b->tasks[w] = (struct encode_task) {
            .t = t, .tseed = tseed, .row0 = row0 + r, .n_rows = share,
            .src = out->src + r * n_per_row, .dst = out->dst + (size_t) r * row_size,
        };
        b->started[w] = thrd_create(&b->threads[w], run_encode_task, &b->tasks[w]) == thrd_success;
        r += share;
    }
}

/* Waits for the chunk; returns its encoded size. */
static size_t encode_finish(struct encode_batch * b) {
    size_t total = 0;
    for (int w = 0; w < b->n_workers; w++) {
        if (b->started[w]) {
            thrd_join(b->threads[w], NULL);
        } else {
            run_encode_task(&b->tasks[w]); /* no thread available: do it here */
        }
        total += b->tasks[w].out_size;
    }
    return total;
}

static bool write_tensor_data(FILE * f, const char * path, const struct tensor_spec * t,
                              uint64_t seed, size_t alignment, struct stream_buffers * buf) {
    const int64_t n_per_row = t->ne[0];
    const int64_t n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    const size_t row_size = ggml_row_size(t->type, n_per_row);
    int64_t rows_per_chunk = (int64_t) (CHUNK_FLOATS / (size_t) n_per_row);
    if (rows_per_chunk < 1) {
        rows_per_chunk = 1;
    }
    const uint64_t tseed = tensor_seed(seed, t->name);

    struct encode_batch batch;
    size_t written = 0;
    size_t ready_size = 0; /* encoded bytes waiting in the other buffer */
    int cur = 0;
    bool ok = true;
    for (int64_t r = 0; r < n_rows && ok; r += rows_per_chunk) {
        const int64_t nr = (n_rows - r < rows_per_chunk) ? n_rows - r : rows_per_chunk;
        encode_start(&batch, t, tseed, r, nr, &buf->chunk[cur], buf->n_threads);
        if (ready_size > 0) {
            ok = write_all(f, buf->chunk[1 - cur].dst, ready_size, path);
            written += ready_size;
        }
        ready_size = encode_finish(&batch);
        if (ready_size != (size_t) nr * row_size) {
            print_error("internal error: %s encoded to %zu bytes, expected %zu",
                        t->name, ready_size, (size_t) nr * row_size);
            return false;
        }
        cur = 1 - cur;
    }
    if (!ok || !write_all(f, buf->chunk[1 - cur].dst, ready_size, path)) {
        return false;
    }
    written += ready_size;

    static const uint8_t zeros[64] = { 0 };
    size_t pad = GGML_PAD(written, alignment) - written;
    while (pad > 0) {
        const size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        if (!write_all(f, zeros, n, path)) {
            return false;
        }
        pad -= n;
    }
    return true;
}

static void add_model_kv(struct gguf_context * g, const struct write_job * job) {
    gguf_set_val_str(g, "general.architecture", job->arch->gguf_arch);
    gguf_set_val_str(g, "general.name", job->model_name);
    gguf_set_val_u32(g, "general.file_type", job->quant->llama_ftype);
    gguf_set_val_u32(g, "general.quantization_version", GGML_QNT_VERSION);
    job->arch->add_kv(g, job->arch->gguf_arch, job->shape);
}

/* Writes one shard: metadata first, then every tensor streamed in row chunks. */
static bool write_shard(const struct write_job * job, const struct tensor_plan * plan, int shard,
                        struct stream_buffers * buf, size_t * bytes_out) {
    char path[PATH_MAX + 32];
    shard_path(job, shard, path, sizeof path);

    size_t n_tensors = 0;
    for (size_t i = 0; i < plan->n; i++) {
        n_tensors += plan->v[i].shard == shard;
    }

    struct gguf_context * g = gguf_init_empty();
    if (shard == 0) {
        add_model_kv(g, job);
        if (!copy_tokenizer_kv(g, job->vocab)) {
            gguf_free(g);
            return false;
        }
    }
    if (job->split_count > 1) {
        /* same keys and types as gguf-split writes them */
        gguf_set_val_u16(g, "split.no", (uint16_t) shard);
        gguf_set_val_u16(g, "split.count", (uint16_t) job->split_count);
        gguf_set_val_i32(g, "split.tensors.count", (int32_t) plan->n);
    }

    /* tensor descriptors only: no_alloc keeps the weights out of memory */
    struct ggml_init_params ip = {
        .mem_size   = (n_tensors + 1) * ggml_tensor_overhead(),
        .mem_buffer = NULL,
        .no_alloc   = true,
    };
    struct ggml_context * meta = ggml_init(ip);
    if (!meta) {
        print_error("out of memory creating tensor metadata");
        gguf_free(g);
        return false;
    }
    for (size_t i = 0; i < plan->n; i++) {
        const struct tensor_spec * t = &plan->v[i];
        if (t->shard != shard) {
            continue;
        }
        struct ggml_tensor * gt = ggml_new_tensor(meta, t->type, t->n_dims, t->ne);
        ggml_set_name(gt, t->name);
        gguf_add_tensor(g, gt);
    }

    bool ok = false;
    FILE * f = NULL;
    uint8_t * meta_bytes = NULL;
    const size_t meta_size = gguf_get_meta_size(g);
    const size_t alignment = gguf_get_alignment(g);

    f = fopen(path, "wb");
    if (!f) {
        print_error("cannot open %s for writing: %s", path, strerror(errno));
        goto done;
    }
    meta_bytes = malloc(meta_size);
    if (!meta_bytes) {
        print_error("out of memory for %zu bytes of metadata", meta_size);
        goto done;
    }
    gguf_get_meta_data(g, meta_bytes);
    if (!write_all(f, meta_bytes, meta_size, path)) {
        goto done;
    }

    /* the data must land exactly where the header says it is */
    size_t data_pos = 0;
    int64_t tensor_id = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const struct tensor_spec * t = &plan->v[i];
        if (t->shard != shard) {
            continue;
        }
        if (gguf_get_tensor_offset(g, tensor_id) != data_pos ||
            gguf_get_tensor_size(g, tensor_id) != t->nbytes) {
            print_error("internal error: layout of %s disagrees with the GGUF header", t->name);
            goto done;
        }
        if (!write_tensor_data(f, path, t, job->seed, alignment, buf)) {
            goto done;
        }
        data_pos += GGML_PAD(t->nbytes, alignment);
        tensor_id++;
    }

    if (fflush(f) != 0 || ferror(f)) {
        print_error("write to %s failed: %s", path, strerror(errno));
        goto done;
    }
    *bytes_out += meta_size + data_pos;
    ok = true;

done:
    if (f && fclose(f) != 0 && ok) {
        print_error("closing %s failed: %s", path, strerror(errno));
        ok = false;
    }
    free(meta_bytes);
    ggml_free(meta);
    gguf_free(g);
    return ok;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void free_stream_buffers(struct stream_buffers * buf) {
    for (int i = 0; i < 2; i++) {
        free(buf->chunk[i].src);
        free(buf->chunk[i].dst);
    }
}

static int write_model(const struct write_job * job, struct tensor_plan * plan) {
    struct stream_buffers buf = { .n_threads = job->n_threads };
    int64_t max_row = 1;
    for (size_t i = 0; i < plan->n; i++) {
        if (plan->v[i].ne[0] > max_row) {
            max_row = plan->v[i].ne[0];
        }
    }
    const size_t n_floats = CHUNK_FLOATS > (size_t) max_row ? CHUNK_FLOATS : (size_t) max_row;
    bool have_memory = true;
    for (int i = 0; i < 2; i++) {
        buf.chunk[i].src = malloc(n_floats * sizeof(float));
        buf.chunk[i].dst = malloc(n_floats * sizeof(float)); /* no output type is wider than F32 */
        have_memory = have_memory && buf.chunk[i].src && buf.chunk[i].dst;
    }
    if (!have_memory) {
        free_stream_buffers(&buf);
        print_error("out of memory for stream buffers");
        return 1;
    }

    const double t0 = now_seconds();
    size_t bytes = 0;
    int shard = 0;
    bool ok = true;
    for (; shard < job->split_count && ok; shard++) {
        ok = write_shard(job, plan, shard, &buf, &bytes);
    }
    const double dt = now_seconds() - t0;
    free_stream_buffers(&buf);

    if (!ok) {
        /* never leave a truncated model behind: it would load as garbage.
         * Only regular files: -o may name a device such as /dev/full. */
        for (int s = 0; s < shard; s++) {
            char path[PATH_MAX + 32];
            struct stat st;
            shard_path(job, s, path, sizeof path);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                remove(path);
            }
        }
        return 1;
    }

    char first[PATH_MAX + 32];
    shard_path(job, 0, first, sizeof first);
    fprintf(stderr, PROG ": wrote %s%s: %zu tensors, %.1f MiB in %.2f s (%.1f MB/s)\n",
            first, job->split_count > 1 ? " and the following shards" : "", plan->n,
            (double) bytes / (1024.0 * 1024.0), dt, dt > 0 ? (double) bytes / 1e6 / dt : 0.0);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Command line                                                              */
/* ------------------------------------------------------------------------ */

static void print_usage(FILE * out) {
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

static int64_t parse_int(const char * flag, const char * text, int64_t lo, int64_t hi) {
    errno = 0;
    char * end = NULL;
    const long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != 0 || v < lo || v > hi) {
        die("%s: expected an integer in [%" PRId64 ", %" PRId64 "], got '%s'", flag, lo, hi, text);
    }
    return (int64_t) v;
}

static uint64_t parse_seed(const char * text) {
    errno = 0;
    char * end = NULL;
    if (text[0] == '-' || text[0] == 0) {
        die("--seed: expected a non-negative integer, got '%s'", text);
    }
    const unsigned long long v = strtoull(text, &end, 0);
    if (errno != 0 || *end != 0) {
        die("--seed: expected a non-negative integer, got '%s'", text);
    }
    return (uint64_t) v;
}

static const struct arch_desc * find_arch(const char * name) {
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (strcmp(ARCHS[i].name, name) == 0) {
            return &ARCHS[i];
        }
    }
    return NULL;
}

static const struct preset_desc * find_preset(const char * name) {
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (strcmp(PRESETS[i].name, name) == 0) {
            return &PRESETS[i];
        }
    }
    return NULL;
}

struct options {
    const char * arch;
    const char * preset;
    const char * quant;
    const char * vocab;
    const char * output;
    uint64_t     seed;
    int64_t      n_layer, n_embd, n_ff_exp, n_expert, n_expert_used; /* 0: keep */
    int64_t      split_count;
    int64_t      n_threads;    /* 0: one per online CPU */
    int          fused;  /* -1: arch default */
};

static struct options parse_args(int argc, char ** argv) {
    struct options o = { .seed = 1, .split_count = 1, .fused = -1 };
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
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
        const char * v = argv[++i];
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
static void apply_overrides(struct model_shape * s, const struct arch_desc * a, const struct options * o) {
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
    if (a->features & F_GATED_DELTA) {
        if (s->n_layer < s->full_attn_interval) {
            die("%s needs --n-layer >= %" PRId64 " so that one block has full attention",
                a->name, s->full_attn_interval);
        }
    }
}

int main(int argc, char ** argv) {
    const struct options o = parse_args(argc, argv);

    const struct preset_desc * preset = find_preset(o.preset ? o.preset : "tiny");
    if (!preset) {
        die("unknown preset '%s' (see --list)", o.preset);
    }
    const char * arch_name = o.arch ? o.arch : preset->arch;
    if (!arch_name) {
        die("--arch is required with preset %s (see --list)", preset->name);
    }
    const struct arch_desc * arch = find_arch(arch_name);
    if (!arch) {
        die("unknown architecture '%s' (see --list)", arch_name);
    }
    if (preset->arch && strcmp(preset->arch, arch->name) != 0) {
        die("preset %s is a %s model, not %s", preset->name, preset->arch, arch->name);
    }
    if (!o.output) {
        die("no output file given (-o OUT.gguf)");
    }

    const struct quant_desc * quant = o.quant ? find_quant_by_name(o.quant)
                                              : find_quant_by_type(arch->default_quant);
    if (!quant) {
        die("unsupported quant type '%s' (supported: F16, Q8_0, Q4_0, Q4_K, MXFP4)", o.quant);
    }

    bool fused = (arch->features & F_FUSED_DEFAULT) != 0;
    if (o.fused >= 0) {
        if (o.fused && !(arch->features & F_FUSED_OK)) {
            die("%s does not accept a fused ffn_gate_up_exps tensor (deepseek2 and qwen35moe do)", arch->name);
        }
        fused = o.fused != 0;
    }

    struct model_shape shape = preset->arch ? preset->shape : arch->tiny;
    apply_overrides(&shape, arch, &o);

    /* resolve the vocab */
    char vocab_path[PATH_MAX];
    if (o.vocab) {
        snprintf(vocab_path, sizeof vocab_path, "%s", o.vocab);
    } else {
        const char * dir = getenv("GUANACO_VOCAB_DIR");
        if (!dir || !*dir) {
            die("no vocab: pass --vocab FILE or set GUANACO_VOCAB_DIR to a directory holding %s",
                preset->vocab_file);
        }
        snprintf(vocab_path, sizeof vocab_path, "%s/%s", dir, preset->vocab_file);
    }
    struct gguf_context * vocab = load_vocab(vocab_path, &shape.n_vocab);

    struct write_job job = {
        .arch = arch, .quant = quant, .shape = &shape, .vocab = vocab,
        .seed = o.seed, .split_count = (int) o.split_count, .n_threads = (int) o.n_threads,
    };
    if (job.n_threads == 0) {
        const long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
        job.n_threads = n_cpu < 1 ? 1 : (n_cpu > MAX_THREADS ? MAX_THREADS : (int) n_cpu);
    }
    if (strlen(o.output) >= sizeof job.out_path - 32) {
        die("output path too long");
    }
    snprintf(job.out_path, sizeof job.out_path, "%s", o.output);
    snprintf(job.prefix, sizeof job.prefix, "%s", o.output);
    const size_t len = strlen(job.prefix);
    if (len > 5 && strcmp(job.prefix + len - 5, ".gguf") == 0) {
        job.prefix[len - 5] = 0;
    }
    char model_name[128];
    snprintf(model_name, sizeof model_name, "guanaco synthetic %s %s %s seed %" PRIu64,
             arch->name, preset->name, quant->name, o.seed);
    job.model_name = model_name;

    struct tensor_plan plan = { 0 };
    plan_model(&plan, arch, &shape, fused);
    const int n_fallback = assign_types(&plan, quant->type);
    if (n_fallback > 0) {
        fprintf(stderr, PROG ": note: %d tensor(s) use Q8_0/F16 because their rows do not fit %s blocks\n",
                n_fallback, quant->name);
    }
    if ((size_t) job.split_count > plan.n) {
        die("--split-count %d exceeds the number of tensors (%zu)", job.split_count, plan.n);
    }
    assign_shards(&plan, job.split_count);

    const int rc = write_model(&job, &plan);

    free(plan.v);
    gguf_free(vocab);
    ggml_quantize_free();
    return rc;
}
