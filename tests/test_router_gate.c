/*
 * test_router_gate.c - owns the tests of router_gate.c against ggml itself:
 * small router graphs of the shapes llama.cpp builds (softmax; gpt-oss's
 * biased logits; sigmoid with deepseek/glm's selection bias; sqrt-softplus;
 * a quantized router weight) are computed by ggml-cpu, and the scores
 * router_gate computes from the learnt router must pick the same top-k and
 * match the graph's selection scores. Routers it cannot follow (grouped
 * selection, an op it does not know) must be refused, never guessed.
 */
#include "router_gate.h"

#include "ggml-cpu.h"
#include "ggml.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum {
    N_EMBD = 64,
    N_EXPERT = 16,
    TOP_K = 4,
    N_TOKENS = 3,
};

enum chain { CHAIN_SOFTMAX, CHAIN_LOGIT_BIAS, CHAIN_SIGMOID_SELECTION_BIAS, CHAIN_SQRT_SOFTPLUS, CHAIN_GROUPED,
             CHAIN_SCALED };

static float next_value(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*state >> 40) & 0xffff) / 32768.0f - 1.0f;
}

static void fill(struct ggml_tensor *t, uint64_t seed) {
    float *data = t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) {
        data[i] = next_value(&seed);
    }
}

struct router_graph {
    struct ggml_context *ctx;
    struct ggml_tensor *input, *selection, *topk;
};

/* Builds and computes input -> router -> top-k the way build_moe_ffn does. */
static bool build(enum chain chain, enum ggml_type weight_type, struct router_graph *g) {
    struct ggml_init_params params = {.mem_size = 16 * 1024 * 1024, .mem_buffer = NULL, .no_alloc = false};
    g->ctx = ggml_init(params);
    if (!g->ctx) {
        return false;
    }
    struct ggml_context *ctx = g->ctx;
    struct ggml_tensor *weight_f32 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N_EMBD, N_EXPERT);
    fill(weight_f32, 7);
    struct ggml_tensor *weight = weight_f32;
    if (weight_type != GGML_TYPE_F32) {
        weight = ggml_new_tensor_2d(ctx, weight_type, N_EMBD, N_EXPERT);
        ggml_quantize_chunk(weight_type, weight_f32->data, weight->data, 0, N_EXPERT, N_EMBD, NULL);
    }
    struct ggml_tensor *bias = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N_EXPERT);
    fill(bias, 9);
    g->input = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N_EMBD, N_TOKENS);
    fill(g->input, 11);
    struct ggml_tensor *logits = ggml_mul_mat(ctx, weight, g->input);
    struct ggml_tensor *selection = NULL;
    switch (chain) {
    case CHAIN_SOFTMAX:
        selection = ggml_soft_max(ctx, logits);
        break;
    case CHAIN_LOGIT_BIAS:
        selection = ggml_add(ctx, logits, bias); /* gpt-oss: softmax only after the top-k */
        break;
    case CHAIN_SIGMOID_SELECTION_BIAS:
        selection = ggml_add(ctx, ggml_sigmoid(ctx, logits), bias);
        break;
    case CHAIN_SQRT_SOFTPLUS:
        selection = ggml_sqrt(ctx, ggml_softplus(ctx, logits));
        break;
    case CHAIN_GROUPED: {
        /* deepseek's grouped selection, reduced to its shape: the scores go through a reshape */
        struct ggml_tensor *groups = ggml_reshape_3d(ctx, ggml_soft_max(ctx, logits), N_EXPERT / 4, 4, N_TOKENS);
        selection = ggml_reshape_2d(ctx, ggml_cont(ctx, groups), N_EXPERT, N_TOKENS);
        break;
    }
    case CHAIN_SCALED:
        selection = ggml_scale(ctx, logits, 2.0f);
        break;
    }
    g->selection = selection;
    g->topk = ggml_argsort_top_k(ctx, selection, TOP_K);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, g->topk);
    return ggml_graph_compute_with_ctx(ctx, graph, 1) == GGML_STATUS_SUCCESS;
}

/* The graph's top-k of one token, as a set. */
static bool same_top_k(const struct router_graph *g, int token, const float *scores) {
    const int32_t *ids = (const int32_t *)((const char *)g->topk->data + (size_t)token * g->topk->nb[1]);
    bool taken[N_EXPERT] = {0};
    for (int r = 0; r < TOP_K; r++) {
        int best = -1;
        for (int e = 0; e < N_EXPERT; e++) {
            if (!taken[e] && (best < 0 || scores[e] > scores[best])) {
                best = e;
            }
        }
        taken[best] = true;
    }
    for (int r = 0; r < TOP_K; r++) {
        if (ids[r] < 0 || ids[r] >= N_EXPERT || !taken[ids[r]]) {
            return false;
        }
    }
    return true;
}

static void test_chain(enum chain chain, enum ggml_type weight_type, const char *name, double tolerance) {
    struct router_graph g;
    CHECK(build(chain, weight_type, &g));
    struct guanaco_router_gate *gate = NULL;
    CHECK(guanaco_router_gate_create(4, N_EXPERT, &gate) == 0);
    /* learnt as layer 2, then applied to the same input as layer 2 is: the graph's own selection */
    const struct ggml_tensor *input = guanaco_router_gate_learn(gate, 2, g.topk);
    CHECK(input == g.input);
    size_t scratch_bytes = guanaco_router_gate_scratch_bytes(gate, N_EMBD);
    void *scratch = malloc(scratch_bytes);
    float scores[N_TOKENS * N_EXPERT];
    CHECK(guanaco_router_gate_scores(gate, 2, input, N_TOKENS, 1, scores, scratch, scratch_bytes) == 0);
    double worst = 0;
    bool top_k_agrees = true;
    for (int t = 0; t < N_TOKENS; t++) {
        const float *graph_row = (const float *)((const char *)g.selection->data + (size_t)t * g.selection->nb[1]);
        for (int e = 0; e < N_EXPERT; e++) {
            double d = fabs((double)graph_row[e] - scores[t * N_EXPERT + e]);
            worst = d > worst ? d : worst;
        }
        top_k_agrees = top_k_agrees && same_top_k(&g, t, &scores[t * N_EXPERT]);
    }
    printf("%s: largest difference from ggml's selection scores %.2e\n", name, worst);
    CHECK(worst <= tolerance);
    CHECK(top_k_agrees);
    /* a sample of the rows, every second one: rows 0 and 2, scored as above */
    float sampled[2 * N_EXPERT];
    CHECK(guanaco_router_gate_scores(gate, 2, input, 2, 2, sampled, scratch, scratch_bytes) == 0);
    CHECK(memcmp(sampled, scores, N_EXPERT * sizeof(float)) == 0);
    CHECK(memcmp(sampled + N_EXPERT, scores + 2 * N_EXPERT, N_EXPERT * sizeof(float)) == 0);
    CHECK(guanaco_router_gate_scores(gate, 2, input, 2, 3, sampled, scratch, scratch_bytes) == -EINVAL); /* row 3 */
    CHECK(guanaco_router_gate_scores(gate, 2, input, 1, 0, sampled, scratch, scratch_bytes) == -EINVAL);
    /* a layer whose router was never seen has no scores; bad arguments are refused */
    CHECK(guanaco_router_gate_scores(gate, 3, input, N_TOKENS, 1, scores, scratch, scratch_bytes) == -ENOENT);
    CHECK(guanaco_router_gate_scores(gate, 2, input, N_TOKENS + 1, 1, scores, scratch, scratch_bytes) == -EINVAL);
    CHECK(guanaco_router_gate_scores(gate, 9, input, N_TOKENS, 1, scores, scratch, scratch_bytes) == -EINVAL);
    free(scratch);
    guanaco_router_gate_free(gate);
    ggml_free(g.ctx);
}

static void test_refused(enum chain chain, const char *name) {
    struct router_graph g;
    CHECK(build(chain, GGML_TYPE_F32, &g));
    struct guanaco_router_gate *gate = NULL;
    CHECK(guanaco_router_gate_create(4, N_EXPERT, &gate) == 0);
    const struct ggml_tensor *input = guanaco_router_gate_learn(gate, 1, g.topk);
    printf("%s: %s\n", name, input ? "followed (wrong)" : "refused");
    CHECK(input == NULL);
    float scores[N_TOKENS * N_EXPERT];
    char scratch[4096];
    CHECK(guanaco_router_gate_scores(gate, 1, g.input, N_TOKENS, 1, scores, scratch, sizeof(scratch)) == -ENOENT);
    /* and it stays refused: a second look does not change its mind */
    CHECK(guanaco_router_gate_learn(gate, 1, g.topk) == NULL);
    guanaco_router_gate_free(gate);
    ggml_free(g.ctx);
}

static void test_bad_arguments(void) {
    struct guanaco_router_gate *gate = NULL;
    CHECK(guanaco_router_gate_create(0, 8, &gate) == -EINVAL);
    CHECK(guanaco_router_gate_create(4, 0, &gate) == -EINVAL);
    CHECK(guanaco_router_gate_create(4, 8, NULL) == -EINVAL);
    CHECK(guanaco_router_gate_create(4, 8, &gate) == 0);
    CHECK(guanaco_router_gate_learn(gate, 4, NULL) == NULL);
    CHECK(guanaco_router_gate_learn(NULL, 0, NULL) == NULL);
    guanaco_router_gate_free(gate);
    guanaco_router_gate_free(NULL);
}

int main(void) {
    ggml_cpu_init();
    test_chain(CHAIN_SOFTMAX, GGML_TYPE_F32, "softmax (qwen3moe, mixtral)", 1e-5);
    test_chain(CHAIN_LOGIT_BIAS, GGML_TYPE_F32, "biased logits (gpt-oss)", 1e-4);
    test_chain(CHAIN_SIGMOID_SELECTION_BIAS, GGML_TYPE_F32, "sigmoid + selection bias (deepseek2, glm4moe)", 1e-5);
    test_chain(CHAIN_SQRT_SOFTPLUS, GGML_TYPE_F32, "sqrt(softplus)", 1e-4);
    /* a quantized router runs through ggml's own vec_dot with the activations converted as ggml does */
    test_chain(CHAIN_SOFTMAX, GGML_TYPE_Q8_0, "softmax, Q8_0 router", 1e-5);
    test_chain(CHAIN_LOGIT_BIAS, GGML_TYPE_F16, "biased logits, F16 router", 1e-3);
    test_refused(CHAIN_GROUPED, "grouped selection");
    test_refused(CHAIN_SCALED, "an unknown op between the logits and the top-k");
    test_bad_arguments();
    return check_summary();
}
