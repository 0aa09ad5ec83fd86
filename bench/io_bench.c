/*
 * io_bench.c - owns measuring src/io.c the way the engine will use it: one
 * batch of N random expert-sized reads (default 256 x 1.5 MiB, a Qwen3-30B-A3B
 * Q8_0 expert slice) from a file, for each backend, queue depth and buffered
 * or O_DIRECT, with the file dropped from the page cache before every run.
 * Prints GB/s per configuration. Not a test: it checks nothing but errors.
 * bench/fio-expert-reads.fio measures the same pattern with fio.
 *
 * usage: io_bench [-n reads] [-s size] [-c chunk] [-r repeats] [-q 1,4,16,64]
 *                 [-b io_uring,threads] [-m buffered,direct] FILE
 * Sizes take a k, m or g suffix (binary): -s 1536k.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096ull
#define MAX_DEPTHS 16
#define MAX_REPEATS 32

static uint64_t parse_size(const char *text) {
    char *end = NULL;
    double value = strtod(text, &end);
    uint64_t scale = 1;
    switch (end && *end ? *end : ' ') {
    case 'k': case 'K': scale = 1ull << 10; break;
    case 'm': case 'M': scale = 1ull << 20; break;
    case 'g': case 'G': scale = 1ull << 30; break;
    case ' ': break;
    default: return 0;
    }
    return value > 0 ? (uint64_t)(value * (double)scale) : 0;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t next_random(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fraction of the ranges' pages in the page cache: proof that the drop before a run worked. */
static double resident_fraction(const unsigned char *map, const struct guanaco_io_request *requests, size_t n) {
    size_t resident = 0, total = 0;
    unsigned char vector[4096];
    for (size_t i = 0; i < n; i++) {
        uint64_t start = requests[i].offset & ~(ALIGN - 1), end = requests[i].offset + requests[i].length;
        for (uint64_t at = start; at < end;) {
            uint64_t pages = (end - at + ALIGN - 1) / ALIGN;
            if (pages > sizeof(vector)) {
                pages = sizeof(vector);
            }
            if (mincore((void *)(map + at), pages * ALIGN, vector) != 0) {
                return -1;
            }
            for (uint64_t p = 0; p < pages; p++) {
                resident += vector[p] & 1;
            }
            total += pages;
            at += pages * ALIGN;
        }
    }
    return total ? (double)resident / (double)total : 0;
}

int main(int argc, char **argv) {
    size_t n = 256;
    uint64_t size = 1536 * 1024, chunk = 1 << 20;
    int repeats = 3;
    unsigned depths[MAX_DEPTHS] = {1, 4, 16, 64};
    int n_depths = 4;
    bool use_backend[2] = {true, true}, use_mode[2] = {true, true};
    int option;
    while ((option = getopt(argc, argv, "n:s:c:r:q:b:m:")) != -1) {
        switch (option) {
        case 'n': n = strtoul(optarg, NULL, 10); break;
        case 's': size = parse_size(optarg); break;
        case 'c': chunk = parse_size(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'q':
            n_depths = 0;
            for (char *p = strtok(optarg, ","); p && n_depths < MAX_DEPTHS; p = strtok(NULL, ",")) {
                depths[n_depths++] = (unsigned)strtoul(p, NULL, 10);
            }
            break;
        case 'b':
            use_backend[GUANACO_IO_URING] = strstr(optarg, "uring") != NULL;
            use_backend[GUANACO_IO_THREADS] = strstr(optarg, "threads") != NULL;
            break;
        case 'm':
            use_mode[0] = strstr(optarg, "buffered") != NULL;
            use_mode[1] = strstr(optarg, "direct") != NULL;
            break;
        default:
            fprintf(stderr, "usage: %s [-n reads] [-s size] [-c chunk] [-r repeats] [-q 1,4,16,64] "
                            "[-b io_uring,threads] [-m buffered,direct] FILE\n", argv[0]);
            return 2;
        }
    }
    if (optind != argc - 1 || n == 0 || size == 0 || chunk == 0 || chunk > GUANACO_IO_MAX_CHUNK_BYTES ||
        repeats < 1 || repeats > MAX_REPEATS) {
        fprintf(stderr, "guanaco: error: io_bench needs one FILE, and -n, -s, -c, -r (1..%d) above zero\n",
                MAX_REPEATS);
        return 2;
    }
    const char *path = argv[optind];
    int fd_buffered = open(path, O_RDONLY);
    struct stat st;
    if (fd_buffered < 0 || fstat(fd_buffered, &st) != 0) {
        fprintf(stderr, "guanaco: error: %s: %s\n", path, strerror(errno));
        return 1;
    }
    /* O_DIRECT needs whole blocks: every read is one expert rounded up to them, at a block-aligned slot. */
    uint64_t stride = (size + ALIGN - 1) & ~(ALIGN - 1);
    uint64_t slots = (uint64_t)st.st_size / stride;
    if (slots < n) {
        fprintf(stderr, "guanaco: error: %s holds %llu slots of %llu bytes, fewer than the %zu reads asked for\n",
                path, (unsigned long long)slots, (unsigned long long)stride, n);
        return 1;
    }
    uint64_t *slot_of = malloc(slots * sizeof(*slot_of));
    for (uint64_t i = 0; i < slots; i++) {
        slot_of[i] = i;
    }
    unsigned char *buffer = NULL;
    if (posix_memalign((void **)&buffer, ALIGN, n * stride) != 0) {
        fprintf(stderr, "guanaco: error: cannot allocate %zu x %llu bytes\n", n, (unsigned long long)stride);
        return 1;
    }
    memset(buffer, 1, n * stride); /* fault the destination in now, not inside the timed reads */
    struct guanaco_io_request *requests = calloc(n, sizeof(*requests));
    unsigned char *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd_buffered, 0);
    fdatasync(fd_buffered); /* dirty pages of a freshly written file cannot be dropped */

    printf("%s: %zu reads of %llu bytes (%.1f MiB per batch), chunk %llu, median of %d runs, "
           "page cache dropped before each\n",
           path, n, (unsigned long long)size, (double)(n * size) / (1 << 20), (unsigned long long)chunk, repeats);
    printf("%-9s %-9s %5s %9s %9s %11s\n", "backend", "mode", "depth", "GB/s", "best GB/s", "ms/batch");
    for (int backend = GUANACO_IO_URING; backend <= GUANACO_IO_THREADS; backend++) {
        if (!use_backend[backend]) {
            continue;
        }
        for (int direct = 0; direct <= 1; direct++) {
            if (!use_mode[direct]) {
                continue;
            }
            int fd = direct ? open(path, O_RDONLY | O_DIRECT) : fd_buffered;
            if (fd < 0) {
                printf("%-9s %-9s  skipped: %s\n", guanaco_io_backend_name(backend), "direct", strerror(errno));
                continue;
            }
            uint64_t length = direct ? stride : size;
            for (int d = 0; d < n_depths; d++) {
                struct guanaco_io *io = NULL;
                int ret = guanaco_io_create(backend, depths[d], (unsigned)chunk, &io);
                if (ret < 0) {
                    printf("%-9s %-9s %5u  skipped: %s\n", guanaco_io_backend_name(backend),
                           direct ? "direct" : "buffered", depths[d], strerror(-ret));
                    continue;
                }
                double rates[MAX_REPEATS], seconds_total = 0, worst_resident = 0;
                for (int r = 0; r < repeats && ret == 0; r++) {
                    /* Fresh distinct slots every run, like distinct experts: no read finds another's pages in
                     * a cache (ours is dropped; a VM host's or a drive's may not be). */
                    for (size_t i = 0; i < n; i++) {
                        uint64_t j = i + next_random() % (slots - i), t = slot_of[i];
                        slot_of[i] = slot_of[j];
                        slot_of[j] = t;
                    }
                    for (size_t i = 0; i < n; i++) {
                        requests[i] = (struct guanaco_io_request){
                            .fd = fd, .offset = slot_of[i] * stride, .length = length,
                            .destination = buffer + i * stride};
                    }
                    posix_fadvise(fd_buffered, 0, 0, POSIX_FADV_DONTNEED);
                    double resident = map != MAP_FAILED ? resident_fraction(map, requests, n) : 0;
                    worst_resident = resident > worst_resident ? resident : worst_resident;
                    double start = now_seconds();
                    ret = guanaco_io_read_batch(io, requests, n);
                    double seconds = now_seconds() - start;
                    seconds_total += seconds;
                    rates[r] = (double)(n * length) / seconds / 1e9;
                }
                guanaco_io_destroy(io);
                if (ret < 0) {
                    printf("%-9s %-9s %5u  failed: %s\n", guanaco_io_backend_name(backend),
                           direct ? "direct" : "buffered", depths[d], strerror(-ret));
                    continue;
                }
                qsort(rates, (size_t)repeats, sizeof(double), compare_doubles);
                printf("%-9s %-9s %5u %9.2f %9.2f %11.1f%s\n", guanaco_io_backend_name(backend),
                       direct ? "direct" : "buffered", depths[d], rates[repeats / 2], rates[repeats - 1],
                       seconds_total * 1e3 / repeats,
                       worst_resident > 0.01 ? "  (warning: page cache not dropped)" : "");
            }
            if (direct) {
                close(fd);
            }
        }
    }
    if (map != MAP_FAILED) {
        munmap(map, (size_t)st.st_size);
    }
    free(requests);
    free(buffer);
    free(slot_of);
    close(fd_buffered);
    return 0;
}
