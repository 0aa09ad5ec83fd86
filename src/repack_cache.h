/*
 * repack_cache.h - owns the repack cache: a file beside a GGUF shard that
 * holds its streamed expert tensors already in the layout ggml-cpu's
 * repacked kernels compute from (expert_repack.h), so that an expert read
 * from it needs no repack. Repacking a miss as it lands costs 0.16-0.49
 * CPU-s per GB read (Q4_0, Q4_K), more than the faster kernels save under a
 * budget on two cores (bench/COMPUTE_PARITY.md); read from this file it costs
 * nothing.
 *
 * The cache mirrors the shard: a repacked tensor's bytes lie at the same
 * offsets as in the GGUF (a repacked tensor has the size of the original),
 * and everything else is a hole, so it takes disk space for the repacked
 * tensors alone and any read of the GGUF is the same read of the cache. A
 * trailer after the mirrored range, written last by guanaco-repack-cache,
 * names the GGUF it was made from (size and modification time) and the
 * tensors it holds (their count, bytes and a hash of their names, in the
 * manifest's order).
 * A cache whose trailer does not match, or that is not a regular file, is
 * never used; the engine also compares one expert per shard with its own
 * repack of the GGUF's bytes before it trusts the file (engine.c).
 */
#ifndef GUANACO_REPACK_CACHE_H
#define GUANACO_REPACK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ggml.h"

struct ggml_tensor;
struct guanaco_expert_repack;
struct guanaco_expert_tensor;
struct guanaco_manifest;

#define GUANACO_REPACK_CACHE_SUFFIX ".guanaco-repack"
#define GUANACO_REPACK_CACHE_NAMES_SEED 0xcbf29ce484222325ull /* FNV-1a 64's offset basis */

/* What a cache must hold for a shard: the tensors ggml repacks, in the manifest's order. */
struct guanaco_repack_cache_contents {
    uint32_t n_tensors;
    uint64_t names_hash; /* guanaco_repack_cache_hash_name over them, from GUANACO_REPACK_CACHE_NAMES_SEED */
    uint64_t bytes;      /* their bytes */
};

/*
 * Whether --guanaco-repack auto reads experts of this type from a cache
 * under a budget: where repacked experts from a cache measured at least level
 * with the file's layout (8-layer models, replayed routing, 5 reps, paired
 * decode at 25%: Q4_0 1.08x, Q4_K 1.06x, MXFP4 1.04x, prompts 1.16-1.22x;
 * MXFP4 1.15x at 50%; once prompts streamed from the cache;
 * bench/COMPUTE_PARITY.md).
 * IQ4_NL, not measured, stays in the file's layout. --guanaco-repack on reads
 * any.
 */
bool guanaco_repack_cache_pays(enum ggml_type type);

/* The hash of the names so far, extended by `name` (its bytes and its NUL). */
uint64_t guanaco_repack_cache_hash_name(uint64_t hash, const char *name);

/* Whether shard `shard`'s cache holds manifest tensor i (`tensors` its ggml tensors, parallel to
   manifest->tensors): one of the shard's, and one ggml repacks on this CPU. */
bool guanaco_repack_cache_holds(const struct guanaco_manifest *manifest, const struct ggml_tensor *const *tensors,
                                const struct guanaco_expert_repack *repack, int shard, size_t i);

/*
 * What shard `shard`'s cache must hold: the manifest's expert tensors of
 * that shard that ggml repacks on this CPU (guanaco_expert_repack_applies),
 * given as ggml tensors parallel to manifest->tensors. n_tensors 0: nothing
 * of this shard repacks, and it has no cache.
 */
void guanaco_repack_cache_expect(const struct guanaco_manifest *manifest, const struct ggml_tensor *const *tensors,
                                 const struct guanaco_expert_repack *repack, int shard,
                                 struct guanaco_repack_cache_contents *out);

/*
 * The check of an open cache's bytes: the first expert of the shard's first
 * repacked tensor and the last expert of its last, read from the shard and
 * repacked here, against the cache's. Catches a cache of another CPU's
 * layout, or one whose trailer was written over other bytes. 0, -EXDEV
 * (differs; `why` says where), -ENOMEM, or the errno of a failed read.
 */
int guanaco_repack_cache_verify(const struct guanaco_manifest *manifest, const struct ggml_tensor *const *tensors,
                                const struct guanaco_expert_repack *repack, int shard, int shard_fd, int cache_fd,
                                char *why, size_t size);

/* "<shard>.guanaco-repack" into out; 0 or -ENAMETOOLONG. */
int guanaco_repack_cache_path(const char *shard_path, char *out, size_t size);

/*
 * Opens the cache at `path` for the shard open as `shard_fd`, and checks it:
 * a regular file whose trailer names this shard (size, modification time)
 * and exactly `expected`. On success *fd is it opened O_RDONLY and, with
 * want_direct, *direct_fd O_RDONLY|O_DIRECT (else -1). Errors, with *fd and
 * *direct_fd -1 and `why` (size bytes) saying why in words: -ENOENT (no
 * such file), -EINVAL (not a regular file, not a repack cache, another
 * version, truncated), -ESTALE (made from another GGUF, or the GGUF changed
 * since), -EXDEV (holds other tensors than this ggml repacks here), or the
 * errno of a failed open or read.
 */
int guanaco_repack_cache_open(const char *path, int shard_fd, const struct guanaco_repack_cache_contents *expected,
                              int want_direct, int *fd, int *direct_fd, char *why, size_t size);

/*
 * guanaco-repack-cache's step for one expert: expert e of manifest tensor t
 * (`tensor` its ggml tensor), read from `shard_fd`, repacked, written to
 * `cache_fd` at the offset it has in the shard. `file` and `repacked` are
 * scratch of t->expert_stride bytes each. 0, -EIO (the shard ends early),
 * -EINVAL (ggml does not repack it), or -errno of a read or a write.
 */
int guanaco_repack_cache_put_expert(const struct guanaco_expert_tensor *t, const struct ggml_tensor *tensor,
                                    const struct guanaco_expert_repack *repack, uint32_t e, int shard_fd, int cache_fd,
                                    char *file, char *repacked);

/*
 * guanaco-repack-cache's last step: writes the trailer into `fd` (the cache,
 * every tensor already written) for the shard open as `shard_fd`, and syncs
 * it. 0 or -errno.
 */
int guanaco_repack_cache_seal(int fd, int shard_fd, const struct guanaco_repack_cache_contents *contents);

#endif
