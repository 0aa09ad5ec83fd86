/*
 * router_gate.c - owns evaluating one MoE layer's router on another layer's
 * input: it learns each layer's router from the graph the first time that
 * layer's ffn_moe_topk is seen (the weight, and the bias and squashing
 * between the logits and the top-k), and then applies the next layer's router
 * to the current layer's MoE input. That input is still alive when
 * ffn_moe_topk is reached, because the expert matmuls consume it, and the
 * router weight is a resident non-expert weight, so the gate predictor costs
 * one small matmul per layer and no extra synchronisation of the scheduler.
 *
 * A router it cannot follow (grouped selection as in deepseek2, a LoRA on the
 * router, weights off the host or repacked, an op it does not know) is marked
 * unsupported once and said so; the predictor then falls back to pilot.
 */
#include "router_gate.h"
#include "log.h"

#include "ggml-cpu.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS 4

enum step_kind { STEP_ADD_BIAS, STEP_SOFTMAX, STEP_SIGMOID, STEP_SQRT_SOFTPLUS };

struct step {
    enum step_kind kind;
    const float *bias; /* STEP_ADD_BIAS: n_expert floats */
};

enum router_state { ROUTER_UNKNOWN = 0, ROUTER_READY, ROUTER_UNSUPPORTED };

struct router {
    _Atomic int state; /* enum router_state; READY is published after the fields below are written */
    const char *weight;
    enum ggml_type type;
    int64_t n_embd;
    size_t row_bytes; /* between experts' rows */
    int n_steps;
    struct step steps[MAX_STEPS]; /* from the logits to the selection scores, in order */
};

struct guanaco_router_gate {
    int n_layer;
    int64_t n_expert;
    pthread_mutex_t lock; /* learning only: a learnt router is read without it */
    _Atomic int told_unsupported;
    struct router *routers; /* n_layer */
};

int guanaco_router_gate_create(int n_layer, int64_t n_expert, struct guanaco_router_gate **out) {
    if (!out || n_layer <= 0 || n_expert <= 0) {
        return -EINVAL;
    }
    struct guanaco_router_gate *gate = calloc(1, sizeof(*gate));
    if (!gate) {
        return -ENOMEM;
    }
    gate->routers = calloc((size_t)n_layer, sizeof(*gate->routers));
    if (!gate->routers) {
        free(gate);
        return -ENOMEM;
    }
    gate->n_layer = n_layer;
    gate->n_expert = n_expert;
    pthread_mutex_init(&gate->lock, NULL);
    *out = gate;
    return 0;
}

void guanaco_router_gate_free(struct guanaco_router_gate *gate) {
    if (!gate) {
        return;
    }
    pthread_mutex_destroy(&gate->lock);
    free(gate->routers);
    free(gate);
}

static bool on_host(const struct ggml_tensor *t) {
    return t->data && (!t->buffer || ggml_backend_buffer_is_host(t->buffer));
}

/* A weight the graph reads as is: a leaf on the host, not repacked (repacked tensors carry `extra`). */
static bool plain_weight(const struct ggml_tensor *t) {
    return t->op == GGML_OP_NONE && on_host(t) && !t->extra && ggml_is_contiguous(t);
}

static bool expert_bias(const struct ggml_tensor *t, int64_t n_expert) {
    return plain_weight(t) && t->type == GGML_TYPE_F32 && ggml_nelements(t) == n_expert;
}

static float op_param_float(const struct ggml_tensor *t, int i) {
    float value;
    memcpy(&value, (const char *)t->op_params + (size_t)i * sizeof(float), sizeof(value));
    return value;
}

/* Walks back from ffn_moe_topk to the router's matmul. Returns the matmul, or NULL when the chain holds
   something this file cannot evaluate; fills r's steps (in graph order). */
static const struct ggml_tensor *follow_router(const struct ggml_tensor *topk, int64_t n_expert, struct router *r) {
    const struct ggml_tensor *node = topk;
    if (node->op == GGML_OP_VIEW) {
        node = node->src[0];
    }
    if (!node || (node->op != GGML_OP_ARGSORT && node->op != GGML_OP_TOP_K)) {
        return NULL;
    }
    node = node->src[0];
    struct step backwards[MAX_STEPS];
    int n = 0;
    while (node) {
        if (node->ne[0] != n_expert || node->type != GGML_TYPE_F32) {
            return NULL;
        }
        if (node->op == GGML_OP_MUL_MAT) {
            break;
        }
        if (n == MAX_STEPS) {
            return NULL;
        }
        switch (node->op) {
        case GGML_OP_ADD:
            if (!expert_bias(node->src[1], n_expert)) {
                return NULL;
            }
            backwards[n++] = (struct step){STEP_ADD_BIAS, node->src[1]->data};
            node = node->src[0];
            break;
        case GGML_OP_SOFT_MAX:
            /* plain softmax only: no mask, scale 1, no ALiBi */
            if (node->src[1] || node->src[2] || op_param_float(node, 0) != 1.0f || op_param_float(node, 1) != 0.0f) {
                return NULL;
            }
            backwards[n++] = (struct step){STEP_SOFTMAX, NULL};
            node = node->src[0];
            break;
        case GGML_OP_UNARY:
            if (ggml_get_unary_op(node) != GGML_UNARY_OP_SIGMOID) {
                return NULL;
            }
            backwards[n++] = (struct step){STEP_SIGMOID, NULL};
            node = node->src[0];
            break;
        case GGML_OP_SQRT:
            if (!node->src[0] || node->src[0]->op != GGML_OP_UNARY ||
                ggml_get_unary_op(node->src[0]) != GGML_UNARY_OP_SOFTPLUS) {
                return NULL;
            }
            backwards[n++] = (struct step){STEP_SQRT_SOFTPLUS, NULL};
            node = node->src[0]->src[0];
            break;
        default:
            return NULL;
        }
    }
    if (!node) {
        return NULL;
    }
    const struct ggml_tensor *weight = node->src[0];
    if (!plain_weight(weight) || weight->ne[1] != n_expert || ggml_n_dims(weight) != 2 ||
        weight->ne[0] % ggml_blck_size(weight->type) != 0 || !ggml_get_type_traits_cpu(weight->type)->vec_dot) {
        return NULL;
    }
    r->n_steps = n;
    for (int i = 0; i < n; i++) {
        r->steps[i] = backwards[n - 1 - i];
    }
    r->weight = weight->data;
    r->type = weight->type;
    r->n_embd = weight->ne[0];
    r->row_bytes = weight->nb[1];
    return node;
}

const struct ggml_tensor *guanaco_router_gate_learn(struct guanaco_router_gate *gate, int layer,
                                                    const struct ggml_tensor *topk) {
    if (!gate || !topk || layer < 0 || layer >= gate->n_layer) {
        return NULL;
    }
    struct router *r = &gate->routers[layer];
    int state = atomic_load_explicit(&r->state, memory_order_acquire);
    if (state == ROUTER_UNSUPPORTED) {
        return NULL;
    }
    struct router found = {0};
    const struct ggml_tensor *matmul = follow_router(topk, gate->n_expert, &found);
    if (state == ROUTER_UNKNOWN) {
        pthread_mutex_lock(&gate->lock);
        if (atomic_load_explicit(&r->state, memory_order_relaxed) == ROUTER_UNKNOWN) {
            if (matmul) {
                r->weight = found.weight;
                r->type = found.type;
                r->n_embd = found.n_embd;
                r->row_bytes = found.row_bytes;
                r->n_steps = found.n_steps;
                memcpy(r->steps, found.steps, sizeof(r->steps));
            }
            atomic_store_explicit(&r->state, matmul ? ROUTER_READY : ROUTER_UNSUPPORTED, memory_order_release);
            if (!matmul && !atomic_exchange(&gate->told_unsupported, 1)) {
                guanaco_log_info("prefetch gate: the router of layer %d cannot be evaluated here (grouped or "
                                 "unusual selection, or weights off the host): pilot predicts its layer instead",
                                 layer);
            }
        }
        pthread_mutex_unlock(&gate->lock);
    }
    if (!matmul) {
        return NULL;
    }
    const struct ggml_tensor *input = matmul->src[1];
    if (!input || input->type != GGML_TYPE_F32 || !on_host(input) || input->ne[0] != found.n_embd ||
        input->nb[0] != sizeof(float)) {
        return NULL;
    }
    return input;
}

size_t guanaco_router_gate_scratch_bytes(const struct guanaco_router_gate *gate, int64_t n_embd) {
    (void)gate;
    /* every vec_dot type is at most 4 bytes per value plus its per-block scales */
    return (size_t)n_embd * sizeof(float) * 2 + 1024;
}

static void apply_steps(const struct router *r, int64_t n_expert, float *scores) {
    for (int s = 0; s < r->n_steps; s++) {
        const struct step *step = &r->steps[s];
        switch (step->kind) {
        case STEP_ADD_BIAS:
            for (int64_t e = 0; e < n_expert; e++) {
                scores[e] += step->bias[e];
            }
            break;
        case STEP_SOFTMAX: {
            float max = -INFINITY;
            for (int64_t e = 0; e < n_expert; e++) {
                max = scores[e] > max ? scores[e] : max;
            }
            double sum = 0;
            for (int64_t e = 0; e < n_expert; e++) {
                scores[e] = expf(scores[e] - max);
                sum += scores[e];
            }
            for (int64_t e = 0; e < n_expert; e++) {
                scores[e] = (float)(scores[e] / sum);
            }
            break;
        }
        case STEP_SIGMOID:
            for (int64_t e = 0; e < n_expert; e++) {
                scores[e] = 1.0f / (1.0f + expf(-scores[e]));
            }
            break;
        case STEP_SQRT_SOFTPLUS:
            for (int64_t e = 0; e < n_expert; e++) {
                scores[e] = sqrtf(scores[e] > 20.0f ? scores[e] : log1pf(expf(scores[e])));
            }
            break;
        }
    }
}

int guanaco_router_gate_scores(struct guanaco_router_gate *gate, int layer, const struct ggml_tensor *input,
                               int n_tokens, int stride, float *scores, void *scratch, size_t scratch_bytes) {
    if (!gate || !input || !scores || layer < 0 || layer >= gate->n_layer || n_tokens <= 0 || stride <= 0 ||
        (int64_t)(n_tokens - 1) * stride >= input->ne[1]) {
        return -EINVAL;
    }
    const struct router *r = &gate->routers[layer];
    if (atomic_load_explicit(&r->state, memory_order_acquire) != ROUTER_READY) {
        return -ENOENT;
    }
    if (input->ne[0] != r->n_embd) {
        return -EINVAL;
    }
    const struct ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu(r->type);
    const enum ggml_type vec_type = traits->vec_dot_type;
    const size_t converted_bytes = ggml_row_size(vec_type, r->n_embd);
    if (vec_type != GGML_TYPE_F32 && (converted_bytes > scratch_bytes || !scratch ||
                                      !ggml_get_type_traits_cpu(vec_type)->from_float)) {
        return -ENOSPC;
    }
    for (int t = 0; t < n_tokens; t++) {
        const float *row = (const float *)((const char *)input->data + (size_t)t * (size_t)stride * input->nb[1]);
        const void *activation = row;
        if (vec_type != GGML_TYPE_F32) {
            ggml_get_type_traits_cpu(vec_type)->from_float(row, scratch, r->n_embd);
            activation = scratch;
        }
        float *out = scores + (size_t)t * (size_t)gate->n_expert;
        for (int64_t e = 0; e < gate->n_expert; e++) {
            traits->vec_dot((int)r->n_embd, &out[e], 0, r->weight + (size_t)e * r->row_bytes, 0, activation, 0, 1);
        }
        apply_steps(r, gate->n_expert, out);
    }
    return 0;
}
