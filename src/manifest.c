/*
 * manifest.c - owns reading a model's expert layout from GGUF metadata.
 *
 * Safest rule for which layers are MoE (REFERENCE.md section 3): a layer is
 * MoE iff it has *_exps tensors, because sparse architectures (leading dense
 * blocks, interleaving, per-layer types) disagree on how to say it in KV.
 */
#include "manifest.h"
#include "log.h"

#include "gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int guanaco_tensor_name_is_expert(const char *name, int *layer) {
    if (strncmp(name, "blk.", 4) != 0) {
        return 0;
    }
    char *end = NULL;
    long parsed = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || parsed < 0 || parsed > 1000000) {
        return 0;
    }
    /* "_exps." must close the tensor's base name: ffn_gate_exps.weight, ffn_down_exps.bias */
    const char *marker = strstr(end, "_exps.");
    if (!marker || strchr(marker + 6, '.') != NULL) {
        return 0;
    }
    if (layer) {
        *layer = (int)parsed;
    }
    return 1;
}

/* Reads an integer KV of any integer GGUF type; returns -1 when absent or not an integer. */
static long long read_integer_key(const struct gguf_context *gguf, const char *key) {
    int64_t id = gguf_find_key(gguf, key);
    if (id < 0) {
        return -1;
    }
    switch (gguf_get_kv_type(gguf, id)) {
    case GGUF_TYPE_UINT8: return gguf_get_val_u8(gguf, id);
    case GGUF_TYPE_INT8: return gguf_get_val_i8(gguf, id);
    case GGUF_TYPE_UINT16: return gguf_get_val_u16(gguf, id);
    case GGUF_TYPE_INT16: return gguf_get_val_i16(gguf, id);
    case GGUF_TYPE_UINT32: return gguf_get_val_u32(gguf, id);
    case GGUF_TYPE_INT32: return gguf_get_val_i32(gguf, id);
    case GGUF_TYPE_UINT64: return (long long)gguf_get_val_u64(gguf, id);
    case GGUF_TYPE_INT64: return gguf_get_val_i64(gguf, id);
    default: return -1;
    }
}

static int compare_tensors(const void *a, const void *b) {
    const struct guanaco_expert_tensor *x = a, *y = b;
    if (x->layer != y->layer) {
        return x->layer < y->layer ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

static int read_model_keys(const struct gguf_context *gguf, const char *path, struct guanaco_manifest *out) {
    int64_t arch_id = gguf_find_key(gguf, "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(gguf, arch_id) != GGUF_TYPE_STRING) {
        guanaco_log_error("%s: no general.architecture key; not a model GGUF", path);
        return -EINVAL;
    }
    snprintf(out->arch, sizeof(out->arch), "%s", gguf_get_val_str(gguf, arch_id));
    char key[128];
    snprintf(key, sizeof(key), "%s.block_count", out->arch);
    out->n_layer = (int)read_integer_key(gguf, key);
    snprintf(key, sizeof(key), "%s.expert_count", out->arch);
    out->n_expert = (int)read_integer_key(gguf, key);
    snprintf(key, sizeof(key), "%s.expert_used_count", out->arch);
    out->n_expert_used = (int)read_integer_key(gguf, key);
    return 0;
}

/* Adds the expert tensors of one shard; checks every tensor's bytes lie inside the file. */
static int add_shard_tensors(struct gguf_context *gguf, struct ggml_context *meta, int shard,
                             struct guanaco_manifest *out, size_t *capacity) {
    const char *path = out->shard_paths[shard];
    uint64_t data_offset = gguf_get_data_offset(gguf);
    int64_t n = gguf_get_n_tensors(gguf);
    for (int64_t i = 0; i < n; i++) {
        const char *name = gguf_get_tensor_name(gguf, i);
        uint64_t offset = data_offset + gguf_get_tensor_offset(gguf, i);
        uint64_t nbytes = gguf_get_tensor_size(gguf, i);
        if (offset + nbytes < offset || offset + nbytes > out->shard_sizes[shard]) {
            guanaco_log_error("%s: tensor %s needs bytes up to %llu but the file has %llu: truncated or corrupt",
                              path, name, (unsigned long long)(offset + nbytes),
                              (unsigned long long)out->shard_sizes[shard]);
            return -EIO;
        }
        out->total_bytes += nbytes;
        int layer;
        if (!guanaco_tensor_name_is_expert(name, &layer)) {
            continue;
        }
        const struct ggml_tensor *t = ggml_get_tensor(meta, name);
        int dims = t ? ggml_n_dims(t) : 0;
        int64_t experts_in_tensor = dims > 0 ? t->ne[dims - 1] : 0;
        if (out->n_expert <= 0 || experts_in_tensor != out->n_expert || nbytes % (uint64_t)out->n_expert != 0) {
            guanaco_log_error("%s: expert tensor %s has %lld experts in its last dimension but the model "
                              "declares %d", path, name, (long long)experts_in_tensor, out->n_expert);
            return -EINVAL;
        }
        if (out->n_tensors == *capacity) {
            size_t grown = *capacity ? *capacity * 2 : 64;
            struct guanaco_expert_tensor *tensors = realloc(out->tensors, grown * sizeof(*tensors));
            if (!tensors) {
                return -ENOMEM;
            }
            out->tensors = tensors;
            *capacity = grown;
        }
        struct guanaco_expert_tensor *e = &out->tensors[out->n_tensors++];
        memset(e, 0, sizeof(*e));
        snprintf(e->name, sizeof(e->name), "%s", name);
        e->layer = layer;
        e->shard = shard;
        e->file_offset = offset;
        e->nbytes = nbytes;
        e->expert_stride = nbytes / (uint64_t)out->n_expert;
        e->type = t->type;
        out->expert_bytes += nbytes;
    }
    return 0;
}

static int open_shard(const char *path, uint64_t *size, struct gguf_context **gguf, struct ggml_context **meta) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        guanaco_log_error("%s: %s", path, strerror(err));
        return -err;
    }
    *size = (uint64_t)st.st_size;
    struct gguf_init_params params = {.no_alloc = true, .ctx = meta};
    *gguf = gguf_init_from_file(path, params);
    if (!*gguf) {
        guanaco_log_error("%s: not a readable GGUF file", path);
        return -EINVAL;
    }
    return 0;
}

int guanaco_manifest_load(const char *path, const char *const *split_paths, size_t n_split_paths,
                          struct guanaco_manifest *out) {
    memset(out, 0, sizeof(*out));
    size_t n_shards = n_split_paths ? n_split_paths : 1;
    out->shard_paths = calloc(n_shards, sizeof(*out->shard_paths));
    out->shard_sizes = calloc(n_shards, sizeof(*out->shard_sizes));
    if (!out->shard_paths || !out->shard_sizes) {
        guanaco_manifest_free(out);
        return -ENOMEM;
    }
    out->n_shards = (int)n_shards;
    size_t capacity = 0;
    int err = 0;
    for (size_t s = 0; s < n_shards && err == 0; s++) {
        out->shard_paths[s] = strdup(n_split_paths ? split_paths[s] : path);
        if (!out->shard_paths[s]) {
            err = -ENOMEM;
            break;
        }
        struct gguf_context *gguf = NULL;
        struct ggml_context *meta = NULL;
        err = open_shard(out->shard_paths[s], &out->shard_sizes[s], &gguf, &meta);
        if (err == 0 && s == 0) {
            err = read_model_keys(gguf, out->shard_paths[s], out);
        }
        if (err == 0) {
            err = add_shard_tensors(gguf, meta, (int)s, out, &capacity);
        }
        if (meta) {
            ggml_free(meta);
        }
        if (gguf) {
            gguf_free(gguf);
        }
    }
    if (err != 0) {
        guanaco_manifest_free(out);
        return err;
    }
    qsort(out->tensors, out->n_tensors, sizeof(*out->tensors), compare_tensors);
    int last_layer = -1;
    for (size_t i = 0; i < out->n_tensors; i++) {
        if (out->tensors[i].layer != last_layer) {
            out->n_moe_layers++;
            last_layer = out->tensors[i].layer;
        }
        if (out->tensors[i].layer >= out->n_layer) {
            out->n_layer = out->tensors[i].layer + 1; /* e.g. an MTP block past block_count */
        }
    }
    return 0;
}

void guanaco_manifest_free(struct guanaco_manifest *manifest) {
    for (int s = 0; manifest->shard_paths && s < manifest->n_shards; s++) {
        free(manifest->shard_paths[s]);
    }
    free(manifest->shard_paths);
    free(manifest->shard_sizes);
    free(manifest->tensors);
    memset(manifest, 0, sizeof(*manifest));
}

const struct guanaco_expert_tensor *guanaco_manifest_find(const struct guanaco_manifest *manifest,
                                                          const char *name) {
    int layer;
    if (!guanaco_tensor_name_is_expert(name, &layer)) {
        return NULL;
    }
    struct guanaco_expert_tensor key;
    key.layer = layer;
    snprintf(key.name, sizeof(key.name), "%s", name);
    return bsearch(&key, manifest->tensors, manifest->n_tensors, sizeof(key), compare_tensors);
}
