/*
 * budget.h - the budget's rules, written once: the --guanaco-ram auto rule
 * (the engine sizes its budget with it, and guanaco-plan reads it backwards:
 * the memory a budget needs), and how many experts of each layer the preload
 * fills it with (the engine preloads that many, the simulator replays the
 * same), the read-ahead's share, and which calls stream their layer.
 * budget.c says why each margin is what it is.
 */
#ifndef GUANACO_BUDGET_H
#define GUANACO_BUDGET_H

#include "manifest.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct guanaco_auto_budget {
    uint64_t budget;   /* expert bytes allowed resident */
    uint64_t margin;   /* kept free besides the non-expert weights (contexts' buffers included, when known) */
    uint64_t spares;   /* kept for direct loading's spare copies (keeps_spares), beside the budget */
    bool at_floor;     /* the memory left less than the floor of a quarter layer, which was taken instead */
};

/* The non-expert weights a token reads: all of them but the token embedding's, where the model has an output
   matrix of its own (manifest cold_embedding_bytes): a prompt reads its own rows of the embedding only, and the
   kernel may take the others' page cache back at no cost. What the auto rule and the stream buffers' rule count. */
uint64_t guanaco_hot_non_expert_bytes(const struct guanaco_manifest *m);

/* What plain llama.cpp's own load of the model takes: the whole file in the page cache, a repacked copy of every
   expert, and the load-time margin for the contexts. Where a process has that, an explicit budget that holds
   every expert hands them to llama.cpp (--guanaco-when-fits plain). */
uint64_t guanaco_plain_load_bytes(const struct guanaco_manifest *m);

/* The budget `memory` bytes leave: before any context exists (contexts_known false) a fixed margin covers
   the KV cache and compute buffers; after, context_bytes are what they really hold. keeps_spares (direct
   loading) leaves guanaco_spare_limit(budget) beside the budget. */
void guanaco_auto_budget(uint64_t memory, const struct guanaco_manifest *m, int64_t context_bytes,
                         bool contexts_known, bool keeps_spares, struct guanaco_auto_budget *out);

/* The memory at which the load-time rule (contexts unknown) gives `budget`: the rule read backwards. */
double guanaco_auto_budget_memory_needed(uint64_t budget, uint64_t non_expert_bytes, bool keeps_spares);


/* What a prompt's stream buffers (--guanaco-stream-direct: anonymous memory, held while a prompt streams) must
   borrow from the budget to fit in `memory` beside the non-expert weights a ubatch reads (hot_non_expert_bytes:
   the engine leaves out the token embedding's, of which a prompt reads its own rows only), the budget and the
   contexts' buffers (and, once those are known, 256 MiB for the process): 0 where they fit beside it,
   GUANACO_STREAM_BUFFERS_REFUSED where more than half the budget would go (budget.c). Before any context exists
   (contexts_known false) the load-time margin stands in for the contexts. Their memory takes the place of the
   page cache a prompt streamed through, which the kernel could reclaim; this it cannot. */
#define GUANACO_STREAM_BUFFERS_REFUSED UINT64_MAX
uint64_t guanaco_stream_buffers_loan(uint64_t memory, uint64_t hot_non_expert_bytes, uint64_t budget,
                                     int64_t context_bytes, bool contexts_known, uint64_t buffer_bytes);

/* Whether the stream buffers may stay mapped between prompts: they fit in `memory` beside what decode holds, the
   budget and its spares (guanaco_spare_limit) included, as well as what the loan above counts; false for an
   unknown memory (0). Spares come back after a prompt, so a rule that left them out kept the buffers with decode
   at the limit: on the 24-layer Q8_0 shape at 25% in bench/side_by_side.sh's limit (budget + non-expert weights +
   1.5 GiB), decode ran 70 MB under it, and 0.3 GB more anonymous memory after a prompt (Dec 6) left the
   non-expert weights 0.8 of their 1.2 GB of page cache: decode read 1.7 GB per token, at 0.7 against 8.2 tok/s. */
bool guanaco_stream_buffers_stay(uint64_t memory, uint64_t hot_non_expert_bytes, uint64_t budget,
                                 int64_t context_bytes, bool contexts_known, uint64_t buffer_bytes);

/* The most bytes of evicted copies direct loading keeps for the next reads, beyond the budget: an eighth of
   it, at least 64 MiB. Anonymous memory the kernel cannot reclaim, so --guanaco-ram auto counts it. */
uint64_t guanaco_spare_limit(uint64_t budget_bytes);

/* Whether direct loading fits `memory` (the cgroup limit, or MemAvailable at load) with a budget the user gave:
   its copies pin the budget, and up to guanaco_spare_limit of spares, in anonymous memory the kernel cannot
   reclaim, beside the hot non-expert weights and 256 MiB for the process (the known margin's fixed part; its 5%
   would have sent the 48-layer Qwen3 shape at 50% in bench/side_by_side.sh's limit to page-cache). Where they do not
   fit, the kernel reclaims the weights instead and they fault back in all run long; page-cache loading keeps the
   budget in page cache the kernel can take (bench/soak.sh's 256 MiB limit and 64 MiB budget: 74.5 requests per
   minute and 2 major faults, against 23.2 and 42,765 with direct loading). A budget that holds every expert
   (expert_bytes) pins them and keeps no spares, since nothing is evicted. memory 0 (unknown): true. */
bool guanaco_direct_load_fits(uint64_t memory, uint64_t hot_non_expert_bytes, uint64_t budget, uint64_t expert_bytes);

/* The rule's margin in words, "1 GiB + 10%" (contexts unknown) or "256 MiB + 5%" (known), written into
   `text` from the same constants, for the lines that explain a budget (the engine's log, guanaco-plan). */
void guanaco_auto_budget_margin_rule(bool contexts_known, char *text, size_t size);

/* The most bytes read-ahead may hold at once: half the budget, room for a prompt's whole next layer or a
   few experts in decode, with the other half for the layer being computed. The engine, the residency
   engine's budget changes and the simulator all take it from here. */
uint64_t guanaco_read_ahead_allowance(uint64_t budget_bytes);

/* Whether a layer's call (or its read-ahead) that needs `experts` of its n_expert streams the layer
   (--guanaco-stream-prompts): half of them or more, a prompt's ubatch. The residency engine and the
   simulator both ask here. */
bool guanaco_streams_layer(size_t experts, uint32_t n_expert);

/*
 * How many experts --guanaco-preload puts in each MoE layer: the layer's
 * share of the budget in proportion to its expert bytes, in whole experts,
 * which is the same count for every layer (budget * n_expert / all expert
 * bytes), at most n_expert and at most max_per_layer when that is set.
 */
uint32_t guanaco_preload_count(uint64_t budget_bytes, uint64_t total_expert_bytes, uint32_t n_expert,
                               uint32_t max_per_layer);

#endif
