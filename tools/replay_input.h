/*
 * replay_input.h - owns what guanaco-sim and guanaco-plan share to replay
 * routing: a model's geometry (bytes of one expert in each layer, from its
 * GGUF manifest) and the replay core's request trace (offline/simulate.h) built
 * from loaded routing traces (src/trace.h). Static inline functions, so each
 * tool compiles only what it uses; `program` prefixes the messages.
 */
#ifndef GUANACO_TOOLS_REPLAY_INPUT_H
#define GUANACO_TOOLS_REPLAY_INPUT_H

#include "manifest.h"
#include "residency.h"
#include "simulate.h"
#include "trace.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- model geometry: bytes of one expert in each layer ---- */

struct replay_geometry {
    char description[200];
    uint32_t n_layer, n_expert, top_k;
    uint64_t *expert_bytes;      /* n_layer entries; 0 = a layer without experts */
    double *small_page_share;    /* n_layer: the share of its experts' bytes outside their slices' 2 MiB-aligned
                                    middles, which page-cache loading maps in 4 KiB pages; NULL for a named
                                    shape (no file offsets: all of it) */
    uint32_t n_moe_layers;
    uint64_t total_expert_bytes; /* every expert of every layer: 100% */
    uint64_t one_per_layer_bytes;/* one expert of each MoE layer: the unit of "Ne" budgets */
};

static inline void replay_geometry_finish(struct replay_geometry *geometry) {
    for (uint32_t l = 0; l < geometry->n_layer; l++) {
        if (geometry->expert_bytes[l] > 0) {
            geometry->n_moe_layers++;
            geometry->one_per_layer_bytes += geometry->expert_bytes[l];
            geometry->total_expert_bytes += geometry->expert_bytes[l] * geometry->n_expert;
        }
    }
}

/* The geometry of a loaded manifest; `path` names the model in messages and the description.
   -EINVAL after a message for a dense model, or -ENOMEM. */
static inline int replay_geometry_from_manifest(const char *program, const struct guanaco_manifest *manifest,
                                                const char *path, struct replay_geometry *out) {
    if (manifest->n_tensors == 0 || manifest->n_expert <= 0 || manifest->n_expert_used <= 0) {
        fprintf(stderr, "%s: %s has no expert tensors (a dense model): nothing to replay\n", program, path);
        return -EINVAL;
    }
    out->n_layer = (uint32_t)manifest->n_layer;
    out->n_expert = (uint32_t)manifest->n_expert;
    out->top_k = (uint32_t)manifest->n_expert_used;
    out->expert_bytes = calloc(out->n_layer, sizeof(*out->expert_bytes));
    if (!out->expert_bytes) {
        return -ENOMEM;
    }
    out->small_page_share = calloc(out->n_layer, sizeof(*out->small_page_share));
    if (!out->small_page_share) {
        free(out->expert_bytes);
        out->expert_bytes = NULL;
        return -ENOMEM;
    }
    /* One expert of a layer is its slice of each of the layer's expert tensors (gate, up, down, ...). A slice's
       2 MiB-aligned middle is what the engine reads in huge folios (guanaco_huge_middle, src/residency.h); the rest, all
       of a slice that has no such middle, goes in 4 KiB pages. */
    for (size_t i = 0; i < manifest->n_tensors; i++) {
        const struct guanaco_expert_tensor *t = &manifest->tensors[i];
        out->expert_bytes[t->layer] += t->expert_stride;
        for (int e = 0; e < manifest->n_expert; e++) {
            uint64_t a = t->file_offset + (uint64_t)e * t->expert_stride, begin, end;
            guanaco_huge_middle(a, a + t->expert_stride, &begin, &end);
            out->small_page_share[t->layer] += (double)(t->expert_stride - (begin < end ? end - begin : 0));
        }
    }
    for (uint32_t l = 0; l < out->n_layer; l++) {
        out->small_page_share[l] =
            out->expert_bytes[l] ? out->small_page_share[l] / ((double)out->expert_bytes[l] * out->n_expert) : 1.0;
    }
    const char *base = strrchr(path, '/');
    snprintf(out->description, sizeof(out->description), "%s (%s)", base ? base + 1 : path, manifest->arch);
    replay_geometry_finish(out);
    return 0;
}

/* ---- the request trace, built from any number of loaded traces ---- */

struct replay_requests {
    size_t n_requests;
    uint64_t *token;
    uint32_t *layer;
    size_t *start;      /* n_requests + 1 */
    uint32_t *experts;
    uint64_t *sequence; /* per request: 0, 1, ... across every appended trace */
    size_t *row_start;  /* n_requests + 1: the routed rows behind request r (guanaco_request_rows) */
    int32_t *row_ids;   /* top_k per row */
    uint32_t top_k;
    uint64_t n_tokens;  /* distinct (trace, sequence, token) positions */
    uint64_t n_sequences;
    uint64_t n_passes;  /* runs of requests with one token: a ubatch, or one decode token */
    size_t n_records;
};

struct replay_order {
    uint32_t sequence, token, layer;
    size_t record;
};

static inline int replay_compare_order(const void *a, const void *b) {
    const struct replay_order *x = a, *y = b;
    if (x->sequence != y->sequence) return x->sequence < y->sequence ? -1 : 1;
    if (x->token != y->token) return x->token < y->token ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return x->record < y->record ? -1 : x->record > y->record;
}

/*
 * Appends one trace's records as requests, in (sequence, token, layer) order,
 * which is execution order for decode. Sequences follow each other and the
 * cache carries over, as for a server answering prompts in turn; a new
 * (sequence, token) is a new tick of the policies' clock.
 *
 * With `ubatches`, the records stay in the order they were recorded
 * (--guanaco-trace-out writes them as the router hook sees them: each MoE
 * layer of a ubatch, all of its rows). Consecutive records of one sequence
 * and layer with consecutive tokens are one request, the ubatch's rows; a
 * request whose layer does not come after the previous one's, or of another
 * sequence, starts a new pass. The clock is then the first token of the
 * pass. A trace written sorted (converted, or guanaco-tracegen) has one
 * token per pass either way.
 */
static inline int replay_append_trace(const char *program, struct replay_requests *requests,
                                      const struct guanaco_trace *trace, const char *path,
                                      const struct replay_geometry *geometry, bool ubatches) {
    size_t n = trace->n_records;
    uint32_t top_k = trace->shape.top_k;
    if (n == 0) {
        return 0;
    }
    if (requests->top_k && requests->top_k != top_k) {
        fprintf(stderr, "%s: %s routes top-%u, the traces before it top-%u\n", program, path, top_k,
                requests->top_k);
        return -EINVAL;
    }
    requests->top_k = top_k;
    size_t n_requests = requests->n_requests + n, n_experts = requests->start[requests->n_requests] + n * top_k;
    uint64_t *token = realloc(requests->token, n_requests * sizeof(*token));
    if (token) requests->token = token;
    uint32_t *layer = realloc(requests->layer, n_requests * sizeof(*layer));
    if (layer) requests->layer = layer;
    size_t *start = realloc(requests->start, (n_requests + 1) * sizeof(*start));
    if (start) requests->start = start;
    uint32_t *experts = realloc(requests->experts, n_experts * sizeof(*experts));
    if (experts) requests->experts = experts;
    uint64_t *sequences = realloc(requests->sequence, n_requests * sizeof(*sequences));
    if (sequences) requests->sequence = sequences;
    size_t n_rows_before = requests->row_start ? requests->row_start[requests->n_requests] : 0;
    size_t *row_start = realloc(requests->row_start, (n_requests + 1) * sizeof(*row_start));
    if (row_start) {
        if (!requests->row_start) row_start[0] = 0;
        requests->row_start = row_start;
    }
    int32_t *row_ids = realloc(requests->row_ids, (n_rows_before + n) * top_k * sizeof(*row_ids));
    if (row_ids) requests->row_ids = row_ids;
    /* seen[id] == record + 1 when the record already named id: a repeated id needs no second slot */
    size_t *seen = calloc(geometry->n_expert, sizeof(*seen));
    struct replay_order *order = NULL;
    bool sorted = true;
    for (size_t i = 1; i < n && sorted && !ubatches; i++) {
        struct replay_order a = {trace->sequence[i - 1], trace->token[i - 1], trace->layer[i - 1], i - 1};
        struct replay_order b = {trace->sequence[i], trace->token[i], trace->layer[i], i};
        sorted = replay_compare_order(&a, &b) < 0;
    }
    if (!sorted) {
        /* the engine appends in hook order, and several contexts may interleave */
        order = malloc(n * sizeof(*order));
        if (order) {
            for (size_t i = 0; i < n; i++) {
                order[i] = (struct replay_order){trace->sequence[i], trace->token[i], trace->layer[i], i};
            }
            qsort(order, n, sizeof(*order), replay_compare_order);
        }
    }
    if (!token || !layer || !start || !experts || !sequences || !row_start || !row_ids || !seen ||
        (!sorted && !order)) {
        free(seen);
        free(order);
        fprintf(stderr, "%s: out of memory for the requests of %s\n", program, path);
        return -ENOMEM;
    }
    size_t r = requests->n_requests, e = requests->start[r], row = n_rows_before, pass_request = SIZE_MAX;
    uint32_t last_sequence = 0, last_token = 0, last_layer = 0;
    bool open = false;
    size_t mark = 0; /* 1 + the record that opened the request: seen[id] == mark when the request has id */
    for (size_t i = 0; i < n; i++) {
        size_t record = sorted ? i : order[i].record;
        uint32_t sequence = trace->sequence[record], position = trace->token[record], l = trace->layer[record];
        if (geometry->expert_bytes[l] == 0) {
            fprintf(stderr, "%s: %s: record %zu routes in layer %u, which has no experts in %s\n", program, path,
                    record, l, geometry->description);
            free(seen);
            free(order);
            return -EINVAL;
        }
        bool new_sequence = i == 0 || sequence != last_sequence;
        if (new_sequence) {
            requests->n_sequences++;
        }
        bool new_request = true, new_pass = new_sequence || position != last_token;
        if (ubatches) {
            new_request = new_sequence || l != last_layer || position != last_token + 1;
            new_pass = new_request && (new_sequence || l <= last_layer);
        }
        if (new_request) {
            r += open;
            open = true;
            mark = i + 1;
            requests->start[r] = e;
            requests->row_start[r] = row;
            /* the clock: the pass's first token, counted over every trace appended */
            requests->token[r] = new_pass ? requests->n_tokens : requests->token[r - 1];
            requests->layer[r] = l;
            requests->sequence[r] = requests->n_sequences - 1;
            if (new_pass) {
                requests->n_passes++;
                pass_request = r;
            }
        }
        last_sequence = sequence;
        last_token = position;
        last_layer = l;
        for (uint32_t k = 0; k < top_k; k++) {
            int32_t id = trace->ids[record * top_k + k];
            requests->row_ids[row * top_k + k] = id;
            if (seen[id] != mark) {
                seen[id] = mark;
                requests->experts[e++] = (uint32_t)id;
            }
        }
        row++;
        requests->n_tokens += r == pass_request; /* a pass's tokens are its first request's rows */
    }
    r += open;
    requests->start[r] = e;
    requests->row_start[r] = row;
    requests->n_requests = r;
    requests->n_records += n;
    free(seen);
    free(order);
    return 0;
}

static inline void replay_requests_free(struct replay_requests *requests) {
    free(requests->sequence);
    free(requests->row_start);
    free(requests->row_ids);
    free(requests->token);
    free(requests->layer);
    free(requests->start);
    free(requests->experts);
}

/*
 * Loads the trace at `path`, refuses it (after a message) unless it was
 * recorded on the geometry's shape, and appends its requests. `source`
 * (source_size bytes) receives the trace's source text, or the path when it
 * has none. 0, or a negative errno after a message.
 */
static inline int replay_add_trace_file(const char *program, const char *path, const struct replay_geometry *geometry,
                                        struct replay_requests *requests, char *source, size_t source_size,
                                        bool ubatches) {
    struct guanaco_trace trace;
    int err = guanaco_trace_load(path, &trace);
    if (err != 0) {
        fprintf(stderr, "%s: cannot replay %s: %s\n", program, path, strerror(-err));
        return err;
    }
    if (guanaco_trace_shape_check(&trace.shape, geometry->n_layer, geometry->n_expert, geometry->top_k) != 0) {
        fprintf(stderr,
                "%s: %s was recorded on %u layers x %u experts, top-%u; %s has %u layers x %u experts, "
                "top-%u: refusing to replay it\n",
                program, path, trace.shape.n_layer, trace.shape.n_expert, trace.shape.top_k, geometry->description,
                geometry->n_layer, geometry->n_expert, geometry->top_k);
        guanaco_trace_free(&trace);
        return -EINVAL;
    }
    snprintf(source, source_size, "%s", trace.shape.source[0] ? trace.shape.source : path);
    err = replay_append_trace(program, requests, &trace, path, geometry, ubatches);
    guanaco_trace_free(&trace);
    return err;
}

/* The rows behind the requests, for guanaco_simulate and guanaco_simulate_pipeline; `timed` may be NULL (every
   request timed). */
static inline struct guanaco_request_rows replay_request_rows(const struct replay_requests *requests,
                                                              const uint8_t *timed) {
    return (struct guanaco_request_rows){
        .top_k = requests->top_k,
        .request_row_start = requests->row_start,
        .ids = requests->row_ids,
        .request_timed = timed,
    };
}

/* The replay core's view of the requests: borrowed arrays, valid while both arguments live. */
static inline struct guanaco_request_trace replay_request_trace(const struct replay_geometry *geometry,
                                                                const struct replay_requests *requests) {
    return (struct guanaco_request_trace){
        .n_layer = geometry->n_layer,
        .n_expert = geometry->n_expert,
        .expert_bytes = geometry->expert_bytes,
        .n_requests = requests->n_requests,
        .request_token = requests->token,
        .request_layer = requests->layer,
        .request_start = requests->start,
        .experts = requests->experts,
    };
}

#endif
