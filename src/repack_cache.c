/*
 * repack_cache.c - owns the repack cache's file format: its name, its
 * trailer, and the checks before a cache is read (repack_cache.h).
 */
#include "repack_cache.h"
#include "expert_repack.h"
#include "manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRAILER_MAGIC "GNCRPCK1"
#define TRAILER_VERSION 1u
#define TRAILER_ALIGN 4096u

struct trailer { /* little-endian on every machine a cache is read on: it is made and used on the same CPU */
    char magic[8];
    uint32_t version;
    uint32_t n_tensors;
    uint64_t shard_size;
    int64_t shard_mtime_sec, shard_mtime_nsec;
    uint64_t names_hash;
    uint64_t bytes;
    uint8_t reserved[8];
};
_Static_assert(sizeof(struct trailer) == 64, "the trailer's layout is the file format");

/* The trailer lies past the mirrored shard, page aligned, so no read of the shard's range ever reaches it. */
static uint64_t trailer_offset(uint64_t shard_size) {
    return (shard_size + TRAILER_ALIGN - 1) / TRAILER_ALIGN * TRAILER_ALIGN;
}

bool guanaco_repack_cache_pays(enum ggml_type type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_MXFP4;
}

uint64_t guanaco_repack_cache_hash_name(uint64_t hash, const char *name) {
    for (const unsigned char *c = (const unsigned char *)name;; c++) {
        hash = (hash ^ *c) * 0x100000001b3ull;
        if (!*c) {
            return hash;
        }
    }
}

bool guanaco_repack_cache_holds(const struct guanaco_manifest *manifest, const struct ggml_tensor *const *tensors,
                                const struct guanaco_expert_repack *repack, int shard, size_t i) {
    return manifest->tensors[i].shard == shard && tensors[i] && guanaco_expert_repack_applies(repack, tensors[i]);
}

void guanaco_repack_cache_expect(const struct guanaco_manifest *manifest, const struct ggml_tensor *const *tensors,
                                 const struct guanaco_expert_repack *repack, int shard,
                                 struct guanaco_repack_cache_contents *out) {
    *out = (struct guanaco_repack_cache_contents){.names_hash = GUANACO_REPACK_CACHE_NAMES_SEED};
    for (size_t i = 0; i < manifest->n_tensors; i++) {
        const struct guanaco_expert_tensor *t = &manifest->tensors[i];
        if (guanaco_repack_cache_holds(manifest, tensors, repack, shard, i)) {
            out->n_tensors++;
            out->names_hash = guanaco_repack_cache_hash_name(out->names_hash, t->name);
            out->bytes += t->nbytes;
        }
    }
}

/* All of [offset, offset + length) read into or written from `buffer`: 0, -EIO at the file's end, or -errno. */
static int transfer_exactly(int fd, char *buffer, uint64_t length, uint64_t offset, bool write) {
    for (uint64_t done = 0; done < length;) {
        ssize_t moved = write ? pwrite(fd, buffer + done, length - done, (off_t)(offset + done))
                              : pread(fd, buffer + done, length - done, (off_t)(offset + done));
        if (moved < 0 && errno == EINTR) {
            continue;
        }
        if (moved <= 0) {
            return moved < 0 ? -errno : -EIO;
        }
        done += (uint64_t)moved;
    }
    return 0;
}

int guanaco_repack_cache_put_expert(const struct guanaco_expert_tensor *t, const struct ggml_tensor *tensor,
                                    const struct guanaco_expert_repack *repack, uint32_t e, int shard_fd, int cache_fd,
                                    char *file, char *repacked) {
    const uint64_t at = t->file_offset + (uint64_t)e * t->expert_stride; /* the cache mirrors the shard */
    int err = transfer_exactly(shard_fd, file, t->expert_stride, at, false);
    if (err) {
        return err;
    }
    int done = guanaco_expert_repack_layout(repack, tensor, e, file, repacked);
    if (done != 1) {
        return done < 0 ? done : -EINVAL;
    }
    return transfer_exactly(cache_fd, repacked, t->expert_stride, at, true);
}

/* Expert e of t: the shard's bytes repacked here against the cache's. */
static int compare_expert(const struct guanaco_expert_tensor *t, const struct ggml_tensor *tensor,
                          const struct guanaco_expert_repack *repack, uint32_t e, int shard_fd, int cache_fd,
                          char *why, size_t size) {
    char *file = malloc(t->expert_stride), *repacked = malloc(t->expert_stride), *cached = malloc(t->expert_stride);
    int err = file && repacked && cached ? 0 : -ENOMEM;
    const uint64_t at = t->file_offset + (uint64_t)e * t->expert_stride;
    if (!err) {
        err = transfer_exactly(shard_fd, file, t->expert_stride, at, false);
    }
    if (!err) {
        err = transfer_exactly(cache_fd, cached, t->expert_stride, at, false);
        if (err == -EIO) {
            snprintf(why, size, "ends before expert %u of %s", e, t->name);
            err = -EINVAL;
        }
    }
    if (!err) {
        int done = guanaco_expert_repack_layout(repack, tensor, e, file, repacked);
        err = done < 0 ? done : 0;
        if (!err && memcmp(repacked, cached, t->expert_stride) != 0) {
            snprintf(why, size, "expert %u of %s differs from this CPU's repack of the model's bytes (made on another "
                                "machine, or changed since)", e, t->name);
            err = -EXDEV;
        }
    } else if (err != -EINVAL) {
        snprintf(why, size, "%s", strerror(-err));
    }
    free(file);
    free(repacked);
    free(cached);
    return err;
}

int guanaco_repack_cache_verify(const struct guanaco_manifest *manifest, const struct ggml_tensor *const *tensors,
                                const struct guanaco_expert_repack *repack, int shard, int shard_fd, int cache_fd,
                                char *why, size_t size) {
    size_t first = manifest->n_tensors, last = manifest->n_tensors;
    for (size_t i = 0; i < manifest->n_tensors; i++) {
        if (guanaco_repack_cache_holds(manifest, tensors, repack, shard, i)) {
            first = first == manifest->n_tensors ? i : first;
            last = i;
        }
    }
    if (first == manifest->n_tensors) {
        return 0;
    }
    const struct guanaco_expert_tensor *a = &manifest->tensors[first], *b = &manifest->tensors[last];
    int err = compare_expert(a, tensors[first], repack, 0, shard_fd, cache_fd, why, size);
    uint32_t n_expert = (uint32_t)(b->nbytes / b->expert_stride);
    return err ? err : compare_expert(b, tensors[last], repack, n_expert - 1, shard_fd, cache_fd, why, size);
}

int guanaco_repack_cache_path(const char *shard_path, char *out, size_t size) {
    int n = snprintf(out, size, "%s%s", shard_path, GUANACO_REPACK_CACHE_SUFFIX);
    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int fail(char *why, size_t size, int err, const char *text) {
    snprintf(why, size, "%s", text);
    return err;
}

static int check(int fd, int shard_fd, const struct guanaco_repack_cache_contents *expected, char *why, size_t size) {
    struct stat cache, shard;
    if (fstat(fd, &cache) != 0 || fstat(shard_fd, &shard) != 0) {
        return fail(why, size, -errno, strerror(errno));
    }
    if (!S_ISREG(cache.st_mode)) {
        return fail(why, size, -EINVAL, "not a regular file");
    }
    struct trailer t;
    const uint64_t at = trailer_offset((uint64_t)shard.st_size);
    if ((uint64_t)cache.st_size < at + sizeof(t)) {
        return fail(why, size, -EINVAL, "too short to hold this model's experts and a trailer (truncated, or made "
                                        "from a smaller file)");
    }
    ssize_t got = pread(fd, &t, sizeof(t), (off_t)at);
    if (got != (ssize_t)sizeof(t)) {
        return fail(why, size, got < 0 ? -errno : -EINVAL, got < 0 ? strerror(errno) : "short read of its trailer");
    }
    if (memcmp(t.magic, TRAILER_MAGIC, sizeof(t.magic)) != 0) {
        return fail(why, size, -EINVAL, "no repack cache trailer where this model's ends (not made by "
                                        "guanaco-repack-cache for it, or not finished)");
    }
    if (t.version != TRAILER_VERSION) {
        return fail(why, size, -EINVAL, "made by another version of guanaco-repack-cache");
    }
    if (t.shard_size != (uint64_t)shard.st_size || t.shard_mtime_sec != (int64_t)shard.st_mtim.tv_sec ||
        t.shard_mtime_nsec != (int64_t)shard.st_mtim.tv_nsec) {
        return fail(why, size, -ESTALE, "made from another file, or the model changed since (size or modification "
                                        "time differ)");
    }
    if (t.n_tensors != expected->n_tensors || t.names_hash != expected->names_hash || t.bytes != expected->bytes) {
        return fail(why, size, -EXDEV, "holds other tensors than this ggml repacks on this CPU (made on another "
                                       "machine or by another build)");
    }
    return 0;
}

int guanaco_repack_cache_open(const char *path, int shard_fd, const struct guanaco_repack_cache_contents *expected,
                              int want_direct, int *fd, int *direct_fd, char *why, size_t size) {
    *fd = *direct_fd = -1;
    /* O_NONBLOCK: a FIFO given as the cache must not block the load; the check refuses it */
    int opened = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (opened < 0) {
        return fail(why, size, -errno, strerror(errno));
    }
    int err = check(opened, shard_fd, expected, why, size);
    if (err == 0 && fcntl(opened, F_SETFL, 0) != 0) {
        err = fail(why, size, -errno, strerror(errno));
    }
    if (err == 0 && want_direct && (*direct_fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC)) < 0) {
        err = fail(why, size, -errno, "cannot be opened with O_DIRECT");
    }
    if (err) {
        close(opened);
        return err;
    }
    *fd = opened;
    return 0;
}

int guanaco_repack_cache_seal(int fd, int shard_fd, const struct guanaco_repack_cache_contents *contents) {
    struct stat shard;
    if (fstat(shard_fd, &shard) != 0) {
        return -errno;
    }
    struct trailer t = {
        .version = TRAILER_VERSION,
        .n_tensors = contents->n_tensors,
        .shard_size = (uint64_t)shard.st_size,
        .shard_mtime_sec = (int64_t)shard.st_mtim.tv_sec,
        .shard_mtime_nsec = (int64_t)shard.st_mtim.tv_nsec,
        .names_hash = contents->names_hash,
        .bytes = contents->bytes,
    };
    memcpy(t.magic, TRAILER_MAGIC, sizeof(t.magic));
    /* the tensors reach the disk before the trailer that vouches for them */
    if (fsync(fd) != 0) {
        return -errno;
    }
    const uint64_t at = trailer_offset((uint64_t)shard.st_size);
    if (ftruncate(fd, (off_t)at) != 0) {
        return -errno;
    }
    ssize_t put = pwrite(fd, &t, sizeof(t), (off_t)at);
    if (put != (ssize_t)sizeof(t)) {
        return put < 0 ? -errno : -EIO;
    }
    return fsync(fd) != 0 ? -errno : 0;
}
