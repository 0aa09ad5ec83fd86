/*
 * engine.h - the engine's internals shared by engine.c (lifecycle, mapping,
 * summary) and hook.c (the router callback). Not part of the public API.
 */
#ifndef GUANACO_ENGINE_H
#define GUANACO_ENGINE_H

#include "guanaco.h"
#include "manifest.h"

#include <stdatomic.h>

struct guanaco_engine {
    struct guanaco_manifest manifest;
    struct guanaco_options options;
    bool dry_run;                  /* the loader's memory-fit pass: decide, map nothing, say nothing */
    int *moe_layer_of;             /* n_layer entries: 1 when the layer has experts */
    _Atomic uint64_t *access_count; /* n_layer * n_expert: times the router chose (layer, expert) */
    _Atomic uint64_t routed_tokens; /* tokens seen, summed over MoE layers */
    _Atomic uint64_t router_calls;  /* ffn_moe_topk evaluations */
    _Atomic uint64_t invalid_ids;   /* ids outside [0, n_expert): counted, never used */
    _Atomic int hooks;              /* contexts currently hooked */
};

/* Count one router decision: `n_tokens` rows of `k` expert ids for `layer`. */
void guanaco_engine_count_routing(struct guanaco_engine *engine, int layer, const int32_t *ids, int k,
                                  int n_tokens);

#endif
