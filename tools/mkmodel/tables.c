/*
 * tables.c - owns what guanaco-mkmodel knows about each model family: the
 * supported architectures (which GGUF keys stock llama.cpp reads for them,
 * their tiny test shapes and default quant type), the presets with real
 * shapes, and the quant types with their general.file_type values.
 */

#include "mkmodel.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static void kv_u32(struct gguf_context *g, const char *arch, const char *key, int64_t v) {
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    gguf_set_val_u32(g, full, (uint32_t)v);
}

static void kv_f32(struct gguf_context *g, const char *arch, const char *key, float v) {
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    gguf_set_val_f32(g, full, v);
}

static void kv_bool(struct gguf_context *g, const char *arch, const char *key, bool v) {
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    gguf_set_val_bool(g, full, v);
}

/* A per-layer array, as convert_hf_to_gguf writes it (a list of ints is INT32). */
static void kv_layers(struct gguf_context *g, const char *arch, const char *key, const int32_t *v, int64_t n) {
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    gguf_set_arr_data(g, full, GGUF_TYPE_INT32, v, (size_t)n);
}

/* Keys every supported architecture reads the same way.  head_count_kv is
 * per layer where llama.cpp tells recurrent blocks by a 0 there. */
static void kv_common_layers(struct gguf_context *g, const char *a, const struct model_shape *s,
                             const int32_t *head_count_kv) {
    kv_u32(g, a, "vocab_size",       s->n_vocab);
    kv_u32(g, a, "context_length",   s->n_ctx_train);
    kv_u32(g, a, "embedding_length", s->n_embd);
    kv_u32(g, a, "block_count",      s->n_layer);
    kv_u32(g, a, "attention.head_count",    s->n_head);
    if (head_count_kv) {
        kv_layers(g, a, "attention.head_count_kv", head_count_kv, s->n_layer);
    } else {
        kv_u32(g, a, "attention.head_count_kv", s->n_head_kv);
    }
    kv_f32(g, a, "attention.layer_norm_rms_epsilon", s->rms_eps);
    kv_f32(g, a, "rope.freq_base",   s->rope_freq_base);
    if (s->n_expert > 0) {
        kv_u32(g, a, "expert_count",      s->n_expert);
        kv_u32(g, a, "expert_used_count", s->n_expert_used);
    }
}

static void kv_common(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common_layers(g, a, s, NULL);
}

/* Head size is only implied by n_embd / n_head unless written; write it
 * whenever that implication would be wrong. */
static void kv_head_dim_if_needed(struct gguf_context *g, const char *a, const struct model_shape *s) {
    if (s->n_head * s->head_dim != s->n_embd) {
        kv_u32(g, a, "attention.key_length",   s->head_dim);
        kv_u32(g, a, "attention.value_length", s->head_dim);
    }
}

static void kv_qwen3moe(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",        s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "attention.key_length",       s->head_dim);
    kv_u32(g, a, "attention.value_length",     s->head_dim);
}

/* Mixtral GGUFs are plain "llama" files whose FFN width is the expert width. */
static void kv_mixtral(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",   s->n_ff_exp);
    kv_u32(g, a, "rope.dimension_count",  s->head_dim);
    kv_head_dim_if_needed(g, a, s);
}

static void kv_llama_dense(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",   s->n_ff);
    kv_u32(g, a, "rope.dimension_count",  s->head_dim);
    kv_head_dim_if_needed(g, a, s);
}

bool deepseek2_is_lite(const struct model_shape *s) {
    /* mirrors llama_model_deepseek2::load_arch_hparams: these variants have no q_lora */
    return s->n_layer == 27 || s->n_layer == 26 || (s->n_layer == 48 && s->n_vocab == 128256);
}

/* MLA is stored as MQA over the compressed KV (see conversion/deepseek.py):
 * key_length/value_length describe the latent cache, *_mla the real heads. */
static void kv_deepseek2(struct gguf_context *g, const char *a, const struct model_shape *s) {
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

static void kv_gptoss(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",        s->n_ff_exp);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "attention.key_length",       s->head_dim);
    kv_u32(g, a, "attention.value_length",     s->head_dim);
    kv_u32(g, a, "attention.sliding_window",   s->sliding_window);
}

static void kv_olmoe(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length", s->n_ff_exp);
}

static void kv_glm4moe(struct gguf_context *g, const char *a, const struct model_shape *s) {
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

static void kv_qwen35moe(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",               s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length",        s->n_ff_exp);
    kv_u32(g, a, "expert_shared_feed_forward_length", s->n_ff_shexp);
    kv_u32(g, a, "attention.key_length",              s->head_dim);
    kv_u32(g, a, "attention.value_length",            s->head_dim);
    kv_u32(g, a, "rope.dimension_count",              s->n_rot);
    /* text-only positions: all rotary pairs in the first (temporal) section */
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.dimension_sections", a);
    const int32_t sections[4] = { (int32_t)(s->n_rot / 2), 0, 0, 0 };
    gguf_set_arr_data(g, key, GGUF_TYPE_INT32, sections, 4);
    kv_u32(g, a, "ssm.conv_kernel",        s->ssm_conv_kernel);
    kv_u32(g, a, "ssm.state_size",         s->ssm_state);
    kv_u32(g, a, "ssm.group_count",        s->ssm_group);
    kv_u32(g, a, "ssm.time_step_rank",     s->ssm_v_heads);
    kv_u32(g, a, "ssm.inner_size",         s->ssm_state * s->ssm_v_heads);
    kv_u32(g, a, "full_attention_interval", s->full_attn_interval);
}

/* Which blocks are recurrent is the arch's own pattern:
 *   lfm2moe: attention every full_attn_interval-th block, short convolution elsewhere
 *     (LFM2-8B-A1B mixes them the same way, about 1 in 4 with attention);
 *   nemotron_h_moe: odd blocks are MoE, the others alternate mamba2 and attention
 *     (M E * E M E ..., the 52-layer model's "MEMEM*E..." pattern, denser in attention,
 *     so the 4-block tiny model has each kind).
 * The others have no recurrent blocks here (qwen35moe's are in plan.c). */
enum layer_role layer_role(unsigned features, const struct model_shape *s, int il) {
    if (features & F_SHORTCONV) {
        return (il + 1) % s->full_attn_interval == 0 ? ROLE_ATTENTION : ROLE_RECURRENT;
    }
    if (features & F_MAMBA2) {
        if (il % 2 == 1) {
            return ROLE_FFN_ONLY;
        }
        return il % 4 == 2 ? ROLE_ATTENTION : ROLE_RECURRENT;
    }
    return ROLE_ATTENTION;
}

/* llama_model_lfm2moe::load_arch_hparams: a block is a short convolution iff its
 * head_count_kv is 0. */
static void kv_lfm2moe(struct gguf_context *g, const char *a, const struct model_shape *s) {
    int32_t head_kv[LLAMA_MAX_LAYERS];
    for (int il = 0; il < s->n_layer; il++) {
        head_kv[il] = layer_role(F_SHORTCONV, s, il) == ROLE_ATTENTION ? (int32_t)s->n_head_kv : 0;
    }
    kv_common_layers(g, a, s, head_kv);
    kv_u32(g, a, "feed_forward_length",        s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "leading_dense_block_count",  s->n_dense_lead);
    kv_u32(g, a, "shortconv.l_cache",          s->shortconv_l_cache);
    kv_u32(g, a, "expert_gating_func",         GATING_SIGMOID);
}

/* llama_model_nemotron_h::load_arch_hparams: mamba2 blocks have head_count_kv 0 and
 * feed_forward_length 0, attention blocks only the latter, MoE blocks neither. */
static void kv_nemotron_h_moe(struct gguf_context *g, const char *a, const struct model_shape *s) {
    int32_t head_kv[LLAMA_MAX_LAYERS];
    int32_t ff[LLAMA_MAX_LAYERS];
    for (int il = 0; il < s->n_layer; il++) {
        const enum layer_role role = layer_role(F_MAMBA2, s, il);
        head_kv[il] = role == ROLE_ATTENTION ? (int32_t)s->n_head_kv : 0;
        ff[il] = role == ROLE_FFN_ONLY ? (int32_t)s->n_ff : 0;
    }
    kv_common_layers(g, a, s, head_kv);
    kv_head_dim_if_needed(g, a, s);
    kv_layers(g, a, "feed_forward_length", ff, s->n_layer);
    kv_u32(g, a, "expert_feed_forward_length",        s->n_ff_exp);
    kv_u32(g, a, "expert_shared_feed_forward_length", s->n_ff_shexp);
    kv_u32(g, a, "expert_shared_count",               1);
    kv_bool(g, a, "expert_weights_norm",              true);
    kv_f32(g, a, "expert_weights_scale",              1.0f);
    kv_f32(g, a, "attention.layer_norm_epsilon",      s->rms_eps);
    kv_u32(g, a, "ssm.conv_kernel",    s->ssm_conv_kernel);
    kv_u32(g, a, "ssm.inner_size",     s->ssm_inner);
    kv_u32(g, a, "ssm.state_size",     s->ssm_state);
    kv_u32(g, a, "ssm.time_step_rank", s->ssm_v_heads);
    kv_u32(g, a, "ssm.group_count",    s->ssm_group);
}

static void kv_afmoe(struct gguf_context *g, const char *a, const struct model_shape *s) {
    kv_common(g, a, s);
    kv_u32(g, a, "feed_forward_length",        s->n_ff);
    kv_u32(g, a, "expert_feed_forward_length", s->n_ff_exp);
    kv_u32(g, a, "expert_shared_count",        s->n_expert_shared);
    kv_u32(g, a, "leading_dense_block_count",  s->n_dense_lead);
    kv_u32(g, a, "attention.key_length",       s->head_dim);
    kv_u32(g, a, "attention.value_length",     s->head_dim);
    kv_u32(g, a, "attention.sliding_window",   s->sliding_window);
    kv_u32(g, a, "expert_gating_func",         GATING_SIGMOID);
    kv_bool(g, a, "expert_weights_norm",       true);
    kv_f32(g, a, "expert_weights_scale",       1.0f);
}

/* Tiny shapes: multiples of 256 so every quant type applies without fallback;
 * about 14 MB at Q4_0 (mostly the two 32000-token embedding matrices), written
 * in a fraction of a second. */
#define TINY_SHAPE(kv_heads, rope_base, eps) \
    .n_layer = 4, .n_embd = 256, .n_ff = 512, .n_ff_exp = 256, \
    .n_expert = 8, .n_expert_used = 2, .n_head = 4, .n_head_kv = (kv_heads), .head_dim = 64, \
    .n_ctx_train = 4096, .rope_freq_base = (rope_base), .rms_eps = (eps)

const struct arch_desc ARCHS[] = {
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
    { "lfm2moe", "lfm2moe",
      F_QK_NORM_HEAD | F_HEADS_FROM_EMBD | F_EXP_PROBS_B | F_SHORTCONV | F_LFM2_OUT_NORM, GGML_TYPE_Q4_0,
      { TINY_SHAPE(4, 1000000.0f, 1e-5f), .n_dense_lead = 1, .full_attn_interval = 2,
        .shortconv_l_cache = 3 },
      kv_lfm2moe },
    { "nemotron_h_moe", "nemotron_h_moe", F_EXP_PROBS_B | F_MAMBA2, GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 10000.0f, 1e-5f), .n_ff_shexp = 256,
        .ssm_conv_kernel = 4, .ssm_state = 64, .ssm_group = 2, .ssm_v_heads = 8, .ssm_inner = 512 },
      kv_nemotron_h_moe },
    { "afmoe", "afmoe",
      F_QK_NORM_HEAD | F_SANDWICH_NORM | F_ATTN_GATE | F_EXP_PROBS_B | F_SHARED_EXPERTS, GGML_TYPE_Q4_0,
      { TINY_SHAPE(2, 10000.0f, 1e-5f), .n_expert_shared = 1, .n_dense_lead = 1, .sliding_window = 128 },
      kv_afmoe },
};
const size_t N_ARCHS = sizeof(ARCHS) / sizeof(ARCHS[0]);

const struct preset_desc PRESETS[] = {
    /* llama-spm keeps tiny models small: 32000 tokens */
    { "tiny", NULL, "ggml-vocab-llama-spm.gguf", {0} },
    { "qwen3-30b-a3b", "qwen3moe", "ggml-vocab-qwen2.gguf",
      { .n_layer = 48, .n_embd = 2048, .n_ff = 6144, .n_ff_exp = 768, .n_expert = 128,
        .n_expert_used = 8, .n_head = 32, .n_head_kv = 4, .head_dim = 128,
        .n_ctx_train = 40960, .rope_freq_base = 1000000.0f, .rms_eps = 1e-6f } },
    { "mixtral-8x7b", "mixtral", "ggml-vocab-llama-spm.gguf",
      { .n_layer = 32, .n_embd = 4096, .n_ff = 14336, .n_ff_exp = 14336, .n_expert = 8,
        .n_expert_used = 2, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
        .n_ctx_train = 32768, .rope_freq_base = 1000000.0f, .rms_eps = 1e-5f } },
};
const size_t N_PRESETS = sizeof(PRESETS) / sizeof(PRESETS[0]);

const struct quant_desc QUANTS[] = {
    { "F16",   GGML_TYPE_F16,   1 },
    { "Q8_0",  GGML_TYPE_Q8_0,  7 },
    { "Q4_0",  GGML_TYPE_Q4_0,  2 },
    { "Q4_K",  GGML_TYPE_Q4_K,  14 }, /* all Q4_K, i.e. Q4_K_S */
    { "MXFP4", GGML_TYPE_MXFP4, 38 }, /* MXFP4_MOE: experts MXFP4, rest Q8_0 */
};
const size_t N_QUANTS = sizeof(QUANTS) / sizeof(QUANTS[0]);

const struct quant_desc *find_quant_by_name(const char *name) {
    for (size_t i = 0; i < N_QUANTS; i++) {
        const char *a = QUANTS[i].name;
        const char *b = name;
        while (*a && *b && toupper((unsigned char) *a) == toupper((unsigned char) *b)) { a++; b++; }
        if (*a == 0 && *b == 0) {
            return &QUANTS[i];
        }
    }
    return NULL;
}

const struct quant_desc *find_quant_by_type(enum ggml_type t) {
    for (size_t i = 0; i < N_QUANTS; i++) {
        if (QUANTS[i].type == t) {
            return &QUANTS[i];
        }
    }
    return NULL;
}

const struct arch_desc *find_arch(const char *name) {
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (strcmp(ARCHS[i].name, name) == 0) {
            return &ARCHS[i];
        }
    }
    return NULL;
}

const struct preset_desc *find_preset(const char *name) {
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (strcmp(PRESETS[i].name, name) == 0) {
            return &PRESETS[i];
        }
    }
    return NULL;
}
