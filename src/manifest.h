/*
 * manifest.h - owns the map from a (possibly sharded) GGUF model to its
 * expert slices: which tensors hold experts, in which shard and at which file
 * offset, and how many bytes one expert takes in each. Built from the gguf
 * API's metadata only; no tensor data is read.
 */
#ifndef GUANACO_MANIFEST_H
#define GUANACO_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "ggml.h"

struct guanaco_expert_tensor {
    char name[GGML_MAX_NAME];
    int layer;
    int shard;              /* index into guanaco_manifest.shard_paths */
    uint64_t file_offset;   /* absolute offset of the tensor's first byte in its shard */
    uint64_t nbytes;        /* whole tensor */
    uint64_t expert_stride; /* bytes of one expert: expert e is [e*stride, (e+1)*stride) */
    enum ggml_type type;
};

/* Any tensor of the file, expert or not: where its bytes lie, so that later passes need not parse the GGUF again
   (a parse reads the whole vocabulary: 0.1 s of a warm start on a Qwen3 model) */
struct guanaco_file_tensor {
    char name[GGML_MAX_NAME];
    int shard;
    uint64_t file_offset;
    uint64_t nbytes;
};

struct guanaco_manifest {
    char arch[64];
    /* For an MoE model (n_tensors > 0) these are checked at load: n_layer from 1
       to the blocks the file has tensors for (more for an MTP block past
       block_count), n_expert equal to every expert tensor's count, n_expert_used
       from 1 to n_expert. A dense model keeps -1 where a key is missing or does
       not fit, and Guanaco does not use them. */
    int n_layer;        /* block_count */
    int n_expert;       /* expert_count */
    int n_expert_used;  /* expert_used_count; its largest element when it is a per-layer array */
    int n_moe_layers;   /* layers with at least one *_exps tensor */
    int n_shards;
    char **shard_paths;
    uint64_t *shard_sizes;
    struct guanaco_expert_tensor *tensors; /* sorted by (layer, name) */
    size_t n_tensors;
    struct guanaco_file_tensor *file_tensors; /* every tensor, in file order per shard */
    size_t n_file_tensors;
    uint64_t expert_bytes;  /* sum of nbytes over expert tensors */
    uint64_t total_bytes;   /* sum of all tensor bytes */
    /* token_embd.weight where the model has its own output.weight: a prompt reads only its tokens' rows, so the
       rest may leave the page cache at no cost (the stream buffers' rule, budget.h); 0 where the embedding is
       also the output matrix, which every ubatch reads whole */
    uint64_t cold_embedding_bytes;
};

/*
 * Read the layout of the model at `path` (or of `n_split_paths` shards).
 * Returns 0, or a negative errno after printing why: -ENOENT (missing),
 * -EINVAL (not GGUF, inconsistent expert shapes, a block_count,
 * expert_count or expert_used_count an MoE model cannot have; the message
 * names the key and its value as written, never truncated to an int), -EIO
 * (truncated file).
 * A dense model is success with n_tensors == 0.
 */
int guanaco_manifest_load(const char *path, const char *const *split_paths, size_t n_split_paths,
                          struct guanaco_manifest *out);

void guanaco_manifest_free(struct guanaco_manifest *manifest);

/* The expert tensor called `name`, or NULL. O(log n). */
const struct guanaco_expert_tensor *guanaco_manifest_find(const struct guanaco_manifest *manifest,
                                                          const char *name);

/* True when a tensor name has the shape of a streamed expert tensor: blk.N.*_exps.weight */
int guanaco_tensor_name_is_expert(const char *name, int *layer);

#endif
