/*
 * imatrix.h - owns the imatrix prior (--guanaco-imatrix FILE): reading the
 * per-expert routing counts out of an llama.cpp importance-matrix file,
 * checking that they belong to the model being loaded, and the one rule
 * that turns them into the experts the preload brings in. The engine and
 * the simulator both choose with guanaco_prior_preload_choice(), so a
 * simulated preload is the live one.
 *
 * The file: llama-imatrix writes a GGUF (general.type = "imatrix") with two
 * F32 tensors per matrix it saw, "<weight>.in_sum2" {in_dim, nmat} and
 * "<weight>.counts" {1, nmat}. For an expert tensor (blk.N.ffn_*_exps.weight)
 * nmat is the model's expert count and counts[e] is how many (token, slot)
 * routings went to expert e; every expert tensor of a layer carries the same
 * counts, because the same routing fed all of them. Only the counts are read
 * (a few bytes per layer), never in_sum2.
 *
 * The legacy .dat format (llama-imatrix --output-format dat) is refused with
 * a message: it stores, per tensor, one call count and activations already
 * divided by each expert's count, so which experts were routed to how often
 * cannot be recovered from it.
 */
#ifndef GUANACO_IMATRIX_H
#define GUANACO_IMATRIX_H

#include <stdint.h>

#include "manifest.h"

struct guanaco_imatrix_prior {
    uint32_t n_layer, n_expert;
    uint8_t *has_prior; /* n_layer: the file had non-zero expert counts for the layer */
    float *weight;      /* n_layer * n_expert: each expert's share of its layer's routings (sums to 1 over a
                           layer with a prior; all 0 in one without) */
    double *routings;   /* n_layer: (token, slot) routings counted in the layer */
    uint32_t n_layers_with_prior;
};

/*
 * Reads the counts of the imatrix GGUF at `path` for the model described by
 * `manifest`. Every failure prints a message naming --guanaco-imatrix and the
 * file and returns: -ENOENT (missing), -EINVAL (not a regular file, not GGUF,
 * the legacy .dat format, not an imatrix, counts of another model: a layer
 * or tensor this model lacks, another expert count; absurd counts: negative,
 * not finite, not whole, or disagreeing between tensors of one layer; no
 * expert counts at all), -EIO (truncated or unreadable), -ENOMEM. MoE layers
 * the file has no (or only zero) counts for get no prior, and one line says
 * which.
 */
int guanaco_imatrix_load(const char *path, const struct guanaco_manifest *manifest,
                         struct guanaco_imatrix_prior *out);

void guanaco_imatrix_free(struct guanaco_imatrix_prior *prior);

/* The layer's weights (n_expert entries), or NULL when the layer has no prior (or prior is NULL). */
const float *guanaco_imatrix_layer(const struct guanaco_imatrix_prior *prior, uint32_t layer);

/*
 * The experts the preload brings into one layer: the `n` with the largest
 * weight, ties by the lowest id; with weights NULL (no prior) the `n`
 * lowest-numbered. Experts flagged in `skip` (NULL, or n_expert flags: those
 * a warm start already holds) are neither chosen nor counted. Pure; no
 * allocation. `out` (room for n) receives them in the order the preload
 * hands them to the policy: the preference order reversed (ascending
 * weight, ties by descending id), so that the most-routed is the most
 * recently used; without a prior in ascending id, as the preload always
 * did. Returns how many were written: min(n, experts not skipped).
 */
uint32_t guanaco_prior_preload_choice(const float *weights, uint32_t n_expert, const uint8_t *skip, uint32_t n,
                                      uint32_t *out);

#endif
