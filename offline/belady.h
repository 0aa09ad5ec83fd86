/*
 * belady.h - owns the offline optimum the policies are measured against:
 * Belady's MIN over a whole routing trace (simulate.h) under a byte budget.
 *
 * MIN evicts the resident expert whose next use lies farthest ahead, never
 * one the current request needs. That minimises misses exactly when every
 * expert has the same size, which holds for the MoE layers of Mixtral, Qwen3
 * MoE, DeepSeek and gpt-oss: all their MoE layers have equal expert bytes.
 * With sizes that differ between layers, optimal caching is NP-hard and
 * farthest-next-use is only a strong heuristic, not a bound: stats are
 * computed the same way and *exact says which case it was.
 */
#ifndef GUANACO_BELADY_H
#define GUANACO_BELADY_H

#include "simulate.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * Replay `trace` under MIN with `budget_bytes`, with the same oversubscription
 * rule as the policies: a request larger than the budget is still loaded
 * whole and the excess leaves right after. O(accesses * log resident) time;
 * one next-use index per access (4 bytes) and a few arrays per slot.
 * 0, -EINVAL (bad trace, or 2^32 - 1 requests or more) or -ENOMEM.
 */
int guanaco_belady(const struct guanaco_request_trace *trace, uint64_t budget_bytes, struct guanaco_replay_stats *stats,
                   bool *exact);

#endif
