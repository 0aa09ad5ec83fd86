/*
 * router_gate.h - evaluating a MoE layer's router on another layer's input,
 * for the gate predictor (router_gate.c says how and why).
 *
 *     input = guanaco_router_gate_learn(gate, L, topk_node);   // at ffn_moe_topk-L
 *     if (input && guanaco_router_gate_scores(gate, next, input, n_tokens, 1, scores, scratch, bytes) == 0)
 *         ... scores: n_tokens rows of n_expert selection scores of layer `next` ...
 *
 * Thread-safe: several contexts may learn and score at once.
 */
#ifndef GUANACO_ROUTER_GATE_H
#define GUANACO_ROUTER_GATE_H

#include "ggml-backend.h"
#include "ggml.h"

#include <stddef.h>
#include <stdint.h>

struct guanaco_router_gate;

int guanaco_router_gate_create(int n_layer, int64_t n_expert, struct guanaco_router_gate **out); /* 0, -EINVAL, -ENOMEM */
void guanaco_router_gate_free(struct guanaco_router_gate *gate); /* NULL accepted */

/* Learns layer's router from its ffn_moe_topk node the first time (a router it cannot evaluate is
   reported once and skipped from then on), and returns that layer's MoE input (n_embd x n_tokens F32,
   on the host), or NULL when there is none it can use. */
const struct ggml_tensor *guanaco_router_gate_learn(struct guanaco_router_gate *gate, int layer,
                                                    const struct ggml_tensor *topk);

/* Scratch the caller lends guanaco_router_gate_scores for inputs of n_embd values. */
size_t guanaco_router_gate_scratch_bytes(const struct guanaco_router_gate *gate, int64_t n_embd);

/* Applies `layer`'s learnt router to n_tokens rows of input, rows 0, stride, 2 * stride, ... (a prompt's
   ubatch is scored on a sample of its tokens): n_tokens x n_expert selection scores into `scores`. 0; -ENOENT
   when that router is not learnt yet or cannot be evaluated, -EINVAL (also for rows beyond input's), -ENOSPC
   when the scratch is too small. */
int guanaco_router_gate_scores(struct guanaco_router_gate *gate, int layer, const struct ggml_tensor *input,
                               int n_tokens, int stride, float *scores, void *scratch, size_t scratch_bytes);

#endif
