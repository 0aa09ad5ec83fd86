// concurrent_decode: the test program for "one engine per loaded model, shared safely by every
// context created on it".
//
// Owns: loading ONE model, creating N contexts on it, and decoding from N threads at once
// (each thread its own context and its own token sequence: a multi-ubatch prompt, then
// greedy single-token steps), keeping every logits row; then redoing each thread's work alone,
// on a fresh context of the same model with nothing else running, and comparing the two runs
// byte for byte. Like logits_dump it knows nothing about Guanaco: the patched libllama reads
// GUANACO_* from the environment, so the script picks streaming, budget, policy and io.
//
// Why this proves sharing is safe: with a budget, every context's router hook drives the same
// residency engine, so one context's prepare_layer evicts experts while another context is
// computing. Contexts of one model are independent in llama.cpp, so any difference from the
// lone run can only come from state that leaks between contexts. Logits must not move by a bit.
//
// It also checks what the logits cannot show:
//   - the decodes really overlapped: the most contexts inside llama_decode at once, and the
//     router callbacks that fired while another context was decoding, must both be non-trivial;
//   - Guanaco's hook chain hands each context its OWN user callback data (a user cb_eval is
//     installed per context and must only ever see its own thread), and sees the same number
//     of router evaluations per context concurrently as alone.
//
// Usage: concurrent_decode MODEL.gguf [--contexts N] [--prompt-tokens P] [--gen-tokens M]
//                          [--batch B] [--ubatch U] [--no-repack] [--no-sequential] [--out FILE]
//   --no-sequential  only the concurrent phase (so Guanaco's summary at model free describes
//                    just that phase); the comparison is then left to the caller via --out
//   --out FILE       the concurrent phase's logits: magic "GNCCONC1", uint32 n_vocab,
//                    n_contexts, rows per context, then float rows[n_contexts][rows][n_vocab]
//
// Exit codes: 0 all equal, 1 a difference or a runtime failure, 2 usage error. Failures print
// lines starting with "concurrent_decode: ".

#define _POSIX_C_SOURCE 200809L // pthread_barrier_t: -std=c11 hides POSIX otherwise

#include "llama.h"

#define TEST_PROGRAM "concurrent_decode"
#include "llama_test_util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CTX 256u
#define MAX_CONTEXTS 64
#define ROUTER_PREFIX "ffn_moe_topk-"

static const char MAGIC[8] = {'G', 'N', 'C', 'C', 'O', 'N', 'C', '1'};

// Warnings and errors only (CONT lines inherit the level of the line they continue): llama.cpp's
// INFO chatter would bury Guanaco's lines, which the script greps.
static void log_cb(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    static _Thread_local enum ggml_log_level last = GGML_LOG_LEVEL_INFO;
    if (level != GGML_LOG_LEVEL_CONT) {
        last = level;
    }
    if (last == GGML_LOG_LEVEL_WARN || last == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static void usage(void) {
    fprintf(stderr,
        "usage: concurrent_decode MODEL.gguf [--contexts N] [--prompt-tokens P] [--gen-tokens M]\n"
        "                         [--batch B] [--ubatch U] [--no-repack] [--no-sequential] [--out FILE]\n");
}

// ---- what is shared between the decoding threads -------------------------------------------

// Contexts inside llama_decode right now, the most seen at once, and whether we are in the
// concurrent phase (the overlap counters mean nothing in the sequential one).
static _Atomic int inside_decode;
static _Atomic int most_inside;
static _Atomic bool concurrent_phase;
static _Atomic uint64_t overlapped_routings; // router callbacks while another context was decoding

// One thread's work and everything it observed. Each context's cb_eval_user_data points here.
struct worker {
    int index;
    struct llama_context * ctx;
    llama_token * prompt;
    float * rows;               // (n_prompt + n_gen) x n_vocab
    pthread_t owner;            // the thread that decodes on ctx right now
    uint64_t routings;          // router evaluations this context's callback saw
    uint64_t foreign_callbacks; // callbacks that arrived on a thread that does not own ctx
    char error[256];            // first failure, "" when none
};

struct workload {
    const struct llama_vocab * vocab;
    int32_t n_vocab;
    int n_prompt, n_gen, n_batch;
    pthread_barrier_t * start; // NULL in the sequential phase
};

struct thread_arg {
    struct worker * worker;
    const struct workload * load;
};

// A user eval callback, so Guanaco's hook has something to chain. It asks only for the router
// nodes Guanaco asks for anyway (no extra scheduler synchronisation), counts them per context,
// and records whether the callback ran on the thread decoding this context: a hook that mixed
// up contexts' user data would deliver one context's callbacks to another's worker.
static bool observe(struct ggml_tensor * t, bool ask, void * user_data) {
    struct worker * w = user_data;
    const bool router = strncmp(t->name, ROUTER_PREFIX, sizeof(ROUTER_PREFIX) - 1) == 0;
    if (ask) {
        return router;
    }
    if (router) {
        w->routings++;
        if (!pthread_equal(w->owner, pthread_self())) {
            w->foreign_callbacks++;
        }
        if (atomic_load(&concurrent_phase) && atomic_load(&inside_decode) > 1) {
            atomic_fetch_add(&overlapped_routings, 1);
        }
    }
    return true; // false would make the scheduler skip the rest of the split
}

static int32_t timed_decode(struct llama_context * ctx, struct llama_batch batch) {
    const int now = atomic_fetch_add(&inside_decode, 1) + 1;
    int seen = atomic_load(&most_inside);
    while (now > seen && !atomic_compare_exchange_weak(&most_inside, &seen, now)) {
    }
    const int32_t ret = llama_decode(ctx, batch);
    atomic_fetch_sub(&inside_decode, 1);
    return ret;
}

static bool store_row(struct worker * w, const struct workload * load, int row, const float * logits) {
    if (logits == NULL) {
        snprintf(w->error, sizeof(w->error), "no logits for row %d", row);
        return false;
    }
    for (int32_t j = 0; j < load->n_vocab; ++j) {
        if (!isfinite(logits[j])) {
            snprintf(w->error, sizeof(w->error), "non-finite logit at row %d, token %d", row, (int) j);
            return false;
        }
    }
    memcpy(w->rows + (size_t) row * (size_t) load->n_vocab, logits, (size_t) load->n_vocab * sizeof(float));
    return true;
}

// One thread's work on w->ctx: the prompt in calls of n_batch tokens (each split into ubatches
// by llama.cpp), every position's logits kept, then n_gen greedy single-token steps.
static void run_work(struct worker * w, const struct workload * load) {
    struct llama_batch batch = llama_batch_init(load->n_batch, 0, 1);
    w->owner = pthread_self();
    if (load->start != NULL) {
        // Every context starts together, so their decodes overlap from the first ubatch.
        pthread_barrier_wait(load->start);
    }
    int row = 0;
    for (int first = 0; first < load->n_prompt; first += load->n_batch) {
        const int n = load->n_prompt - first < load->n_batch ? load->n_prompt - first : load->n_batch;
        batch.n_tokens = n;
        for (int i = 0; i < n; ++i) {
            batch.token[i]     = w->prompt[first + i];
            batch.pos[i]       = first + i;
            batch.n_seq_id[i]  = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i]    = 1;
        }
        const int32_t ret = timed_decode(w->ctx, batch);
        if (ret != 0) {
            snprintf(w->error, sizeof(w->error), "llama_decode failed on prompt tokens %d..%d (ret = %d)",
                     first, first + n - 1, (int) ret);
            goto done;
        }
        for (int i = 0; i < n; ++i, ++row) {
            if (!store_row(w, load, row, llama_get_logits_ith(w->ctx, i))) {
                goto done;
            }
        }
    }
    for (int g = 0; g < load->n_gen; ++g, ++row) {
        batch.n_tokens     = 1;
        batch.token[0]     = argmax(w->rows + (size_t) (row - 1) * (size_t) load->n_vocab, load->n_vocab);
        batch.pos[0]       = row;
        batch.n_seq_id[0]  = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0]    = 1;
        const int32_t ret = timed_decode(w->ctx, batch);
        if (ret != 0) {
            snprintf(w->error, sizeof(w->error), "llama_decode failed on generation step %d (ret = %d)", g, (int) ret);
            goto done;
        }
        if (!store_row(w, load, row, llama_get_logits_ith(w->ctx, -1))) {
            goto done;
        }
    }
done:
    llama_batch_free(batch);
}

static void * thread_main(void * p) {
    struct thread_arg * a = p;
    run_work(a->worker, a->load);
    return NULL;
}

static struct llama_context * new_context(struct llama_model * model, struct worker * w, long n_batch, long n_ubatch) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx             = N_CTX;
    cp.n_batch           = (uint32_t) n_batch;
    cp.n_ubatch          = (uint32_t) n_ubatch;
    cp.n_seq_max         = 1;
    // One compute thread per context: the overlap comes from the contexts, and a single thread
    // keeps each context's summation order fixed whatever else runs.
    cp.n_threads         = 1;
    cp.n_threads_batch   = 1;
    cp.flash_attn_type   = LLAMA_FLASH_ATTN_TYPE_DISABLED; // the same kernel in every run
    cp.embeddings        = false;
    cp.no_perf           = true;
    cp.op_offload        = false;
    cp.cb_eval           = observe;
    cp.cb_eval_user_data = w;
    return llama_init_from_model(model, cp);
}

// Describes the first differing row of two runs of thread t; returns false when they differ.
static bool compare_rows(int t, const float * concurrent, const float * alone, int n_prompt, int n_gen,
                         int32_t n_vocab) {
    const size_t row_bytes = (size_t) n_vocab * sizeof(float);
    for (int row = 0; row < n_prompt + n_gen; ++row) {
        const float * a = concurrent + (size_t) row * (size_t) n_vocab;
        const float * b = alone + (size_t) row * (size_t) n_vocab;
        if (memcmp(a, b, row_bytes) == 0) {
            continue;
        }
        int32_t first = 0, differing = 0;
        double worst = 0.0;
        for (int32_t j = n_vocab - 1; j >= 0; --j) {
            if (memcmp(&a[j], &b[j], sizeof(float)) != 0) {
                first = j;
                differing++;
                const double d = fabs((double) a[j] - (double) b[j]);
                worst = d > worst ? d : worst;
            }
        }
        if (row < n_prompt) {
            say("thread %d, prompt position %d: concurrent logits differ from the lone run "
                "(%d of %d logits, first at token %d: %.9g vs %.9g, max |diff| %.3g)",
                t, row, (int) differing, (int) n_vocab, (int) first, (double) a[first], (double) b[first], worst);
        } else {
            say("thread %d, generation step %d: concurrent logits differ from the lone run "
                "(%d of %d logits, first at token %d: %.9g vs %.9g, max |diff| %.3g)",
                t, row - n_prompt, (int) differing, (int) n_vocab, (int) first, (double) a[first],
                (double) b[first], worst);
        }
        return false;
    }
    return true;
}

static bool write_out(const char * path, float * const * rows, int n_contexts, int n_rows, int32_t n_vocab) {
    FILE * f = fopen(path, "wb");
    if (f == NULL) {
        say("cannot open '%s' for writing: %s", path, strerror(errno));
        return false;
    }
    const uint32_t hdr[3] = { (uint32_t) n_vocab, (uint32_t) n_contexts, (uint32_t) n_rows };
    bool ok = fwrite(MAGIC, 1, sizeof(MAGIC), f) == sizeof(MAGIC) && fwrite(hdr, sizeof(hdr[0]), 3, f) == 3;
    const size_t n_floats = (size_t) n_rows * (size_t) n_vocab;
    for (int t = 0; ok && t < n_contexts; ++t) {
        ok = fwrite(rows[t], sizeof(float), n_floats, f) == n_floats;
    }
    if (fclose(f) != 0) {
        ok = false;
    }
    if (!ok) {
        say("write to '%s' failed: %s", path, strerror(errno));
        remove(path); // never leave a partial dump that a later cmp could mistake for output
    }
    return ok;
}

int main(int argc, char ** argv) {
    const char * model_path = NULL;
    const char * out_path   = NULL;
    long n_contexts = 4, n_prompt = 48, n_gen = 8, n_batch = 32, n_ubatch = 16;
    bool no_repack = false, sequential = true;

    for (int i = 1; i < argc; ++i) {
        const char * a = argv[i];
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--contexts") == 0) {
            if (!parse_int(a, v, 1, MAX_CONTEXTS, &n_contexts)) { return 2; }
            ++i;
        } else if (strcmp(a, "--prompt-tokens") == 0) {
            if (!parse_int(a, v, 1, (long) N_CTX, &n_prompt)) { return 2; }
            ++i;
        } else if (strcmp(a, "--gen-tokens") == 0) {
            if (!parse_int(a, v, 0, (long) N_CTX, &n_gen)) { return 2; }
            ++i;
        } else if (strcmp(a, "--batch") == 0) {
            if (!parse_int(a, v, 1, (long) N_CTX, &n_batch)) { return 2; }
            ++i;
        } else if (strcmp(a, "--ubatch") == 0) {
            if (!parse_int(a, v, 1, (long) N_CTX, &n_ubatch)) { return 2; }
            ++i;
        } else if (strcmp(a, "--out") == 0) {
            if (v == NULL) { say("--out needs a value"); return 2; }
            out_path = v;
            ++i;
        } else if (strcmp(a, "--no-repack") == 0) {
            no_repack = true;
        } else if (strcmp(a, "--no-sequential") == 0) {
            sequential = false;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage();
            return 0;
        } else if (a[0] == '-' && a[1] == '-') {
            say("unknown option '%s'", a);
            usage();
            return 2;
        } else if (model_path == NULL) {
            model_path = a;
        } else {
            say("unexpected argument '%s'", a);
            usage();
            return 2;
        }
    }
    if (model_path == NULL) {
        say("MODEL.gguf is required");
        usage();
        return 2;
    }
    if (n_prompt + n_gen > (long) N_CTX) {
        say("--prompt-tokens + --gen-tokens (%ld) exceeds the context size %u", n_prompt + n_gen, N_CTX);
        return 2;
    }
    if (n_ubatch > n_batch) {
        say("--ubatch (%ld) must not exceed --batch (%ld)", n_ubatch, n_batch);
        return 2;
    }

    llama_log_set(log_cb, NULL);
    llama_backend_init();

    int rc = 1;
    struct llama_model * model = NULL;
    struct worker workers[MAX_CONTEXTS];
    float * concurrent_rows[MAX_CONTEXTS] = {0};
    uint64_t concurrent_routings[MAX_CONTEXTS] = {0};
    memset(workers, 0, sizeof(workers));

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0; // CPU only: the invariant is about the mmap path
    if (no_repack) {
        mp.use_extra_bufts = false;
    }
    model = llama_model_load_from_file(model_path, mp);
    if (model == NULL) {
        say("failed to load model '%s'", model_path);
        goto done;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    if (n_vocab <= 0) {
        say("model has an empty vocabulary");
        goto done;
    }
    const int n_rows = (int) (n_prompt + n_gen);
    const size_t row_floats = (size_t) n_rows * (size_t) n_vocab;

    // Different token sequences per thread: contexts that route differently stress the shared
    // residency engine harder, and a mix-up of two contexts' results cannot go unnoticed.
    for (int t = 0; t < n_contexts; ++t) {
        struct worker * w = &workers[t];
        w->index  = t;
        w->prompt = malloc((size_t) n_prompt * sizeof(llama_token));
        w->rows   = malloc(row_floats * sizeof(float));
        if (w->prompt == NULL || w->rows == NULL) {
            say("out of memory for thread %d's rows", t);
            goto done;
        }
        uint32_t lcg = 0x6775616eu ^ (uint32_t) (t * 0x9e3779b9u);
        for (int i = 0; i < n_prompt; ++i) {
            w->prompt[i] = (llama_token) (lcg_next(&lcg) % (uint32_t) n_vocab);
        }
    }

    // ---- phase 1: every context decodes at the same time ----
    for (int t = 0; t < n_contexts; ++t) {
        workers[t].ctx = new_context(model, &workers[t], n_batch, n_ubatch);
        if (workers[t].ctx == NULL) {
            say("failed to create context %d", t);
            goto done;
        }
    }
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, (unsigned) n_contexts) != 0) {
        say("pthread_barrier_init failed");
        goto done;
    }
    struct workload load = { vocab, n_vocab, (int) n_prompt, (int) n_gen, (int) n_batch, &start };
    struct thread_arg args[MAX_CONTEXTS];
    pthread_t threads[MAX_CONTEXTS];
    atomic_store(&concurrent_phase, true);
    for (int t = 0; t < n_contexts; ++t) {
        args[t] = (struct thread_arg) { &workers[t], &load };
        const int err = pthread_create(&threads[t], NULL, thread_main, &args[t]);
        if (err != 0) {
            // The barrier waits for all n_contexts threads: without this one nobody would start.
            say("pthread_create for thread %d failed: %s", t, strerror(err));
            fflush(stderr);
            _Exit(1);
        }
    }
    for (int t = 0; t < n_contexts; ++t) {
        pthread_join(threads[t], NULL);
    }
    atomic_store(&concurrent_phase, false);
    pthread_barrier_destroy(&start);

    bool ok = true;
    for (int t = 0; t < n_contexts; ++t) {
        if (workers[t].error[0] != '\0') {
            say("thread %d (concurrent): %s", t, workers[t].error);
            ok = false;
        }
        if (workers[t].foreign_callbacks != 0) {
            say("thread %d (concurrent): %llu of its context's %llu router callbacks ran on another thread: "
                "the hook chain mixed up the contexts' user data",
                t, (unsigned long long) workers[t].foreign_callbacks, (unsigned long long) workers[t].routings);
            ok = false;
        }
        if (workers[t].routings == 0) {
            say("thread %d (concurrent): its eval callback never saw a router node: the hook chain dropped it", t);
            ok = false;
        }
        // The lone runs reuse the same workers: keep what the concurrent phase produced.
        concurrent_rows[t]     = workers[t].rows;
        concurrent_routings[t] = workers[t].routings;
        workers[t].rows        = NULL;
        llama_free(workers[t].ctx);
        workers[t].ctx = NULL;
    }
    if (!ok) {
        goto done;
    }
    const int most = atomic_load(&most_inside);
    const uint64_t overlapped = atomic_load(&overlapped_routings);
    if (n_contexts > 1 && (most < 2 || overlapped == 0)) {
        say("the decodes never overlapped (at most %d contexts in llama_decode at once, %llu router "
            "callbacks while another context decoded): this run proves nothing", most,
            (unsigned long long) overlapped);
        goto done;
    }
    // Identical workloads would hide a context receiving another context's results.
    for (int t = 1; t < n_contexts; ++t) {
        if (memcmp(concurrent_rows[t], concurrent_rows[0], row_floats * sizeof(float)) == 0) {
            say("threads 0 and %d produced identical logits from different prompts", t);
            goto done;
        }
    }
    uint64_t h = 1469598103934665603ull;
    for (int t = 0; t < n_contexts; ++t) {
        h = fnv1a(h, concurrent_rows[t], row_floats * sizeof(float));
    }
    if (out_path != NULL && !write_out(out_path, concurrent_rows, (int) n_contexts, n_rows, n_vocab)) {
        goto done;
    }

    // ---- phase 2: each thread's work alone, on a fresh context, nothing else running ----
    int mismatched = 0;
    for (int t = 0; sequential && t < n_contexts; ++t) {
        struct worker * w = &workers[t];
        w->routings = w->foreign_callbacks = 0;
        w->rows = malloc(row_floats * sizeof(float));
        if (w->rows == NULL) {
            say("out of memory for thread %d's lone rows", t);
            goto done;
        }
        w->ctx = new_context(model, w, n_batch, n_ubatch);
        if (w->ctx == NULL) {
            say("failed to create the lone context for thread %d", t);
            goto done;
        }
        const struct workload alone = { vocab, n_vocab, (int) n_prompt, (int) n_gen, (int) n_batch, NULL };
        run_work(w, &alone);
        llama_free(w->ctx);
        w->ctx = NULL;
        if (w->error[0] != '\0') {
            say("thread %d (alone): %s", t, w->error);
            goto done;
        }
        if (!compare_rows(t, concurrent_rows[t], w->rows, (int) n_prompt, (int) n_gen, n_vocab)) {
            mismatched++;
        }
        if (w->foreign_callbacks != 0) {
            say("thread %d (alone): %llu of its context's router callbacks ran on another thread",
                t, (unsigned long long) w->foreign_callbacks);
            mismatched++;
        }
        if (w->routings != concurrent_routings[t]) {
            say("thread %d: its callback saw %llu router evaluations concurrently but %llu alone",
                t, (unsigned long long) concurrent_routings[t], (unsigned long long) w->routings);
            mismatched++;
        }
    }
    if (mismatched) {
        say("%d of %ld threads differ between the concurrent and the lone runs", mismatched, n_contexts);
        goto done;
    }

    printf("concurrent_decode: %ld contexts x (%ld prompt + %ld gen) tokens, batch %ld, ubatch %ld: "
           "up to %d decoding at once, %llu router callbacks while another context decoded, "
           "%s, fnv1a=%016llx\n",
           n_contexts, n_prompt, n_gen, n_batch, n_ubatch, most, (unsigned long long) overlapped,
           sequential ? "all logits equal the lone runs" : "lone runs skipped", (unsigned long long) h);
    rc = 0;

done:
    for (int t = 0; t < n_contexts; ++t) {
        if (workers[t].ctx != NULL) {
            llama_free(workers[t].ctx);
        }
        free(workers[t].prompt);
        free(workers[t].rows);
        free(concurrent_rows[t]);
    }
    if (rc != 0 && out_path != NULL) {
        remove(out_path);
    }
    // Guanaco prints its summary (and the residency line the script reads) here.
    if (model != NULL) {
        llama_model_free(model);
    }
    llama_backend_free();
    return rc;
}
