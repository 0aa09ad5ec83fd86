/*
 * fuzz_file.h - owns handing a fuzz input to the APIs under test that take a
 * path, not a buffer (guanaco_manifest_load, guanaco_trace_load,
 * guanaco_trace_convert_jsonl): the bytes go into an anonymous memfd, and the
 * API opens /proc/self/fd/N. A memfd is a regular file of known size, as
 * those readers require, and touches no disk. One memfd per role is reused
 * across inputs (truncated, then rewritten) so an execution costs a few
 * syscalls, not a file creation.
 */
#ifndef GUANACO_FUZZ_FILE_H
#define GUANACO_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct fuzz_file {
    int fd;
    char path[64]; /* /proc/self/fd/N */
};

/* Creates the memfd once; a failure here is the harness's, not the target's: stop loudly. */
static inline void fuzz_file_init(struct fuzz_file *file, const char *name) {
    if (file->path[0]) {
        return;
    }
    file->fd = memfd_create(name, MFD_CLOEXEC);
    if (file->fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(file->path, sizeof(file->path), "/proc/self/fd/%d", file->fd);
}

/* Replaces the memfd's contents with `data` (empty when size is 0). */
static inline void fuzz_file_set(struct fuzz_file *file, const uint8_t *data, size_t size) {
    if (ftruncate(file->fd, 0) != 0) {
        perror("ftruncate");
        abort();
    }
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(file->fd, data + done, size - done, (off_t)done);
        if (n <= 0) {
            perror("pwrite");
            abort();
        }
        done += (size_t)n;
    }
}

/* A property of the target failed: crash so libFuzzer keeps the input, with the reason first. */
#define FUZZ_CHECK(condition)                                                                  \
    do {                                                                                       \
        if (!(condition)) {                                                                    \
            fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #condition); \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

#endif
