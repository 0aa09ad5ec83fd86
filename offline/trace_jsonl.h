/*
 * trace_jsonl.h - owns converting routing logs in JSON Lines (one flat object
 * per line: dataset, problem_id, layer, experts, gating_probs, token_idx; see
 * shared/traces/README.md) into Guanaco's routing-trace format (trace.h),
 * and the statistics that check a conversion against the published numbers.
 */
#ifndef GUANACO_TRACE_JSONL_H
#define GUANACO_TRACE_JSONL_H

#include "trace.h"

#include <stddef.h>
#include <stdint.h>

struct guanaco_trace_convert_options {
    const char *arch;   /* header arch; NULL -> "unknown" */
    const char *source; /* header source; NULL -> the input file's base name */
    uint32_t n_layer;   /* 0 -> highest layer + 1; else at least that */
    uint32_t n_expert;  /* 0 -> highest id + 1; else at least that (Mixtral: 8 even if 7 is never chosen) */
};

/* One sequence of the trace: a (dataset, problem_id) pair, numbered in order of first appearance. */
struct guanaco_trace_convert_sequence {
    char dataset[64];
    char problem_id[64]; /* the JSON value as written: 3 or "HumanEval/3" (without quotes) */
    size_t n_tokens;     /* distinct token positions */
};

struct guanaco_trace_convert_report {
    struct guanaco_trace_shape shape; /* as written to the header */
    size_t n_lines;                   /* non-blank input lines, one record each */
    size_t n_records;
    size_t n_sequences;
    struct guanaco_trace_convert_sequence *sequences; /* n_sequences; free with ..._report_free */
    size_t n_tokens;                  /* distinct (sequence, token) positions */
    size_t n_incomplete_tokens;       /* positions lacking a layer that appears elsewhere in the input */
    size_t n_moe_layers;              /* distinct layers in the input */
    /* Reuse: over every (sequence, layer, token t) whose token t+1 is also present
     * in that layer, each expert chosen at t counts a pair; a hit when it is chosen
     * again at t+1. probability = hits / pairs; chance is top_k / n_expert. */
    uint64_t reuse_pairs;
    uint64_t reuse_hits;
    double reuse_probability;
    double reuse_chance;
};

/*
 * Reads `in_path`, sorts its records by (sequence, token, layer) and writes
 * them as a trace to `out_path`. Fills `report` (which may be NULL) on
 * success. `in_path` must be a regular file, read no further than its size at
 * open (a pipe or /dev/zero has no size to bound it). Returns 0, or a negative
 * errno after a message: -EINVAL for a malformed line (the message names the
 * file and line; a NUL byte stops the read at once), an expert named twice in
 * one decision, a top_k that changes, a repeated (sequence, token, layer),
 * options the data does not fit, or an input that is not a regular file;
 * -ENOSPC etc. from writing. On failure no trace is left at `out_path` if it
 * is a regular file.
 */
int guanaco_trace_convert_jsonl(const char *in_path, const char *out_path,
                                const struct guanaco_trace_convert_options *options,
                                struct guanaco_trace_convert_report *report);

void guanaco_trace_convert_report_free(struct guanaco_trace_convert_report *report);

#endif
