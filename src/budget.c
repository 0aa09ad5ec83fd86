/*
 * budget.c - owns the --guanaco-ram auto rule. What the machine or cgroup
 * leaves once the rest of the model is resident: memory - non-expert weights
 * - a margin. At load the contexts' KV cache and compute buffers are not known
 * yet, so 1 GiB plus 10% is kept for them. Once a context has allocated them
 * (guanaco_engine_context_memory), the margin is what they take plus 256 MiB
 * plus 5% for the process, the page cache's slack and reads in flight: in a
 * 6 GB limit on a 16.5 GB model, the load-time rule alone left 1.4 GB unused.
 * Direct loading keeps evicted copies (anonymous, not reclaimable) beside the
 * budget, up to guanaco_spare_limit, so its budget leaves room for them.
 * The token embedding is not counted where the model has its own output
 * matrix: a token reads one row of it (in a 6 GiB limit on the 24-layer
 * Qwen3 shape, counting its 0.31 GiB left llama-bench's peak at 89% of the
 * limit).
 * A prompt's stream buffers (--guanaco-stream-direct) must fit beside the
 * budget too. Where they do not, the budget lends them what is missing while a
 * prompt streams (decode's least wanted experts make room, and are read again
 * when decode wants them): through the page cache the prompt needed that
 * memory all the same, and in `auto`'s limit it thrashed the non-expert
 * weights (llama-cli: 49,000 major faults, 18 tok/s prompts, bench/PIPELINE.md).
 * At most half the budget is lent; beyond that prompts stream through the page
 * cache.
 * The floor is a quarter of a layer's experts, or nothing runs. --guanaco-load
 * auto's choice lives here too, a rule on the same manifest.
 * The preload
 * count lives here too: it is the budget's split between layers, and the
 * engine and the simulator must preload the same experts.
 */
#include "budget.h"

#include <stdio.h>

#define MARGIN_UNKNOWN_BYTES (1ull << 30)
#define MARGIN_UNKNOWN_SHARE 0.10
#define MARGIN_KNOWN_BYTES (256ull << 20)
#define MARGIN_KNOWN_SHARE 0.05
#define SPARE_MIN_BYTES (64ull << 20)
#define SPARE_SHARE_DIVISOR 8

uint64_t guanaco_spare_limit(uint64_t budget_bytes) {
    uint64_t share = budget_bytes / SPARE_SHARE_DIVISOR;
    return share > SPARE_MIN_BYTES ? share : SPARE_MIN_BYTES;
}

bool guanaco_direct_load_fits(uint64_t memory, uint64_t hot_non_expert_bytes, uint64_t budget, uint64_t expert_bytes) {
    double pinned = budget >= expert_bytes ? (double)expert_bytes : (double)budget + (double)guanaco_spare_limit(budget);
    double beside = (double)hot_non_expert_bytes + (double)MARGIN_KNOWN_BYTES;
    return memory == 0 || pinned + beside <= (double)memory;
}

/* The largest budget b with b + guanaco_spare_limit(b) <= room. */
static uint64_t budget_beside_spares(uint64_t room) {
    uint64_t share_budget = room / (SPARE_SHARE_DIVISOR + 1) * SPARE_SHARE_DIVISOR;
    if (share_budget / SPARE_SHARE_DIVISOR >= SPARE_MIN_BYTES) {
        return share_budget;
    }
    return room > SPARE_MIN_BYTES ? room - SPARE_MIN_BYTES : 0;
}

uint64_t guanaco_plain_load_bytes(const struct guanaco_manifest *m) {
    return m->total_bytes + m->expert_bytes + MARGIN_UNKNOWN_BYTES;
}

uint64_t guanaco_hot_non_expert_bytes(const struct guanaco_manifest *m) {
    return m->total_bytes - m->expert_bytes - m->cold_embedding_bytes;
}

void guanaco_auto_budget(uint64_t memory, const struct guanaco_manifest *m, int64_t context_bytes,
                         bool contexts_known, bool keeps_spares, struct guanaco_auto_budget *out) {
    uint64_t non_expert = guanaco_hot_non_expert_bytes(m);
    uint64_t contexts = context_bytes > 0 ? (uint64_t)context_bytes : 0;
    uint64_t margin = contexts_known ? MARGIN_KNOWN_BYTES + (uint64_t)((double)memory * MARGIN_KNOWN_SHARE) + contexts
                                     : MARGIN_UNKNOWN_BYTES + (uint64_t)((double)memory * MARGIN_UNKNOWN_SHARE);
    uint64_t room = memory > non_expert + margin ? memory - non_expert - margin : 0;
    uint64_t budget = keeps_spares ? budget_beside_spares(room) : room;
    uint64_t floor = m->n_moe_layers > 0 ? m->expert_bytes / (uint64_t)m->n_moe_layers / 4 : 0;
    out->margin = margin;
    out->spares = keeps_spares ? room - budget : 0;
    out->at_floor = budget < floor;
    out->budget = out->at_floor ? floor : budget;
}

/* What `memory` leaves for the budget and the stream buffers beside the hot non-expert weights, the contexts'
   buffers and the process: beyond the contexts' own buffers, only the fixed part of the margin, for the process's
   own memory, which nothing else here counts; the non-expert weights' page cache is the slack that page-cache
   streaming lived in too. */
static uint64_t stream_room(uint64_t memory, uint64_t hot_non_expert_bytes, int64_t context_bytes,
                            bool contexts_known) {
    uint64_t contexts = !contexts_known ? MARGIN_UNKNOWN_BYTES + (uint64_t)((double)memory * MARGIN_UNKNOWN_SHARE)
                        : (context_bytes > 0 ? (uint64_t)context_bytes : 0) + MARGIN_KNOWN_BYTES;
    uint64_t beside = hot_non_expert_bytes + contexts; /* what the budget cannot lend */
    return memory > beside ? memory - beside : 0;
}

bool guanaco_stream_buffers_stay(uint64_t memory, uint64_t hot_non_expert_bytes, uint64_t budget,
                                 int64_t context_bytes, bool contexts_known, uint64_t buffer_bytes) {
    return memory &&
           stream_room(memory, hot_non_expert_bytes, context_bytes, contexts_known) >=
               budget + guanaco_spare_limit(budget) + buffer_bytes;
}

uint64_t guanaco_stream_buffers_loan(uint64_t memory, uint64_t hot_non_expert_bytes, uint64_t budget,
                                     int64_t context_bytes, bool contexts_known, uint64_t buffer_bytes) {
    /* spares are given back while a prompt streams */
    uint64_t room = stream_room(memory, hot_non_expert_bytes, context_bytes, contexts_known);
    if (room >= budget + buffer_bytes) {
        return 0;
    }
    uint64_t loan = budget + buffer_bytes - room;
    return loan <= budget / 2 ? loan : GUANACO_STREAM_BUFFERS_REFUSED;
}

double guanaco_auto_budget_memory_needed(uint64_t budget, uint64_t non_expert_bytes, bool keeps_spares) {
    double spares = keeps_spares ? (double)guanaco_spare_limit(budget) : 0.0;
    return ((double)budget + spares + (double)non_expert_bytes + (double)MARGIN_UNKNOWN_BYTES) /
           (1.0 - MARGIN_UNKNOWN_SHARE);
}

void guanaco_auto_budget_margin_rule(bool contexts_known, char *text, size_t size) {
    uint64_t bytes = contexts_known ? MARGIN_KNOWN_BYTES : MARGIN_UNKNOWN_BYTES;
    double share = contexts_known ? MARGIN_KNOWN_SHARE : MARGIN_UNKNOWN_SHARE;
    bool whole_gib = bytes % (1ull << 30) == 0;
    snprintf(text, size, "%llu %s + %.0f%%", (unsigned long long)(bytes >> (whole_gib ? 30 : 20)),
             whole_gib ? "GiB" : "MiB", share * 100.0);
}

uint64_t guanaco_read_ahead_allowance(uint64_t budget_bytes) {
    return budget_bytes / 2;
}

bool guanaco_streams_layer(size_t experts, uint32_t n_expert) {
    return experts * 2 >= n_expert;
}

uint32_t guanaco_preload_count(uint64_t budget_bytes, uint64_t total_expert_bytes, uint32_t n_expert,
                               uint32_t max_per_layer) {
    if (total_expert_bytes == 0) {
        return 0;
    }
    double fit = (double)budget_bytes * (double)n_expert / (double)total_expert_bytes;
    uint32_t n = fit >= (double)n_expert ? n_expert : (uint32_t)fit;
    return max_per_layer && n > max_per_layer ? max_per_layer : n;
}
