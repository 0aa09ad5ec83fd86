/*
 * simulate.c - owns the replay of a routing trace through a policy, counting
 * what the live engine would read and evict. It drives the policy exactly as
 * the engine does (access, then evict protecting the layer), so simulated hit
 * rates are the engine's. The pipeline replay adds the engine's read-ahead
 * (predictor, prompt rule, allowance), its streamed prompts (prompt-sized
 * calls the policy hears only the hits of) and the timing model of
 * simulate.h, with the kernel's CPU for reads and drops where the caller
 * gives it, so guanaco-sim and guanaco-plan estimate time with one rule.
 */
#include "simulate.h"
#include "budget.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int guanaco_request_trace_check(const struct guanaco_request_trace *trace) {
    if (!trace || trace->n_layer == 0 || trace->n_expert == 0 || !trace->expert_bytes ||
        (uint64_t)trace->n_layer * trace->n_expert > UINT32_MAX / 2 ||
        (trace->n_requests > 0 && (!trace->request_token || !trace->request_layer || !trace->request_start))) {
        return -EINVAL;
    }
    if (trace->n_requests == 0) {
        return 0;
    }
    if (trace->request_start[trace->n_requests] > 0 && !trace->experts) {
        return -EINVAL;
    }
    /* mark[slot] = 1 + the last request that named it: catches repeats inside a request */
    size_t n_slots = (size_t)trace->n_layer * trace->n_expert;
    size_t *mark = calloc(n_slots, sizeof(*mark));
    if (!mark) {
        return -ENOMEM;
    }
    int result = 0;
    for (size_t r = 0; r < trace->n_requests && result == 0; r++) {
        uint32_t layer = trace->request_layer[r];
        if (layer >= trace->n_layer || trace->expert_bytes[layer] == 0 ||
            trace->request_start[r + 1] < trace->request_start[r] ||
            (r > 0 && trace->request_token[r] < trace->request_token[r - 1])) {
            result = -EINVAL;
            break;
        }
        for (size_t i = trace->request_start[r]; i < trace->request_start[r + 1]; i++) {
            uint32_t expert = trace->experts[i];
            size_t slot = (size_t)layer * trace->n_expert + expert;
            if (expert >= trace->n_expert || mark[slot] == r + 1) {
                result = -EINVAL;
                break;
            }
            mark[slot] = r + 1;
        }
    }
    free(mark);
    return result;
}

/* The engine's preload: each MoE layer's count of lowest-numbered experts, at token 0. */
static int preload_policy(const struct guanaco_request_trace *trace, const struct guanaco_policy_config *config,
                          struct guanaco_policy *policy, uint32_t *ids, uint32_t *victim_layers,
                          uint32_t *victim_experts, size_t n_slots) {
    uint64_t total = 0;
    for (uint32_t l = 0; l < trace->n_layer; l++) {
        total += trace->expert_bytes[l] * trace->n_expert;
    }
    uint32_t n = guanaco_preload_count(config->budget_bytes, total, trace->n_expert, config->max_per_layer);
    for (uint32_t e = 0; e < n; e++) {
        ids[e] = e;
    }
    for (uint32_t l = 0; l < trace->n_layer && n; l++) {
        size_t n_missing = 0, n_victims = 0;
        if (trace->expert_bytes[l] == 0) {
            continue;
        }
        int err = guanaco_policy_access(policy, l, ids, n, 0, victim_experts, &n_missing);
        if (err == 0) {
            err = guanaco_policy_evict(policy, l, victim_layers, victim_experts, n_slots, &n_victims);
        }
        if (err != 0) {
            return err;
        }
    }
    return 0;
}

/* Request r's tokens: its routed rows (a ubatch's), or 1 without rows. */
static uint32_t request_tokens(const struct guanaco_request_rows *rows, size_t r) {
    size_t n = rows ? rows->request_row_start[r + 1] - rows->request_row_start[r] : 1;
    return n == 0 ? 1 : n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int guanaco_simulate(const struct guanaco_request_trace *trace, const struct guanaco_request_rows *rows,
                     const struct guanaco_policy_config *config, bool preload, struct guanaco_replay_stats *stats) {
    memset(stats, 0, sizeof(*stats));
    int err = guanaco_request_trace_check(trace);
    if (err == 0 && rows && !rows->request_row_start) {
        err = -EINVAL;
    }
    if (err != 0 || !config) {
        return err ? err : -EINVAL;
    }
    struct guanaco_policy_config geometry = *config;
    geometry.n_layer = trace->n_layer;
    geometry.n_expert = trace->n_expert;
    geometry.expert_bytes = trace->expert_bytes;
    struct guanaco_policy *policy = NULL;
    err = guanaco_policy_create(&geometry, &policy);
    if (err != 0) {
        return err;
    }
    size_t n_slots = (size_t)trace->n_layer * trace->n_expert;
    uint32_t *missing = malloc(trace->n_expert * sizeof(*missing));
    uint32_t *victim_layers = malloc(n_slots * sizeof(*victim_layers));
    uint32_t *victim_experts = malloc(n_slots * sizeof(*victim_experts));
    if (!missing || !victim_layers || !victim_experts) {
        err = -ENOMEM;
    }
    if (err == 0 && preload) {
        err = preload_policy(trace, &geometry, policy, missing, victim_layers, victim_experts, n_slots);
    }
    for (size_t r = 0; r < trace->n_requests && err == 0; r++) {
        uint32_t layer = trace->request_layer[r];
        size_t start = trace->request_start[r], n = trace->request_start[r + 1] - start;
        size_t n_missing = 0, n_victims = 0;
        err = guanaco_policy_access_batch(policy, layer, trace->experts + start, n, trace->request_token[r],
                                          request_tokens(rows, r), missing, &n_missing);
        if (err == 0) {
            /* n_slots victims always suffice, so -ENOBUFS cannot happen here */
            err = guanaco_policy_evict(policy, layer, victim_layers, victim_experts, n_slots, &n_victims);
        }
        stats->requests++;
        stats->accesses += n;
        stats->misses += n_missing;
        stats->hits += n - n_missing;
        stats->bytes_read += n_missing * trace->expert_bytes[layer];
        stats->evictions += n_victims;
        uint64_t resident = guanaco_policy_resident_bytes(policy);
        if (resident > stats->peak_resident_bytes) {
            stats->peak_resident_bytes = resident;
        }
        if (resident > geometry.budget_bytes && resident - geometry.budget_bytes > stats->worst_overshoot_bytes) {
            stats->worst_overshoot_bytes = resident - geometry.budget_bytes;
        }
    }
    free(missing);
    free(victim_layers);
    free(victim_experts);
    guanaco_policy_free(policy);
    return err;
}

/* ---- the pipeline ---- */

void guanaco_pipeline_layer_time(const struct guanaco_layer_reads *reads, double bytes_per_second,
                                 struct guanaco_layer_time *out) {
    double ahead_seconds = (double)reads->ahead_bytes / bytes_per_second;
    double undone = 0;
    if (ahead_seconds > 0 && ahead_seconds > reads->window_seconds) {
        undone = (ahead_seconds - reads->window_seconds) / ahead_seconds;
    }
    double used = (double)(reads->ahead_used_bytes < reads->ahead_bytes ? reads->ahead_used_bytes : reads->ahead_bytes);
    double waited_bytes = (double)reads->demand_bytes + undone * used;
    double waited_seconds = waited_bytes / bytes_per_second;
    /* the previous call's drops run on the calling thread while this call's reads are on the disk */
    out->stall_seconds = (waited_seconds > reads->drop_seconds ? waited_seconds : reads->drop_seconds) +
                         reads->drop_serial_seconds + reads->map_seconds;
    double compute = reads->compute_seconds + reads->kernel_seconds;
    out->overlapped_seconds = compute + out->stall_seconds;
    if (reads->overlap_layer) {
        double busy = reads->drop_seconds + compute;
        out->overlapped_seconds =
            (busy > waited_seconds ? busy : waited_seconds) + reads->drop_serial_seconds + reads->map_seconds;
        out->stall_seconds = out->overlapped_seconds - compute;
    }
    out->serial_seconds = compute + ((double)reads->demand_bytes + used) / bytes_per_second + reads->map_seconds;
    out->hidden_bytes = used * (1 - undone);
}

/* The compute time reading `bytes` takes from the cores compute runs on: their kernel CPU in the load's way (4 KiB
   folios, or O_DIRECT into copies) spread over the cores. */
static double read_cpu_seconds(const struct guanaco_pipeline_config *config, uint64_t bytes) {
    double per_byte = config->load_direct ? config->direct_read_cpu_seconds_per_byte : config->read_cpu_seconds_per_byte;
    return (double)bytes * per_byte / (config->cpu_cores ? config->cpu_cores : 1);
}

/* Read-ahead started for one layer, waiting for that layer's request. */
struct pipeline_ahead {
    bool active;
    uint32_t layer;
    uint64_t pass;           /* the request_token of the pass that issued it */
    double window_seconds;   /* the issuing request's compute */
    size_t n;                /* experts read ahead: ahead_experts[0..n) */
    uint64_t bytes;
    double kernel_seconds;   /* the CPU its reads take from compute (4 KiB folios or O_DIRECT; 0 when streamed) */
    bool streamed;           /* read in 2 MiB folios, whose drop is not charged */
};

struct pipeline_run {
    const struct guanaco_request_trace *trace;
    const struct guanaco_request_rows *rows;
    const struct guanaco_pipeline_config *config;
    struct guanaco_policy *policy;
    struct guanaco_predictor *predictor;
    uint64_t budget;
    uint32_t n_moe_layers, last_moe_layer;
    uint32_t *missing, *hits, *victim_layers, *victim_experts, *guess;
    uint32_t *ahead_experts;
    uint8_t *absent; /* n_expert: the guessed layer's experts that are not resident */
    uint8_t *ahead_mark;     /* per expert of the pending layer: 1 = read ahead */
    size_t n_slots;
    struct pipeline_ahead ahead;
    bool *stream_ahead;      /* n_layer: the layer was read ahead as a streamed one, so its next call streams */
    uint64_t pending_drop_bytes; /* victims (4 KiB folios) whose pages the next call drops while it reads */
    uint64_t pending_evict_bytes; /* direct: victims of a read-ahead, evicted before the next layer's call */
};

static int pipeline_evict(struct pipeline_run *run, uint32_t protect_layer, uint64_t *evictions,
                          uint64_t *victim_bytes) {
    size_t n_victims = 0;
    int err = guanaco_policy_evict(run->policy, protect_layer, run->victim_layers, run->victim_experts, run->n_slots,
                                   &n_victims);
    *evictions += n_victims;
    for (size_t i = 0; i < n_victims; i++) {
        *victim_bytes += run->trace->expert_bytes[run->victim_layers[i]];
    }
    return err;
}

/* The engine's guanaco_engine_read_ahead + guanaco_residency_prefetch, after request r has been served. */
static int pipeline_read_ahead(struct pipeline_run *run, size_t r, double compute_seconds, uint64_t *evictions) {
    const struct guanaco_request_trace *trace = run->trace;
    const struct guanaco_request_rows *rows = run->rows;
    if (run->config->predictor == GUANACO_PREDICTOR_NONE) {
        return 0; /* the engine makes no predictor, and reads nothing ahead, prompts included */
    }
    uint32_t layer = trace->request_layer[r];
    size_t first_row = rows->request_row_start[r], n_rows = rows->request_row_start[r + 1] - first_row;
    const int32_t *ids = rows->ids + first_row * rows->top_k;
    if (r > 0 && trace->request_token[r - 1] == trace->request_token[r] &&
        rows->request_row_start[r] - rows->request_row_start[r - 1] == n_rows) {
        /* the hook observes only when both layers saw the same tokens */
        int err = guanaco_predictor_observe(run->predictor, trace->request_layer[r - 1],
                                            rows->ids + rows->request_row_start[r - 1] * rows->top_k, layer, ids,
                                            rows->top_k, (uint32_t)n_rows);
        if (err != 0) {
            return err;
        }
    }
    uint32_t next = guanaco_predictor_next_layer(run->predictor, layer);
    if (next == UINT32_MAX || trace->expert_bytes[next] == 0) {
        return 0;
    }
    for (uint32_t e = 0; e < trace->n_expert; e++) {
        run->absent[e] = !guanaco_policy_is_resident(run->policy, next, e);
    }
    const struct guanaco_read_ahead_call call = {
        .layer = layer,
        .ids = ids,
        .k = rows->top_k,
        .n_tokens = (uint32_t)n_rows,
        .absent = run->absent,
        .prompts_read_ahead = !run->config->load_direct || run->config->stream_prompts, /* as the engine */
    };
    size_t n_read = 0;
    (void)guanaco_read_ahead_choose(run->predictor, &call, run->guess, trace->n_expert, &n_read);
    /* what is not resident, within the engine's read-ahead allowance */
    const uint64_t expert_bytes = trace->expert_bytes[next], allowance = guanaco_read_ahead_allowance(run->budget);
    size_t wanted = 0;
    for (size_t i = 0; i < n_read; i++) {
        if (run->absent[run->guess[i]] && (wanted + 1) * expert_bytes <= allowance) {
            run->ahead_experts[wanted++] = run->guess[i];
        }
    }
    if (wanted == 0) {
        return 0;
    }
    /* the engine's prefetch: a read-ahead of half the layer or more streams, and so will the layer's call */
    const bool streamed = run->config->stream_prompts && guanaco_streams_layer(wanted, trace->n_expert);
    if (streamed) {
        run->stream_ahead[next] = true;
    }
    /* room inside the budget for decode's guesses; a streamed layer takes none, as in the engine */
    int err = 0;
    if (!streamed) {
        guanaco_policy_set_reserve(run->policy, wanted * expert_bytes);
        err = pipeline_evict(run, layer, evictions,
                             run->config->load_direct ? &run->pending_evict_bytes : &run->pending_drop_bytes);
        uint64_t used = guanaco_policy_resident_bytes(run->policy);
        size_t fits = used < run->budget ? (size_t)((run->budget - used) / expert_bytes) : 0;
        wanted = fits < wanted ? fits : wanted;
        guanaco_policy_set_reserve(run->policy, wanted * expert_bytes);
    }
    run->ahead = (struct pipeline_ahead){.active = wanted > 0, .layer = next, .pass = trace->request_token[r],
                                         .window_seconds = compute_seconds, .n = wanted,
                                         .bytes = wanted * expert_bytes};
    run->ahead.streamed = streamed;
    if (!streamed) {
        run->ahead.kernel_seconds = read_cpu_seconds(run->config, run->ahead.bytes);
    }
    return err;
}

static void add_time(struct guanaco_pipeline_phase *phase, const struct guanaco_layer_reads *reads,
                     const struct guanaco_layer_time *time) {
    phase->serial_seconds += time->serial_seconds;
    phase->overlapped_seconds += time->overlapped_seconds;
    phase->stall_seconds += time->stall_seconds;
    phase->compute_seconds += reads->compute_seconds;
    phase->kernel_seconds += reads->kernel_seconds;
    phase->drop_seconds += reads->drop_seconds + reads->drop_serial_seconds;
    phase->map_seconds += reads->map_seconds;
    phase->demand_bytes += reads->demand_bytes;
    phase->ahead_bytes += reads->ahead_bytes;
    phase->ahead_used_bytes += reads->ahead_used_bytes;
    phase->hidden_bytes += time->hidden_bytes;
}

static int check_rows(const struct guanaco_request_trace *trace, const struct guanaco_request_rows *rows) {
    if (!rows || rows->top_k == 0 || rows->top_k > trace->n_expert || !rows->request_row_start ||
        (trace->n_requests > 0 && !rows->ids)) {
        return -EINVAL;
    }
    for (size_t r = 0; r < trace->n_requests; r++) {
        if (rows->request_row_start[r + 1] <= rows->request_row_start[r]) {
            return -EINVAL;
        }
    }
    return 0;
}

const char *guanaco_simulate_predictor_caveat(enum guanaco_predictor_kind predictor) {
    return predictor == GUANACO_PREDICTOR_GATE
               ? "replayed as pilot, its fallback: a trace holds no activations to score, so gate's guesses for a "
                 "prompt's narrow layers are not read"
               : NULL;
}

int guanaco_simulate_pipeline(const struct guanaco_request_trace *trace, const struct guanaco_request_rows *rows,
                              const struct guanaco_policy_config *policy_config, bool preload,
                              const struct guanaco_pipeline_config *config, struct guanaco_pipeline_stats *stats) {
    memset(stats, 0, sizeof(*stats));
    int err = guanaco_request_trace_check(trace);
    if (err != 0) {
        return err;
    }
    if (!policy_config || !config || check_rows(trace, rows) != 0 || !(config->bytes_per_second > 0) ||
        !(config->prompt_bytes_per_second >= 0) || !(config->token_seconds >= 0) ||
        !(config->prompt_token_seconds >= 0) || !(config->read_cpu_seconds_per_byte >= 0) ||
        !(config->drop_cpu_seconds_per_byte >= 0) || !(config->map_cpu_seconds_per_byte >= 0) ||
        !(config->evict_cpu_seconds_per_byte >= 0) || !(config->direct_read_cpu_seconds_per_byte >= 0) ||
        !(config->first_touch_seconds_per_byte >= 0)) {
        return -EINVAL;
    }
    for (uint32_t l = 0; config->small_page_share && l < trace->n_layer; l++) {
        if (!(config->small_page_share[l] >= 0 && config->small_page_share[l] <= 1)) {
            return -EINVAL;
        }
    }
    struct pipeline_run run = {.trace = trace, .rows = rows, .config = config, .budget = policy_config->budget_bytes};
    struct guanaco_policy_config geometry = *policy_config;
    geometry.n_layer = trace->n_layer;
    geometry.n_expert = trace->n_expert;
    geometry.expert_bytes = trace->expert_bytes;
    uint8_t *moe_layer = calloc(trace->n_layer, 1);
    if (!moe_layer) {
        return -ENOMEM;
    }
    for (uint32_t l = 0; l < trace->n_layer; l++) {
        moe_layer[l] = trace->expert_bytes[l] > 0;
        run.n_moe_layers += moe_layer[l];
        run.last_moe_layer = moe_layer[l] ? l : run.last_moe_layer;
    }
    err = guanaco_policy_create(&geometry, &run.policy);
    if (err == 0) {
        struct guanaco_predictor_config predictor_config = {
            .kind = config->predictor, .n_layer = trace->n_layer, .n_expert = trace->n_expert,
            .top_k = rows->top_k, .moe_layer = moe_layer, .mass = config->pilot_mass,
            .half_life = config->pilot_half_life};
        err = guanaco_predictor_create(&predictor_config, &run.predictor);
    }
    free(moe_layer);
    run.n_slots = (size_t)trace->n_layer * trace->n_expert;
    run.missing = malloc(trace->n_expert * sizeof(*run.missing));
    run.hits = malloc(trace->n_expert * sizeof(*run.hits));
    run.stream_ahead = calloc(trace->n_layer, sizeof(*run.stream_ahead));
    run.guess = malloc(trace->n_expert * sizeof(*run.guess));
    run.ahead_experts = malloc(trace->n_expert * sizeof(*run.ahead_experts));
    run.absent = malloc(trace->n_expert);
    run.ahead_mark = calloc(trace->n_expert, 1);
    run.victim_layers = malloc(run.n_slots * sizeof(*run.victim_layers));
    run.victim_experts = malloc(run.n_slots * sizeof(*run.victim_experts));
    if (err == 0 && (!run.missing || !run.hits || !run.stream_ahead || !run.guess || !run.ahead_experts ||
                     !run.absent || !run.ahead_mark || !run.victim_layers || !run.victim_experts)) {
        err = -ENOMEM;
    }
    if (err == 0 && preload) {
        err = preload_policy(trace, &geometry, run.policy, run.missing, run.victim_layers, run.victim_experts,
                             run.n_slots);
    }
    struct guanaco_replay_stats *replay = &stats->replay;
    uint32_t pass_rows = 0;
    bool pass_streamed = false;
    for (size_t r = 0; r < trace->n_requests && err == 0; r++) {
        uint32_t layer = trace->request_layer[r];
        uint64_t token = trace->request_token[r];
        size_t start = trace->request_start[r], n = trace->request_start[r + 1] - start;
        bool new_pass = r == 0 || trace->request_token[r - 1] != token;
        if (new_pass) {
            pass_rows = request_tokens(rows, r);
        }
        bool prompt = pass_rows > 1;
        bool timed = !rows->request_timed || rows->request_timed[r];
        struct guanaco_pipeline_phase *phase = prompt ? &stats->prompt : &stats->decode;
        if (timed && new_pass) {
            phase->passes++;
            phase->tokens += pass_rows;
        }

        /* read-ahead for this layer is claimed; read-ahead for anything else is dropped, read for nothing */
        bool claimed = run.ahead.active && run.ahead.layer == layer && run.ahead.pass == token;
        uint64_t dropped = run.ahead.active && !claimed ? run.ahead.bytes : 0;
        for (size_t i = 0; claimed && i < run.ahead.n; i++) {
            run.ahead_mark[run.ahead_experts[i]] = 1;
        }
        guanaco_policy_set_reserve(run.policy, 0);
        /* the engine's call streams when it needs half of the layer or more, or its read-ahead streamed */
        const bool stream = config->stream_prompts && (run.stream_ahead[layer] || guanaco_streams_layer(n, trace->n_expert));
        run.stream_ahead[layer] = false;
        if (new_pass) {
            pass_streamed = false;
        }
        size_t n_missing = 0;
        uint64_t drop_bytes = run.pending_drop_bytes, victim_bytes = 0;
        run.pending_drop_bytes = 0;
        if (stream) {
            /* its reads are used once: the policy hears of its hits only, and its misses are never admitted */
            size_t n_hits = 0;
            for (size_t i = start; i < start + n; i++) {
                uint32_t e = trace->experts[i];
                if (guanaco_policy_is_resident(run.policy, layer, e)) {
                    run.hits[n_hits++] = e;
                } else {
                    run.missing[n_missing++] = e;
                }
            }
            size_t n_admitted = 0;
            err = guanaco_policy_access_batch(run.policy, layer, run.hits, n_hits, token, pass_rows,
                                              run.guess, &n_admitted);
            if (timed && !pass_streamed) {
                phase->streamed_passes++;
                pass_streamed = true;
            }
        } else {
            err = guanaco_policy_access_batch(run.policy, layer, trace->experts + start, n, token,
                                              pass_rows, run.missing, &n_missing);
        }
        if (err == 0) {
            err = pipeline_evict(&run, layer, &replay->evictions, &victim_bytes);
        }
        size_t n_used = 0;
        for (size_t i = 0; i < n_missing; i++) {
            n_used += run.ahead_mark[run.missing[i]];
        }
        for (size_t i = 0; claimed && i < run.ahead.n; i++) {
            run.ahead_mark[run.ahead_experts[i]] = 0;
        }
        uint64_t expert_bytes = trace->expert_bytes[layer];
        struct guanaco_layer_reads reads = {
            .compute_seconds = (double)pass_rows * (prompt ? config->prompt_token_seconds : config->token_seconds) /
                               (double)run.n_moe_layers,
            .window_seconds = claimed ? run.ahead.window_seconds : 0,
            .ahead_bytes = claimed ? run.ahead.bytes : 0,
            .ahead_used_bytes = n_used * expert_bytes,
            .demand_bytes = (n_missing - n_used) * expert_bytes,
            .kernel_seconds = run.ahead.active ? run.ahead.kernel_seconds : 0,
            .drop_seconds = (double)drop_bytes * config->drop_cpu_seconds_per_byte,
            .overlap_layer = config->overlap_layer,
        };
        /* The engine drops this call's victims during the next call's reads, except the last MoE layer's, which
           go at once (between tokens only the budget is cached); a streamed call's own misses (4 KiB folios)
           go with the next call too. Direct copies are placed after their reads and evicted at once. */
        if (config->load_direct) {
            reads.map_seconds = stream ? 0 : (double)(n_missing * expert_bytes) * config->map_cpu_seconds_per_byte;
            reads.drop_serial_seconds =
                (double)(victim_bytes + run.pending_evict_bytes) * config->evict_cpu_seconds_per_byte;
            run.pending_evict_bytes = 0;
        } else if (layer == run.last_moe_layer) {
            reads.drop_serial_seconds = (double)victim_bytes * config->drop_cpu_seconds_per_byte;
        } else {
            run.pending_drop_bytes += victim_bytes;
        }
        if (stream) {
            run.pending_drop_bytes += reads.demand_bytes;
        }
        if (run.ahead.active && !run.ahead.streamed && !config->load_direct) {
            /* wrong guesses in 4 KiB folios: the engine drops them with the next call (direct frees its copies) */
            run.pending_drop_bytes += claimed ? run.ahead.bytes - reads.ahead_used_bytes : run.ahead.bytes;
        }
        replay->requests++;
        replay->accesses += n;
        replay->misses += n_missing;
        replay->hits += n - n_missing;
        replay->bytes_read += reads.demand_bytes + reads.ahead_bytes + dropped;
        uint64_t resident = guanaco_policy_resident_bytes(run.policy);
        if (resident > replay->peak_resident_bytes) {
            replay->peak_resident_bytes = resident;
        }
        if (resident > geometry.budget_bytes && resident - geometry.budget_bytes > replay->worst_overshoot_bytes) {
            replay->worst_overshoot_bytes = resident - geometry.budget_bytes;
        }
        if (timed) {
            struct guanaco_layer_time time;
            double rate = prompt && config->prompt_bytes_per_second > 0 ? config->prompt_bytes_per_second
                                                                        : config->bytes_per_second;
            if (config->load_direct && !stream && reads.demand_bytes > 0 && n > 0) {
                /* The call's own O_DIRECT reads take CPU from compute only while both run: while the layer's
                   experts already in memory compute and its reads are in flight. For the rest of the read time
                   the compute threads wait, and the cores are free for it. */
                double read_seconds = (double)reads.demand_bytes / rate;
                double window = reads.compute_seconds * (double)(n - n_missing) / (double)n;
                double share = window < read_seconds ? window / read_seconds : 1.0;
                reads.kernel_seconds += read_cpu_seconds(config, reads.demand_bytes) * share;
            }
            if (!config->load_direct) {
                /* compute's first read of each page this call's reads and the read-ahead it used mapped */
                double share = config->small_page_share ? config->small_page_share[layer] : 1.0;
                reads.kernel_seconds += (double)(reads.demand_bytes + reads.ahead_used_bytes) * share *
                                        config->first_touch_seconds_per_byte;
            }
            guanaco_pipeline_layer_time(&reads, rate, &time);
            add_time(phase, &reads, &time);
            phase->ahead_bytes += dropped;
        }
        run.ahead.active = false;
        if (err == 0) {
            err = pipeline_read_ahead(&run, r, reads.compute_seconds, &replay->evictions);
        }
    }
    guanaco_predictor_free(run.predictor);
    guanaco_policy_free(run.policy);
    free(run.missing);
    free(run.hits);
    free(run.stream_ahead);
    free(run.guess);
    free(run.ahead_experts);
    free(run.absent);
    free(run.ahead_mark);
    free(run.victim_layers);
    free(run.victim_experts);
    return err;
}
