// logits_dump: Guanaco's logits oracle for the "streaming never changes logits" invariant.
//
// Owns: loading a GGUF with the plain llama.cpp C API, running a fixed, fully deterministic
// token workload on the CPU (one multi-token prompt batch + N single-token greedy decode
// steps, that pair repeated --turns times in one context, as a chat's turns are), and writing every logit row to a binary file so two runs (GUANACO_STREAMING unset
// vs =1, repack on vs off) can be compared with `cmp`. It knows nothing about streaming
// itself: the patched libllama reads GUANACO_STREAMING from the environment, so the same
// binary works against the stock build (where the variable is ignored).
//
// Usage: logits_dump MODEL.gguf OUT.bin [--threads N] [--prompt-tokens N] [--gen-tokens N]
//                    [--turns N] [--no-repack] [--ubatch N] [--rpc HOST:PORT] [--n-gpu-layers N] [--cpu-moe]
//
// --rpc, --n-gpu-layers and --cpu-moe mean what llama.cpp's common flags of those names mean
// (an rpc-server as a device, layers offloaded to it, expert tensors kept in host memory):
// tests/test_rpc.sh compares device offload with and without streaming through them.
//
// Output format (native byte order, little-endian on every platform we test):
//   char     magic[8]  = "GNCLOGT1"
//   uint32_t n_vocab
//   uint32_t n_rows        (= turns x (prompt tokens + gen tokens))
//   uint32_t n_prompt
//   uint32_t n_gen
//   float    logits[n_rows][n_vocab]
//
// Exit codes: 0 ok, 1 runtime failure (load/decode/non-finite/IO), 2 usage error.
// Every failure prints one line starting with "logits_dump: " on stderr.
// Set LOGITS_DUMP_VERBOSE=1 to see llama.cpp's INFO logging (default: warnings/errors only).

#include "llama.h"

#define TEST_PROGRAM "logits_dump"
#include "llama_test_util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CTX 512u

static const char MAGIC[8] = {'G', 'N', 'C', 'L', 'O', 'G', 'T', '1'};

// Keep llama.cpp quiet unless asked: the bad-input tests grep stderr for our own message, and
// the INFO chatter (hundreds of lines per load) makes failures hard to read. CONT lines inherit
// the level of the line they continue, so track it.
static void log_cb(enum ggml_log_level level, const char * text, void * user_data) {
    static enum ggml_log_level last = GGML_LOG_LEVEL_INFO;
    const bool verbose = user_data != NULL;
    if (level != GGML_LOG_LEVEL_CONT) {
        last = level;
    }
    if (verbose || last == GGML_LOG_LEVEL_WARN || last == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static void usage(void) {
    fprintf(stderr,
        "usage: logits_dump MODEL.gguf OUT.bin [--threads N] [--prompt-tokens N] [--gen-tokens N]\n"
        "                   [--turns N] [--no-repack] [--ubatch N] [--rpc HOST:PORT] [--n-gpu-layers N] [--cpu-moe]\n");
}

// Checks all values are finite; reports the first offender.
static bool check_finite(const float * row, int32_t n_vocab, int32_t row_idx) {
    for (int32_t j = 0; j < n_vocab; ++j) {
        if (!isfinite(row[j])) {
            say("non-finite logit at row %d, token %d (value %f)", (int) row_idx, (int) j, (double) row[j]);
            return false;
        }
    }
    return true;
}

// Copies the logits of batch position `at` (-1: the last) into row `row`; false, said, where there are none or
// one is not finite. `what` and `which` name the position for the message.
static bool keep_row(struct llama_context * ctx, int32_t at, int32_t n_vocab, float * rows, size_t row,
                     const char * what, int32_t which) {
    const float * l = llama_get_logits_ith(ctx, at);
    if (l == NULL) {
        say("no logits for %s %d", what, (int) which);
        return false;
    }
    if (!check_finite(l, n_vocab, (int32_t) row)) {
        return false;
    }
    memcpy(rows + row * (size_t) n_vocab, l, (size_t) n_vocab * sizeof(float));
    return true;
}

// Anonymous memory (kB) from /proc/self/status, or -1 where that file does not exist.
// The cgroup test sizes its memory limit from this: the limit must hold the process's own
// heap/KV/compute buffers (which cannot be reclaimed) and still be well below the model size.
static long status_kb(const char * key) {
    FILE * f = fopen("/proc/self/status", "r");
    if (f == NULL) {
        return -1;
    }
    char line[256];
    long kb = -1;
    const size_t klen = strlen(key);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            kb = strtol(line + klen + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb;
}

static void batch_set(struct llama_batch * b, int32_t i, llama_token tok, llama_pos pos, bool want_logits) {
    b->token[i]     = tok;
    b->pos[i]       = pos;
    b->n_seq_id[i]  = 1;
    b->seq_id[i][0] = 0;
    b->logits[i]    = want_logits ? 1 : 0;
}

int main(int argc, char ** argv) {
    const char * model_path = NULL;
    const char * out_path   = NULL;
    long n_threads  = 2;
    long n_prompt   = 48;
    long n_gen      = 8;
    long n_turns    = 1;
    long n_ubatch   = 64;
    bool no_repack  = false;
    const char * rpc_endpoint = NULL;
    long n_gpu_layers = 0;
    bool cpu_moe    = false;

    for (int i = 1; i < argc; ++i) {
        const char * a = argv[i];
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--threads") == 0) {
            if (!parse_int(a, v, 1, 512, &n_threads)) { return 2; }
            ++i;
        } else if (strcmp(a, "--prompt-tokens") == 0) {
            if (!parse_int(a, v, 1, (long) N_CTX, &n_prompt)) { return 2; }
            ++i;
        } else if (strcmp(a, "--gen-tokens") == 0) {
            if (!parse_int(a, v, 0, (long) N_CTX, &n_gen)) { return 2; }
            ++i;
        } else if (strcmp(a, "--turns") == 0) {
            if (!parse_int(a, v, 1, (long) N_CTX, &n_turns)) { return 2; }
            ++i;
        } else if (strcmp(a, "--ubatch") == 0) {
            if (!parse_int(a, v, 1, (long) N_CTX, &n_ubatch)) { return 2; }
            ++i;
        } else if (strcmp(a, "--no-repack") == 0) {
            no_repack = true;
        } else if (strcmp(a, "--rpc") == 0) {
            if (v == NULL) { say("--rpc needs HOST:PORT"); return 2; }
            rpc_endpoint = v;
            ++i;
        } else if (strcmp(a, "--n-gpu-layers") == 0) {
            if (!parse_int(a, v, 0, 1000, &n_gpu_layers)) { return 2; }
            ++i;
        } else if (strcmp(a, "--cpu-moe") == 0) {
            cpu_moe = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage();
            return 0;
        } else if (a[0] == '-' && a[1] == '-') {
            say("unknown option '%s'", a);
            usage();
            return 2;
        } else if (model_path == NULL) {
            model_path = a;
        } else if (out_path == NULL) {
            out_path = a;
        } else {
            say("unexpected argument '%s'", a);
            usage();
            return 2;
        }
    }
    if (model_path == NULL || out_path == NULL) {
        say("MODEL.gguf and OUT.bin are required");
        usage();
        return 2;
    }
    if (n_turns * (n_prompt + n_gen) > (long) N_CTX) {
        say("--turns x (--prompt-tokens + --gen-tokens) (%ld) exceeds the context size %u", n_turns * (n_prompt + n_gen),
            N_CTX);
        return 2;
    }

    const char * verbose_env = getenv("LOGITS_DUMP_VERBOSE");
    const bool verbose = verbose_env != NULL && verbose_env[0] != '\0' && strcmp(verbose_env, "0") != 0;
    // non-NULL user_data means "verbose"; the pointer itself is never dereferenced
    llama_log_set(log_cb, verbose ? (void *) &n_threads : NULL);

    llama_backend_init();

    int rc = 1;
    struct llama_model   * model = NULL;
    struct llama_context * ctx   = NULL;
    struct llama_batch     batch = {0};
    bool   batch_alive = false;
    FILE * out = NULL;
    float * rows = NULL;

    // As common's --rpc does it: through the registry, so this builds without GGML_RPC too.
    if (rpc_endpoint != NULL) {
        ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
        typedef ggml_backend_reg_t (*add_server_fn)(const char * endpoint);
        add_server_fn add_server = rpc == NULL ? NULL
            : (add_server_fn) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
        if (add_server == NULL) {
            say("--rpc %s: this ggml was built without the RPC backend (GGML_RPC)", rpc_endpoint);
            return 2;
        }
        ggml_backend_reg_t server = add_server(rpc_endpoint);
        if (server == NULL || ggml_backend_reg_dev_count(server) == 0) {
            say("--rpc %s: no device at that endpoint (is rpc-server running?)", rpc_endpoint);
            return 1;
        }
        ggml_backend_register(server);
    }
    // common's --cpu-moe: every expert tensor stays in host memory (the mapping Guanaco streams into).
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_buffer_type_t host = cpu == NULL ? NULL : ggml_backend_dev_buffer_type(cpu);
    const struct llama_model_tensor_buft_override cpu_moe_overrides[] = {
        { "\\.ffn_(up|down|gate|gate_up)_(ch|)exps", host },
        { NULL, NULL },
    };

    struct llama_model_params mparams = llama_model_default_params();
    // CPU only unless asked: the invariant is about the CPU/mmap path
    mparams.n_gpu_layers = (int32_t) n_gpu_layers;
    if (cpu_moe) {
        mparams.tensor_buft_overrides = cpu_moe_overrides;
    }
    if (no_repack) {
        // Repacking (CPU "extra" buffer types, e.g. Q4_0 -> Q4_0x8) changes the kernel and thus
        // the float summation order; disabling it gives the layout streaming must match.
        mparams.use_extra_bufts = false;
    }

    model = llama_model_load_from_file(model_path, mparams);
    if (model == NULL) {
        say("failed to load model '%s' (missing, not a GGUF, truncated or unsupported)", model_path);
        goto done;
    }

    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    if (n_vocab <= 0) {
        say("model has an empty vocabulary (n_vocab = %d)", (int) n_vocab);
        goto done;
    }

    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = N_CTX;
    cparams.n_ubatch        = (uint32_t) n_ubatch;
    // The prompt must go in as ONE llama_decode call; n_batch only bounds that call, while
    // n_ubatch controls how it is split internally (so --ubatch < prompt still exercises the
    // multi-ubatch path without changing what we submit).
    cparams.n_batch         = (uint32_t) (n_ubatch > n_prompt ? n_ubatch : n_prompt);
    cparams.n_seq_max       = 1;
    cparams.n_threads       = (int32_t) n_threads;
    cparams.n_threads_batch = (int32_t) n_threads;
    // AUTO may pick flash attention depending on backend support; pin it off so both runs take
    // the same attention kernel regardless of how the library was built.
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.embeddings      = false;
    cparams.no_perf         = true;
    cparams.op_offload      = false;    // nothing may move to another device mid-run

    ctx = llama_init_from_model(model, cparams);
    if (ctx == NULL) {
        say("failed to create a context for '%s'", model_path);
        goto done;
    }

    const size_t n_rows = (size_t) (n_turns * (n_prompt + n_gen));
    rows = malloc(n_rows * (size_t) n_vocab * sizeof(float));
    if (rows == NULL) {
        say("out of memory allocating %zu logit rows of %d", n_rows, (int) n_vocab);
        goto done;
    }

    batch = llama_batch_init((int32_t) n_prompt, 0, 1);
    batch_alive = true;

    uint32_t lcg = 0x6775616eu; // "guan"
    size_t row = 0;
    // Each turn after the first is a prompt after decode: what the engine keeps across that boundary (its
    // resident experts, and memory the prompt borrows and gives back) must not change a logit either.
    for (long turn = 0; turn < n_turns; ++turn) {
        const size_t first_row = row;
        batch.n_tokens = (int32_t) n_prompt;
        for (int32_t i = 0; i < (int32_t) n_prompt; ++i) {
            const llama_token tok = (llama_token) (lcg_next(&lcg) % (uint32_t) n_vocab);
            batch_set(&batch, i, tok, (llama_pos) (first_row + (size_t) i), true);
        }

        int32_t ret = llama_decode(ctx, batch);
        if (ret != 0) {
            say("llama_decode failed on the %ld-token prompt batch (ret = %d)", n_prompt, (int) ret);
            goto done;
        }

        for (int32_t i = 0; i < (int32_t) n_prompt; ++i, ++row) {
            if (!keep_row(ctx, i, n_vocab, rows, row, "prompt position", i)) {
                goto done;
            }
        }

        // Single-token steps exercise the batch-size-1 (mat-vec) kernels, which differ from the
        // prompt's mat-mat path and touch only the experts the router picks for one token.
        for (int32_t g = 0; g < (int32_t) n_gen; ++g, ++row) {
            const llama_token next = argmax(rows + (row - 1) * (size_t) n_vocab, n_vocab);
            batch.n_tokens = 1;
            batch_set(&batch, 0, next, (llama_pos) row, true);
            ret = llama_decode(ctx, batch);
            if (ret != 0) {
                say("llama_decode failed on generation step %d (ret = %d)", (int) g, (int) ret);
                goto done;
            }
            if (!keep_row(ctx, -1, n_vocab, rows, row, "generation step", g)) {
                goto done;
            }
        }
    }

    out = fopen(out_path, "wb");
    if (out == NULL) {
        say("cannot open '%s' for writing: %s", out_path, strerror(errno));
        goto done;
    }
    const uint32_t hdr[4] = { (uint32_t) n_vocab, (uint32_t) n_rows, (uint32_t) n_prompt, (uint32_t) n_gen };
    const size_t n_floats = n_rows * (size_t) n_vocab;
    if (fwrite(MAGIC, 1, sizeof(MAGIC), out) != sizeof(MAGIC) ||
        fwrite(hdr, sizeof(hdr[0]), 4, out) != 4 ||
        fwrite(rows, sizeof(float), n_floats, out) != n_floats) {
        say("write to '%s' failed: %s", out_path, strerror(errno));
        goto done;
    }
    if (fclose(out) != 0) {
        out = NULL;
        say("closing '%s' failed: %s", out_path, strerror(errno));
        goto done;
    }
    out = NULL;

    // measured while model, context and buffers are all still alive, i.e. near the peak
    printf("logits_dump: n_vocab=%d rows=%zu (%ld x (prompt %ld + gen %ld)) threads=%ld ubatch=%ld repack=%s "
           "fnv1a=%016llx rss_anon_kb=%ld rss_file_kb=%ld\n",
           (int) n_vocab, n_rows, n_turns, n_prompt, n_gen, n_threads, n_ubatch, no_repack ? "off" : "on",
           (unsigned long long) fnv1a(1469598103934665603ull, rows, n_floats * sizeof(float)),
           status_kb("RssAnon"), status_kb("RssFile"));
    rc = 0;

done:
    if (out != NULL) {
        fclose(out);
    }
    if (rc != 0 && out_path != NULL) {
        // never leave a partial/stale dump behind that a later cmp could mistake for output
        remove(out_path);
    }
    free(rows);
    if (batch_alive) {
        llama_batch_free(batch);
    }
    if (ctx != NULL) {
        llama_free(ctx);
    }
    if (model != NULL) {
        llama_model_free(model);
    }
    llama_backend_free();
    return rc;
}
