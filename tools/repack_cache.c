/*
 * repack_cache.c - guanaco-repack-cache: writes, once per model and machine,
 * the repack cache the engine reads repacked experts from (src/repack_cache.h):
 * every expert tensor that ggml-cpu repacks on this CPU, each expert put
 * through ggml's own repack exactly as the engine would, at the offsets it
 * has in the GGUF. Beside each shard as <shard>.guanaco-repack, through a
 * .partial file that is renamed only once the trailer vouches for it, so an
 * interrupted run leaves nothing the engine would read.
 *
 * This file owns the command line and the copy loop. Which tensors, the
 * layout and the trailer are the library's (expert_repack.h,
 * repack_cache.h), shared with the engine's checks.
 */
#include "expert_repack.h"
#include "log.h"
#include "manifest.h"
#include "repack_cache.h"
#include "guanaco.h"

#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROG "guanaco-repack-cache"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " MODEL.gguf [MORE-SHARDS.gguf ...]\n"
            "\n"
            "Writes MODEL.gguf" GUANACO_REPACK_CACHE_SUFFIX " (one per shard): the model's expert tensors that\n"
            "llama.cpp repacks on this CPU (Q4_0, Q4_K, IQ4_NL, MXFP4 on x86), in the repacked layout, at their\n"
            "offsets in the GGUF; the rest of the file is a hole, so it takes disk space for those tensors alone.\n"
            "With it, --guanaco-repack reads experts ready to compute instead of repacking each one it reads\n"
            "(--guanaco-repack-cache, README). Made for this model file and this CPU: the engine checks both and\n"
            "ignores a cache that does not match.\n");
}

static double seconds_since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* Shard s's cache, written to `partial`: every expert of every tensor it must hold. 0 or -errno, said. */
static int write_shard(const struct guanaco_manifest *m, const struct ggml_tensor *const *tensors,
                       const struct guanaco_expert_repack *repack, int s, int shard_fd, const char *partial,
                       const struct guanaco_repack_cache_contents *contents) {
    int fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = -errno;
        fprintf(stderr, PROG ": %s: %s\n", partial, strerror(-err));
        return err;
    }
    uint64_t largest = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        largest = m->tensors[i].expert_stride > largest ? m->tensors[i].expert_stride : largest;
    }
    char *file = malloc(largest), *repacked = malloc(largest);
    int err = file && repacked ? 0 : -ENOMEM;
    uint64_t written = 0;
    const bool progress = isatty(STDERR_FILENO);
    for (size_t i = 0; !err && i < m->n_tensors; i++) {
        const struct guanaco_expert_tensor *t = &m->tensors[i];
        if (!guanaco_repack_cache_holds(m, tensors, repack, s, i)) {
            continue;
        }
        const uint32_t n_expert = (uint32_t)(t->nbytes / t->expert_stride);
        for (uint32_t e = 0; !err && e < n_expert; e++) {
            if ((err = guanaco_repack_cache_put_expert(t, tensors[i], repack, e, shard_fd, fd, file, repacked)) != 0) {
                fprintf(stderr, PROG ": %s, expert %u of %s: %s\n", partial, e, t->name,
                        err == -EIO ? "the model file ends early" : err == -EINVAL ? "ggml did not repack it"
                                                                              : strerror(-err));
            }
        }
        written += err ? 0 : t->nbytes;
        if (!err && progress) { /* a terminal's line, rewritten; a log gets the totals only */
            fprintf(stderr, "\r" PROG ": %s: %.0f%%", m->shard_paths[s], 100.0 * (double)written / (double)contents->bytes);
        }
    }
    if (progress) {
        fprintf(stderr, "\n");
    }
    if (!err && (err = guanaco_repack_cache_seal(fd, shard_fd, contents)) != 0) {
        fprintf(stderr, PROG ": %s: writing its trailer: %s\n", partial, strerror(-err));
    }
    if (close(fd) != 0 && !err) {
        err = -errno;
        fprintf(stderr, PROG ": %s: %s\n", partial, strerror(-err));
    }
    free(file);
    free(repacked);
    return err;
}

/* ggml says "repack tensor ... with ..." at every expert: only its warnings and errors are for the user here */
static void quiet_ggml_log(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int a = 1; a < argc; a++) {
        if (argv[a][0] == '-') {
            fprintf(stderr, PROG ": unknown option %s\n", argv[a]);
            print_usage(stderr);
            return 2;
        }
    }
    guanaco_log_set_enabled(true);
    struct guanaco_manifest m;
    if (guanaco_manifest_load(argv[1], (const char *const *)argv + 2, (size_t)(argc - 2), &m) != 0) {
        return 1; /* the manifest said why */
    }
    if (m.n_tensors == 0) {
        printf(PROG ": %s has no expert tensors (a dense model): nothing to cache\n", argv[1]);
        guanaco_manifest_free(&m);
        return 0;
    }
    ggml_log_set(quiet_ggml_log, NULL);
    ggml_cpu_init();
    struct guanaco_expert_repack *repack = NULL;
    int err = guanaco_expert_repack_create(&repack);
    if (err || !repack) {
        fprintf(err ? stderr : stdout, PROG ": %s\n",
                err ? strerror(-err) : "this build of ggml has no repacked CPU kernels here: nothing to cache");
        guanaco_manifest_free(&m);
        return err ? 1 : 0;
    }
    /* the tensors' types and shapes, as llama.cpp would give them to ggml: from each shard's GGUF */
    struct ggml_context **contexts = calloc((size_t)m.n_shards, sizeof(*contexts));
    const struct ggml_tensor **tensors = calloc(m.n_tensors, sizeof(*tensors));
    err = contexts && tensors ? 0 : -ENOMEM;
    for (int s = 0; !err && s < m.n_shards; s++) {
        struct gguf_init_params params = {.no_alloc = true, .ctx = &contexts[s]};
        struct gguf_context *gguf = gguf_init_from_file(m.shard_paths[s], params);
        if (!gguf) {
            fprintf(stderr, PROG ": %s: not a GGUF file ggml can read\n", m.shard_paths[s]);
            err = -EINVAL;
            break;
        }
        gguf_free(gguf);
    }
    for (size_t i = 0; !err && i < m.n_tensors; i++) {
        tensors[i] = ggml_get_tensor(contexts[m.tensors[i].shard], m.tensors[i].name);
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uint64_t total = 0;
    int written = 0;
    for (int s = 0; !err && s < m.n_shards; s++) {
        struct guanaco_repack_cache_contents contents;
        guanaco_repack_cache_expect(&m, tensors, repack, s, &contents);
        if (contents.n_tensors == 0) {
            printf(PROG ": %s: none of its expert tensors has a repacked kernel on this CPU: no cache\n",
                   m.shard_paths[s]);
            continue;
        }
        char path[GUANACO_PATH_BYTES + 32], partial[GUANACO_PATH_BYTES + 48];
        if ((err = guanaco_repack_cache_path(m.shard_paths[s], path, sizeof(path))) != 0 ||
            snprintf(partial, sizeof(partial), "%s.partial", path) >= (int)sizeof(partial)) {
            fprintf(stderr, PROG ": %s: path too long\n", m.shard_paths[s]);
            err = -ENAMETOOLONG;
            break;
        }
        int shard_fd = open(m.shard_paths[s], O_RDONLY | O_CLOEXEC);
        if (shard_fd < 0) {
            err = -errno;
            fprintf(stderr, PROG ": %s: %s\n", m.shard_paths[s], strerror(-err));
            break;
        }
        err = write_shard(&m, tensors, repack, s, shard_fd, partial, &contents);
        close(shard_fd);
        if (!err && rename(partial, path) != 0) {
            err = -errno;
            fprintf(stderr, PROG ": renaming %s to %s: %s\n", partial, path, strerror(-err));
        }
        if (err) {
            (void)unlink(partial);
            break;
        }
        printf(PROG ": wrote %s: %u expert tensors, %.2f GiB\n", path, contents.n_tensors,
               (double)contents.bytes / (1024.0 * 1024.0 * 1024.0));
        total += contents.bytes;
        written++;
    }
    if (!err) {
        double elapsed = seconds_since(&start);
        printf(PROG ": %d cache%s, %.2f GiB in %.1f s (%.0f MB/s)\n", written, written == 1 ? "" : "s",
               (double)total / (1024.0 * 1024.0 * 1024.0), elapsed, elapsed > 0 ? (double)total / 1e6 / elapsed : 0.0);
    }
    for (int s = 0; contexts && s < m.n_shards; s++) {
        if (contexts[s]) {
            ggml_free(contexts[s]);
        }
    }
    free(contexts);
    free(tensors);
    guanaco_expert_repack_destroy(repack);
    guanaco_manifest_free(&m);
    return err ? 1 : 0;
}
