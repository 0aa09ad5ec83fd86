/*
 * test_io.c - owns the tests of src/io.c, run once per backend: random
 * ranges of 1 B to 8 MiB at unaligned offsets compared with plain pread, the
 * O_DIRECT path and its alignment checks, end of file before the length, and
 * injected faults (an error, a short read, EINTR, a premature end of file)
 * that must fail only their own request; and jobs: several in flight at
 * once, waited for one by one, urgent before the rest, and cancelled; and a job's `then`, run once after its
 * reads and before it counts as done. A 64 MiB file with a known pattern
 * is written under $TMPDIR (or /tmp) and removed at once.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "check.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FILE_BYTES (64ull << 20)
#define MiB (1ull << 20)
#define GUARD 16


static int fd_buffered = -1, fd_direct = -1;
static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t next_random(void) {
    /* splitmix64: a fixed seed, so a failure repeats */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t random_below(uint64_t bound) {
    return bound ? next_random() % bound : 0;
}

/* The byte at file position p: varies inside every block and between blocks, so a misplaced chunk shows. */
static unsigned char pattern_byte(uint64_t p) {
    return (unsigned char)((p * 0x9e3779b1u) >> 13 ^ (p >> 12) ^ (p >> 20));
}

static int make_file(void) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/guanaco-test-io-XXXXXX", dir && *dir ? dir : "/tmp");
    fd_buffered = mkstemp(path);
    if (fd_buffered < 0) {
        perror("mkstemp");
        return -1;
    }
    unsigned char *block = malloc(MiB);
    for (uint64_t at = 0; at < FILE_BYTES; at += MiB) {
        for (uint64_t i = 0; i < MiB; i++) {
            block[i] = pattern_byte(at + i);
        }
        if (pwrite(fd_buffered, block, MiB, (off_t)at) != (ssize_t)MiB) {
            perror("pwrite");
            free(block);
            return -1;
        }
    }
    free(block);
    fd_direct = open(path, O_RDONLY | O_DIRECT);
    if (fd_direct >= 0) {
        /* Some filesystems accept the flag at open and refuse the read; probe one block. */
        void *probe = NULL;
        if (posix_memalign(&probe, 4096, 4096) != 0 || pread(fd_direct, probe, 4096, 0) != 4096) {
            close(fd_direct);
            fd_direct = -1;
        }
        free(probe);
    }
    if (fd_direct < 0) {
        printf("SKIP O_DIRECT tests: the filesystem of %s does not support O_DIRECT\n", path);
    }
    unlink(path);
    return 0;
}

static bool matches_pattern(const unsigned char *data, uint64_t offset, uint64_t length) {
    for (uint64_t i = 0; i < length; i++) {
        if (data[i] != pattern_byte(offset + i)) {
            return false;
        }
    }
    return true;
}

/* The destination of a buffered request: poisoned, with guard bytes after it that no read may touch. */
static unsigned char *guarded_buffer(uint64_t length) {
    unsigned char *buffer = malloc(length + GUARD);
    memset(buffer, 0x5a, length);
    memset(buffer + length, 0xa5, GUARD);
    return buffer;
}

static bool guard_intact(const unsigned char *buffer, uint64_t length) {
    for (int i = 0; i < GUARD; i++) {
        if (buffer[length + i] != 0xa5) {
            return false;
        }
    }
    return true;
}

static bool same_as_pread(const struct guanaco_io_request *r) {
    unsigned char *expected = malloc(r->length ? r->length : 1);
    uint64_t got = 0;
    while (got < r->length) {
        ssize_t n = pread(fd_buffered, expected + got, r->length - got, (off_t)(r->offset + got));
        if (n <= 0) {
            break;
        }
        got += (uint64_t)n;
    }
    bool same = got == r->length && memcmp(expected, r->destination, r->length) == 0;
    free(expected);
    return same;
}

static struct guanaco_io *create_or_skip(enum guanaco_io_backend backend, unsigned depth, unsigned chunk) {
    struct guanaco_io *io = NULL;
    int ret = guanaco_io_create(backend, depth, chunk, &io);
    CHECK(ret == 0 && io != NULL);
    return io;
}

/* Many random ranges in one batch, sizes log-uniform from 1 B to max_size, plus the two extremes. */
static void test_random_ranges(enum guanaco_io_backend backend, unsigned depth, unsigned chunk, size_t count,
                               uint64_t max_size) {
    struct guanaco_io *io = create_or_skip(backend, depth, chunk);
    if (!io) {
        return;
    }
    struct guanaco_io_request *requests = calloc(count, sizeof(*requests));
    int max_bits = 0;
    while ((1ull << max_bits) < max_size) {
        max_bits++;
    }
    for (size_t i = 0; i < count; i++) {
        uint64_t length = i == 0 ? 1 : i == 1 ? max_size : 1 + random_below(1ull << random_below(max_bits + 1));
        if (length > max_size) {
            length = max_size;
        }
        requests[i] = (struct guanaco_io_request){
            .fd = fd_buffered,
            .offset = random_below(FILE_BYTES - length + 1),
            .length = length,
            .destination = guarded_buffer(length),
            .result = 12345,
        };
    }
    int ret = guanaco_io_read_batch(io, requests, count);
    CHECK(ret == 0);
    bool all_ok = true;
    for (size_t i = 0; i < count; i++) {
        struct guanaco_io_request *r = &requests[i];
        if (r->result != 0 || !same_as_pread(r) || !matches_pattern(r->destination, r->offset, r->length) ||
            !guard_intact(r->destination, r->length)) {
            fprintf(stderr, "  %s depth %u chunk %u: request %zu (offset %llu, length %llu) result %d wrong\n",
                    guanaco_io_backend_name(backend), depth, chunk, i, (unsigned long long)r->offset,
                    (unsigned long long)r->length, r->result);
            all_ok = false;
        }
        free(r->destination);
    }
    CHECK(all_ok);
    free(requests);
    guanaco_io_destroy(io);
}

/* End of file before the length: only that request fails, with -ENODATA, and the bytes before EOF arrive. */
static void test_end_of_file(enum guanaco_io_backend backend, unsigned depth) {
    struct guanaco_io *io = create_or_skip(backend, depth, 64 * 1024);
    if (!io) {
        return;
    }
    struct guanaco_io_request requests[4] = {
        {.fd = fd_buffered, .offset = 1000, .length = 300000},
        {.fd = fd_buffered, .offset = FILE_BYTES - 100, .length = 200},
        {.fd = fd_buffered, .offset = 5, .length = 3 * MiB},
        {.fd = fd_buffered, .offset = FILE_BYTES + 4096, .length = 10},
    };
    for (int i = 0; i < 4; i++) {
        requests[i].destination = guarded_buffer(requests[i].length);
    }
    CHECK(guanaco_io_read_batch(io, requests, 4) == -ENODATA);
    CHECK(requests[0].result == 0 && matches_pattern(requests[0].destination, 1000, 300000));
    CHECK(requests[1].result == -ENODATA && matches_pattern(requests[1].destination, FILE_BYTES - 100, 100));
    CHECK(requests[2].result == 0 && matches_pattern(requests[2].destination, 5, 3 * MiB));
    CHECK(requests[3].result == -ENODATA);
    for (int i = 0; i < 4; i++) {
        CHECK(guard_intact(requests[i].destination, requests[i].length));
        free(requests[i].destination);
    }
    guanaco_io_destroy(io);
}

/*
 * Five 3 MiB requests cut into 1 MiB chunks; the fault hits the middle of the
 * third. Every other request must still be read in full.
 */
static void test_fault(enum guanaco_io_backend backend, unsigned depth, int fault, int expected) {
    struct guanaco_io *io = create_or_skip(backend, depth, (unsigned)MiB);
    if (!io) {
        return;
    }
    struct guanaco_io_request requests[5];
    for (int i = 0; i < 5; i++) {
        requests[i] = (struct guanaco_io_request){
            .fd = fd_buffered, .offset = 7 + (uint64_t)i * 5 * MiB, .length = 3 * MiB,
            .destination = guarded_buffer(3 * MiB)};
    }
    guanaco_io_inject_fault(io, 2 * 3 * MiB + MiB + MiB / 2 + 7, fault);
    CHECK(guanaco_io_read_batch(io, requests, 5) == expected);
    for (int i = 0; i < 5; i++) {
        struct guanaco_io_request *r = &requests[i];
        if (i == 2) {
            CHECK(r->result == expected);
            /* At depth 1 the last chunk is not yet issued when the fault hits; a failed request issues no more. */
            if (depth == 1 && expected < 0) {
                CHECK(((unsigned char *)r->destination)[3 * MiB - 1] == 0x5a);
            }
        } else {
            CHECK(r->result == 0 && matches_pattern(r->destination, r->offset, r->length));
        }
        if (r->result == 0) {
            CHECK(matches_pattern(r->destination, r->offset, r->length));
        }
        CHECK(guard_intact(r->destination, r->length));
    }
    /* One-shot: the same batch again reads cleanly. */
    CHECK(guanaco_io_read_batch(io, requests, 5) == 0);
    CHECK(requests[2].result == 0 && matches_pattern(requests[2].destination, requests[2].offset, 3 * MiB));
    for (int i = 0; i < 5; i++) {
        free(requests[i].destination);
    }
    guanaco_io_destroy(io);
}

static void *aligned_buffer(uint64_t length) {
    void *buffer = NULL;
    if (posix_memalign(&buffer, 4096, length ? length : 4096) != 0) {
        return NULL;
    }
    memset(buffer, 0x5a, length);
    return buffer;
}

/* O_DIRECT: aligned ranges (mixed with buffered ones on the other fd) read exactly; unaligned ones refused. */
static void test_direct(enum guanaco_io_backend backend, unsigned depth) {
    if (fd_direct < 0) {
        return;
    }
    /* A chunk size that is not whole blocks: chunks on the O_DIRECT fd must still stay aligned. */
    struct guanaco_io *io = create_or_skip(backend, depth, (unsigned)MiB + 100);
    if (!io) {
        return;
    }
    enum { COUNT = 24 };
    struct guanaco_io_request requests[COUNT];
    for (int i = 0; i < COUNT; i++) {
        bool direct = i % 3 != 2;
        uint64_t blocks = 1 + random_below(2048); /* up to 8 MiB */
        uint64_t length = direct ? blocks * 4096 : 1 + random_below(3 * MiB);
        uint64_t offset = direct ? random_below(FILE_BYTES / 4096 - blocks + 1) * 4096
                                 : random_below(FILE_BYTES - length + 1);
        requests[i] = (struct guanaco_io_request){
            .fd = direct ? fd_direct : fd_buffered, .offset = offset, .length = length,
            .destination = aligned_buffer(length)};
    }
    requests[0].offset = FILE_BYTES - 4096; /* the last block exactly */
    requests[0].length = 4096;
    CHECK(guanaco_io_read_batch(io, requests, COUNT) == 0);
    bool all_ok = true;
    for (int i = 0; i < COUNT; i++) {
        struct guanaco_io_request *r = &requests[i];
        if (r->result != 0 || !matches_pattern(r->destination, r->offset, r->length) || !same_as_pread(r)) {
            fprintf(stderr, "  %s O_DIRECT depth %u: request %d (offset %llu, length %llu) result %d wrong\n",
                    guanaco_io_backend_name(backend), depth, i, (unsigned long long)r->offset,
                    (unsigned long long)r->length, r->result);
            all_ok = false;
        }
        free(r->destination);
    }
    CHECK(all_ok);

    /* Unaligned offset, length, destination: -EINVAL for each, nothing read; the aligned ones still complete. */
    unsigned char *buffers[6];
    for (int i = 0; i < 6; i++) {
        buffers[i] = aligned_buffer(2 * 4096);
    }
    struct guanaco_io_request bad[6] = {
        {.fd = fd_direct, .offset = 8192, .length = 8192, .destination = buffers[0]},
        {.fd = fd_direct, .offset = 8192 + 512, .length = 4096, .destination = buffers[1]},
        {.fd = fd_direct, .offset = 8192, .length = 4000, .destination = buffers[2]},
        {.fd = fd_direct, .offset = 8192, .length = 4096, .destination = buffers[3] + 8},
        {.fd = fd_direct, .offset = FILE_BYTES, .length = 4096, .destination = buffers[4]}, /* past EOF */
        {.fd = fd_direct, .offset = 4096, .length = 4096, .destination = buffers[5]},
    };
    CHECK(guanaco_io_read_batch(io, bad, 6) == -EINVAL);
    CHECK(bad[0].result == 0 && matches_pattern(buffers[0], 8192, 8192));
    CHECK(bad[1].result == -EINVAL && buffers[1][0] == 0x5a);
    CHECK(bad[2].result == -EINVAL && buffers[2][0] == 0x5a);
    CHECK(bad[3].result == -EINVAL && buffers[3][8] == 0x5a);
    CHECK(bad[4].result == -ENODATA);
    CHECK(bad[5].result == 0 && matches_pattern(buffers[5], 4096, 4096));

    /* An injected short read on O_DIRECT stops on a block boundary and is continued. */
    struct guanaco_io_request one = {.fd = fd_direct, .offset = 3 * MiB, .length = 3 * MiB,
                                     .destination = aligned_buffer(3 * MiB)};
    guanaco_io_inject_fault(io, MiB + 5000, GUANACO_IO_FAULT_SHORT);
    CHECK(guanaco_io_read_batch(io, &one, 1) == 0 && matches_pattern(one.destination, one.offset, one.length));
    free(one.destination);
    for (int i = 0; i < 6; i++) {
        free(buffers[i]);
    }
    guanaco_io_destroy(io);
}

/* Argument checks, empty batches and requests, bad descriptors, and destroying an idle reader. */
static void test_edges(enum guanaco_io_backend backend) {
    struct guanaco_io *io = NULL;
    CHECK(guanaco_io_create(backend, 0, 4096, &io) == -EINVAL && io == NULL);
    CHECK(guanaco_io_create(backend, 4, 0, &io) == -EINVAL && io == NULL);
    CHECK(guanaco_io_create(backend, GUANACO_IO_MAX_QUEUE_DEPTH + 1, 4096, &io) == -EINVAL);
    guanaco_io_destroy(NULL);

    io = create_or_skip(backend, 8, 4096);
    if (!io) {
        return;
    }
    CHECK(guanaco_io_read_batch(io, NULL, 0) == 0);
    char byte = 0;
    struct guanaco_io_request requests[4] = {
        {.fd = fd_buffered, .offset = 123, .length = 0, .destination = NULL},
        {.fd = -1, .offset = 0, .length = 1, .destination = &byte},
        {.fd = fd_buffered, .offset = 0, .length = 1, .destination = NULL},
        {.fd = fd_buffered, .offset = 77, .length = 1, .destination = &byte},
    };
    CHECK(guanaco_io_read_batch(io, requests, 4) == -EBADF);
    CHECK(requests[0].result == 0 && requests[1].result == -EBADF && requests[2].result == 0); /* [2]: advise */
    CHECK(requests[3].result == 0 && (unsigned char)byte == pattern_byte(77));

    int closed = dup(fd_buffered);
    close(closed);
    struct guanaco_io_request stale = {.fd = closed, .offset = 0, .length = 10, .destination = &byte};
    CHECK(guanaco_io_read_batch(io, &stale, 1) == -EBADF && stale.result == -EBADF);

    /* A write-only descriptor: the kernel's own error comes back unchanged. */
    char path[] = "/tmp/guanaco-test-io-wo-XXXXXX";
    int write_only = mkstemp(path);
    if (write_only >= 0) {
        int fd = open(path, O_WRONLY);
        unlink(path);
        close(write_only);
        struct guanaco_io_request wrong = {.fd = fd, .offset = 0, .length = 10, .destination = &byte};
        CHECK(guanaco_io_read_batch(io, &wrong, 1) == -EBADF && wrong.result == -EBADF);
        close(fd);
    }
    /* Disarming a fault leaves the next batch clean. */
    guanaco_io_inject_fault(io, 0, -EIO);
    guanaco_io_inject_fault(io, 0, 0);
    struct guanaco_io_request clean = {.fd = fd_buffered, .offset = 0, .length = 1, .destination = &byte};
    CHECK(guanaco_io_read_batch(io, &clean, 1) == 0);
    guanaco_io_destroy(io);

    /* Created and destroyed without ever reading: no thread or ring left behind. */
    for (int i = 0; i < 20; i++) {
        io = create_or_skip(backend, 64, (unsigned)MiB);
        guanaco_io_destroy(io);
    }
}

/* Jobs in flight together: each lands exactly, a subset can be waited for alone, and poll never blocks. */
static void test_jobs(enum guanaco_io_backend backend, unsigned depth) {
    struct guanaco_io *io = create_or_skip(backend, depth, 64 * 1024);
    enum { JOBS = 6, PER_JOB = 5 };
    struct guanaco_io_request requests[JOBS][PER_JOB];
    struct guanaco_io_job jobs[JOBS];
    unsigned char *buffers[JOBS][PER_JOB];
    for (int j = 0; j < JOBS; j++) {
        for (int i = 0; i < PER_JOB; i++) {
            uint64_t length = 1 + random_below(3 * MiB);
            buffers[j][i] = guarded_buffer(length);
            requests[j][i] = (struct guanaco_io_request){.fd = fd_buffered, .offset = random_below(FILE_BYTES - length),
                                                         .length = length, .destination = buffers[j][i], .result = 1};
        }
        CHECK(guanaco_io_submit(io, &jobs[j], requests[j], PER_JOB, j % 2) == 0);
    }
    /* the last job alone first: it must not need the others to be waited for */
    CHECK(guanaco_io_wait(io, &jobs[JOBS - 1]) == 0);
    CHECK(guanaco_io_poll(io, &jobs[JOBS - 1]) == 1);
    for (int j = 0; j < JOBS; j++) {
        CHECK(guanaco_io_wait(io, &jobs[j]) == 0);
        for (int i = 0; i < PER_JOB; i++) {
            CHECK(requests[j][i].result == 0);
            CHECK(matches_pattern(buffers[j][i], requests[j][i].offset, requests[j][i].length));
            CHECK(guard_intact(buffers[j][i], requests[j][i].length));
            free(buffers[j][i]);
        }
    }
    /* an empty job is done at once */
    struct guanaco_io_job empty;
    CHECK(guanaco_io_submit(io, &empty, NULL, 0, 0) == 0 && guanaco_io_poll(io, &empty) == 1);
    CHECK(guanaco_io_wait(io, &empty) == 0);
    CHECK(guanaco_io_submit(io, &empty, NULL, 3, 0) == -EINVAL);
    guanaco_io_destroy(io);
}

/*
 * A long non-urgent job (thousands of 4 KiB chunks at depth 1) and an urgent
 * one submitted after it: the urgent one finishes first. Then cancelling the
 * long job stops it early: its unread requests say -ECANCELED, the bytes it
 * reports as read are exactly its complete requests, and those are correct.
 */
static void test_urgent_and_cancel(enum guanaco_io_backend backend) {
    struct guanaco_io *io = create_or_skip(backend, 1, 4096);
    enum { LONG_REQUESTS = 64 };
    struct guanaco_io_request slow[LONG_REQUESTS];
    unsigned char *slow_buffer = malloc(LONG_REQUESTS * MiB);
    for (int i = 0; i < LONG_REQUESTS; i++) {
        slow[i] = (struct guanaco_io_request){.fd = fd_buffered, .offset = (uint64_t)i * MiB, .length = MiB,
                                              .destination = slow_buffer + (size_t)i * MiB};
    }
    unsigned char *fast_buffer = guarded_buffer(8192);
    struct guanaco_io_request fast = {.fd = fd_buffered, .offset = 12345, .length = 8192, .destination = fast_buffer};
    struct guanaco_io_job slow_job, fast_job;
    CHECK(guanaco_io_submit(io, &slow_job, slow, LONG_REQUESTS, 0) == 0);
    CHECK(guanaco_io_submit(io, &fast_job, &fast, 1, 1) == 0);
    CHECK(guanaco_io_wait(io, &fast_job) == 0);
    CHECK(matches_pattern(fast_buffer, fast.offset, fast.length) && guard_intact(fast_buffer, fast.length));
    CHECK(guanaco_io_poll(io, &slow_job) == 0); /* 16384 chunks at depth 1 cannot be done yet */
    uint64_t useful = guanaco_io_cancel(io, &slow_job);
    CHECK(guanaco_io_poll(io, &slow_job) == 1);
    uint64_t complete = 0;
    int cancelled = 0;
    for (int i = 0; i < LONG_REQUESTS; i++) {
        if (slow[i].result == 0) {
            complete += slow[i].length;
            CHECK(matches_pattern(slow[i].destination, slow[i].offset, slow[i].length));
        } else {
            CHECK(slow[i].result == -ECANCELED);
            cancelled++;
        }
    }
    CHECK(useful == complete);
    CHECK(cancelled > 0);
    CHECK(guanaco_io_wait(io, &slow_job) == -ECANCELED);
    /* cancelling a job that is already done changes nothing */
    CHECK(guanaco_io_cancel(io, &fast_job) == fast.length && fast.result == 0);
    free(slow_buffer);
    free(fast_buffer);
    guanaco_io_destroy(io);
}

/*
 * Requests with no destination only fill the page cache (WILLNEED, no copy): after the job, mapping the range
 * finds every page cached and the file's bytes; the page cache was empty there before. An O_DIRECT fd refuses
 * them, and an injected fault fails them like a read.
 */
static void test_advise(enum guanaco_io_backend backend) {
    struct guanaco_io *io = create_or_skip(backend, 16, (unsigned)MiB);
    const uint64_t offset = 24 * MiB, length = 9 * MiB + 12345;
    CHECK(posix_fadvise(fd_buffered, (off_t)offset, (off_t)length, POSIX_FADV_DONTNEED) == 0);
    struct guanaco_io_request requests[3] = {
        {.fd = fd_buffered, .offset = offset, .length = 5 * MiB},
        {.fd = fd_buffered, .offset = offset + 5 * MiB, .length = length - 5 * MiB},
        {.fd = fd_buffered, .offset = FILE_BYTES - 1, .length = 1},
    };
    CHECK(guanaco_io_read_batch(io, requests, 3) == 0);
    const unsigned char *map = mmap(NULL, FILE_BYTES, PROT_READ, MAP_SHARED, fd_buffered, 0);
    CHECK(map != MAP_FAILED);
    if (map != MAP_FAILED) {
        size_t pages = (size_t)((length + 4095) / 4096);
        unsigned char *cached = malloc(pages);
        /* the reads were issued; the pages arrive as the disk answers, so wait for them as a mapping would */
        CHECK(madvise((void *)(map + offset), length, MADV_POPULATE_READ) == 0);
        CHECK(mincore((void *)(map + offset), length, cached) == 0);
        size_t present = 0;
        for (size_t p = 0; p < pages; p++) {
            present += cached[p] & 1;
        }
        CHECK(present == pages);
        CHECK(matches_pattern(map + offset, offset, length));
        free(cached);
        munmap((void *)map, FILE_BYTES);
    }
    struct guanaco_io_request failing = {.fd = fd_buffered, .offset = 0, .length = 3 * MiB};
    guanaco_io_inject_fault(io, 2 * MiB, -EIO);
    CHECK(guanaco_io_read_batch(io, &failing, 1) == -EIO && failing.result == -EIO);
    if (fd_direct >= 0) {
        struct guanaco_io_request direct = {.fd = fd_direct, .offset = 0, .length = 4096};
        CHECK(guanaco_io_read_batch(io, &direct, 1) == -EINVAL && direct.result == -EINVAL);
    }
    guanaco_io_destroy(io);
}

/* What a `then` saw: how often it ran, and whether every request had its result and its bytes then. */
struct then_record {
    atomic_int calls;
    atomic_bool complete_when_called; /* every request had a result, and each read one held the file's bytes */
    atomic_bool hold;                 /* while set, the `then` spins: the job must not count as done meanwhile */
    atomic_bool running;
};

static void record_then(struct guanaco_io_job *job, void *context) {
    struct then_record *record = context;
    atomic_store(&record->running, true);
    bool complete = true;
    for (size_t i = 0; i < job->n; i++) {
        const struct guanaco_io_request *r = &job->requests[i];
        complete = complete && r->result != 1 &&
                   (r->result != 0 || matches_pattern(r->destination, r->offset, r->length));
    }
    atomic_store(&record->complete_when_called, complete);
    while (atomic_load(&record->hold)) {
        sched_yield();
    }
    atomic_fetch_add(&record->calls, 1);
}

/*
 * guanaco_io_submit_then: each job's `then` runs exactly once, after every request of the job has its result
 * and bytes, and before poll or wait says the job is done (a held `then` keeps it not done); a cancelled
 * job's and an empty job's run too, the empty one's before submit returns.
 */
static void test_then(enum guanaco_io_backend backend, unsigned depth) {
    struct guanaco_io *io = create_or_skip(backend, depth, 256 * 1024);
    enum { JOBS = 5, PER_JOB = 3 };
    struct guanaco_io_request requests[JOBS][PER_JOB];
    struct guanaco_io_job jobs[JOBS];
    struct then_record records[JOBS];
    unsigned char *buffers[JOBS][PER_JOB];
    for (int j = 0; j < JOBS; j++) {
        records[j] = (struct then_record){0};
        atomic_store(&records[j].hold, j == 0);
        for (int i = 0; i < PER_JOB; i++) {
            uint64_t length = 1 + random_below(2 * MiB);
            buffers[j][i] = guarded_buffer(length);
            requests[j][i] = (struct guanaco_io_request){.fd = fd_buffered, .offset = random_below(FILE_BYTES - length),
                                                         .length = length, .destination = buffers[j][i], .result = 1};
        }
        CHECK(guanaco_io_submit_then(io, &jobs[j], requests[j], PER_JOB, 1, record_then, &records[j]) == 0);
    }
    /* job 0's `then` is held: once it runs, its reads are all in, and still the job is not done */
    while (!atomic_load(&records[0].running)) {
        sched_yield();
    }
    CHECK(guanaco_io_poll(io, &jobs[0]) == 0);
    CHECK(atomic_load(&records[0].calls) == 0);
    atomic_store(&records[0].hold, false);
    for (int j = 0; j < JOBS; j++) {
        CHECK(guanaco_io_wait(io, &jobs[j]) == 0);
        CHECK(atomic_load(&records[j].calls) == 1); /* ran before wait returned, and once */
        CHECK(atomic_load(&records[j].complete_when_called));
        for (int i = 0; i < PER_JOB; i++) {
            CHECK(guard_intact(buffers[j][i], requests[j][i].length));
            free(buffers[j][i]);
        }
    }
    CHECK(guanaco_io_wait(io, &jobs[0]) == 0 && atomic_load(&records[0].calls) == 1); /* not again */

    /* a cancelled job's `then` runs once, seeing each request read or -ECANCELED */
    enum { LONG_REQUESTS = 32 };
    struct guanaco_io_request slow[LONG_REQUESTS];
    unsigned char *slow_buffer = malloc(LONG_REQUESTS * MiB);
    for (int i = 0; i < LONG_REQUESTS; i++) {
        slow[i] = (struct guanaco_io_request){.fd = fd_buffered, .offset = (uint64_t)i * MiB, .length = MiB,
                                              .destination = slow_buffer + (size_t)i * MiB, .result = 1};
    }
    struct guanaco_io_job slow_job;
    struct then_record slow_record = {0};
    CHECK(guanaco_io_submit_then(io, &slow_job, slow, LONG_REQUESTS, 0, record_then, &slow_record) == 0);
    (void)guanaco_io_cancel(io, &slow_job);
    CHECK(atomic_load(&slow_record.calls) == 1 && atomic_load(&slow_record.complete_when_called));
    free(slow_buffer);

    /* an empty job's `then` runs on the submitter */
    struct guanaco_io_job empty;
    struct then_record empty_record = {0};
    CHECK(guanaco_io_submit_then(io, &empty, NULL, 0, 0, record_then, &empty_record) == 0);
    CHECK(atomic_load(&empty_record.calls) == 1 && guanaco_io_poll(io, &empty) == 1);
    guanaco_io_destroy(io);
}

static void test_backend(enum guanaco_io_backend backend) {
    const char *name = guanaco_io_backend_name(backend);
    struct guanaco_io *probe = NULL;
    int ret = guanaco_io_create(backend, 4, 4096, &probe);
    if (ret == -ENOSYS) {
        printf("SKIP %s: not available on this system (io_uring missing, blocked by seccomp or disabled)\n", name);
        return;
    }
    guanaco_io_destroy(probe);
    int before = check_failed;

    test_random_ranges(backend, 1, (unsigned)MiB, 48, 8 * MiB);
    test_random_ranges(backend, 64, (unsigned)MiB, 96, 8 * MiB);
    test_random_ranges(backend, 16, 4097, 48, 256 * 1024); /* odd chunk size: many chunks per request */
    test_random_ranges(backend, 4, (unsigned)(64 * MiB), 24, 8 * MiB); /* chunks never split */
    test_end_of_file(backend, 1);
    test_end_of_file(backend, 64);
    for (int depth = 1; depth <= 64; depth *= 64) {
        test_fault(backend, (unsigned)depth, -EIO, -EIO);
        test_fault(backend, (unsigned)depth, -EINTR, 0);
        test_fault(backend, (unsigned)depth, -EAGAIN, 0);
        test_fault(backend, (unsigned)depth, GUANACO_IO_FAULT_SHORT, 0);
        test_fault(backend, (unsigned)depth, GUANACO_IO_FAULT_EOF, -ENODATA);
    }
    test_direct(backend, 1);
    test_direct(backend, 16);
    test_edges(backend);
    test_advise(backend);
    test_jobs(backend, 1);
    test_jobs(backend, 16);
    test_urgent_and_cancel(backend);
    test_then(backend, 1);
    test_then(backend, 16);
    printf("%s %s\n", check_failed == before ? "PASS" : "FAIL", name);
}

int main(void) {
    if (make_file() != 0) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    test_backend(GUANACO_IO_URING);
    test_backend(GUANACO_IO_THREADS);
    close(fd_buffered);
    if (fd_direct >= 0) {
        close(fd_direct);
    }
    return check_summary();
}
