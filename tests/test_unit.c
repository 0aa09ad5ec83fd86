/*
 * test_unit.c - owns the unit tests of libguanaco that need no llama.cpp
 * model: flag and environment parsing, expert-name recognition, the manifest
 * read from a GGUF written here with ggml's gguf API (including a truncated
 * one), the engine's dense passthrough, and the router hook reading a strided
 * ffn_moe_topk view and chaining a user callback.
 */
#include "budget.h"
#include "engine.h"
#include "guanaco.h"
#include "io.h"
#include "manifest.h"
#include "policy.h"
#include "predictor.h"
#include "slot_pool.h"

#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>

#include "check.h"
#include "huge_pages.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "capture.h"


static void test_expert_names(void) {
    int layer = -1;
    CHECK(guanaco_tensor_name_is_expert("blk.12.ffn_gate_exps.weight", &layer) && layer == 12);
    CHECK(guanaco_tensor_name_is_expert("blk.0.ffn_gate_up_exps.weight", &layer) && layer == 0);
    CHECK(!guanaco_tensor_name_is_expert("blk.3.ffn_down_exps.bias", NULL)); /* read by ADD_ID from the mapping */
    CHECK(!guanaco_tensor_name_is_expert("blk.3.ffn_down_shexp.weight", NULL));
    CHECK(!guanaco_tensor_name_is_expert("blk.3.ffn_gate_inp.weight", NULL));
    CHECK(!guanaco_tensor_name_is_expert("token_embd.weight", NULL));
    CHECK(!guanaco_tensor_name_is_expert("blk.x.ffn_up_exps.weight", NULL));
    CHECK(!guanaco_tensor_name_is_expert("blk.1.ffn_up_exps.weight.extra", NULL));
}

static void test_options(void) {
    struct guanaco_options options;
    unsetenv("GUANACO_STREAMING");
    unsetenv("LLAMA_ARG_GUANACO_STREAMING");
    CHECK(guanaco_options_get(&options) == 0 && !options.streaming && options.readahead == GUANACO_READAHEAD_NORMAL);
    /* the residency defaults the README states */
    CHECK(options.load == GUANACO_LOAD_AUTO && options.overlap_layer_follows_load && options.status_every == GUANACO_DEFAULT_STATUS_EVERY &&
          !options.audit && options.preload && options.io == GUANACO_IO_URING && options.policy == 3 /* guanaco */ &&
          options.stream_prompts);
    /* read-ahead is on by default with the pilot predictor and its own default mass */
    CHECK(options.prefetch == 1 /* pilot */ && options.pilot_mass == 0.0);
    /* and throttled: it runs only where it is measured faster */
    CHECK(options.prefetch_throttle);
    setenv("GUANACO_PREFETCH_THROTTLE", "off", 1);
    CHECK(guanaco_options_get(&options) == 0 && !options.prefetch_throttle);
    setenv("GUANACO_PREFETCH_THROTTLE", "sometimes", 1);
    CHECK(guanaco_options_get(&options) == -EINVAL);
    unsetenv("GUANACO_PREFETCH_THROTTLE");
    setenv("GUANACO_PREFETCH", "none", 1);
    setenv("GUANACO_PILOT_MASS", "0.9", 1);
    CHECK(guanaco_options_get(&options) == 0 && options.prefetch == 0 && options.pilot_mass > 0.8999 &&
          options.pilot_mass < 0.9001);
    setenv("GUANACO_PILOT_MASS", "nan", 1);
    CHECK(guanaco_options_get(&options) == -EINVAL);
    unsetenv("GUANACO_PREFETCH");
    unsetenv("GUANACO_PILOT_MASS");
    setenv("GUANACO_IO_URING", "0", 1); /* the documented switch to the pread pool */
    CHECK(guanaco_options_get(&options) == 0 && options.io == 1);
    setenv("GUANACO_IO", "io_uring", 1); /* the named option wins over the switch; the backend's own name */
    CHECK(guanaco_options_get(&options) == 0 && options.io == GUANACO_IO_URING);
    CHECK(strcmp(guanaco_io_backend_name(GUANACO_IO_URING), "io_uring") == 0); /* what the log lines say */
    setenv("GUANACO_IO", "uring", 1); /* the flag's earlier spelling is still accepted */
    CHECK(guanaco_options_get(&options) == 0 && options.io == GUANACO_IO_URING);
    setenv("GUANACO_IO", "io-uring", 1); /* an alias is one exact name, not a loose match */
    CHECK(guanaco_options_get(&options) == -EINVAL);
    unsetenv("GUANACO_IO");
    /* Every name the policy, predictor and io modules give is a value of the flag, meaning that kind. */
    for (int kind = GUANACO_POLICY_LRU; kind <= GUANACO_POLICY_GUANACO; kind++) {
        setenv("GUANACO_POLICY", guanaco_policy_kind_name((enum guanaco_policy_kind)kind), 1);
        CHECK(guanaco_options_get(&options) == 0 && options.policy == kind);
    }
    unsetenv("GUANACO_POLICY");
    for (int kind = GUANACO_PREDICTOR_NONE; kind <= GUANACO_PREDICTOR_GATE; kind++) {
        setenv("GUANACO_PREFETCH", guanaco_predictor_kind_name((enum guanaco_predictor_kind)kind), 1);
        CHECK(guanaco_options_get(&options) == 0 && options.prefetch == kind);
    }
    unsetenv("GUANACO_PREFETCH");
    for (int backend = GUANACO_IO_URING; backend <= GUANACO_IO_THREADS; backend++) {
        setenv("GUANACO_IO", guanaco_io_backend_name((enum guanaco_io_backend)backend), 1);
        CHECK(guanaco_options_get(&options) == 0 && options.io == backend);
    }
    unsetenv("GUANACO_IO");
    setenv("GUANACO_IO_URING", "maybe", 1);
    CHECK(guanaco_options_get(&options) == -EINVAL);
    unsetenv("GUANACO_IO_URING");
    setenv("GUANACO_LOAD", "direct", 1);
    setenv("GUANACO_STATUS_EVERY", "4", 1);
    setenv("GUANACO_PRELOAD", "off", 1);
    setenv("GUANACO_AUDIT", "1", 1);
    setenv("GUANACO_STREAM_PROMPTS", "off", 1);
    CHECK(guanaco_options_get(&options) == 0 && options.load == GUANACO_LOAD_DIRECT && options.status_every == 4 &&
          !options.preload && options.audit && !options.stream_prompts);
    unsetenv("GUANACO_STREAM_PROMPTS");
    unsetenv("GUANACO_LOAD");
    unsetenv("GUANACO_STATUS_EVERY");
    unsetenv("GUANACO_PRELOAD");
    unsetenv("GUANACO_AUDIT");

    setenv("GUANACO_STREAMING", "1", 1);
    CHECK(guanaco_options_get(&options) == 0 && options.streaming);
    setenv("LLAMA_ARG_GUANACO_STREAMING", "off", 1); /* llama.cpp's spelling wins over ours */
    CHECK(guanaco_options_get(&options) == 0 && !options.streaming);
    setenv("GUANACO_STREAMING", "banana", 1);
    unsetenv("LLAMA_ARG_GUANACO_STREAMING");
    CHECK(guanaco_options_get(&options) == -EINVAL);
    unsetenv("GUANACO_STREAMING");

    char a0[] = "tool", a1[] = "-m", a2[] = "x.gguf", a3[] = "--guanaco-streaming", a4[] = "--guanaco-readahead",
         a5[] = "sequential", a6[] = "-n", a7[] = "4";
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, NULL};
    int argc = 8;
    CHECK(guanaco_options_parse_argv(&argc, argv) == 0);
    CHECK(argc == 5 && strcmp(argv[1], "-m") == 0 && strcmp(argv[3], "-n") == 0 && argv[5] == NULL);
    CHECK(guanaco_options_get(&options) == 0 && options.streaming && options.readahead == GUANACO_READAHEAD_SEQUENTIAL);

    setenv("GUANACO_STREAMING", "0", 1); /* a flag beats the environment */
    CHECK(guanaco_options_get(&options) == 0 && options.streaming);
    unsetenv("GUANACO_STREAMING");

    char b1[] = "--guanaco-streaming=maybe";
    char *bad1[] = {a0, b1, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, bad1) == -EINVAL);
    char b2[] = "--guanaco-readahead";
    char *bad2[] = {a0, b2, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, bad2) == -EINVAL);
    char b3[] = "--guanaco-nonsense";
    char *bad3[] = {a0, b3, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, bad3) == -EINVAL);
    /* Budgets: sizes with binary units or auto, counts with a range; absurd values are refused by name. */
    char r1[] = "--guanaco-ram", r2[] = "6G", r3[] = "--guanaco-max-experts=16", r4[] = "--guanaco-policy",
         r5[] = "layer-lru", r6[] = "--guanaco-io=threads";
    char *budget[] = {a0, r1, r2, r3, r4, r5, r6, NULL};
    argc = 7;
    CHECK(guanaco_options_parse_argv(&argc, budget) == 0 && argc == 1);
    CHECK(guanaco_options_get(&options) == 0 && options.residency && options.ram_bytes == 6ull << 30 &&
          options.max_experts == 16 && options.policy == 2 && options.io == 1);
    setenv("GUANACO_RAM", "6144M", 1);
    CHECK(guanaco_options_get(&options) == 0 && options.ram_bytes == 6ull << 30); /* the flag still wins */
    unsetenv("GUANACO_RAM");
    char r7[] = "--guanaco-ram=auto";
    char *automatic[] = {a0, r7, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, automatic) == 0);
    CHECK(guanaco_options_get(&options) == 0 && options.residency && options.ram_bytes == 0);
    const char *absurd[] = {"--guanaco-ram=-5G", "--guanaco-ram=12Q", "--guanaco-ram=100", "--guanaco-ram=5000T",
                            "--guanaco-max-experts=0", "--guanaco-max-experts=1e3", "--guanaco-max-experts=99999",
                            "--guanaco-policy=mru", "--guanaco-io=aio", "--guanaco-load=fast",
                            "--guanaco-status-every=0", "--guanaco-status-every=x", "--guanaco-audit=sometimes",
                            "--guanaco-preload=2", "--guanaco-prefetch=oracle", "--guanaco-pilot-mass=0",
                            "--guanaco-pilot-mass=1.5", "--guanaco-pilot-mass=nan", "--guanaco-pilot-mass= 0.5",
                            "--guanaco-pilot-mass=0.5x", "--guanaco-ram=nan", "--guanaco-ram=NaN", "--guanaco-ram=inf",
                            "--guanaco-ram= 6G", "--guanaco-ram=\t6G", "--guanaco-ram=0x40000000",
                            "--guanaco-ram=+6G", "--guanaco-max-experts= 5", "--guanaco-max-experts=+5",
                            "--guanaco-status-every= 32", "--guanaco-when-fits=sometimes", "--guanaco-when-fits="};
    for (size_t i = 0; i < sizeof(absurd) / sizeof(absurd[0]); i++) {
        char flag[64];
        snprintf(flag, sizeof(flag), "%s", absurd[i]);
        char *bad[] = {a0, flag, NULL};
        argc = 2;
        CHECK(guanaco_options_parse_argv(&argc, bad) == -EINVAL);
    }

    char b4[] = "--guanaco-streaming=off";
    char *off[] = {a0, b4, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, off) == 0 && argc == 1);

    /* An on/off flag takes its value as the next argument too, as the README writes it; a bare flag is on,
       and an argument that is not an on/off word stays for llama.cpp. */
    char s1[] = "--guanaco-audit", s2[] = "off", s3[] = "--guanaco-preload", s4[] = "No", s5[] = "--guanaco-log",
         s6[] = "-n", s7[] = "5", s8[] = "--guanaco-streaming";
    char *spaced[] = {a0, s1, s2, s3, s4, s5, s6, s7, s8, NULL};
    argc = 9;
    CHECK(guanaco_options_parse_argv(&argc, spaced) == 0 && argc == 3 && strcmp(spaced[1], "-n") == 0 &&
          strcmp(spaced[2], "5") == 0 && spaced[3] == NULL);
    CHECK(guanaco_options_get(&options) == 0 && !options.audit && !options.preload && options.log &&
          options.streaming);
    char t1[] = "--guanaco-audit", t2[] = "on", t3[] = "--guanaco-preload", t4[] = "1";
    char *restore[] = {a0, t1, t2, t3, t4, b4, NULL};
    argc = 6;
    CHECK(guanaco_options_parse_argv(&argc, restore) == 0 && argc == 1);
    CHECK(guanaco_options_get(&options) == 0 && options.audit && options.preload && !options.streaming);
    /* A size is a number of bytes: nan is not one (it used to become 8 EiB). */
    char r8[] = "--guanaco-ram=1.5G";
    char *fractional[] = {a0, r8, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, fractional) == 0);
    CHECK(guanaco_options_get(&options) == 0 && options.ram_bytes == 3ull << 29);
    /* An explicit budget that holds every expert hands them to llama.cpp unless told to keep the engine. */
    CHECK(guanaco_options_get(&options) == 0 && options.when_fits == GUANACO_WHEN_FITS_PLAIN);
    char w1[] = "--guanaco-when-fits", w2[] = "engine";
    char *when_fits[] = {a0, w1, w2, NULL};
    argc = 3;
    CHECK(guanaco_options_parse_argv(&argc, when_fits) == 0 && argc == 1);
    CHECK(guanaco_options_get(&options) == 0 && options.when_fits == GUANACO_WHEN_FITS_ENGINE);
    char w3[] = "--guanaco-when-fits=plain";
    char *when_fits_plain[] = {a0, w3, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, when_fits_plain) == 0);
    CHECK(guanaco_options_get(&options) == 0 && options.when_fits == GUANACO_WHEN_FITS_PLAIN);
    char r9[] = "--guanaco-ram=auto";
    char *back_to_auto[] = {a0, r9, NULL};
    argc = 2;
    CHECK(guanaco_options_parse_argv(&argc, back_to_auto) == 0);
}

enum { TEST_EXPERTS = 4, TEST_EMBD = 64, TEST_FF = 32, TEST_LAYERS = 3 };

/* Changes a test model's metadata before it is written; NULL for none. */
typedef void (*gguf_edit)(struct gguf_context *gguf);
static gguf_edit test_gguf_edit;
static bool test_gguf_output; /* an output.weight of its own, so the embedding is not also the output */

/* A model-shaped GGUF: layer 0 dense, layers 1-2 with experts. Returns the file size. */
static long write_test_gguf(const char *path, bool with_experts) {
    struct ggml_init_params params = {.mem_size = 64 * 1024 * 1024, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(params);
    struct gguf_context *gguf = gguf_init_empty();
    gguf_set_val_str(gguf, "general.architecture", "qwen3moe");
    gguf_set_val_u32(gguf, "qwen3moe.block_count", TEST_LAYERS);
    gguf_set_val_u32(gguf, "qwen3moe.expert_count", TEST_EXPERTS);
    gguf_set_val_u32(gguf, "qwen3moe.expert_used_count", 2);
    struct ggml_tensor *embd = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, TEST_EMBD, 16);
    ggml_set_name(embd, "token_embd.weight");
    memset(embd->data, 0, ggml_nbytes(embd));
    gguf_add_tensor(gguf, embd);
    if (test_gguf_output) {
        struct ggml_tensor *output = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, TEST_EMBD, 16);
        ggml_set_name(output, "output.weight");
        memset(output->data, 0, ggml_nbytes(output));
        gguf_add_tensor(gguf, output);
    }
    for (int layer = 1; with_experts && layer < TEST_LAYERS; layer++) {
        const char *parts[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
        for (int p = 0; p < 3; p++) {
            struct ggml_tensor *t = p == 2 ? ggml_new_tensor_3d(ctx, GGML_TYPE_F16, TEST_FF, TEST_EMBD, TEST_EXPERTS)
                                           : ggml_new_tensor_3d(ctx, GGML_TYPE_F16, TEST_EMBD, TEST_FF, TEST_EXPERTS);
            ggml_format_name(t, "blk.%d.%s.weight", layer, parts[p]);
            memset(t->data, 0, ggml_nbytes(t));
            gguf_add_tensor(gguf, t);
        }
    }
    if (test_gguf_edit) {
        test_gguf_edit(gguf);
    }
    bool ok = gguf_write_to_file(gguf, path, false);
    gguf_free(gguf);
    ggml_free(ctx);
    if (!ok) {
        return -1;
    }
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return size;
}

static void test_manifest(const char *dir) {
    char path[512], truncated[512];
    snprintf(path, sizeof(path), "%s/unit-moe.gguf", dir);
    snprintf(truncated, sizeof(truncated), "%s/unit-truncated.gguf", dir);
    long size = write_test_gguf(path, true);
    CHECK(size > 0);

    struct guanaco_manifest m;
    CHECK(guanaco_manifest_load(path, NULL, 0, &m) == 0);
    CHECK(m.n_tensors == 6 && m.n_moe_layers == 2 && m.n_expert == TEST_EXPERTS && m.n_layer == TEST_LAYERS);
    const struct guanaco_expert_tensor *down = guanaco_manifest_find(&m, "blk.2.ffn_down_exps.weight");
    CHECK(down && down->layer == 2 && down->expert_stride == (uint64_t)TEST_FF * TEST_EMBD * 2);
    CHECK(down && down->file_offset + down->nbytes <= (uint64_t)size);
    CHECK(guanaco_manifest_find(&m, "blk.0.ffn_down_exps.weight") == NULL);
    CHECK(guanaco_manifest_find(&m, "token_embd.weight") == NULL);
    uint64_t expected_bytes = 2ull * 3 * TEST_EXPERTS * TEST_FF * TEST_EMBD * 2;
    CHECK(m.expert_bytes == expected_bytes);
    CHECK(m.cold_embedding_bytes == 0); /* no output.weight: the embedding is the output matrix too, read whole */
    /* every tensor's extent, experts and the rest, as the expert table has them: the engine's later passes use
       them instead of parsing the file again */
    uint64_t listed_bytes = 0;
    bool embedding_listed = false, down_listed = false;
    for (size_t i = 0; i < m.n_file_tensors; i++) {
        const struct guanaco_file_tensor *f = &m.file_tensors[i];
        listed_bytes += f->nbytes;
        CHECK(f->shard == 0 && f->file_offset + f->nbytes <= (uint64_t)size);
        embedding_listed = embedding_listed || strcmp(f->name, "token_embd.weight") == 0;
        if (down && strcmp(f->name, down->name) == 0) {
            down_listed = f->file_offset == down->file_offset && f->nbytes == down->nbytes;
        }
    }
    CHECK(m.n_file_tensors > m.n_tensors && listed_bytes == m.total_bytes && embedding_listed && down_listed);
    guanaco_manifest_free(&m);
    CHECK(m.file_tensors == NULL && m.n_file_tensors == 0);
    test_gguf_output = true;
    CHECK(write_test_gguf(path, true) > 0);
    CHECK(guanaco_manifest_load(path, NULL, 0, &m) == 0);
    CHECK(m.cold_embedding_bytes == (uint64_t)TEST_EMBD * 16 * 4); /* only the prompt's rows of it are read */
    guanaco_manifest_free(&m);
    test_gguf_output = false;
    size = write_test_gguf(path, true);

    /* Cut the file in the middle of the last expert tensor. */
    CHECK(truncate(path, size - 1000) == 0);
    CHECK(guanaco_manifest_load(path, NULL, 0, &m) == -EIO);
    CHECK(guanaco_manifest_load(truncated, NULL, 0, &m) == -ENOENT);
    FILE *junk = fopen(truncated, "wb");
    fputs("this is not a gguf file at all, just some words", junk);
    fclose(junk);
    CHECK(guanaco_manifest_load(truncated, NULL, 0, &m) == -EINVAL);
    unlink(truncated);
    unlink(path);
}

/* Bad values of the keys Guanaco relies on: each refused with -EINVAL and a message naming the key. */
static void used_zero(struct gguf_context *g) { gguf_set_val_u32(g, "qwen3moe.expert_used_count", 0); }
static void used_above(struct gguf_context *g) { gguf_set_val_u32(g, "qwen3moe.expert_used_count", TEST_EXPERTS + 1); }
static void used_missing(struct gguf_context *g) { gguf_remove_key(g, "qwen3moe.expert_used_count"); }
static void used_text(struct gguf_context *g) { gguf_set_val_str(g, "qwen3moe.expert_used_count", "two"); }
static void used_wrapped(struct gguf_context *g) { gguf_set_val_u64(g, "qwen3moe.expert_used_count", (1ull << 32) + 2); }
static void used_array_bad(struct gguf_context *g) {
    const uint32_t per_layer[TEST_LAYERS] = {0, 2, 5};
    gguf_remove_key(g, "qwen3moe.expert_used_count");
    gguf_set_arr_data(g, "qwen3moe.expert_used_count", GGUF_TYPE_UINT32, per_layer, TEST_LAYERS);
}
static void used_array_good(struct gguf_context *g) {
    const uint32_t per_layer[TEST_LAYERS] = {0, 2, 3}; /* the dense first layer routes to none */
    gguf_remove_key(g, "qwen3moe.expert_used_count");
    gguf_set_arr_data(g, "qwen3moe.expert_used_count", GGUF_TYPE_UINT32, per_layer, TEST_LAYERS);
}
static void blocks_zero(struct gguf_context *g) { gguf_set_val_u32(g, "qwen3moe.block_count", 0); }
static void blocks_1000(struct gguf_context *g) { gguf_set_val_u32(g, "qwen3moe.block_count", 1000); }
static void blocks_max(struct gguf_context *g) { gguf_set_val_u32(g, "qwen3moe.block_count", UINT32_MAX); }
static void blocks_wrapped(struct gguf_context *g) { gguf_set_val_u64(g, "qwen3moe.block_count", (1ull << 32) + TEST_LAYERS); }
static void blocks_missing(struct gguf_context *g) { gguf_remove_key(g, "qwen3moe.block_count"); }
static void experts_wrapped(struct gguf_context *g) { gguf_set_val_u64(g, "qwen3moe.expert_count", (1ull << 32) + TEST_EXPERTS); }
static void experts_i64(struct gguf_context *g) { gguf_set_val_i64(g, "qwen3moe.expert_count", TEST_EXPERTS); }

static void test_manifest_keys(const char *dir) {
    char path[512];
    snprintf(path, sizeof(path), "%s/unit-keys.gguf", dir);
    const struct {
        gguf_edit edit;
        const char *message; /* names the key and the value as written */
    } refused[] = {
        {used_zero, "qwen3moe.expert_used_count is 0; it must be from 1 to qwen3moe.expert_count (4)"},
        {used_above, "qwen3moe.expert_used_count is 5;"},
        {used_missing, "qwen3moe.expert_used_count is missing"},
        {used_text, "qwen3moe.expert_used_count is str (not an integer)"},
        {used_wrapped, "qwen3moe.expert_used_count is 4294967298;"},
        {used_array_bad, "qwen3moe.expert_used_count is [0, 2, 5];"},
        {blocks_zero, "qwen3moe.block_count is 0, but the file has tensors for blocks 0 to 2: it must be from 1 to 3"},
        {blocks_1000, "qwen3moe.block_count is 1000, but"},
        {blocks_max, "qwen3moe.block_count is 4294967295, but"},
        {blocks_wrapped, "qwen3moe.block_count is 4294967299, but"},
        {blocks_missing, "qwen3moe.block_count is missing"},
        {experts_wrapped, "declares qwen3moe.expert_count = 4294967300"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        test_gguf_edit = refused[i].edit;
        CHECK(write_test_gguf(path, true) > 0);
        test_gguf_edit = NULL;
        struct guanaco_manifest m;
        begin_capture();
        int err = guanaco_manifest_load(path, NULL, 0, &m);
        end_capture();
        if (err != -EINVAL || !said(refused[i].message)) {
            fprintf(stderr, "FAIL case %zu: err %d, wanted \"%s\", said: %s", i, err, refused[i].message, captured);
        }
        CHECK(err == -EINVAL && said(refused[i].message));
    }
    /* Any integer type is read whole; a per-layer array counts by its largest element. */
    test_gguf_edit = experts_i64;
    CHECK(write_test_gguf(path, true) > 0);
    struct guanaco_manifest m;
    CHECK(guanaco_manifest_load(path, NULL, 0, &m) == 0 && m.n_expert == TEST_EXPERTS && m.n_expert_used == 2);
    guanaco_manifest_free(&m);
    test_gguf_edit = used_array_good;
    CHECK(write_test_gguf(path, true) > 0);
    CHECK(guanaco_manifest_load(path, NULL, 0, &m) == 0 && m.n_expert_used == 3);
    guanaco_manifest_free(&m);
    test_gguf_edit = NULL;
    /* A dense model keeps loading whatever its expert keys say: Guanaco does not touch it. */
    test_gguf_edit = used_zero;
    CHECK(write_test_gguf(path, false) > 0);
    test_gguf_edit = NULL;
    CHECK(guanaco_manifest_load(path, NULL, 0, &m) == 0 && m.n_tensors == 0);
    guanaco_manifest_free(&m);
    unlink(path);
}

static int user_calls_ask, user_calls_done;

static bool user_callback(struct ggml_tensor *t, bool ask, void *user_data) {
    (void)user_data;
    bool wanted = strncmp(t->name, "ffn_moe_logits", 14) == 0 || strncmp(t->name, "ffn_moe_topk", 12) == 0;
    if (ask) {
        user_calls_ask++;
    } else {
        user_calls_done++;
    }
    return wanted;
}

static void test_engine_and_hook(const char *dir) {
    char path[512];
    snprintf(path, sizeof(path), "%s/unit-engine.gguf", dir);
    struct guanaco_engine *engine = (void *)1;

    unsetenv("GUANACO_STREAMING");
    char a0[] = "tool", off[] = "--guanaco-streaming=off", on[] = "--guanaco-streaming";
    char *argv_off[] = {a0, off, NULL};
    int argc = 2;
    guanaco_options_parse_argv(&argc, argv_off);
    CHECK(write_test_gguf(path, true) > 0);
    CHECK(guanaco_engine_open(path, NULL, 0, false, true, &engine) == 0 && engine == NULL);

    char *argv_on[] = {a0, on, NULL};
    argc = 2;
    guanaco_options_parse_argv(&argc, argv_on);
    CHECK(write_test_gguf(path, false) > 0); /* dense: passthrough, no engine */
    CHECK(guanaco_engine_open(path, NULL, 0, false, true, &engine) == 0 && engine == NULL);
    CHECK(guanaco_engine_open("/nonexistent/model.gguf", NULL, 0, false, true, &engine) == -ENOENT);

    CHECK(write_test_gguf(path, true) > 0);
    CHECK(guanaco_engine_open(path, NULL, 0, false, true, &engine) == 0 && engine != NULL);
    if (!engine) {
        return;
    }
    CHECK(guanaco_engine_is_expert_tensor(engine, "blk.1.ffn_up_exps.weight"));
    CHECK(!guanaco_engine_is_expert_tensor(engine, "blk.0.ffn_up_exps.weight"));
    CHECK(!guanaco_engine_is_expert_tensor(NULL, "blk.1.ffn_up_exps.weight"));

    /* The router's ids as llama.cpp lays them out: a [k, n_tokens] view of [n_expert, n_tokens]. */
    struct ggml_init_params params = {.mem_size = 1024 * 1024, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(params);
    const int n_tokens = 3, k = 2;
    struct ggml_tensor *argsort = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, TEST_EXPERTS, n_tokens);
    int32_t rows[3][TEST_EXPERTS] = {{3, 1, 0, 2}, {3, 2, 1, 0}, {0, 3, 2, 1}};
    memcpy(argsort->data, rows, sizeof(rows));
    struct ggml_tensor *topk = ggml_view_2d(ctx, argsort, k, n_tokens, argsort->nb[1], 0);
    ggml_set_name(topk, "ffn_moe_topk-2");
    struct ggml_tensor *other = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4);
    ggml_set_name(other, "ffn_moe_logits-2");
    struct ggml_tensor *dense_layer = ggml_view_2d(ctx, argsort, k, n_tokens, argsort->nb[1], 0);
    ggml_set_name(dense_layer, "ffn_moe_topk-0");

    ggml_backend_sched_eval_callback callback = user_callback;
    void *user_data = NULL;
    CHECK(guanaco_hook_install(engine, &callback, &user_data) == 0 && callback != user_callback);
    CHECK(callback(topk, true, user_data));           /* ours (and the user's) */
    CHECK(callback(other, true, user_data));          /* the user's only */
    CHECK(callback(topk, false, user_data));
    CHECK(callback(other, false, user_data));
    CHECK(user_calls_done == 2);
    /* token 0 chose {3,1}, token 1 {3,2}, token 2 {0,3}: expert 3 three times, others once */
    CHECK(guanaco_engine_access_count(engine, 2, 3) == 3);
    CHECK(guanaco_engine_access_count(engine, 2, 1) == 1);
    CHECK(guanaco_engine_access_count(engine, 2, 2) == 1);
    CHECK(guanaco_engine_access_count(engine, 2, 0) == 1);
    CHECK(guanaco_engine_access_count(engine, 1, 3) == 0);
    /* layer 0 has no experts in this model: its router node is not ours, so nothing is counted */
    callback(dense_layer, false, user_data);
    CHECK(guanaco_engine_access_count(engine, 0, 3) == 0);

    guanaco_hook_remove(callback, user_data);
    ggml_free(ctx);
    guanaco_engine_close(engine);
    unlink(path);
}

/* Which weights keep the file's layout: streamed experts, and with --guanaco-reference every expert. */
static void test_file_layout(const char *dir) {
    char path[512];
    snprintf(path, sizeof(path), "%s/unit-layout.gguf", dir);
    CHECK(write_test_gguf(path, true) > 0);
    char a0[] = "tool", on[] = "--guanaco-streaming", off[] = "--guanaco-streaming=off";
    char reference_off[] = "--guanaco-reference=off";
    char *argv_on[] = {a0, on, NULL};
    int argc = 2;
    unsetenv("GUANACO_REFERENCE");
    guanaco_options_parse_argv(&argc, argv_on);
    struct guanaco_engine *engine = NULL;
    CHECK(guanaco_engine_open(path, NULL, 0, false, true, &engine) == 0 && engine != NULL);
    CHECK(guanaco_weight_keeps_file_layout(engine, "blk.1.ffn_up_exps.weight"));
    CHECK(!guanaco_weight_keeps_file_layout(engine, "blk.1.attn_q.weight"));
    CHECK(!guanaco_weight_keeps_file_layout(engine, "blk.1.ffn_up_shexp.weight"));
    CHECK(!guanaco_weight_keeps_file_layout(engine, "output.weight"));
    guanaco_engine_close(engine);

    /* plain llama.cpp: its own choice for every weight, unless the reference layout is asked for */
    char *argv_off[] = {a0, off, NULL};
    argc = 2;
    guanaco_options_parse_argv(&argc, argv_off);
    CHECK(!guanaco_weight_keeps_file_layout(NULL, "blk.1.ffn_up_exps.weight"));
    setenv("GUANACO_REFERENCE", "1", 1);
    CHECK(guanaco_weight_keeps_file_layout(NULL, "blk.1.ffn_up_exps.weight"));
    CHECK(guanaco_weight_keeps_file_layout(NULL, "blk.7.ffn_gate_up_exps.weight"));
    CHECK(!guanaco_weight_keeps_file_layout(NULL, "blk.1.attn_q.weight"));
    CHECK(!guanaco_weight_keeps_file_layout(NULL, "token_embd.weight"));
    char *argv_reference_off[] = {a0, reference_off, NULL};
    argc = 2;
    guanaco_options_parse_argv(&argc, argv_reference_off); /* the flag wins over the environment */
    CHECK(!guanaco_weight_keeps_file_layout(NULL, "blk.1.ffn_up_exps.weight"));
    unsetenv("GUANACO_REFERENCE");
    unlink(path);
}

/* The budget's rules (budget.h), which the engine, guanaco-plan and the simulator all call. */
static void test_budget(void) {
    char rule[32];
    guanaco_auto_budget_margin_rule(false, rule, sizeof(rule));
    CHECK(strcmp(rule, "1 GiB + 10%") == 0);
    guanaco_auto_budget_margin_rule(true, rule, sizeof(rule));
    CHECK(strcmp(rule, "256 MiB + 5%") == 0);
    CHECK(guanaco_read_ahead_allowance(1000) == 500 && guanaco_read_ahead_allowance(0) == 0);
    /* the load-time rule read backwards gives back the budget it was read from */
    struct guanaco_manifest m = {.n_expert = 8, .n_moe_layers = 4, .expert_bytes = 8ull << 30,
                                 .total_bytes = 9ull << 30};
    struct guanaco_auto_budget auto_budget;
    double memory = guanaco_auto_budget_memory_needed(3ull << 30, m.total_bytes - m.expert_bytes, false);
    guanaco_auto_budget((uint64_t)memory + 1, &m, 0, false, false, &auto_budget);
    CHECK(!auto_budget.at_floor && auto_budget.budget >= 3ull << 30 && auto_budget.budget <= (3ull << 30) + 2);
    CHECK(auto_budget.spares == 0);
    /* direct loading: its spare copies (an eighth of the budget, at least 64 MiB) fit beside the budget, both
       where the eighth rules and where the 64 MiB floor does, and the rule still reads backwards (64 layers:
       the floor of a quarter layer, 32 MiB, stays below these budgets) */
    struct guanaco_manifest deep = m;
    deep.n_moe_layers = 64;
    CHECK(guanaco_spare_limit(1ull << 30) == 128ull << 20 && guanaco_spare_limit(100ull << 20) == 64ull << 20);
    uint64_t budgets[] = {3ull << 30, 400ull << 20, 512ull << 20, 600ull << 20};
    for (size_t i = 0; i < sizeof(budgets) / sizeof(budgets[0]); i++) {
        memory = guanaco_auto_budget_memory_needed(budgets[i], m.total_bytes - m.expert_bytes, true);
        struct guanaco_auto_budget plain;
        guanaco_auto_budget((uint64_t)memory + 16, &deep, 0, false, true, &auto_budget);
        guanaco_auto_budget((uint64_t)memory + 16, &deep, 0, false, false, &plain);
        CHECK(auto_budget.budget + guanaco_spare_limit(auto_budget.budget) <= plain.budget);
        CHECK(auto_budget.spares == plain.budget - auto_budget.budget);
        CHECK(auto_budget.budget >= budgets[i] && auto_budget.budget <= budgets[i] + 64);
    }
    /* direct loading with a budget given fits where memory holds the budget, its spares, the hot non-expert
       weights and 256 MiB; bench/soak.sh's 256 MiB limit with a 64 MiB budget does not */
    CHECK(!guanaco_direct_load_fits(256ull << 20, 55ull << 20, 64ull << 20, 819ull << 20));
    CHECK(guanaco_direct_load_fits(0, 55ull << 20, 64ull << 20, 819ull << 20)); /* memory unknown: as before */
    {
        const uint64_t budget = 4ull << 30, weights = 1ull << 30;
        double exact = (double)budget + (double)guanaco_spare_limit(budget) + (double)weights + (double)(256ull << 20);
        CHECK(guanaco_direct_load_fits((uint64_t)exact + 16, weights, budget, 4 * budget));
        CHECK(!guanaco_direct_load_fits((uint64_t)exact - (1ull << 20), weights, budget, 4 * budget));
        /* every expert held: no spares, and a budget beyond the experts pins only them */
        CHECK(guanaco_direct_load_fits((uint64_t)exact - (1ull << 20), weights, budget, budget));
        CHECK(guanaco_direct_load_fits((uint64_t)exact - (1ull << 20), weights, 2 * budget, budget));
    }
    /* the token embedding's rows a token does not read are left to the kernel: the budget gets them */
    struct guanaco_manifest untied = m;
    untied.cold_embedding_bytes = 1ull << 30;
    struct guanaco_auto_budget with_output;
    guanaco_auto_budget(8ull << 30, &m, 0, false, false, &auto_budget);
    guanaco_auto_budget(8ull << 30, &untied, 0, false, false, &with_output);
    CHECK(guanaco_hot_non_expert_bytes(&untied) == 0 && guanaco_hot_non_expert_bytes(&m) == 1ull << 30);
    CHECK(with_output.budget == auto_budget.budget + (1ull << 30));
    /* too little memory: the floor of a quarter layer's experts */
    guanaco_auto_budget(1ull << 30, &m, 0, false, false, &auto_budget);
    CHECK(auto_budget.at_floor && auto_budget.budget == (8ull << 30) / 4 / 4);
    /* the stream buffers fit where memory holds the non-expert weights, the budget, the contexts, 256 MiB for the
       process and them; before the contexts are known, the load-time margin (1 GiB + 10%) stands in for the last
       two */
    const uint64_t gib = 1ull << 30;
    const uint64_t process = 256ull << 20; /* the known margin's fixed part, for the process's own memory */
    CHECK(guanaco_stream_buffers_loan(6 * gib + process, gib, 2 * gib, (int64_t)gib, true, 2 * gib) == 0);
    CHECK(guanaco_stream_buffers_loan(7 * gib, gib, 2 * gib, 0, false, 2 * gib) == 0);
    /* short of room: the budget lends what is missing, up to half of itself */
    CHECK(guanaco_stream_buffers_loan(6 * gib + process, gib, 2 * gib, (int64_t)gib + 1, true, 2 * gib) == 1);
    CHECK(guanaco_stream_buffers_loan(6 * gib, gib, 2 * gib, (int64_t)gib, true, 2 * gib) == process);
    CHECK(guanaco_stream_buffers_loan(6 * gib, gib, 2 * gib, 0, false, 2 * gib) ==
          (uint64_t)((double)(6 * gib) * 0.10)); /* 1 GiB + 10% stand in for the contexts */
    CHECK(guanaco_stream_buffers_loan(6 * gib + process, gib, 2 * gib, (int64_t)(2 * gib), true, 2 * gib) == gib);
    CHECK(guanaco_stream_buffers_loan(6 * gib + process, gib, 2 * gib, (int64_t)(2 * gib) + 1, true, 2 * gib) ==
          GUANACO_STREAM_BUFFERS_REFUSED); /* more than half the budget */
    CHECK(guanaco_stream_buffers_loan(gib, 2 * gib, gib, 0, true, 1) == GUANACO_STREAM_BUFFERS_REFUSED);
    /* staying mapped between prompts takes room for decode's spares too (an eighth of the budget) */
    CHECK(guanaco_stream_buffers_stay(6 * gib + process + gib / 4, gib, 2 * gib, (int64_t)gib, true, 2 * gib));
    CHECK(!guanaco_stream_buffers_stay(6 * gib + process + gib / 4 - 1, gib, 2 * gib, (int64_t)gib, true, 2 * gib));
    CHECK(guanaco_stream_buffers_loan(6 * gib + process + gib / 4 - 1, gib, 2 * gib, (int64_t)gib, true, 2 * gib) ==
          0); /* a prompt still fits without a loan: its spares go back while it streams */
    CHECK(!guanaco_stream_buffers_stay(0, gib, 2 * gib, 0, true, 2 * gib)); /* memory unknown */
    /* the preload share: whole experts in proportion to the budget, capped by n_expert and max_per_layer */
    CHECK(guanaco_preload_count(2ull << 30, 8ull << 30, 8, 0) == 2);
    CHECK(guanaco_preload_count(16ull << 30, 8ull << 30, 8, 0) == 8);
    CHECK(guanaco_preload_count(4ull << 30, 8ull << 30, 8, 3) == 3);
    CHECK(guanaco_preload_count(1, 0, 8, 0) == 0);
}

/* slot_pool: slots carved from 2 MiB-aligned chunks advised for huge pages; a slot given back is taken again
   (empty) before anything new is carved, so churn never adds chunks. */
static void test_slot_pool(void) {
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), huge = 2ull << 20, slot = 3 * page + page;
    struct guanaco_slot_pool pool;
    guanaco_slot_pool_init(&pool, 3 * huge - 1); /* rounded up to 3 huge pages */
    CHECK(pool.chunk_bytes == 3 * huge && pool.n_chunks == 0);
    char *first = guanaco_slot_pool_take(&pool, slot);
    CHECK(first && (uintptr_t)first % huge == 0 && pool.n_chunks == 1);
    if (!first) {
        guanaco_slot_pool_destroy(&pool);
        return;
    }
    char *second = guanaco_slot_pool_take(&pool, slot);
    CHECK(second == first + slot); /* neighbours share huge pages */
    memset(first, 0xab, slot);
    memset(second, 0xcd, slot);
    CHECK(guanaco_slot_pool_owns(&pool, first) && guanaco_slot_pool_owns(&pool, second + slot - 1));
    int on_stack = 0;
    CHECK(!guanaco_slot_pool_owns(&pool, &on_stack) && !guanaco_slot_pool_owns(&pool, first + pool.chunk_bytes));
    if (transparent_huge_pages_available()) {
        CHECK(pool.huge && mapping_advised_huge(first));
    } else {
        printf("  (transparent huge pages are off here: the pool's chunks serve in small pages)\n");
    }
    /* given back: its memory goes (the next taker finds zeros), its range is the next slot of its size */
    CHECK(guanaco_slot_pool_give(&pool, first, slot, false) == 0);
    char *again = guanaco_slot_pool_take(&pool, slot);
    CHECK(again == first && again[0] == 0 && again[slot - 1] == 0 && second[0] == (char)0xcd);
    /* a shorter slot takes part of a given-back range; the rest stays for the next */
    CHECK(guanaco_slot_pool_give(&pool, second, slot, false) == 0);
    char *part = guanaco_slot_pool_take(&pool, 2 * page), *rest = guanaco_slot_pool_take(&pool, 2 * page);
    CHECK(part == second && rest == second + 2 * page);
    /* a range some other mapping replaced (the file mapped over an evicted copy) comes back writable */
    CHECK(mmap(rest, 2 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == rest);
    CHECK(guanaco_slot_pool_give(&pool, rest, 2 * page, true) == 0);
    char *rewritten = guanaco_slot_pool_take(&pool, 2 * page);
    CHECK(rewritten == rest);
    if (rewritten == rest) {
        rest[0] = 1; /* faults (SIGSEGV) if the range stayed read-only */
        CHECK(rest[0] == 1);
    }
    /* churn: take and give back far more than a chunk holds; the chunks stay as many as the most held at once */
    for (int i = 0; i < 1000; i++) {
        char *churn = guanaco_slot_pool_take(&pool, slot);
        CHECK(churn != NULL);
        if (churn) {
            churn[0] = (char)i;
            CHECK(guanaco_slot_pool_give(&pool, churn, slot, false) == 0);
        }
    }
    CHECK(pool.n_chunks == 1);
    /* a slot larger than a chunk gets a chunk of its own */
    char *large = guanaco_slot_pool_take(&pool, 4 * huge + page);
    CHECK(large && (uintptr_t)large % huge == 0 && pool.n_chunks == 2 && guanaco_slot_pool_owns(&pool, large + 4 * huge));
    if (large) {
        memset(large, 1, 4 * huge + page);
    }
    guanaco_slot_pool_destroy(&pool);
    CHECK(pool.n_chunks == 0 && !guanaco_slot_pool_owns(&pool, first));
    printf("slot pool: 2 MiB-aligned chunks%s, given-back slots taken again, no chunk added by churn\n",
           transparent_huge_pages_available() ? " advised for huge pages" : "");
}

/* slot_pool: giving a slot back splits the huge page its neighbour shares, and collapse() rebuilds it with the
   neighbour's bytes; a page left wholly empty is not filled with zeros. */
static void test_slot_pool_rebuild(void) {
    const uint64_t huge = 2ull << 20, half = huge / 2;
    struct guanaco_slot_pool pool;
    guanaco_slot_pool_init(&pool, 2 * huge);
    char *first = guanaco_slot_pool_take(&pool, half), *second = guanaco_slot_pool_take(&pool, half);
    CHECK(first && second == first + half);
    if (!first || !second) {
        guanaco_slot_pool_destroy(&pool);
        return;
    }
    memset(first, 0xab, half);
    memset(second, 0xcd, half);
    if (!pool.huge || mapping_huge_bytes(first) < huge) {
        printf("slot pool rebuild: not checked (no huge page for the slots here: THP off, or none free)\n");
        guanaco_slot_pool_destroy(&pool);
        return;
    }
    CHECK(guanaco_slot_pool_give(&pool, first, half, false) == 0);
    CHECK(mapping_huge_bytes(second) == 0); /* the neighbour's half is in small pages now */
    long rebuilt = guanaco_slot_pool_collapse(&pool);
    if (rebuilt == -EOPNOTSUPP) {
        printf("slot pool rebuild: this kernel has no MADV_COLLAPSE; the split was seen, no rebuild checked\n");
        guanaco_slot_pool_destroy(&pool);
        return;
    }
    CHECK(rebuilt == 1 && pool.n_split == 0);
    CHECK(mapping_huge_bytes(second) == huge);
    bool kept = true;
    for (uint64_t i = 0; i < half; i++) {
        kept = kept && second[i] == (char)0xcd && first[i] == 0;
    }
    CHECK(kept); /* the neighbour's bytes survive, the given-back half reads as zeros */
    CHECK(guanaco_slot_pool_collapse(&pool) == 0); /* nothing split since */
    /* the other half goes too: the page is wholly empty, and stays so rather than coming back as zeros */
    CHECK(guanaco_slot_pool_give(&pool, second, half, false) == 0);
    CHECK(guanaco_slot_pool_collapse(&pool) == 0 && mapping_huge_bytes(first) == 0);
    first[0] = 1; /* the next slot there: a 2 MiB page again where the kernel freed the empty page table */
    bool huge_again = mapping_huge_bytes(first) == huge;
    guanaco_slot_pool_destroy(&pool);
    printf("slot pool rebuild: a given-back slot split its neighbour's huge page; collapse rebuilt it, bytes kept; "
           "a wholly empty page stayed empty, and %s\n",
           huge_again ? "refilled as a 2 MiB page" : "refills in small pages (this kernel keeps its page table)");
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    test_expert_names();
    test_options();
    test_budget();
    test_slot_pool();
    test_slot_pool_rebuild();
    test_manifest(dir);
    test_manifest_keys(dir);
    test_engine_and_hook(dir);
    test_file_layout(dir);
    return check_summary();
}
