/*
 * gguf_seeds.c - writes the manifest harness's seed corpus: a few GGUF files
 * of a few KiB each, with the keys and tensor names Guanaco reads (an MoE
 * model of two blocks and four experts in F32 and Q4_0, expert_used_count as
 * a per-layer array, a 64-bit block_count, and a dense model). guanaco-mkmodel
 * writes models llama.cpp can run, so each carries a vocabulary of 600 KB or
 * more, which would make the fuzzer's inputs a hundred times larger than the
 * parts of the file the manifest reads.
 *
 * usage: fuzz_gguf_seeds OUT_DIR
 */
#include "ggml.h"
#include "gguf.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum seed_kind { SEED_MOE, SEED_MOE_ARRAY_USED, SEED_MOE_Q4_0, SEED_MOE_U64_BLOCKS, SEED_DENSE };

static struct ggml_tensor *add_tensor(struct gguf_context *gguf, struct ggml_context *ctx, enum ggml_type type,
                                      const char *name, int64_t ne0, int64_t ne1, int64_t ne2) {
    struct ggml_tensor *t = ne2 > 1   ? ggml_new_tensor_3d(ctx, type, ne0, ne1, ne2)
                          : ne1 > 1   ? ggml_new_tensor_2d(ctx, type, ne0, ne1)
                                      : ggml_new_tensor_1d(ctx, type, ne0);
    ggml_set_name(t, name);
    /* Deterministic bytes: the seeds are committed, and a rewrite must not change them. */
    unsigned char *bytes = t->data;
    for (size_t i = 0; i < ggml_nbytes(t); i++) {
        bytes[i] = (unsigned char)(i * 31u + 7u);
    }
    gguf_add_tensor(gguf, t);
    return t;
}

static int write_seed(const char *dir, const char *file, enum seed_kind kind) {
    struct ggml_init_params params = {.mem_size = 1 << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(params);
    struct gguf_context *gguf = gguf_init_empty();
    const bool moe = kind != SEED_DENSE;
    const char *arch = moe ? "qwen3moe" : "llama";
    char key[128];
    gguf_set_val_str(gguf, "general.architecture", arch);
    snprintf(key, sizeof(key), "%s.block_count", arch);
    if (kind == SEED_MOE_U64_BLOCKS) {
        gguf_set_val_u64(gguf, key, 2);
    } else {
        gguf_set_val_u32(gguf, key, 2);
    }
    if (moe) {
        snprintf(key, sizeof(key), "%s.expert_count", arch);
        gguf_set_val_u32(gguf, key, 4);
        snprintf(key, sizeof(key), "%s.expert_used_count", arch);
        if (kind == SEED_MOE_ARRAY_USED) {
            const int32_t used[2] = {0, 2};
            gguf_set_arr_data(gguf, key, GGUF_TYPE_INT32, used, 2);
        } else {
            gguf_set_val_u32(gguf, key, 2);
        }
    }
    const enum ggml_type expert_type = kind == SEED_MOE_Q4_0 ? GGML_TYPE_Q4_0 : GGML_TYPE_F32;
    const int64_t embd = kind == SEED_MOE_Q4_0 ? 32 : 8;
    add_tensor(gguf, ctx, GGML_TYPE_F32, "token_embd.weight", embd, 16, 1);
    for (int block = 0; block < 2; block++) {
        char name[GGML_MAX_NAME];
        snprintf(name, sizeof(name), "blk.%d.attn_norm.weight", block);
        add_tensor(gguf, ctx, GGML_TYPE_F32, name, embd, 1, 1);
        if (!moe || (kind == SEED_MOE_ARRAY_USED && block == 0)) {
            snprintf(name, sizeof(name), "blk.%d.ffn_up.weight", block);
            add_tensor(gguf, ctx, GGML_TYPE_F32, name, embd, 4, 1);
            continue;
        }
        snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp.weight", block);
        add_tensor(gguf, ctx, GGML_TYPE_F32, name, embd, 4, 1);
        static const char *const experts[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
        for (int e = 0; e < 3; e++) {
            snprintf(name, sizeof(name), "blk.%d.%s.weight", block, experts[e]);
            add_tensor(gguf, ctx, expert_type, name, embd, 4, 4);
        }
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    bool ok = gguf_write_to_file(gguf, path, false);
    gguf_free(gguf);
    ggml_free(ctx);
    if (!ok) {
        fprintf(stderr, "fuzz_gguf_seeds: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_gguf_seeds OUT_DIR\n");
        return 2;
    }
    int failed = 0;
    failed |= write_seed(argv[1], "moe.gguf", SEED_MOE);
    failed |= write_seed(argv[1], "moe-array-used.gguf", SEED_MOE_ARRAY_USED);
    failed |= write_seed(argv[1], "moe-q4_0.gguf", SEED_MOE_Q4_0);
    failed |= write_seed(argv[1], "moe-u64-blocks.gguf", SEED_MOE_U64_BLOCKS);
    failed |= write_seed(argv[1], "dense.gguf", SEED_DENSE);
    return failed;
}
