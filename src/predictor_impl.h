/*
 * predictor_impl.h - owns the seam between predictor.c (the public entry
 * points, argument checks and the layer order) and each implementation in
 * predictor_*.c, the way ggml's backends sit behind an interface table. An
 * implementation sees only arguments predictor.c has already checked, so
 * each one holds its own bookkeeping and nothing else.
 */
#ifndef GUANACO_PREDICTOR_IMPL_H
#define GUANACO_PREDICTOR_IMPL_H

#include "predictor.h"

struct guanaco_predictor_ops {
    /* to_layer is the next MoE layer after from_layer; ids may hold any value (out of range is skipped). */
    int (*observe)(void *impl, uint32_t from_layer, const int32_t *from_ids, const int32_t *to_ids, uint32_t k,
                   uint32_t n_tokens);
    /* `layer` has a next MoE layer; capacity > 0. */
    /* the probability of the i-th expert the last predict emitted */
    double (*probability)(void *impl, size_t i);
    size_t (*predict)(void *impl, uint32_t layer, const int32_t *ids, uint32_t k, uint32_t n_tokens, uint32_t *out,
                      size_t capacity);
    /* optional (NULL: the kind has no scores); `next` is the next MoE layer, n_tokens checked; absent may
       be NULL */
    size_t (*predict_scores)(void *impl, uint32_t layer, uint32_t next, const float *scores, uint32_t n_tokens,
                             const uint8_t *absent, uint32_t *out, size_t capacity);
    /* optional; layer < n_layer */
    int (*recall)(void *impl, uint32_t layer, struct guanaco_predictor_recall *recall);
    void (*free)(void *impl);
};

/* config already checked; moe_layer and next_layer: n_layer entries each (the layer routes; the next MoE
   layer after it or UINT32_MAX), read only during create. 0, -E2BIG or -ENOMEM. */
int guanaco_predictor_pilot_create(const struct guanaco_predictor_config *config, const uint8_t *moe_layer,
                                   const uint32_t *next_layer, const struct guanaco_predictor_ops **ops,
                                   void **impl);

/* The same, for gate (which holds a pilot for the ubatches it has no scores for). */
int guanaco_predictor_gate_create(const struct guanaco_predictor_config *config, const uint8_t *moe_layer,
                                  const uint32_t *next_layer, const struct guanaco_predictor_ops **ops, void **impl);

#endif
