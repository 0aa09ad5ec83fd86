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
#include <limits.h>
#include <stdbool.h>
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
    /* "_exps.weight" must close the name: ffn_gate_exps.weight, ffn_gate_up_exps.weight. An expert's bias
       (gpt-oss: ffn_down_exps.bias, a few KB per expert) stays with the non-expert weights: ADD_ID reads it
       straight from the mapping without asking where the expert is, so a streamed one was a major fault at
       each use after its eviction, outside the stall (96 per token on the 8-layer gpt-oss shape at 25%), and
       its slot copy went unread. */
    const char *marker = strstr(end, "_exps.");
    if (!marker || strcmp(marker + 6, "weight") != 0) {
        return 0;
    }
    if (layer) {
        *layer = (int)parsed;
    }
    return 1;
}

/*
 * One integer key of the model as the file has it, never truncated: a
 * 64-bit value that an int would wrap (2^32 + 8 read as 8) must be refused,
 * not believed. expert_used_count may also be an array (one per layer).
 */
struct integer_key {
    char name[128];     /* e.g. "qwen3moe.expert_count" */
    bool present;
    bool integer;       /* present and every value an integer */
    bool array;         /* written as an array, one value per layer */
    long long min, max; /* over the values; u64 values above LLONG_MAX read as LLONG_MAX */
    char text[48];      /* the value as written, for messages: 4294967295, or [2, 2, 0] */
};

static long long integer_value(const struct gguf_context *gguf, int64_t id, enum gguf_type type, size_t index,
                               bool array, bool *ok) {
    *ok = true;
    const void *data = array ? gguf_get_arr_data(gguf, id) : NULL;
    switch (type) {
    case GGUF_TYPE_UINT8: return array ? ((const uint8_t *)data)[index] : gguf_get_val_u8(gguf, id);
    case GGUF_TYPE_INT8: return array ? ((const int8_t *)data)[index] : gguf_get_val_i8(gguf, id);
    case GGUF_TYPE_UINT16: return array ? ((const uint16_t *)data)[index] : gguf_get_val_u16(gguf, id);
    case GGUF_TYPE_INT16: return array ? ((const int16_t *)data)[index] : gguf_get_val_i16(gguf, id);
    case GGUF_TYPE_UINT32: return array ? ((const uint32_t *)data)[index] : gguf_get_val_u32(gguf, id);
    case GGUF_TYPE_INT32: return array ? ((const int32_t *)data)[index] : gguf_get_val_i32(gguf, id);
    case GGUF_TYPE_UINT64: {
        uint64_t v = array ? ((const uint64_t *)data)[index] : gguf_get_val_u64(gguf, id);
        return v > (uint64_t)LLONG_MAX ? LLONG_MAX : (long long)v;
    }
    case GGUF_TYPE_INT64: return array ? ((const int64_t *)data)[index] : gguf_get_val_i64(gguf, id);
    default: *ok = false; return 0;
    }
}

static void read_integer_key(const struct gguf_context *gguf, const char *arch, const char *suffix,
                             struct integer_key *key) {
    memset(key, 0, sizeof(*key));
    snprintf(key->name, sizeof(key->name), "%s.%s", arch, suffix);
    int64_t id = gguf_find_key(gguf, key->name);
    if (id < 0) {
        return;
    }
    key->present = true;
    enum gguf_type type = gguf_get_kv_type(gguf, id);
    bool array = type == GGUF_TYPE_ARRAY;
    key->array = array;
    size_t n = array ? gguf_get_arr_n(gguf, id) : 1;
    if (array) {
        type = gguf_get_arr_type(gguf, id);
    }
    size_t used = 0;
    if (array) {
        used += (size_t)snprintf(key->text, sizeof(key->text), "[");
    }
    key->integer = n > 0;
    for (size_t i = 0; i < n && key->integer; i++) {
        bool ok;
        long long v = integer_value(gguf, id, type, i, array, &ok);
        if (!ok) {
            key->integer = false;
            break;
        }
        if (i == 0 || v < key->min) key->min = v;
        if (i == 0 || v > key->max) key->max = v;
        if (used < sizeof(key->text)) {
            if (type == GGUF_TYPE_UINT64) {
                uint64_t raw = array ? ((const uint64_t *)gguf_get_arr_data(gguf, id))[i] : gguf_get_val_u64(gguf, id);
                used += (size_t)snprintf(key->text + used, sizeof(key->text) - used, "%s%llu", i ? ", " : "",
                                         (unsigned long long)raw);
            } else {
                used += (size_t)snprintf(key->text + used, sizeof(key->text) - used, "%s%lld", i ? ", " : "", v);
            }
        }
    }
    if (array && used < sizeof(key->text)) {
        snprintf(key->text + used, sizeof(key->text) - used, "]");
    }
    if (!key->integer) {
        snprintf(key->text, sizeof(key->text), "%s (not an integer)", array ? "an array" : gguf_type_name(type));
    }
}

/* The keys Guanaco relies on, read from the first shard. */
struct model_keys {
    struct integer_key block_count, expert_count, expert_used_count;
};

static int compare_tensors(const void *a, const void *b) {
    const struct guanaco_expert_tensor *x = a, *y = b;
    if (x->layer != y->layer) {
        return x->layer < y->layer ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

static int read_model_keys(const struct gguf_context *gguf, const char *path, struct guanaco_manifest *out,
                           struct model_keys *keys) {
    int64_t arch_id = gguf_find_key(gguf, "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(gguf, arch_id) != GGUF_TYPE_STRING) {
        guanaco_log_error("%s: no general.architecture key; not a model GGUF", path);
        return -EINVAL;
    }
    snprintf(out->arch, sizeof(out->arch), "%s", gguf_get_val_str(gguf, arch_id));
    read_integer_key(gguf, out->arch, "block_count", &keys->block_count);
    read_integer_key(gguf, out->arch, "expert_count", &keys->expert_count);
    read_integer_key(gguf, out->arch, "expert_used_count", &keys->expert_used_count);
    /* Kept for dense models too, which Guanaco passes through untouched; -1 when absent or out of an int. */
    out->n_layer = keys->block_count.integer && keys->block_count.min == keys->block_count.max &&
                           keys->block_count.max >= 0 && keys->block_count.max <= INT_MAX
                       ? (int)keys->block_count.max : -1;
    out->n_expert = keys->expert_count.integer && keys->expert_count.min == keys->expert_count.max &&
                            keys->expert_count.max >= 0 && keys->expert_count.max <= INT_MAX
                        ? (int)keys->expert_count.max : -1;
    out->n_expert_used = -1;
    return 0;
}

/*
 * The keys an MoE model must get right for Guanaco (and llama.cpp) to run it:
 * block_count from 1 to the blocks the file has tensors for, expert_used_count
 * from 1 to expert_count (as an array: each element from 0, for dense layers,
 * to expert_count, and the largest at least 1). llama.cpp
 * asserts on the same values, so they end here as an error naming the key.
 * expert_count was checked against every expert tensor already.
 */
static int check_moe_keys(const char *path, const struct model_keys *keys, int max_block,
                          struct guanaco_manifest *out) {
    const struct integer_key *blocks = &keys->block_count, *used = &keys->expert_used_count;
    if (!blocks->present || !blocks->integer || blocks->min != blocks->max) {
        guanaco_log_error("%s: %s is %s; an MoE model needs it, a whole number of blocks", path, blocks->name,
                          blocks->present ? blocks->text : "missing");
        return -EINVAL;
    }
    if (blocks->max < 1 || blocks->max > (long long)max_block + 1) {
        guanaco_log_error("%s: %s is %s, but the file has tensors for blocks 0 to %d: it must be from 1 to %d",
                          path, blocks->name, blocks->text, max_block, max_block + 1);
        return -EINVAL;
    }
    /* An array may say 0 for a dense layer, as llama.cpp allows; some layer must route to an expert. */
    long long least = used->array ? 0 : 1;
    if (!used->present || !used->integer || used->min < least || used->max < 1 || used->max > out->n_expert) {
        guanaco_log_error("%s: %s is %s; it must be from 1 to %s (%d): the experts each token is routed to",
                          path, used->name, used->present ? used->text : "missing", keys->expert_count.name,
                          out->n_expert);
        return -EINVAL;
    }
    out->n_layer = (int)blocks->max;
    /* With one count per layer, the largest: the most ids a layer's router hands the hook. */
    out->n_expert_used = (int)used->max;
    return 0;
}

/* Adds the expert tensors of one shard; checks every tensor's bytes lie inside the file. */
static int add_shard_tensors(struct gguf_context *gguf, struct ggml_context *meta, int shard,
                             const struct model_keys *keys, struct guanaco_manifest *out, size_t *capacity,
                             int *max_block, bool *has_output) {
    const char *path = out->shard_paths[shard];
    uint64_t data_offset = gguf_get_data_offset(gguf);
    int64_t n = gguf_get_n_tensors(gguf);
    if (n > 0) {
        struct guanaco_file_tensor *grown = realloc(out->file_tensors, (out->n_file_tensors + (size_t)n) * sizeof(*grown));
        if (!grown) {
            return -ENOMEM;
        }
        out->file_tensors = grown;
    }
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
        struct guanaco_file_tensor *f = &out->file_tensors[out->n_file_tensors++];
        snprintf(f->name, sizeof(f->name), "%s", name);
        f->shard = shard;
        f->file_offset = offset;
        f->nbytes = nbytes;
        if (strcmp(name, "token_embd.weight") == 0) {
            out->cold_embedding_bytes = nbytes; /* zeroed below when no output.weight takes the output's part */
        }
        *has_output = *has_output || strcmp(name, "output.weight") == 0;
        char *end = NULL;
        long block = strncmp(name, "blk.", 4) == 0 ? strtol(name + 4, &end, 10) : -1;
        if (block >= 0 && block <= 1000000 && end != name + 4 && *end == '.' && block > *max_block) {
            *max_block = (int)block;
        }
        int layer;
        if (!guanaco_tensor_name_is_expert(name, &layer)) {
            continue;
        }
        const struct ggml_tensor *t = ggml_get_tensor(meta, name);
        int dims = t ? ggml_n_dims(t) : 0;
        int64_t experts_in_tensor = dims > 0 ? t->ne[dims - 1] : 0;
        const struct integer_key *count = &keys->expert_count;
        if (!count->integer || count->min != count->max || out->n_expert <= 0 ||
            experts_in_tensor != out->n_expert || nbytes % (uint64_t)out->n_expert != 0) {
            guanaco_log_error("%s: expert tensor %s has %lld experts in its last dimension but the model "
                              "declares %s = %s", path, name, (long long)experts_in_tensor, count->name,
                              count->present ? count->text : "nothing (the key is missing)");
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
    int err = 0, max_block = -1;
    bool has_output = false;
    struct model_keys keys;
    memset(&keys, 0, sizeof(keys));
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
            err = read_model_keys(gguf, out->shard_paths[s], out, &keys);
        }
        if (err == 0) {
            err = add_shard_tensors(gguf, meta, (int)s, &keys, out, &capacity, &max_block, &has_output);
        }
        if (meta) {
            ggml_free(meta);
        }
        if (gguf) {
            gguf_free(gguf);
        }
    }
    if (err == 0 && out->n_tensors > 0) {
        err = check_moe_keys(out->shard_paths[0], &keys, max_block, out);
    }
    if (!has_output) {
        out->cold_embedding_bytes = 0; /* tied: the embedding is the output matrix too */
    }
    if (err != 0) {
        guanaco_manifest_free(out);
        return err;
    }
    if (out->n_tensors > 1) { /* qsort of NULL, 0 is undefined (UBSan says so) */
        qsort(out->tensors, out->n_tensors, sizeof(*out->tensors), compare_tensors);
    }
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
    free(manifest->file_tensors);
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
