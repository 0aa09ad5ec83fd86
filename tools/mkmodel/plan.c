/*
 * plan.c - owns the tensor plan: which tensors (names, shapes) stock
 * llama.cpp's loader expects for an architecture and shape, which type each
 * one is stored as, and which shard each one goes to.
 */

#include "mkmodel.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void plan_add(struct tensor_plan *p, enum tensor_kind kind, int n_dims,
                     int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->v = realloc(p->v, p->cap * sizeof(*p->v));
        if (!p->v) {
            die("out of memory");
        }
    }
    struct tensor_spec *t = &p->v[p->n++];
    memset(t, 0, sizeof(*t));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
    t->ne[3] = 1;
    t->kind = kind;
}

static void plan_attention_standard(struct tensor_plan *p, const struct arch_desc *a,
                                    const struct model_shape *s, int il) {
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
    if (a->features & F_ATTN_GATE) {
        plan_add(p, T_MATRIX, 2, s->n_embd, n_q, 0, "blk.%d.attn_gate.weight", il);
    }
}

static void plan_attention_mla(struct tensor_plan *p, const struct model_shape *s, int il) {
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
static void plan_gated_delta(struct tensor_plan *p, const struct model_shape *s, int il) {
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

/* lfm2moe's short-convolution blocks (llama_model_lfm2moe::load_arch_tensors). */
static void plan_shortconv(struct tensor_plan *p, const struct model_shape *s, int il) {
    plan_add(p, T_CONV,   2, s->shortconv_l_cache, s->n_embd, 0, "blk.%d.shortconv.conv.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, 3 * s->n_embd, 0,      "blk.%d.shortconv.in_proj.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, s->n_embd, 0,          "blk.%d.shortconv.out_proj.weight", il);
}

/* nemotron_h_moe's mamba2 blocks (llama_model_nemotron_h::load_arch_tensors). */
static void plan_mamba2(struct tensor_plan *p, const struct model_shape *s, int il) {
    const int64_t n_ssm_head = s->ssm_v_heads;
    const int64_t conv_dim = s->ssm_inner + 2 * s->ssm_group * s->ssm_state;

    plan_add(p, T_MATRIX, 2, s->n_embd, s->ssm_inner + conv_dim + n_ssm_head, 0, "blk.%d.ssm_in.weight", il);
    plan_add(p, T_CONV,   2, s->ssm_conv_kernel, conv_dim, 0,         "blk.%d.ssm_conv1d.weight", il);
    plan_add(p, T_BIAS,   1, conv_dim, 0, 0,                           "blk.%d.ssm_conv1d.bias", il);
    plan_add(p, T_BIAS,   1, n_ssm_head, 0, 0,                         "blk.%d.ssm_dt.bias", il);
    plan_add(p, T_SSM_A,  2, 1, n_ssm_head, 0,                         "blk.%d.ssm_a", il);
    plan_add(p, T_NORM,   2, 1, n_ssm_head, 0,                         "blk.%d.ssm_d", il);
    plan_add(p, T_NORM,   2, s->ssm_inner / s->ssm_group, s->ssm_group, 0, "blk.%d.ssm_norm.weight", il);
    plan_add(p, T_MATRIX, 2, s->ssm_inner, s->n_embd, 0,               "blk.%d.ssm_out.weight", il);
}

/* nemotron_h_moe's MoE blocks: squared-ReLU experts without a gate, one shared expert. */
static void plan_ffn_relu2(struct tensor_plan *p, const struct model_shape *s, int il) {
    plan_add(p, T_ROUTER, 2, s->n_embd, s->n_expert, 0, "blk.%d.ffn_gate_inp.weight", il);
    plan_add(p, T_BIAS,   1, s->n_expert, 0, 0,         "blk.%d.exp_probs_b.bias", il);
    plan_add(p, T_EXPERT, 3, s->n_ff_exp, s->n_embd, s->n_expert, "blk.%d.ffn_down_exps.weight", il);
    plan_add(p, T_EXPERT, 3, s->n_embd, s->n_ff_exp, s->n_expert, "blk.%d.ffn_up_exps.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_ff_shexp, s->n_embd, 0, "blk.%d.ffn_down_shexp.weight", il);
    plan_add(p, T_MATRIX, 2, s->n_embd, s->n_ff_shexp, 0, "blk.%d.ffn_up_shexp.weight", il);
}

static void plan_ffn(struct tensor_plan *p, const struct arch_desc *a,
                     const struct model_shape *s, int il, bool fused) {
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

static bool is_recurrent_layer(const struct arch_desc *a, const struct model_shape *s, int il) {
    return (a->features & F_GATED_DELTA) && (il + 1) % s->full_attn_interval != 0;
}

void plan_model(struct tensor_plan *p, const struct arch_desc *a,
                       const struct model_shape *s, bool fused) {
    plan_add(p, T_EMBED, 2, s->n_embd, s->n_vocab, 0, "token_embd.weight");
    for (int il = 0; il < s->n_layer; il++) {
        plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.attn_norm.weight", il);
        const enum layer_role role = layer_role(a->features, s, il);
        if (a->features & F_MAMBA2) {
            /* one job per block, behind its only norm */
            if (role == ROLE_RECURRENT) {
                plan_mamba2(p, s, il);
            } else if (role == ROLE_ATTENTION) {
                plan_attention_standard(p, a, s, il);
            } else {
                plan_ffn_relu2(p, s, il);
            }
            continue;
        }
        if (a->features & F_MLA) {
            plan_attention_mla(p, s, il);
        } else if (is_recurrent_layer(a, s, il)) {
            plan_gated_delta(p, s, il);
        } else if (role == ROLE_RECURRENT) {
            plan_shortconv(p, s, il);
        } else {
            plan_attention_standard(p, a, s, il);
        }
        if (a->features & F_SANDWICH_NORM) {
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.post_attention_norm.weight", il);
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.ffn_norm.weight", il);
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.post_ffw_norm.weight", il);
        } else if (a->features & F_POST_ATTN_NORM) {
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.post_attention_norm.weight", il);
        } else {
            plan_add(p, T_NORM, 1, s->n_embd, 0, 0, "blk.%d.ffn_norm.weight", il);
        }
        plan_ffn(p, a, s, il, fused);
    }
    /* lfm2moe's converter stores the final norm under this name (LLM_TENSOR_OUTPUT_NORM_LFM2) */
    plan_add(p, T_NORM,  1, s->n_embd, 0, 0,
             (a->features & F_LFM2_OUT_NORM) ? "token_embd_norm.weight" : "output_norm.weight");
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

int assign_types(struct tensor_plan *p, enum ggml_type quant) {
    int n_fallback = 0;
    for (size_t i = 0; i < p->n; i++) {
        struct tensor_spec *t = &p->v[i];
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
        t->nbytes = ggml_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    }
    return n_fallback;
}

/* Balances shards by expert bytes rather than total bytes: in small models
 * the embeddings outweigh everything else and would leave all experts in one
 * shard, while the point of splitting is expert reads across files.
 * Every shard gets at least one tensor; shard numbers never go down. */
void assign_shards(struct tensor_plan *p, int n_shards) {
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
        int want = (int)((long double)before * n_shards / (total ? total : 1));
        if (want > n_shards - 1) want = n_shards - 1;
        if (want < prev) want = prev;
        if (want > prev + 1) want = prev + 1;
        const size_t tensors_left = p->n - i;
        const size_t shards_left = (size_t)(n_shards - 1 - prev);
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
