/*
 * routing_synth.h - owns synthetic MoE routing: a deterministic generator of
 * routing decisions with tunable statistics (expert popularity skew, temporal
 * reuse, cross-layer correlation, topic shifts), the named presets tuned to
 * published or measured statistics of real models, and the measurement of
 * those same statistics on any trace (trace.h), so a synthetic trace can be
 * shown next to the real one it imitates.
 *
 * guanaco-tracegen writes these traces to files; guanaco-plan generates one
 * in memory when the user has no recording of the model. Pure: no I/O.
 */
#ifndef GUANACO_ROUTING_SYNTH_H
#define GUANACO_ROUTING_SYNTH_H

#include "trace.h"

#include <stddef.h>
#include <stdint.h>

struct guanaco_synth_params {
    uint32_t n_layer, n_expert, top_k;
    const uint8_t *moe_layer; /* n_layer flags: 0 = a dense layer, which routes nothing; NULL = all MoE */
    uint32_t sequences;       /* independent sequences: each starts at token 0 with no history */
    uint32_t tokens;          /* tokens per sequence */
    uint64_t seed;            /* the same parameters and seed give the same decisions, bit for bit */
    /* Popularity (Zipf-Mandelbrot): the expert at rank r (from 1) of a
       layer's ranking is drawn with weight (r + zipf_offset)^-zipf. An
       offset flattens the head and, with a larger exponent, thins the tail:
       real routers have a broad hot set and experts that are almost never
       chosen. Each layer's ranking is its own random permutation, and the
       exponents of the MoE layers are spread evenly over
       zipf * (1 - zipf_spread) .. zipf * (1 + zipf_spread), dealt to the
       layers in a random order. zipf 0 is uniform. */
    double zipf;
    double zipf_offset;       /* 0 = plain Zipf */
    double zipf_spread;       /* 0..1 */
    /* Temporal reuse: each expert the layer chose for the previous token of
       the sequence is chosen again, first, with this probability. */
    double reuse;             /* 0..1 */
    /* Cross-layer correlation: each slot reuse left open is filled, with this
       probability, by a fixed map of an expert the previous MoE layer chose
       for the same token. The map sends rank r of one layer's base ranking to
       rank r of the next, so hot experts lead to hot experts and the
       popularity of each layer is kept. */
    double cross_layer;       /* 0..1 */
    /* Topic shifts: at the start of every sequence and then every
       topic_every tokens, each layer's ranking becomes its base ranking with
       every expert's log-rank moved by normal noise of deviation
       topic_strength. 0 = one topic, the base ranking, for the whole trace. */
    uint32_t topic_every;
    double topic_strength;    /* 0..16; about 1 swaps neighbours, 4 and more is close to a fresh permutation */
};

/* 0 when the parameters can be generated; otherwise -EINVAL after writing
   the reason (naming the parameter) into why. */
int guanaco_synth_check(const struct guanaco_synth_params *params, char *why, size_t why_size);

/* Receives one decision: top_k distinct ids. A non-zero return stops the generation and is returned. */
typedef int (*guanaco_synth_emit)(void *user, uint32_t sequence, uint32_t token, uint32_t layer,
                                  const int32_t *ids);

/* Generates sequences x tokens x MoE layers decisions in execution order
   (sequence, token, layer). 0, -EINVAL (bad parameters), -ENOMEM, or the
   emitter's non-zero return. */
int guanaco_synth_generate(const struct guanaco_synth_params *params, guanaco_synth_emit emit, void *user);

/* The same decisions into a trace in memory (free it with guanaco_trace_free).
   `arch` and `source` go into its shape. 0, -EINVAL or -ENOMEM. */
int guanaco_synth_trace(const struct guanaco_synth_params *params, const char *arch, const char *source,
                        struct guanaco_trace *out);

/* Statistics that characterise routing, computed the same way for real and synthetic traces. */
struct guanaco_routing_stats {
    uint64_t records, sequences, tokens; /* tokens: distinct (sequence, token) positions */
    /* Each expert chosen at token t of a (sequence, layer) whose t+1 is also
       present forms a pair; the pair shares when t+1 chooses it too. This is
       guanaco-trace-convert's "reuse". NAN when there is no pair. */
    uint64_t adjacent_pairs;
    double adjacent_share;
    /* Share of a layer's selections carried by its top_count most chosen
       experts (top_count = 2 * top_k, at most n_expert), over the layers
       that route: the lowest, median and highest layer. */
    uint32_t top_count;
    double top_share_min, top_share_median, top_share_max;
    /* Cross-layer predictability: for each expert chosen in a layer, whether
       the best fixed guess from it (the expert of the next routing layer most
       often chosen together with it, fitted on this trace) is among that
       layer's choices. Baseline: guessing the next layer's most chosen expert
       whatever came before. NAN when there is no such pair of layers, or
       n_expert is above GUANACO_ROUTING_CROSS_MAX_EXPERTS (the table would
       not fit comfortably). */
    uint64_t cross_pairs;
    double cross_layer, cross_layer_baseline;
};

#define GUANACO_ROUTING_CROSS_MAX_EXPERTS 512u

/* 0, or -ENOMEM. The trace may be in any record order. */
int guanaco_routing_measure(const struct guanaco_trace *trace, struct guanaco_routing_stats *out);

/* A named set of parameters and the statistics of the real model it imitates. */
struct guanaco_synth_preset {
    const char *name;
    const char *arch;   /* the GGUF architecture of the model it imitates */
    struct guanaco_synth_params params; /* moe_layer NULL */
    /* Targets; NAN when the source gives none. */
    double target_adjacent_share;
    double target_top_share_min, target_top_share_median, target_top_share_max;
    double target_cross_layer;
    const char *target_source;
};

/* Every preset, in a fixed order; *count is set. */
const struct guanaco_synth_preset *guanaco_synth_presets(size_t *count);
/* The preset called `name`, or NULL. */
const struct guanaco_synth_preset *guanaco_synth_preset_find(const char *name);
/* "qwen3-30b-a3b|mixtral-8x7b", for messages that list the accepted names. */
const char *guanaco_synth_preset_names(void);
/* The preset whose (n_expert, top_k) is nearest to the given shape, in ratio. */
const struct guanaco_synth_preset *guanaco_synth_preset_closest(uint32_t n_expert, uint32_t top_k);

#endif
