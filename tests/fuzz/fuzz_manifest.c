/*
 * fuzz_manifest.c - libFuzzer harness for a model's expert layout
 * (src/manifest.c): the input is a whole GGUF file, read by
 * guanaco_manifest_load through ggml's gguf API (built from the pinned
 * llama.cpp with the same instrumentation, so the fuzzer also steers through
 * gguf.cpp's parser) and then through Guanaco's own checks of the MoE keys and
 * tensor extents.
 *
 * Besides "no crash, leak, hang or undefined behaviour", a load that succeeds
 * must describe a layout the engine can trust: every expert tensor inside
 * the file, split evenly into n_expert experts, on a layer below n_layer,
 * sorted and findable by name, and 1 <= n_expert_used <= n_expert. A failure
 * must be a negative errno.
 */
#include "fuzz_file.h"

#include "ggml.h"
#include "manifest.h"

#include <string.h>

static void quiet_ggml_log(enum ggml_log_level level, const char *text, void *user_data) {
    (void)level, (void)text, (void)user_data;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct fuzz_file model;
    fuzz_file_init(&model, "fuzz-model.gguf");
    ggml_log_set(quiet_ggml_log, NULL); /* gguf's complaints about bad input are expected, not news */
    fuzz_file_set(&model, data, size);

    struct guanaco_manifest manifest;
    int err = guanaco_manifest_load(model.path, NULL, 0, &manifest);
    if (err != 0) {
        FUZZ_CHECK(err < 0);
        FUZZ_CHECK(manifest.tensors == NULL && manifest.n_tensors == 0);
        return 0;
    }
    FUZZ_CHECK(manifest.n_shards == 1 && manifest.shard_sizes[0] == size);
    if (manifest.n_tensors > 0) {
        FUZZ_CHECK(manifest.n_expert >= 1);
        FUZZ_CHECK(manifest.n_expert_used >= 1 && manifest.n_expert_used <= manifest.n_expert);
        FUZZ_CHECK(manifest.n_layer >= 1 && manifest.n_moe_layers >= 1 && manifest.n_moe_layers <= manifest.n_layer);
    }
    uint64_t expert_bytes = 0;
    for (size_t i = 0; i < manifest.n_tensors; i++) {
        const struct guanaco_expert_tensor *t = &manifest.tensors[i];
        FUZZ_CHECK(t->shard == 0);
        FUZZ_CHECK(t->file_offset <= size && t->nbytes <= size - t->file_offset);
        FUZZ_CHECK(t->expert_stride * (uint64_t)manifest.n_expert == t->nbytes);
        FUZZ_CHECK(t->layer >= 0 && t->layer < manifest.n_layer);
        if (i > 0) {
            const struct guanaco_expert_tensor *p = &manifest.tensors[i - 1];
            FUZZ_CHECK(p->layer < t->layer || (p->layer == t->layer && strcmp(p->name, t->name) < 0));
        }
        FUZZ_CHECK(guanaco_manifest_find(&manifest, t->name) == t);
        expert_bytes += t->nbytes;
    }
    FUZZ_CHECK(expert_bytes == manifest.expert_bytes && manifest.expert_bytes <= manifest.total_bytes);
    guanaco_manifest_free(&manifest);
    return 0;
}
