/*
 * engine.c - owns one model's Guanaco state from load to free: deciding
 * whether the model streams at all (flag on, experts present), telling the
 * loader which tensors are experts, checking that the experts really are
 * zero-copy views of the file mapping and giving their pages the chosen
 * readahead advice, counting router decisions, and the closing summary.
 */
#include "engine.h"
#include "budget.h"
#include "expert_repack.h"
#include "mapping_guard.h"
#include "imatrix.h"
#include "log.h"
#include "monotonic_clock.h"
#include "repack_cache.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char *readahead_name(enum guanaco_readahead readahead) {
    switch (readahead) {
    case GUANACO_READAHEAD_NORMAL: return "normal";
    case GUANACO_READAHEAD_SEQUENTIAL: return "sequential";
    default: return "random";
    }
}

static double gib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

static const char *load_name(enum guanaco_residency_load load) {
    return load == GUANACO_RESIDENCY_LOAD_DIRECT ? "direct" : "page-cache";
}

static double percent(uint64_t part, uint64_t whole) { return whole ? 100.0 * (double)part / (double)whole : 0.0; }

static double per_token(uint64_t ns, uint64_t tokens) { return tokens ? (double)ns / 1e6 / (double)tokens : 0.0; }

/*
 * One residency line over the interval from `before` to `now` (before zeroed: since the start), `tokens`
 * tokens long. The definitions are the README's ("The Guanaco lines").
 */
static void log_residency(const char *what, const struct guanaco_residency_stats *now,
                          const struct guanaco_residency_stats *before, uint64_t tokens, uint64_t hook_ns,
                          const char *tail) {
    uint64_t accesses = now->accesses - before->accesses, hits = now->hits - before->hits;
    uint64_t issued = now->prefetch_issued_bytes - before->prefetch_issued_bytes;
    uint64_t used = now->prefetch_used_bytes - before->prefetch_used_bytes;
    uint64_t wasted = now->prefetch_wasted_bytes - before->prefetch_wasted_bytes;
    uint64_t hidden = now->prefetch_hidden_bytes - before->prefetch_hidden_bytes;
    uint64_t checked = now->prediction_checked - before->prediction_checked;
    uint64_t named = now->predicted_needed - before->predicted_needed;
    /* bytes read: on demand, plus read-ahead that was used or wasted (a cancelled read never happened) */
    uint64_t demand = now->bytes_read - before->bytes_read;
    uint64_t loads = now->expert_loads - before->expert_loads, bytes = demand + used + wasted;
    uint64_t read_ns = now->read_ns - before->read_ns, stall_ns = now->stall_ns - before->stall_ns;
    uint64_t evictions = now->evictions - before->evictions, churn = now->churn_loads - before->churn_loads;
    char spares[128] = ""; /* direct loading's evicted copies, held beyond the budget */
    if (now->load == GUANACO_RESIDENCY_LOAD_DIRECT) {
        snprintf(spares, sizeof(spares), ", spare copies %.1f MiB, huge pages rebuilt %llu (%.1f ms)",
                 (double)now->spare_bytes / 1048576.0,
                 (unsigned long long)(now->huge_pages_rebuilt - before->huge_pages_rebuilt),
                 (double)(now->rebuild_ns - before->rebuild_ns) / 1e6);
    }
    guanaco_log_info("%s: %llu tokens, resident %.1f%% of %llu accesses, hot-pinned %.1f%%, %llu loads, "
                     "%.2f GiB read at %.2f GB/s, stall %.1f ms/token (reads %.1f, mapping %.1f of which repacking %.1f, eviction %.1f, read-ahead "
                     "wait %.1f, wake-up %.1f), %llu evictions, churn %.1f%% "
                     "(reloaded within %u tokens), read-ahead %.1f MiB issued, %.1f used, %.1f wasted, recall %.1f%%, "
                     "hidden %.1f%% of reads, streamed %.1f MiB (%.1f via the huge mapping, %.1f read direct into the stream "
                     "buffers), loaded %.1f MiB via the huge "
                     "mapping, repacked as reads landed %.1f ms/token, router hook %.1f ms/token%s%s",
                     what, (unsigned long long)tokens, percent(hits, accesses), (unsigned long long)accesses,
                     percent(now->pinned_hits - before->pinned_hits, accesses), (unsigned long long)loads, gib(bytes),
                     read_ns ? (double)demand / (double)read_ns : 0.0, per_token(stall_ns, tokens),
                     per_token(read_ns, tokens), per_token(now->populate_ns - before->populate_ns, tokens),
                     per_token(now->transform_ns - before->transform_ns, tokens), per_token(now->evict_ns - before->evict_ns, tokens),
                     per_token(now->prefetch_wait_ns - before->prefetch_wait_ns, tokens),
                     per_token(now->settle_wake_ns - before->settle_wake_ns, tokens),
                     (unsigned long long)evictions, percent(churn, evictions), GUANACO_RESIDENCY_CHURN_TOKENS,
                     (double)issued / 1048576.0, (double)used / 1048576.0, (double)wasted / 1048576.0,
                     percent(named, checked), percent(hidden, demand + used),
                     (double)(now->streamed_bytes - before->streamed_bytes) / 1048576.0,
                     (double)(now->streamed_huge_bytes - before->streamed_huge_bytes) / 1048576.0,
                     (double)(now->streamed_direct_bytes - before->streamed_direct_bytes) / 1048576.0,
                     (double)(now->loaded_huge_bytes - before->loaded_huge_bytes) / 1048576.0,
                     per_token(now->arrival_transform_ns - before->arrival_transform_ns, tokens),
                     per_token(hook_ns, tokens), spares, tail);
}

/* Every status_every tokens through the last MoE layer: the interval's line plus a RAM check by mincore. */
static void maybe_log_status(struct guanaco_engine *engine, uint64_t done_before, uint64_t done_after) {
    uint64_t every = engine->options.status_every ? engine->options.status_every : GUANACO_DEFAULT_STATUS_EVERY;
    if (!engine->residency || done_before / every == done_after / every || !guanaco_log_enabled() ||
        pthread_mutex_trylock(&engine->status_lock) != 0) {
        return; /* another context is printing this interval's line */
    }
    struct guanaco_residency_stats st;
    guanaco_residency_get_stats(engine->residency, &st);
    uint64_t mapped = 0, file_pages = 0;
    char tail[200] = "";
    if (engine->options.audit && guanaco_residency_audit(engine->residency, &mapped, &file_pages) == 0) {
        /* read-ahead in the page cache counts: it is inside the budget too. The file's share tells direct loading's
           experts (own copies) from what the kernel read around faults on the other weights. */
        snprintf(tail, sizeof(tail), "; RAM: accounted %.1f MiB, mincore %.1f MiB (%.1f of it the file's page cache)",
                 (double)(st.resident_bytes + st.prefetch_outstanding_bytes) / 1048576.0, (double)mapped / 1048576.0,
                 (double)file_pages / 1048576.0);
    }
    char what[64];
    snprintf(what, sizeof(what), "status at token %llu", (unsigned long long)done_after);
    uint64_t hook_ns = atomic_load(&engine->router_hook_ns);
    log_residency(what, &st, &engine->status_last, done_after - engine->status_last_tokens,
                  hook_ns - engine->status_last_hook_ns, tail);
    engine->status_last = st;
    engine->status_last_hook_ns = hook_ns;
    engine->status_last_tokens = done_after;
    engine->status_last_ns = guanaco_now_ns();
    pthread_mutex_unlock(&engine->status_lock);
}

/* Index a replay trace by layer so each context can walk one layer's routing in order. */
static int index_replay(struct guanaco_engine *engine) {
    const struct guanaco_manifest *m = &engine->manifest;
    const struct guanaco_trace *t = &engine->replay;
    engine->replay_records_of_layer = calloc((size_t)m->n_layer, sizeof(*engine->replay_records_of_layer));
    engine->replay_records_in_layer = calloc((size_t)m->n_layer, sizeof(*engine->replay_records_in_layer));
    if (!engine->replay_records_of_layer || !engine->replay_records_in_layer) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n_records; i++) {
        engine->replay_records_in_layer[t->layer[i]]++;
    }
    for (int layer = 0; layer < m->n_layer; layer++) {
        size_t n = engine->replay_records_in_layer[layer];
        if (engine->moe_layer_of[layer] && n == 0) {
            guanaco_log_error("%s: the trace has no routing for MoE layer %d", engine->options.trace_replay, layer);
            return -EINVAL;
        }
        engine->replay_records_of_layer[layer] = calloc(n ? n : 1, sizeof(size_t));
        if (!engine->replay_records_of_layer[layer]) {
            return -ENOMEM;
        }
        engine->replay_records_in_layer[layer] = 0;
    }
    for (size_t i = 0; i < t->n_records; i++) {
        uint32_t layer = t->layer[i];
        engine->replay_records_of_layer[layer][engine->replay_records_in_layer[layer]++] = i;
    }
    return 0;
}

static int open_traces(struct guanaco_engine *engine) {
    const struct guanaco_manifest *m = &engine->manifest;
    int err;
    if (engine->options.trace_replay[0]) {
        if ((err = guanaco_trace_load(engine->options.trace_replay, &engine->replay)) < 0) {
            return err;
        }
        if ((err = guanaco_trace_shape_check(&engine->replay.shape, (uint32_t)m->n_layer, (uint32_t)m->n_expert,
                                             (uint32_t)m->n_expert_used)) < 0) {
            guanaco_log_error("refusing to replay %s onto this %s model: its shape differs",
                              engine->options.trace_replay, m->arch);
            return err;
        }
        if ((err = index_replay(engine)) < 0) {
            return err;
        }
        guanaco_log_info("replaying %zu routing decisions from %s (%s)", engine->replay.n_records,
                         engine->options.trace_replay, engine->replay.shape.source);
    }
    if (engine->options.trace_out[0]) {
        struct guanaco_trace_shape shape = {.n_layer = (uint32_t)m->n_layer, .n_expert = (uint32_t)m->n_expert,
                                            .top_k = (uint32_t)m->n_expert_used};
        snprintf(shape.arch, sizeof(shape.arch), "%s", m->arch);
        snprintf(shape.source, sizeof(shape.source), "recorded by guanaco%s", engine->replay.n_records ? " (replay)" : "");
        if ((err = guanaco_trace_writer_open(engine->options.trace_out, &shape, &engine->trace_writer)) < 0) {
            guanaco_log_error("cannot record routing to %s: %s", engine->options.trace_out, strerror(-err));
            return err;
        }
        guanaco_log_info("recording routing to %s", engine->options.trace_out);
    }
    return 0;
}

static uint64_t process_memory(bool *is_limit);

/*
 * Whether the engine has nothing to do for this model: an explicit budget (auto's may shrink once the contexts
 * exist) holds every expert, so none is ever read or dropped; the memory this process has holds what llama.cpp's
 * own load takes, so it will not thrash where the engine would not; and nothing asked for the router's ids or
 * the file's layout. Then llama.cpp's own load is the fastest there is: with everything resident in Guanaco's
 * slots, the repacked types ran 2-7% behind plain llama.cpp's default on two threads, at the same instruction
 * count, for a cause not found (bench/COMPUTE_PARITY.md). Inside a limit sized for the budget the engine stays:
 * there it decoded up to 1.65x plain at 100% (BENCHMARKS.md).
 */
static bool holds_every_expert_without_engine(const struct guanaco_options *o, const struct guanaco_manifest *m,
                                              uint64_t memory) {
    return o->streaming && o->when_fits == GUANACO_WHEN_FITS_PLAIN && o->ram_bytes >= m->expert_bytes &&
           (!o->max_experts || o->max_experts >= (uint32_t)m->n_expert) && !o->trace_replay[0] && !o->trace_out[0] &&
           !o->audit && o->repack != GUANACO_REPACK_OFF && !o->reference && memory >= guanaco_plain_load_bytes(m);
}

int guanaco_engine_open(const char *path, const char *const *split_paths, size_t n_split_paths, bool dry_run,
                        bool repack_allowed, struct guanaco_engine **out) {
    *out = NULL;
    struct guanaco_options options;
    int err = guanaco_options_get(&options);
    if (err < 0) {
        return err;
    }
    /* Recording or replaying routing needs the hook, not streaming: plain llama.cpp can be driven too. */
    if (!options.streaming && !options.trace_replay[0] && !options.trace_out[0]) {
        return 0;
    }
    struct guanaco_engine *engine = calloc(1, sizeof(*engine));
    if (!engine) {
        return -ENOMEM;
    }
    engine->options = options;
    engine->dry_run = dry_run;
    engine->repack_allowed = repack_allowed;
    err = guanaco_manifest_load(path, split_paths, n_split_paths, &engine->manifest);
    if (err < 0) {
        free(engine);
        return err;
    }
    const struct guanaco_manifest *m = &engine->manifest;
    if (m->n_tensors == 0) {
        if (!dry_run) {
            guanaco_log_info("dense model (%s, no expert tensors): nothing to stream, loading normally", m->arch);
        }
        guanaco_engine_close(engine);
        return 0;
    }
    bool is_limit = false;
    const uint64_t memory = options.ram_bytes >= m->expert_bytes ? process_memory(&is_limit) : 0;
    if (holds_every_expert_without_engine(&options, m, memory)) {
        if (!dry_run) {
            guanaco_log_info("--guanaco-ram %.2f GiB holds every expert (%.2f GiB) and %s (%.2f GiB) holds "
                             "llama.cpp's own load (%.2f GiB): nothing would ever be read, so llama.cpp loads the "
                             "experts as it does without Guanaco (--guanaco-when-fits engine: Guanaco holds them)",
                             gib(options.ram_bytes), gib(m->expert_bytes),
                             is_limit ? "the memory limit" : "the memory available", gib(memory),
                             gib(guanaco_plain_load_bytes(m)));
        }
        guanaco_engine_close(engine);
        return 0;
    }
    engine->moe_layer_of = calloc((size_t)m->n_layer, sizeof(*engine->moe_layer_of));
    engine->access_count = calloc((size_t)m->n_layer * (size_t)m->n_expert, sizeof(*engine->access_count));
    if (!engine->moe_layer_of || !engine->access_count) {
        guanaco_engine_close(engine);
        return -ENOMEM;
    }
    engine->first_moe_layer = -1;
    for (size_t i = 0; i < m->n_tensors; i++) {
        engine->moe_layer_of[m->tensors[i].layer] = 1;
        if (engine->first_moe_layer < 0 || m->tensors[i].layer < engine->first_moe_layer) {
            engine->first_moe_layer = m->tensors[i].layer;
        }
        if (m->tensors[i].layer > engine->last_moe_layer) {
            engine->last_moe_layer = m->tensors[i].layer;
        }
    }
    pthread_mutex_init(&engine->status_lock, NULL);
    if (!dry_run && (err = open_traces(engine)) < 0) {
        engine->dry_run = true; /* nothing ran: no summary */
        guanaco_engine_close(engine);
        return err;
    }
    if (!dry_run) {
        guanaco_log_info("model %s: %d experts, top-%d, %d layers (%d MoE)", m->arch, m->n_expert,
                         m->n_expert_used, m->n_layer, m->n_moe_layers);
        guanaco_log_info("parsed %zu expert tensors across %d MoE layers from %d shard%s", m->n_tensors,
                         m->n_moe_layers, m->n_shards, m->n_shards == 1 ? "" : "s");
    }
    *out = engine;
    return 0;
}

bool guanaco_engine_is_expert_tensor(const struct guanaco_engine *engine, const char *tensor_name) {
    /* Without streaming nothing is marked lazy, so experts load exactly as in plain llama.cpp. */
    return engine && engine->options.streaming && guanaco_manifest_find(&engine->manifest, tensor_name) != NULL;
}

static int advise_expert_pages(const struct guanaco_engine *engine, void *data, uint64_t nbytes) {
    int advice = MADV_RANDOM;
    if (engine->options.readahead == GUANACO_READAHEAD_NORMAL) {
        advice = MADV_NORMAL;
    } else if (engine->options.readahead == GUANACO_READAHEAD_SEQUENTIAL) {
        advice = MADV_SEQUENTIAL;
    }
    /* Advice, not eviction: rounding outward only touches the flags of a neighbour's edge page. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = (uintptr_t)data & ~(page - 1);
    uintptr_t end = ((uintptr_t)data + nbytes + page - 1) & ~(page - 1);
    if (madvise((void *)begin, end - begin, advice) != 0) {
        return -errno;
    }
    return 0;
}

/* The memory limit this process lives under: its cgroup v1 or v2 limit, or 0 when there is none. */
static uint64_t cgroup_memory_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) {
        return 0;
    }
    char line[4096], path[4200] = "";
    bool v1 = false;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *group = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!group) {
            continue;
        }
        *group++ = '\0';
        if (strcmp(controllers + 1, "memory") == 0) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", group);
            v1 = true;
        } else if (!v1 && controllers[1] == '\0') {
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", group);
        }
    }
    fclose(f);
    uint64_t limit = 0;
    f = path[0] ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%" SCNu64, &limit) != 1 || limit >= (1ull << 60)) {
            limit = 0; /* "max" or the v1 "unlimited" sentinel */
        }
        fclose(f);
    }
    return limit;
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kib = 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1) {
            break;
        }
    }
    if (f) {
        fclose(f);
    }
    return kib * 1024;
}

/* --guanaco-ram auto (budget.c): the memory it divides is read once, at load. */
/* Where an expert tensor's MUL_MAT_ID comes in its layer's graph (llama-graph.cpp's build_moe_ffn): up (or the
   fused gate_up) first, then gate, then down; anything else last. */
#define COMPUTE_RANKS 4
static size_t compute_rank(const char *name) {
    if (strstr(name, "ffn_up_exps") || strstr(name, "ffn_gate_up_exps")) {
        return 0;
    }
    return strstr(name, "ffn_gate_exps") ? 1 : strstr(name, "ffn_down_exps") ? 2 : 3;
}

/* The auto rule's term for direct loading's spare copies, or nothing under page-cache loading. */
static void describe_spares(const struct guanaco_auto_budget *rule, char *text, size_t size) {
    text[0] = '\0';
    if (rule->spares) {
        snprintf(text, size, " - direct loading's spare copies %.2f GiB", gib(rule->spares));
    }
}

/* What this process may use: its cgroup's limit, or MemAvailable where that is less or there is none. */
static uint64_t process_memory(bool *is_limit) {
    uint64_t limit = cgroup_memory_limit();
    uint64_t available = mem_available();
    *is_limit = limit && (limit < available || !available);
    return *is_limit ? limit : available;
}

/*
 * --guanaco-stream-direct: the stream buffers are anonymous memory the kernel cannot reclaim, where a prompt
 * streamed through the page cache before, so they are used where they fit beside the budget, or where the budget
 * can lend what is missing while a prompt streams (guanaco_stream_buffers_loan). Asked at load and again once the
 * contexts' buffers are known; says what it chose when that changes.
 */
static void choose_stream_direct(struct guanaco_engine *engine, bool contexts_known) {
    struct guanaco_residency_stats st;
    guanaco_residency_get_stats(engine->residency, &st);
    if (!st.stream_buffer_bytes) {
        return; /* not asked for, or not possible here (page-cache loading, no slots, repacked experts without a cache) */
    }
    const struct guanaco_manifest *m = &engine->manifest;
    int64_t contexts = atomic_load(&engine->context_bytes);
    const uint64_t hot_non_expert = guanaco_hot_non_expert_bytes(m);
    uint64_t loan = !engine->process_memory
                        ? 0
                        : guanaco_stream_buffers_loan(engine->process_memory, hot_non_expert, engine->budget_bytes,
                                                      contexts, contexts_known, st.stream_buffer_bytes);
    bool fit = loan != GUANACO_STREAM_BUFFERS_REFUSED;
    /* beside the budget and its spares in the memory this process has, they may as well stay: only where that
       memory is known */
    bool keep = fit && loan == 0 &&
                guanaco_stream_buffers_stay(engine->process_memory, hot_non_expert, engine->budget_bytes, contexts,
                                            contexts_known, st.stream_buffer_bytes);
    guanaco_residency_set_stream_loan(engine->residency, fit ? loan : 0);
    guanaco_residency_set_stream_keep(engine->residency, keep);
    guanaco_residency_set_stream_direct(engine->residency, fit);
    if (!contexts_known || ((int)fit == engine->stream_direct_told && (!fit || loan == engine->stream_loan_told))) {
        return; /* not decided until the contexts' buffers are known, or said already */
    }
    engine->stream_direct_told = fit;
    engine->stream_loan_told = loan;
    if (fit) {
        char lent[512] = "";
        if (loan) {
            snprintf(lent, sizeof(lent),
                     ", %.2f GiB of it lent by the budget (%.2f GiB) while they are held: %.2f GiB holds beside them "
                     "only the non-expert weights %.2f GiB (without the token embedding's), the contexts' buffers "
                     "%.2f GiB and a margin for the process; decode's least wanted experts make room, and are read "
                     "again when wanted",
                     gib(loan), gib(engine->budget_bytes), gib(engine->process_memory), gib(hot_non_expert),
                     gib((uint64_t)(contexts > 0 ? contexts : 0)));
        }
        guanaco_log_info("prompts stream with O_DIRECT into two layer buffers, %.2f GiB in all %s%s",
                         gib(st.stream_buffer_bytes),
                         keep ? "from the first prompt on (they fit beside the budget and its spares, so they stay "
                                "mapped between prompts)"
                              : "while a prompt streams",
                         lent);
    } else {
        guanaco_log_info("prompts stream through the page cache: the O_DIRECT stream buffers (%.2f GiB) do not fit in "
                         "%.2f GiB beside the non-expert weights (%.2f GiB without the token embedding's), the "
                         "budget (%.2f GiB, which lends at most half) and the contexts' buffers (%.2f GiB)",
                         gib(st.stream_buffer_bytes), gib(engine->process_memory), gib(hot_non_expert),
                         gib(engine->budget_bytes), gib((uint64_t)(contexts > 0 ? contexts : 0)));
    }
}

/* "non-expert weights X GiB", and what of the token embedding is left out (guanaco_hot_non_expert_bytes). */
static void describe_non_expert(const struct guanaco_manifest *m, char *text, size_t size) {
    int n = snprintf(text, size, "non-expert weights %.2f GiB", gib(guanaco_hot_non_expert_bytes(m)));
    if (m->cold_embedding_bytes && n > 0 && (size_t)n < size) {
        snprintf(text + n, size - (size_t)n, " (the token embedding's other rows, %.2f GiB, left to the kernel)",
                 gib(m->cold_embedding_bytes));
    }
}

/* memory: process_memory's answer, read once at load by start_residency */
static uint64_t automatic_budget(struct guanaco_engine *engine, uint64_t memory, bool is_limit, bool keeps_spares) {
    const struct guanaco_manifest *m = &engine->manifest;
    struct guanaco_auto_budget rule;
    guanaco_auto_budget(memory, m, 0, false, keeps_spares, &rule);
    uint64_t margin = rule.margin, budget = rule.budget;
    engine->auto_memory = memory;
    char margin_rule[32];
    guanaco_auto_budget_margin_rule(false, margin_rule, sizeof(margin_rule));
    char spares[64];
    describe_spares(&rule, spares, sizeof(spares));
    char non_expert[128];
    describe_non_expert(m, non_expert, sizeof(non_expert));
    guanaco_log_info("budget auto: %s %.2f GiB - %s - margin %.2f GiB (%s, until the context's buffers are "
                     "known)%s = %.2f GiB",
                     is_limit ? "cgroup limit" : "MemAvailable", gib(memory), non_expert, gib(margin), margin_rule,
                     spares, gib(budget));
    return budget;
}

/* Replay overwrites the ids, a trace records them, the audit runs per status line: none can skip the router. */
static bool router_ids_always_needed(const struct guanaco_engine *engine) {
    return engine->replay.n_records || engine->trace_writer || engine->options.audit;
}

/* Says so when it changes and it matters: the status lines pause while the router's ids are not read. */
static void update_holds_every_expert(struct guanaco_engine *engine) {
    bool holds = guanaco_residency_holds_every_expert(engine->residency);
    bool held = atomic_exchange(&engine->holds_every_expert, holds);
    if (holds == held || router_ids_always_needed(engine)) {
        return;
    }
    guanaco_log_info(holds ? "residency: every expert is resident and the budget keeps them all: the router's ids are "
                             "not read (no graph split per MoE layer), and status lines pause until the budget changes"
                           : "residency: the budget no longer keeps every expert: the router's ids are read again");
}

void guanaco_engine_context_memory(struct guanaco_engine *engine, int64_t bytes) {
    if (!engine || engine->dry_run) {
        return;
    }
    int64_t contexts = atomic_fetch_add(&engine->context_bytes, bytes) + bytes;
    if (!engine->residency) {
        return;
    }
    if (engine->options.ram_bytes || !engine->auto_memory) {
        choose_stream_direct(engine, true);
        return;
    }
    struct guanaco_residency_stats st; /* the load the residency runs: direct may have fallen back at its start */
    guanaco_residency_get_stats(engine->residency, &st);
    struct guanaco_auto_budget rule;
    guanaco_auto_budget(engine->auto_memory, &engine->manifest, contexts, true, st.load == GUANACO_RESIDENCY_LOAD_DIRECT,
                        &rule);
    uint64_t margin = rule.margin, budget = rule.budget;
    guanaco_residency_set_budget(engine->residency, budget);
    engine->budget_bytes = budget;
    update_holds_every_expert(engine);
    choose_stream_direct(engine, true);
    char margin_rule[32];
    guanaco_auto_budget_margin_rule(true, margin_rule, sizeof(margin_rule));
    char spares[64];
    describe_spares(&rule, spares, sizeof(spares));
    char non_expert[128];
    describe_non_expert(&engine->manifest, non_expert, sizeof(non_expert));
    guanaco_log_info("budget auto: %.2f GiB - %s - contexts' buffers %.2f GiB - margin %.2f GiB (%s)%s = %.2f GiB",
                     gib(engine->auto_memory), non_expert, gib((uint64_t)(contexts > 0 ? contexts : 0)),
                     gib(margin - (uint64_t)(contexts > 0 ? contexts : 0)), margin_rule, spares, gib(budget));
}

static int preload(struct guanaco_engine *engine, uint64_t budget, const struct guanaco_imatrix_prior *prior);

static int start_predictor(struct guanaco_engine *engine) {
    const struct guanaco_manifest *m = &engine->manifest;
    uint8_t *moe_layer = calloc((size_t)m->n_layer, 1);
    engine->predicted = calloc((size_t)m->n_expert, sizeof(*engine->predicted));

    engine->predictor_absent = calloc((size_t)m->n_expert, 1);
    if (!moe_layer || !engine->predicted || !engine->predictor_absent) {
        free(moe_layer);
        return -ENOMEM;
    }
    for (int layer = 0; layer < m->n_layer; layer++) {
        moe_layer[layer] = engine->moe_layer_of[layer] != 0;
    }
    struct guanaco_predictor_config config = {
        .kind = (enum guanaco_predictor_kind)engine->options.prefetch,
        .n_layer = (uint32_t)m->n_layer,
        .n_expert = (uint32_t)m->n_expert,
        .top_k = (uint32_t)m->n_expert_used,
        .moe_layer = moe_layer,
        .mass = engine->options.pilot_mass,
    };
    int err = guanaco_predictor_create(&config, &engine->predictor);
    free(moe_layer);
    const bool throttled = engine->options.prefetch_throttle;
    if (err == 0) {
        err = guanaco_read_ahead_throttle_init(&engine->throttle[0], throttled, false, GUANACO_THROTTLE_DECODE_EPOCH,
                                               GUANACO_THROTTLE_DECODE_EXPLORE_EVERY,
                                               GUANACO_THROTTLE_DECODE_FIRST_EXPLORE);
    }
    if (err == 0) {
        err = guanaco_read_ahead_throttle_init(&engine->throttle[1], throttled, true, GUANACO_THROTTLE_PROMPT_EPOCH,
                                               GUANACO_THROTTLE_PROMPT_EXPLORE_EVERY,
                                               GUANACO_THROTTLE_PROMPT_FIRST_EXPLORE);
    }
    if (err == 0 && guanaco_predictor_uses_scores(engine->predictor)) {
        err = guanaco_router_gate_create(m->n_layer, m->n_expert, &engine->router_gate);
    }
    if (err < 0) {
        guanaco_log_error("cannot create the %s predictor: %s", guanaco_predictor_kind_name(config.kind), strerror(-err));
        guanaco_predictor_free(engine->predictor);
        engine->predictor = NULL;
        return err;
    }
    pthread_mutex_init(&engine->predictor_lock, NULL);
    return 0;
}

/* Decode and prompts are throttled apart: a prompt's whole-layer read-ahead can pay where decode's guesses do not. */
static struct guanaco_read_ahead_throttle *throttle_of(struct guanaco_engine *engine, int n_tokens) {
    return &engine->throttle[n_tokens >= (int)GUANACO_PROMPT_MIN_TOKENS];
}

bool guanaco_engine_read_ahead_allowed(struct guanaco_engine *engine, int n_tokens) {
    if (!engine->predictor || (engine->decode_reads_no_guesses && n_tokens < (int)GUANACO_PROMPT_MIN_TOKENS)) {
        return false;
    }
    pthread_mutex_lock(&engine->predictor_lock);
    bool allowed = guanaco_read_ahead_throttle_allows(throttle_of(engine, n_tokens));
    pthread_mutex_unlock(&engine->predictor_lock);
    return allowed;
}

void guanaco_engine_read_ahead_timed(struct guanaco_engine *engine, int n_tokens, bool was_on, uint64_t ns) {
    if (!engine->predictor || n_tokens <= 0) {
        return;
    }
    pthread_mutex_lock(&engine->predictor_lock);
    guanaco_read_ahead_throttle_observe(throttle_of(engine, n_tokens), was_on, (uint64_t)n_tokens, ns);
    pthread_mutex_unlock(&engine->predictor_lock);
}

void guanaco_engine_read_ahead(struct guanaco_engine *engine, int prev_layer, const int32_t *prev_ids, int layer,
                               const int32_t *ids, int k, int n_tokens, const float *next_scores, int n_scored,
                               uint64_t token, bool issue) {
    if (!engine->predictor || k <= 0 || n_tokens <= 0) {
        return;
    }
    const uint32_t n_expert = (uint32_t)engine->manifest.n_expert;
    pthread_mutex_lock(&engine->predictor_lock);
    if (prev_layer >= 0) {
        (void)guanaco_predictor_observe(engine->predictor, (uint32_t)prev_layer, prev_ids, (uint32_t)layer, ids,
                                        (uint32_t)k, (uint32_t)n_tokens);
    }
    uint32_t next = guanaco_predictor_next_layer(engine->predictor, (uint32_t)layer);
    if (next != UINT32_MAX && issue) {
        guanaco_residency_mark_absent(engine->residency, next, engine->predictor_absent);
        const struct guanaco_read_ahead_call call = {
            .layer = (uint32_t)layer,
            .ids = ids,
            .k = (uint32_t)k,
            .n_tokens = (uint32_t)n_tokens,
            .scores = next_scores,
            .n_scored = next_scores ? (uint32_t)n_scored : 0,
            .absent = engine->predictor_absent,
            .prompts_read_ahead = engine->prompt_read_ahead,
        };
        size_t n_read = 0;
        size_t n = guanaco_read_ahead_choose(engine->predictor, &call, engine->predicted, n_expert, &n_read);
        /* under the lock: the guess lives in the engine's scratch */
        (void)guanaco_residency_prefetch(engine->residency, next, engine->predicted, n, n_read, (uint32_t)layer,
                                         token);
    }
    pthread_mutex_unlock(&engine->predictor_lock);
}

/* ggml-cpu has one MUL_MAT_ID question for the whole process: the first engine that overlaps direct reads
   answers it. */
static _Atomic(struct guanaco_engine *) expert_weights_owner;

/* Where MUL_MAT_ID finds expert `expert` of `weights`: its fixed slot, or the mapping; NULL while it is still
   being read and `wait` is false. */
static const void *expert_weights(const struct ggml_tensor *weights, int32_t expert, bool wait, void *user_data) {
    struct guanaco_engine *engine = user_data;
    const char *mapped = (const char *)weights->data + (size_t)expert * weights->nb[2];
    const void *slot = NULL;
    if (expert >= 0 && !guanaco_residency_expert_data(engine->residency, weights->data, (uint32_t)expert, wait, &slot)) {
        return NULL;
    }
    return slot ? slot : mapped;
}

/* Whether this engine may answer MUL_MAT_ID's question; takes it if so. */
static bool claim_expert_weights(struct guanaco_engine *engine) {
    struct guanaco_engine *none = NULL;
    return atomic_compare_exchange_strong(&expert_weights_owner, &none, engine);
}

int guanaco_engine_finish_graph(struct guanaco_engine *engine) {
    return engine && engine->residency ? guanaco_residency_finish(engine->residency) : 0;
}

/* Whether an expert tensor of `type` that ggml repacks runs repacked: --guanaco-repack on, or auto when nothing
   is read after the preload, or when its shard's repack cache hands it over repacked for a type where that pays.
   auto's rule under a budget without a cache: a miss's repack sits in the stall; into fixed slots compute outside
   it is at warm default (8-layer at 25%: 1.04x Q4_0, 1.01x Q4_K against 1.33x and 1.19x), prompts gain (1.22x,
   1.07x), but decode loses (0.91x Q4_0, 0.72x Q4_K: the repack costs 0.16 and 0.47 CPU-s per GB read;
   bench/COMPUTE_PARITY.md). */
static bool runs_repacked(const struct guanaco_engine *engine, enum ggml_type type, bool everything_fits,
                          bool has_cache) {
    return engine->options.repack == GUANACO_REPACK_ON || everything_fits ||
           (has_cache && guanaco_repack_cache_pays(type));
}

/*
 * --guanaco-repack-cache: each shard's <shard>.guanaco-repack where it exists,
 * matches the model and this CPU (repack_cache.h), and repacking is wanted.
 * Fills shard_cache_fds and shard_cache_direct_fds (-1 where none); an error
 * only with `on` and a shard that has no usable cache.
 */
static int open_repack_caches(struct guanaco_engine *engine, bool direct, bool everything_fits) {
    const struct guanaco_manifest *m = &engine->manifest;
    const struct guanaco_options *o = &engine->options;
    engine->shard_cache_fds = malloc((size_t)m->n_shards * sizeof(int));
    engine->shard_cache_direct_fds = malloc((size_t)m->n_shards * sizeof(int));
    if (!engine->shard_cache_fds || !engine->shard_cache_direct_fds) {
        free(engine->shard_cache_fds);
        free(engine->shard_cache_direct_fds);
        engine->shard_cache_fds = engine->shard_cache_direct_fds = NULL;
        return -ENOMEM;
    }
    for (int s = 0; s < m->n_shards; s++) {
        engine->shard_cache_fds[s] = engine->shard_cache_direct_fds[s] = -1;
    }
    if (!engine->repack || o->repack == GUANACO_REPACK_OFF || o->repack_cache == GUANACO_REPACK_OFF) {
        if (o->repack_cache == GUANACO_REPACK_ON) {
            guanaco_log_info("--guanaco-repack-cache on: no cache is read, as no expert is repacked (%s)",
                             o->repack == GUANACO_REPACK_OFF || !engine->repack_allowed
                                 ? "--guanaco-repack off or --no-repack"
                                 : "this ggml has no repacked kernels here");
        }
        return 0;
    }
    const struct ggml_tensor *const *tensors = (const struct ggml_tensor *const *)engine->expert_tensors;
    for (int s = 0; s < m->n_shards; s++) {
        struct guanaco_repack_cache_contents want;
        guanaco_repack_cache_expect(m, tensors, engine->repack, s, &want);
        if (want.n_tensors == 0) {
            continue;
        }
        char path[GUANACO_PATH_BYTES + sizeof(GUANACO_REPACK_CACHE_SUFFIX)], why[512] = "";
        int fd = -1, direct_fd = -1;
        int err = guanaco_repack_cache_path(m->shard_paths[s], path, sizeof(path));
        if (!err) {
            err = guanaco_repack_cache_open(path, engine->shard_fds[s], &want, direct, &fd, &direct_fd, why,
                                            sizeof(why));
        }
        if (!err) {
            err = guanaco_repack_cache_verify(m, tensors, engine->repack, s, engine->shard_fds[s], fd, why,
                                              sizeof(why));
        }
        if (err) {
            if (fd >= 0) {
                close(fd);
            }
            if (direct_fd >= 0) {
                close(direct_fd);
            }
            if (o->repack_cache == GUANACO_REPACK_ON) {
                guanaco_log_error("--guanaco-repack-cache on: %s: %s (guanaco-repack-cache %s writes it)", path, why,
                                  m->shard_paths[s]);
                return err;
            }
            if (err != -ENOENT) {
                guanaco_log_info("repack cache %s not used: %s; guanaco-repack-cache %s writes it again", path, why,
                                 m->shard_paths[s]);
            } else if (o->repack == GUANACO_REPACK_AUTO && !everything_fits) {
                guanaco_log_info("--guanaco-repack auto: experts stay in the file's layout under a budget, where "
                                 "repacking each read costs more than it saves; a repack cache makes it free "
                                 "(guanaco-repack-cache %s)", m->shard_paths[s]);
            }
            continue;
        }
        engine->shard_cache_fds[s] = fd;
        engine->shard_cache_direct_fds[s] = direct_fd;
        uint32_t used = 0;
        for (size_t i = 0; i < m->n_tensors; i++) {
            used += guanaco_repack_cache_holds(m, tensors, engine->repack, s, i) &&
                    runs_repacked(engine, m->tensors[i].type, everything_fits, true);
        }
        if (used < want.n_tensors) {
            guanaco_log_info("repack cache: --guanaco-repack auto keeps %u of its %u tensors in the file's layout under "
                             "a budget: of a type not measured faster repacked there (IQ4_NL; bench/COMPUTE_PARITY.md); "
                             "--guanaco-repack on reads them from the cache too", want.n_tensors - used,
                             want.n_tensors);
        }
        guanaco_log_info("repack cache: %s holds %u repacked expert tensors (%.2f GiB): %u read in that layout, never "
                         "repacked", path, want.n_tensors, gib(want.bytes), used);
    }
    return 0;
}

static int start_residency(struct guanaco_engine *engine, char *const *mapping_base) {
    const struct guanaco_manifest *m = &engine->manifest;
    const struct guanaco_options *o = &engine->options;
    engine->shard_fds = malloc((size_t)m->n_shards * sizeof(int));
    engine->shard_direct_fds = malloc((size_t)m->n_shards * sizeof(int));
    engine->residency_tensors = calloc((size_t)m->n_layer, sizeof(*engine->residency_tensors));
    engine->residency_tensors_in_layer = calloc((size_t)m->n_layer, sizeof(uint32_t));
    if (!engine->shard_fds || !engine->shard_direct_fds || !engine->residency_tensors ||
        !engine->residency_tensors_in_layer) {
        return -ENOMEM;
    }
    for (int s = 0; s < m->n_shards; s++) {
        engine->shard_fds[s] = -1;
        engine->shard_direct_fds[s] = -1;
    }
    int err = 0;
    if (o->repack != GUANACO_REPACK_OFF && engine->repack_allowed &&
        (err = guanaco_expert_repack_create(&engine->repack)) < 0) {
        return err;
    }
    /* auto: direct at every slice size since fixed slots. At 25%, replayed routing, decode against page-cache
       loading: Qwen3-30B-A3B Q8_0 (1.6 MB slices) 1.06-1.36x, Mixtral-8x7B Q4_0 (33 MB) 1.36x paired median,
       gpt-oss MXFP4 (4.4 MB) 1.63x (bench/PIPELINE.md). Before slots Mixtral's was 0.69x, hence the old 4 MiB rule. */
    bool is_limit = false;
    engine->process_memory = process_memory(&is_limit);
    bool direct = o->load != GUANACO_LOAD_PAGE_CACHE;
    const uint64_t hot_non_expert = guanaco_hot_non_expert_bytes(m);
    if (o->load == GUANACO_LOAD_AUTO && o->ram_bytes &&
        !guanaco_direct_load_fits(engine->process_memory, hot_non_expert, o->ram_bytes, m->expert_bytes)) {
        direct = false;
        guanaco_log_info("--guanaco-load auto: page-cache: direct loading would pin the %.2f GiB budget and up to "
                         "%.2f GiB of spare copies in memory the kernel cannot reclaim, which %s (%.2f GiB) cannot "
                         "hold beside %.2f GiB of non-expert weights and the process; the page cache can give back",
                         gib(o->ram_bytes), gib(guanaco_spare_limit(o->ram_bytes)),
                         is_limit ? "the memory limit" : "the memory available", gib(engine->process_memory),
                         gib(hot_non_expert));
    } else if (o->load == GUANACO_LOAD_AUTO) {
        guanaco_log_info("--guanaco-load auto: direct (measured faster than page-cache loading at every expert slice "
                         "size with fixed slots)");
    }
    enum guanaco_residency_load load = direct ? GUANACO_RESIDENCY_LOAD_DIRECT : GUANACO_RESIDENCY_LOAD_PAGE_CACHE;
    for (int s = 0; s < m->n_shards; s++) {
        engine->shard_fds[s] = open(m->shard_paths[s], O_RDONLY | O_CLOEXEC);
        if (engine->shard_fds[s] < 0) {
            int err = -errno;
            guanaco_log_error("%s: %s", m->shard_paths[s], strerror(-err));
            return err;
        }
        if (load == GUANACO_RESIDENCY_LOAD_DIRECT) {
            engine->shard_direct_fds[s] = open(m->shard_paths[s], O_RDONLY | O_DIRECT | O_CLOEXEC);
            if (engine->shard_direct_fds[s] < 0) {
                /* tmpfs and some network file systems refuse O_DIRECT: the page cache path works everywhere */
                guanaco_log_info("%s cannot be opened with O_DIRECT (%s): using page-cache loading",
                                 m->shard_paths[s], strerror(errno));
                load = GUANACO_RESIDENCY_LOAD_PAGE_CACHE;
            }
        }
    }
    for (size_t i = 0; i < m->n_tensors; i++) {
        engine->residency_tensors_in_layer[m->tensors[i].layer]++;
    }
    for (int layer = 0; layer < m->n_layer; layer++) {
        uint32_t n = engine->residency_tensors_in_layer[layer];
        engine->residency_tensors[layer] = calloc(n ? n : 1, sizeof(**engine->residency_tensors));
        if (!engine->residency_tensors[layer]) {
            return -ENOMEM;
        }
        engine->residency_tensors_in_layer[layer] = 0;
    }
    /* Both knobs may be set and the tighter wins; a budget not given is derived. */
    uint64_t budget = o->ram_bytes ? o->ram_bytes : automatic_budget(engine, engine->process_memory, is_limit,
                                                                   load == GUANACO_RESIDENCY_LOAD_DIRECT);
    engine->budget_bytes = budget;
    engine->stream_direct_told = -1;
    engine->stream_loan_told = 0;
    const bool everything_fits = budget >= m->expert_bytes && (!o->max_experts || o->max_experts >= (uint32_t)m->n_expert);
    if ((err = open_repack_caches(engine, load == GUANACO_RESIDENCY_LOAD_DIRECT, everything_fits)) < 0) {
        return err;
    }
    /* Each layer's tensors in the order its matmuls run, so that --guanaco-overlap-layer reads them so */
    for (size_t step = 0; step < COMPUTE_RANKS * m->n_tensors; step++) {
        size_t i = step % m->n_tensors;
        const struct guanaco_expert_tensor *e = &m->tensors[i];
        if (compute_rank(e->name) != step / m->n_tensors) {
            continue;
        }
        if (!mapping_base[e->shard]) {
            guanaco_log_error("expert tensor %s was not mapped by the loader", e->name);
            return -EINVAL;
        }
        struct guanaco_residency_tensor *r =
            &engine->residency_tensors[e->layer][engine->residency_tensors_in_layer[e->layer]++];
        r->fd = engine->shard_fds[e->shard];
        r->direct_fd = engine->shard_direct_fds[e->shard];
        r->file_offset = e->file_offset;
        r->expert_stride = e->expert_stride;
        r->mapped = mapping_base[e->shard] + e->file_offset;
        r->file_size = m->shard_sizes[e->shard];
        struct ggml_tensor *tensor = engine->expert_tensors[i];
        const int cache_fd = engine->shard_cache_fds[e->shard];
        if (engine->repack && tensor && runs_repacked(engine, e->type, everything_fits, cache_fd >= 0)) {
            if ((err = guanaco_expert_repack_adopt(engine->repack, engine->expert_tensors[i], &r->arena)) < 0) {
                return err;
            }
            r->transform = r->arena ? guanaco_expert_repack_transform : NULL;
            r->transform_context = r->arena ? engine->expert_tensors[i] : NULL;
            engine->repacked_tensors += r->arena != NULL;
            if (r->arena && cache_fd >= 0) { /* the cache holds exactly the tensors adopt takes (repack_cache.h) */
                r->file_in_arena_layout = true;
                r->layout_fd = cache_fd;
                r->layout_direct_fd = engine->shard_cache_direct_fds[e->shard];
            }
        }
    }
    if (engine->repack && engine->repacked_tensors == 0) {
        guanaco_expert_repack_destroy(engine->repack); /* no type here has a repacked kernel */
        engine->repack = NULL;
    }
    struct guanaco_residency_config config = {
        .n_layer = (uint32_t)m->n_layer,
        .n_expert = (uint32_t)m->n_expert,
        .tensors_of_layer = (const struct guanaco_residency_tensor *const *)engine->residency_tensors,
        .tensors_in_layer = engine->residency_tensors_in_layer,
        .budget_bytes = budget,
        .max_experts_per_layer = o->max_experts,
        .policy = (enum guanaco_policy_kind)o->policy,
        .io_backend = (enum guanaco_io_backend)o->io,
        .queue_depth = GUANACO_RESIDENCY_DEFAULT_QUEUE_DEPTH,
        .load = load,
        .prefetch_bytes = o->prefetch != GUANACO_PREDICTOR_NONE ? guanaco_read_ahead_allowance(budget) : 0,
        .stream_prompts = o->stream_prompts,
        .huge_folios = o->huge_folios,
        .overlap_layer = o->overlap_layer_follows_load ? load == GUANACO_RESIDENCY_LOAD_DIRECT : o->overlap_layer,
        .fixed_slots = o->fixed_slots,
        .stream_direct = o->stream_direct,
        .n_expert_used = m->n_expert_used > 0 ? (uint32_t)m->n_expert_used : 0,
    };
    /* direct loading's overlap needs MUL_MAT_ID to ask: one engine per process gets it, the others wait for
       their reads as without the overlap */
    if (config.overlap_layer && load == GUANACO_RESIDENCY_LOAD_DIRECT && !claim_expert_weights(engine)) {
        guanaco_log_info("--guanaco-overlap-layer: another model in this process overlaps its direct reads; this one "
                         "waits for its reads");
        config.overlap_layer = false;
    }
    err = guanaco_residency_create(&config, &engine->residency);
    if (err == -ENOSYS && config.io_backend == GUANACO_IO_URING) {
        guanaco_log_info("io_uring is not available here: using the pread thread pool");
        config.io_backend = GUANACO_IO_THREADS;
        err = guanaco_residency_create(&config, &engine->residency);
    }
    if (err < 0) {
        struct guanaco_engine *self = engine;
        atomic_compare_exchange_strong(&expert_weights_owner, &self, NULL);
        return err;
    }
    if (o->preload) {
        /* a warm start: what the page cache already holds is resident for free, and is not read again */
        uint32_t per_layer = guanaco_preload_count(budget, m->expert_bytes, (uint32_t)m->n_expert, o->max_experts);
        uint64_t adopted = 0;
        if ((err = guanaco_residency_adopt_cached(engine->residency, per_layer, &adopted)) < 0) {
            return err;
        }
        if (adopted) {
            guanaco_log_info("warm start: %llu experts were already in the page cache and stay resident without a read",
                             (unsigned long long)adopted);
        }
    }
    if ((err = guanaco_residency_drop_unaccounted(engine->residency)) < 0) {
        return err;
    }
    if (config.prefetch_bytes && (err = start_predictor(engine)) < 0) {
        return err;
    }
    struct guanaco_imatrix_prior prior = {0};
    if (o->imatrix[0] && (err = guanaco_imatrix_load(o->imatrix, m, &prior)) < 0) {
        return err;
    }
    if (o->imatrix[0] && !o->preload) {
        guanaco_log_info("--guanaco-imatrix %s: with --guanaco-preload off the prior chooses nothing", o->imatrix);
    }
    err = o->preload ? preload(engine, budget, o->imatrix[0] ? &prior : NULL) : 0;
    guanaco_imatrix_free(&prior);
    if (err < 0) {
        return err;
    }
    update_holds_every_expert(engine);
    choose_stream_direct(engine, atomic_load(&engine->context_bytes) > 0);
    struct guanaco_residency_stats started;
    guanaco_residency_get_stats(engine->residency, &started);
    if (started.overlap_layer && started.load == GUANACO_RESIDENCY_LOAD_DIRECT) {
        engine->asks_expert_weights = true;
        ggml_cpu_set_expert_weights(expert_weights, engine);
    } else if (atomic_load(&expert_weights_owner) == engine) {
        atomic_store(&expert_weights_owner, NULL); /* direct loading fell back to the page cache */
    }
    /* Not with DIRECT loading that does not stream prompts: its copies would enter the resident set, and the room
       they need, up to half the budget, would evict what decoding keeps (256-token prompts at 25%, replayed
       routing: 32.9% of the run's accesses hit against 36.9% without, decode 2.8-3.2 against 3.4-3.6 tok/s;
       bench/PIPELINE.md). */
    engine->prompt_read_ahead = started.load == GUANACO_RESIDENCY_LOAD_PAGE_CACHE || started.stream_prompts;
    /* With fixed slots the decode stall is the disk, and decode's guesses compete with its misses for it: pilot
       against none 0.83, 0.95 and 0.89 on three cells, throttle on (bench/PIPELINE.md, Dec 4). Prompts still gain. */
    engine->decode_reads_no_guesses = started.fixed_slots && engine->predictor;
    if (engine->decode_reads_no_guesses) {
        guanaco_log_info("read-ahead: prompts only; with fixed slots decode's guesses slowed its own reads (README, "
                         "--guanaco-prefetch)");
    }
    char prefetch[128] = "none";
    if (engine->predictor) {
        snprintf(prefetch, sizeof(prefetch), "%s, up to %.2f GiB ahead", guanaco_predictor_kind_name(o->prefetch),
                 gib(config.prefetch_bytes));
    }
    guanaco_log_info("residency: budget %.2f GiB of %.2f GiB expert weights (%.0f%%), max %u experts per layer, "
                     "policy %s, io %s, load %s%s%s, prefetch %s, status every %u tokens",
                     gib(budget), gib(m->expert_bytes), 100.0 * (double)budget / (double)m->expert_bytes,
                     o->max_experts, guanaco_policy_kind_name(config.policy), guanaco_io_backend_name(config.io_backend),
                     load_name(started.load),
                     started.overlap_layer && (engine->repacked_tensors < m->n_tensors || started.fixed_slots)
                         ? " (a layer computes while its reads land)" : "",
                     started.fixed_slots ? " into fixed slots" : "",
                     prefetch, o->status_every);
    engine->status_last_ns = guanaco_now_ns();
    return 0;
}

/*
 * --guanaco-preload: plain llama.cpp reads the whole file at load
 * (WILLNEED / MAP_POPULATE) and then decodes from RAM when it fits; without
 * the same start, Guanaco would pay for every first touch during decode.
 * Each MoE layer gets its share of the budget (in proportion to its expert
 * bytes, as layer-lru divides it): the experts a warm start adopted, then
 * others by guanaco_prior_preload_choice: with --guanaco-imatrix the layer's
 * most-routed, else the lowest-numbered, as nothing is known about which are
 * hot. The most-routed is handed to the policy last, so recency agrees with
 * the prior. The reads go through the normal path, one layer per batch.
 */
static int preload(struct guanaco_engine *engine, uint64_t budget, const struct guanaco_imatrix_prior *prior) {
    const struct guanaco_manifest *m = &engine->manifest;
    /* the same count for every MoE layer: its share of the budget in whole experts */
    uint32_t n = guanaco_preload_count(budget, m->expert_bytes, (uint32_t)m->n_expert, engine->options.max_experts);
    int32_t *ids = calloc(n ? n : 1, sizeof(*ids));
    uint32_t *chosen = calloc(n ? n : 1, sizeof(*chosen));
    uint8_t *adopted = calloc((size_t)m->n_expert, 1);
    double *rate = calloc((size_t)m->n_expert, sizeof(*rate));
    if (!ids || !chosen || !adopted || !rate) {
        free(ids);
        free(chosen);
        free(adopted);
        free(rate);
        return -ENOMEM;
    }
    char choices[900] = ""; /* the prior's picks, for the line below */
    size_t used = 0;
    uint64_t start = guanaco_now_ns();
    int err = 0;
    for (int layer = 0; layer < m->n_layer && err == 0 && n; layer++) {
        if (!engine->moe_layer_of[layer]) {
            continue;
        }
        uint32_t count = 0;
        for (int e = 0; e < m->n_expert; e++) {
            adopted[e] = guanaco_residency_is_resident(engine->residency, (uint32_t)layer, (uint32_t)e);
            if (adopted[e] && count < n) {
                ids[count++] = e;
            }
        }
        const float *weights = guanaco_imatrix_layer(prior, (uint32_t)layer);
        uint32_t n_chosen = guanaco_prior_preload_choice(weights, (uint32_t)m->n_expert, adopted, n - count, chosen);
        for (uint32_t i = 0; i < n_chosen; i++) {
            ids[count++] = (int32_t)chosen[i];
        }
        if (weights && used < sizeof(choices)) {
            int w = snprintf(choices + used, sizeof(choices) - used, " %d:", layer);
            used += w > 0 ? (size_t)w : 0;
            for (uint32_t i = n_chosen; i-- > 0 && used < sizeof(choices);) { /* the most-routed first */
                w = snprintf(choices + used, sizeof(choices) - used, "%s%u", i + 1 == n_chosen ? "" : ",", chosen[i]);
                used += w > 0 ? (size_t)w : 0;
            }
        }
        err = guanaco_residency_preload_layer(engine->residency, (uint32_t)layer, ids, count);
        if (weights && err == 0) {
            /* the policy's counts start from the prior too, so lfu and guanaco keep the hot experts */
            for (int e = 0; e < m->n_expert; e++) {
                rate[e] = (double)weights[e] * (double)m->n_expert_used;
            }
            guanaco_residency_seed_policy(engine->residency, (uint32_t)layer, rate);
        }
        struct guanaco_residency_stats progress;
        guanaco_residency_get_stats(engine->residency, &progress);
        guanaco_log_progress("preload: layer %d of %d, %.2f GiB read", layer + 1, m->n_layer, gib(progress.bytes_read));
    }
    guanaco_log_progress_end();
    double seconds = (double)(guanaco_now_ns() - start) / 1e9;
    guanaco_residency_get_stats(engine->residency, &engine->after_preload);
    engine->status_last = engine->after_preload;
    if (err == 0) {
        guanaco_log_info("preload: %llu experts, %.2f GiB in %.1f s (%.2f GB/s)",
                         (unsigned long long)engine->after_preload.expert_loads, gib(engine->after_preload.bytes_read),
                         seconds, seconds > 0 ? (double)engine->after_preload.bytes_read / seconds / 1e9 : 0.0);
    }
    if (err == 0 && prior && prior->n_layers_with_prior) {
        /* one line that says which experts the prior chose (a test reads it): layer:ids, most-routed first */
        guanaco_log_info("preload by the imatrix prior %s: up to %u experts per MoE layer, the most-routed (after "
                         "any a warm start kept), not the lowest-numbered:%s%s", engine->options.imatrix, n, choices,
                         used >= sizeof(choices) ? " ..." : "");
    }
    free(ids);
    free(chosen);
    free(adopted);
    free(rate);
    return err;
}

/* A prompt that has read for more than a second shows where it is on a terminal (log.h's progress line). */
#define PROMPT_PROGRESS_AFTER_NS 1000000000ull

static void prompt_progress(struct guanaco_engine *engine, int layer) {
    uint64_t started = atomic_load(&engine->prompt_started_ns);
    if (layer == engine->last_moe_layer) {
        guanaco_log_progress_end();
        return;
    }
    uint64_t elapsed = guanaco_now_ns() - started;
    if (!started || elapsed < PROMPT_PROGRESS_AFTER_NS) {
        return;
    }
    int ordinal = 0;
    for (int l = 0; l <= layer; l++) {
        ordinal += engine->moe_layer_of[l] != 0;
    }
    struct guanaco_residency_stats st;
    guanaco_residency_get_stats(engine->residency, &st);
    uint64_t read = st.bytes_read - atomic_load(&engine->prompt_started_bytes);
    guanaco_log_progress("prompt: MoE layer %d of %d, %.2f GiB read in %.1f s (%.2f GB/s)", ordinal,
                         engine->manifest.n_moe_layers, gib(read), (double)elapsed / 1e9,
                         (double)read / ((double)elapsed / 1e9) / 1e9);
}

int guanaco_engine_prepare_layer(struct guanaco_engine *engine, int layer, const int32_t *ids, size_t n_ids,
                                 uint64_t token) {
    if (!engine->residency) {
        return 0;
    }
    /* several tokens at once: a prompt ubatch, which may read a whole layer per layer */
    const bool prompt = n_ids > (size_t)engine->manifest.n_expert_used;
    if (prompt && layer == engine->first_moe_layer) {
        struct guanaco_residency_stats st;
        guanaco_residency_get_stats(engine->residency, &st);
        atomic_store(&engine->prompt_started_bytes, st.bytes_read);
        atomic_store(&engine->prompt_started_ns, guanaco_now_ns());
    }
    int err = guanaco_residency_prepare_layer(engine->residency, (uint32_t)layer, ids, n_ids, token);
    if (prompt) {
        prompt_progress(engine, layer);
    }
    if (err == 0 && layer == engine->last_moe_layer) {
        update_holds_every_expert(engine); /* once per pass: it takes the residency's lock */
    }
    return err;
}

bool guanaco_engine_needs_router_ids(const struct guanaco_engine *engine) {
    return !atomic_load_explicit(&engine->holds_every_expert, memory_order_relaxed) || router_ids_always_needed(engine);
}

/* A truncated file makes reads of its mapping fault; mapping_guard turns that into engine->mapping_faulted,
   which fails every graph from then on (guanaco_hook_take_error). */
static int guard_mappings(struct guanaco_engine *engine, char *const *mapping_base) {
    const struct guanaco_manifest *m = &engine->manifest;
    engine->guarded_mappings = calloc((size_t)m->n_shards, sizeof(*engine->guarded_mappings));
    if (!engine->guarded_mappings) {
        return -ENOMEM;
    }
    for (int s = 0; s < m->n_shards; s++) {
        if (!mapping_base[s]) {
            continue;
        }
        int err = guanaco_mapping_guard_add(mapping_base[s], m->shard_sizes[s], &engine->mapping_faulted);
        if (err < 0) {
            /* not fatal: without the guard a truncated file crashes the process, as in plain llama.cpp */
            guanaco_log_info("cannot guard the mapping of shard %d against truncation: %s", s, strerror(-err));
            continue;
        }
        engine->guarded_mappings[s] = mapping_base[s];
    }
    return 0;
}

/*
 * Weights that llama.cpp uploaded to a device (-ngl with an RPC or GPU
 * backend) were read once through the file mapping and are not needed on the
 * host again, but munmap leaves their pages in the page cache, where they
 * would compete with the experts for the budget's RAM. The pinned release
 * does not drop them, so streaming does: POSIX_FADV_DONTNEED over each such
 * tensor's bytes (whole pages only; a page a host tensor shares stays).
 * Best effort: a shard that cannot be read again keeps its pages.
 */
static void drop_uploaded_weights(const struct guanaco_engine *engine, guanaco_tensor_lookup lookup, void *user) {
    const struct guanaco_manifest *m = &engine->manifest;
    uint64_t dropped = 0;
    int fd = -1, fd_shard = -1;
    for (size_t i = 0; i < m->n_file_tensors; i++) {
        const struct guanaco_file_tensor *f = &m->file_tensors[i];
        const struct ggml_tensor *t = lookup(f->name, user);
        if (!t || !t->buffer || ggml_backend_buffer_is_host(t->buffer)) {
            continue;
        }
        if (f->shard != fd_shard) { /* file order: each shard is opened once */
            if (fd >= 0) {
                close(fd);
            }
            fd = open(m->shard_paths[f->shard], O_RDONLY | O_CLOEXEC);
            fd_shard = f->shard;
        }
        if (fd >= 0 && posix_fadvise(fd, (off_t)f->file_offset, (off_t)f->nbytes, POSIX_FADV_DONTNEED) == 0) {
            dropped += f->nbytes;
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    if (dropped) {
        guanaco_log_info("dropped %.1f MiB of weights uploaded to a device from the host's page cache",
                         (double)dropped / 1048576.0);
    }
}

int guanaco_engine_attach(struct guanaco_engine *engine, guanaco_tensor_lookup lookup, void *user) {
    if (!engine || engine->dry_run) {
        return 0; /* the memory-fit pass maps nothing */
    }
    if (!engine->options.streaming) {
        guanaco_log_info("streaming off: experts load as in plain llama.cpp; the router is "
                         "only %s", engine->replay.n_records ? "replayed" : "recorded");
        return 0;
    }
    const struct guanaco_manifest *m = &engine->manifest;
    char **mapping_base = calloc((size_t)m->n_shards, sizeof(*mapping_base));
    if (!mapping_base) {
        return -ENOMEM;
    }
    engine->expert_tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*engine->expert_tensors));
    if (!engine->expert_tensors) {
        free(mapping_base);
        return -ENOMEM;
    }
    size_t attached = 0;
    uint64_t attached_bytes = 0;
    int err = 0;
    for (size_t i = 0; i < m->n_tensors && err == 0; i++) {
        const struct guanaco_expert_tensor *e = &m->tensors[i];
        struct ggml_tensor *t = lookup(e->name, user);
        if (!t) {
            continue; /* in the file but not used by this model (e.g. a skipped MTP block) */
        }
        if (!t->buffer || !ggml_backend_buffer_is_host(t->buffer) || !t->data) {
            guanaco_log_error("expert tensor %s is not in host memory; streaming needs it mapped from the file",
                              e->name);
            err = -EINVAL;
            break;
        }
        /* Zero-copy tensors point into the mapping, so data - offset is the same for a whole shard. */
        char *base = (char *)t->data - e->file_offset;
        if (!mapping_base[e->shard]) {
            mapping_base[e->shard] = base;
        } else if (mapping_base[e->shard] != base) {
            guanaco_log_error("expert tensor %s was copied out of the file mapping; streaming needs mmap", e->name);
            err = -EINVAL;
            break;
        }
        err = advise_expert_pages(engine, t->data, e->nbytes);
        if (err < 0) {
            guanaco_log_error("madvise over expert tensor %s failed: %s", e->name, strerror(-err));
            break;
        }
        engine->expert_tensors[i] = t;
        attached++;
        attached_bytes += e->nbytes;
    }
    if (err == 0) {
        err = guard_mappings(engine, mapping_base);
    }
    if (err == 0) {
        drop_uploaded_weights(engine, lookup, user);
    }
    if (err == 0 && engine->options.residency) {
        err = start_residency(engine, mapping_base);
        if (err == 0) {
            guanaco_metrics_register(engine);
        }
    } else if (err == 0 && engine->options.imatrix[0]) {
        guanaco_log_info("--guanaco-imatrix %s: unused without a budget (--guanaco-ram or --guanaco-max-experts)",
                         engine->options.imatrix);
    }
    free(mapping_base);
    if (err == 0 && !engine->dry_run) {
        guanaco_log_info("streaming %zu expert tensors (%.2f GiB of %.2f GiB): not read at load, readahead=%s; "
                         "non-expert weights prefetched and placed as llama.cpp chooses (repacked where it repacks); "
                         "%zu expert tensors run repacked, so results equal %s",
                         attached, gib(attached_bytes), gib(m->total_bytes), readahead_name(engine->options.readahead),
                         engine->repacked_tensors,
                         !engine->repack_allowed ? "plain llama.cpp's --no-repack"
                         : engine->repack ? "plain llama.cpp's default"
                         : engine->residency && engine->options.repack == GUANACO_REPACK_ON
                             ? "plain llama.cpp's default (no expert tensor here has a repacked kernel)"
                             : "--guanaco-reference");
    }
    return err;
}

void guanaco_engine_count_routing(struct guanaco_engine *engine, int layer, const int32_t *ids, int k,
                                  int n_tokens) {
    const int n_expert = engine->manifest.n_expert;
    _Atomic uint64_t *row = engine->access_count + (size_t)layer * (size_t)n_expert;
    uint64_t invalid = 0;
    for (int i = 0; i < k * n_tokens; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= n_expert) {
            invalid++;
            continue;
        }
        atomic_fetch_add_explicit(&row[id], 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&engine->routed_tokens, (uint64_t)n_tokens, memory_order_relaxed);
    if (layer == engine->last_moe_layer) {
        uint64_t before = atomic_fetch_add(&engine->tokens_done, (uint64_t)n_tokens);
        if (before == 0 && engine->residency) {
            /* the first pass faulted the other weights in, with readahead into expert ranges */
            (void)guanaco_residency_drop_unaccounted(engine->residency);
        }
        maybe_log_status(engine, before, before + (uint64_t)n_tokens);
    }
    atomic_fetch_add_explicit(&engine->router_calls, 1, memory_order_relaxed);
    if (invalid) {
        atomic_fetch_add_explicit(&engine->invalid_ids, invalid, memory_order_relaxed);
    }
}

void guanaco_engine_record_routing(struct guanaco_engine *engine, uint32_t sequence, uint32_t first_token,
                                   int layer, const int32_t *ids, int k, int n_tokens) {
    if (!engine->trace_writer || k != engine->manifest.n_expert_used) {
        return;
    }
    for (int row = 0; row < n_tokens; row++) {
        /* The router's weights are computed after ffn_moe_topk; asking for them would cost another chunk. */
        int err = guanaco_trace_writer_append(engine->trace_writer, sequence, first_token + (uint32_t)row,
                                              (uint32_t)layer, ids + (size_t)row * (size_t)k, NULL);
        if (err < 0) {
            int expected = 0;
            if (atomic_compare_exchange_strong(&engine->trace_error, &expected, err)) {
                guanaco_log_error("recording routing to %s failed: %s", engine->options.trace_out, strerror(-err));
            }
            return;
        }
    }
}

const int32_t *guanaco_engine_replay_ids(struct guanaco_engine *engine, int layer, uint64_t row) {
    if (engine->replay.n_records == 0) {
        return NULL;
    }
    size_t n = engine->replay_records_in_layer[layer];
    if (row > 0 && row % n == 0) {
        atomic_fetch_add_explicit(&engine->replay_wraps, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&engine->replayed_rows, 1, memory_order_relaxed);
    size_t record = engine->replay_records_of_layer[layer][row % n];
    return engine->replay.ids + record * engine->replay.shape.top_k;
}

uint64_t guanaco_engine_access_count(const struct guanaco_engine *engine, int layer, int expert) {
    const struct guanaco_manifest *m = &engine->manifest;
    if (!engine->access_count || layer < 0 || layer >= m->n_layer || expert < 0 || expert >= m->n_expert) {
        return 0;
    }
    return atomic_load(&engine->access_count[(size_t)layer * (size_t)m->n_expert + (size_t)expert]);
}

static void print_summary(const struct guanaco_engine *engine) {
    const struct guanaco_manifest *m = &engine->manifest;
    uint64_t accesses = 0, pairs_used = 0;
    double busiest_share = 0.0;
    for (int layer = 0; layer < m->n_layer; layer++) {
        if (!engine->moe_layer_of[layer]) {
            continue;
        }
        uint64_t layer_total = 0, layer_max = 0;
        for (int e = 0; e < m->n_expert; e++) {
            uint64_t c = guanaco_engine_access_count(engine, layer, e);
            layer_total += c;
            layer_max = c > layer_max ? c : layer_max;
            pairs_used += c > 0;
        }
        accesses += layer_total;
        if (layer_total && (double)layer_max / (double)layer_total > busiest_share) {
            busiest_share = (double)layer_max / (double)layer_total;
        }
    }
    uint64_t routed = atomic_load(&engine->routed_tokens);
    uint64_t tokens = m->n_moe_layers ? routed / (uint64_t)m->n_moe_layers : 0;
    guanaco_log_info("summary: %llu tokens routed through %d MoE layers: %llu expert accesses, %llu/%llu "
                     "(layer, expert) pairs used, busiest expert took %.1f%% of its layer, %llu invalid ids",
                     (unsigned long long)tokens, m->n_moe_layers, (unsigned long long)accesses,
                     (unsigned long long)pairs_used, (unsigned long long)m->n_moe_layers * (unsigned long long)m->n_expert,
                     100.0 * busiest_share, (unsigned long long)atomic_load(&engine->invalid_ids));
    if (!guanaco_engine_needs_router_ids(engine)) {
        guanaco_log_info("summary: tokens computed while every expert was resident are not in these counts: their "
                         "router ids were not read");
    }
}

/* The gate's recall per layer guessed: a share of the chosen experts found in each token's top k, and in
   its top k + margin. Layers it never scored (pilot stood in) are left out. */
static void log_gate_recall(struct guanaco_engine *engine) {
    if (!engine->router_gate) {
        return;
    }
    char line[4096];
    size_t used = 0;
    uint64_t tokens = 0;
    double top_k = 0, all_ranks = 0;
    uint32_t ranks = 0;
    for (int layer = 0; layer < engine->manifest.n_layer; layer++) {
        struct guanaco_predictor_recall recall;
        if (guanaco_predictor_recall(engine->predictor, (uint32_t)layer, &recall) < 0 || recall.tokens == 0) {
            continue;
        }
        tokens += recall.tokens;
        top_k += recall.top_k * (double)recall.tokens;
        all_ranks += recall.all_ranks * (double)recall.tokens;
        ranks = recall.ranks;
        if (used < sizeof(line)) {
            int n = snprintf(line + used, sizeof(line) - used, " %d:%.2f/%.2f", layer, recall.top_k, recall.all_ranks);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    if (tokens == 0) {
        guanaco_log_info("prefetch gate: no guess was checked (pilot predicted every layer)");
        return;
    }
    guanaco_log_info("prefetch gate recall, top %d / top %u: %.3f / %.3f over %llu token-layers; per layer:%s",
                     engine->manifest.n_expert_used, ranks, top_k / (double)tokens, all_ranks / (double)tokens,
                     (unsigned long long)tokens, line);
}

/* What the throttle measured and chose, for decode and for prompts. */
static void log_throttle(const struct guanaco_engine *engine) {
    if (!engine->predictor) {
        return;
    }
    static const char *const kind[2] = {"decode", "prompt"};
    for (int i = 0; i < 2; i++) {
        const struct guanaco_read_ahead_throttle *t = &engine->throttle[i];
        uint64_t ubatches = t->ubatches[0] + t->ubatches[1];
        if (ubatches == 0) {
            continue;
        }
        guanaco_log_info("read-ahead throttle, %s: on in %llu of %llu ubatches; %.1f ms per token off, %.1f ms on "
                         "(0: not measured); %llu explorations cut short%s",
                         kind[i], (unsigned long long)t->ubatches[1], (unsigned long long)ubatches,
                         t->estimate[0] / 1e6, t->estimate[1] / 1e6, (unsigned long long)t->explorations_cut,
                         !t->enabled                                    ? "; the throttle is off"
                         : t->estimate[0] == 0.0 || t->estimate[1] == 0.0 ? "; one side was not measured"
                         : guanaco_read_ahead_throttle_prefers_on(t)      ? "; reading ahead pays"
                                                                          : "; reading ahead does not pay here");
    }
}

void guanaco_engine_close(struct guanaco_engine *engine) {
    if (!engine) {
        return;
    }
    guanaco_metrics_unregister(engine);
    if (!engine->dry_run && engine->access_count) {
        print_summary(engine);
        log_throttle(engine);
    }
    if (!engine->dry_run && engine->replay.n_records) {
        guanaco_log_info("replay: %llu routings overwritten, recording wrapped around %llu times",
                         (unsigned long long)atomic_load(&engine->replayed_rows),
                         (unsigned long long)atomic_load(&engine->replay_wraps));
    }
    if (engine->residency) {
        struct guanaco_residency_stats st;
        guanaco_residency_get_stats(engine->residency, &st);
        char tail[256];
        snprintf(tail, sizeof(tail), ", peak %.2f GiB resident, %llu failed loads, load %s, %llu loads settled while their "
                 "layer computed", gib(st.peak_resident_bytes), (unsigned long long)st.load_failures, load_name(st.load),
                 (unsigned long long)st.loads_settled_computing);
        /* the preload is reported on its own line: these are the decode's */
        log_residency("residency", &st, &engine->after_preload, atomic_load(&engine->tokens_done),
                      atomic_load(&engine->router_hook_ns), tail);
        if (engine->asks_expert_weights) {
            ggml_cpu_set_expert_weights(NULL, NULL);
        }
        struct guanaco_engine *self = engine; /* also when the start failed after claiming it */
        atomic_compare_exchange_strong(&expert_weights_owner, &self, NULL);
        guanaco_residency_destroy(engine->residency);
    }
    guanaco_expert_repack_destroy(engine->repack);
    free(engine->expert_tensors);
    if (engine->predictor) {
        log_gate_recall(engine);
        guanaco_predictor_free(engine->predictor);
        pthread_mutex_destroy(&engine->predictor_lock);
    }
    guanaco_router_gate_free(engine->router_gate);
    for (int s = 0; engine->guarded_mappings && s < engine->manifest.n_shards; s++) {
        if (engine->guarded_mappings[s]) {
            guanaco_mapping_guard_remove(engine->guarded_mappings[s]);
        }
    }
    free(engine->guarded_mappings);
    free(engine->predicted);
    free(engine->predictor_absent);
    for (int s = 0; engine->shard_fds && s < engine->manifest.n_shards; s++) {
        if (engine->shard_fds[s] >= 0) {
            close(engine->shard_fds[s]);
        }
    }
    free(engine->shard_fds);
    for (int s = 0; engine->shard_direct_fds && s < engine->manifest.n_shards; s++) {
        if (engine->shard_direct_fds[s] >= 0) {
            close(engine->shard_direct_fds[s]);
        }
    }
    free(engine->shard_direct_fds);
    for (int s = 0; engine->shard_cache_fds && s < engine->manifest.n_shards; s++) {
        if (engine->shard_cache_fds[s] >= 0) {
            close(engine->shard_cache_fds[s]);
        }
        if (engine->shard_cache_direct_fds[s] >= 0) {
            close(engine->shard_cache_direct_fds[s]);
        }
    }
    free(engine->shard_cache_fds);
    free(engine->shard_cache_direct_fds);
    for (int layer = 0; engine->residency_tensors && layer < engine->manifest.n_layer; layer++) {
        free(engine->residency_tensors[layer]);
    }
    free(engine->residency_tensors);
    free(engine->residency_tensors_in_layer);
    if (engine->trace_writer) {
        int err = guanaco_trace_writer_close(engine->trace_writer);
        if (err < 0 && atomic_load(&engine->trace_error) == 0) {
            guanaco_log_error("recording routing to %s failed: %s", engine->options.trace_out, strerror(-err));
        }
    }
    for (int layer = 0; engine->replay_records_of_layer && layer < engine->manifest.n_layer; layer++) {
        free(engine->replay_records_of_layer[layer]);
    }
    free(engine->replay_records_of_layer);
    free(engine->replay_records_in_layer);
    guanaco_trace_free(&engine->replay);
    free(engine->access_count);
    free(engine->moe_layer_of);
    guanaco_manifest_free(&engine->manifest);
    free(engine);
}
