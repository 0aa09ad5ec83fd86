/*
 * page_table_bench.c - owns measuring what direct loading's page-table work
 * costs on this machine, apart from the disk: for expert-sized slices of a
 * file, the time of the syscalls that place and evict an anonymous copy
 * (src/residency.c: mprotect and mremap into the file's mapping, mremap out to
 * a spare and mmap of the file back), and the time of the first read of every
 * page afterwards, which is what a matmul pays; the same first read of a
 * page-cache mapping that page-cache loading populated (MADV_POPULATE_READ)
 * before compute reads it. It compares them with a copy
 * read in place into anonymous memory that never moves, and with a warm read.
 * Where the hypervisor keeps its own (shadow) page tables, a moved page's
 * first read traps to it without any fault the guest can count: that time
 * appears as slower compute, not as engine time. Not a test: it checks only
 * errors and that every copy holds the file's bytes. Reads go through src/io.c, as the engine's do.
 *
 * usage: guanaco-page-table-bench [-s slice] [-n slices] [-r rounds] FILE
 * Sizes take a k, m or g suffix (binary). Defaults: 1632k slices (a
 * Qwen3-30B-A3B Q8_0 expert's gate, up or down tensor), 40 of them, 3 rounds.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096ull

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static long minor_faults(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
}

static uint64_t parse_size(const char *text) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    uint64_t scale = 1;
    switch (*end) {
    case 'k': case 'K': scale = 1ull << 10; end++; break;
    case 'm': case 'M': scale = 1ull << 20; end++; break;
    case 'g': case 'G': scale = 1ull << 30; end++; break;
    default: break;
    }
    if (errno || end == text || *end || value == 0 || value > (1ull << 40) / scale) {
        return 0;
    }
    return value * scale;
}

static volatile uint64_t sink;

/* One 8-byte read per page: the first touch's cost, not the bandwidth. */
static double touch(const char *at, uint64_t length) {
    double start = now_ms();
    uint64_t sum = 0;
    for (uint64_t o = 0; o < length; o += PAGE) {
        sum += *(const volatile uint64_t *)(at + o);
    }
    sink = sum;
    return now_ms() - start;
}

struct touch_part {
    const char *at;
    uint64_t length;
};

static void *touch_part(void *arg) {
    const struct touch_part *part = arg;
    touch(part->at, part->length);
    return NULL;
}

/* The first touch split between two threads, as two compute threads split an expert's rows: whether the
   hypervisor fills shadow entries for both at once or one after the other. Wall time, ms; < 0 if a thread could
   not start. */
static double touch_two_threads(const char *at, uint64_t length) {
    uint64_t half = length / 2 / PAGE * PAGE;
    struct touch_part parts[2] = {{at, half}, {at + half, length - half}};
    pthread_t other;
    double start = now_ms();
    if (pthread_create(&other, NULL, touch_part, &parts[1]) != 0) {
        return -1;
    }
    touch_part(&parts[0]);
    pthread_join(other, NULL);
    return now_ms() - start;
}

struct phase {
    const char *name;
    double syscall_ms, read_ms, touch_ms;
    long touch_faults;
};

static void report(const struct phase *p, uint64_t pages) {
    printf("%-44s  syscalls %7.0f ns/page  first touch %7.0f ns/page (%ld guest faults)  O_DIRECT read %6.2f GB/s\n",
           p->name, p->syscall_ms * 1e6 / (double)pages, p->touch_ms * 1e6 / (double)pages, p->touch_faults,
           p->read_ms > 0 ? (double)pages * PAGE / p->read_ms / 1e6 : 0.0);
}

/* Reads slice i of the file into destinations[i] (with destinations NULL, to base + i * slice), every slice in
   one batch of src/io.c's, as the engine reads a layer's missing experts; 0 or -errno. */
static int read_slices(struct guanaco_io *io, int fd, char *const *destinations, char *base, uint64_t slice,
                       uint64_t n_slices) {
    struct guanaco_io_request *requests = calloc(n_slices, sizeof(*requests));
    if (!requests) {
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < n_slices; i++) {
        requests[i] = (struct guanaco_io_request){
            .fd = fd, .offset = i * slice, .length = slice, .destination = destinations ? destinations[i] : base + i * slice};
    }
    int ret = guanaco_io_read_batch(io, requests, n_slices);
    free(requests);
    return ret;
}

static int fail(const char *what) {
    fprintf(stderr, "page_table_bench: %s: %s\n", what, strerror(errno));
    return 1;
}

/* Drops the mapping's page-table entries, fills them again with MADV_POPULATE_READ as page-cache loading does, then
   reads each page once with 1 or 2 threads and reports; 0, or 1 after a message. */
static int populated_touch(char *mapping, uint64_t length, int threads) {
    struct phase p = {.name = threads == 1 ? "page cache, populated, first touch"
                                           : "page cache, populated, first touch, 2 threads"};
    if (madvise(mapping, length, MADV_DONTNEED) != 0) {
        return fail("madvise");
    }
    double start = now_ms();
    if (madvise(mapping, length, MADV_POPULATE_READ) != 0) {
        return fail("madvise(MADV_POPULATE_READ)");
    }
    p.syscall_ms = now_ms() - start;
    long faults = minor_faults();
    p.touch_ms = threads == 1 ? touch(mapping, length) : touch_two_threads(mapping, length);
    p.touch_faults = minor_faults() - faults;
    if (p.touch_ms < 0) {
        return fail("pthread_create");
    }
    report(&p, length / PAGE);
    return 0;
}

/* Reads every slice with O_DIRECT into its place in `at`, then reads each page once, reports and checks the
   bytes; 0, or 1 after a message. */
static int read_in_place(struct phase *p, struct guanaco_io *io, int direct_fd, char *at, uint64_t slice,
                         uint64_t n_slices, const char *reference) {
    uint64_t length = slice * n_slices;
    double start = now_ms();
    int ret = read_slices(io, direct_fd, NULL, at, slice, n_slices);
    p->read_ms = now_ms() - start;
    if (ret != 0) {
        errno = -ret;
        return fail("O_DIRECT read in place");
    }
    long faults = minor_faults();
    p->touch_ms = touch(at, length);
    p->touch_faults = minor_faults() - faults;
    report(p, length / PAGE);
    if (memcmp(at, reference, length) != 0) {
        fprintf(stderr, "page_table_bench: a copy read in place differs from the file\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    uint64_t slice = 1632ull << 10, n_slices = 40, rounds = 3;
    int opt;
    while ((opt = getopt(argc, argv, "s:n:r:")) != -1) {
        if (opt == '?') {
            return 2; /* getopt said which */
        }
        uint64_t value = parse_size(optarg);
        if (value == 0 || (opt != 's' && value > 100000)) {
            fprintf(stderr, "page_table_bench: bad value for -%c: %s\n", opt, optarg);
            return 2;
        }
        if (opt == 's') {
            slice = (value + PAGE - 1) / PAGE * PAGE;
        } else if (opt == 'n') {
            n_slices = value;
        } else {
            rounds = value;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: guanaco-page-table-bench [-s slice] [-n slices] [-r rounds] FILE\n");
        return 2;
    }
    const char *path = argv[optind];
    uint64_t length = slice * n_slices, pages = length / PAGE;
    int fd = open(path, O_RDONLY), direct_fd = open(path, O_RDONLY | O_DIRECT);
    struct stat st;
    if (fd < 0 || direct_fd < 0 || fstat(fd, &st) != 0) {
        return fail(path);
    }
    if (!S_ISREG(st.st_mode) || slice > (uint64_t)st.st_size / n_slices) {
        fprintf(stderr, "page_table_bench: %s: need a regular file of at least %llu bytes\n", path,
                (unsigned long long)length);
        return 2;
    }
    /* the engine's reads: io_uring where the kernel allows it, 1 MiB requests, queue depth 16 */
    struct guanaco_io *io = NULL;
    int ret = guanaco_io_create(GUANACO_IO_URING, 16, 1u << 20, &io);
    if (ret == -ENOSYS) {
        ret = guanaco_io_create(GUANACO_IO_THREADS, 16, 1u << 20, &io);
    }
    if (ret != 0) {
        errno = -ret;
        return fail("starting reads");
    }
    char *reference = malloc(length);
    if (!reference || (ret = read_slices(io, fd, NULL, reference, slice, n_slices)) != 0) {
        errno = reference ? -ret : ENOMEM;
        return fail("reading the reference copy");
    }
    /* the file's mapping, as the residency maps an expert tensor from its own descriptor */
    char *mapping = mmap(NULL, length, PROT_READ, MAP_SHARED, fd, 0);
    /* anonymous memory that never moves: a copy read in place */
    char *in_place = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char **spare = calloc(n_slices, sizeof(*spare));
    if (mapping == MAP_FAILED || in_place == MAP_FAILED || !spare) {
        return fail("mapping");
    }
    memset(in_place, 0, length);
    printf("page_table_bench: %s, %llu slices of %llu KiB (%llu pages), %llu rounds\n", path,
           (unsigned long long)n_slices, (unsigned long long)(slice >> 10), (unsigned long long)pages,
           (unsigned long long)rounds);
    for (uint64_t round = 1; round <= rounds; round++) {
        printf("round %llu\n", (unsigned long long)round);
        /* the file's pages, cached (read above), faulted into a mapping that has not seen them */
        if (madvise(mapping, length, MADV_DONTNEED) != 0) {
            return fail("madvise");
        }
        struct phase file = {.name = "page cache, first touch of the mapping"};
        long faults = minor_faults();
        file.touch_ms = touch(mapping, length);
        file.touch_faults = minor_faults() - faults;
        report(&file, pages);

        /* page-cache loading: the engine populates the mapping (MADV_POPULATE_READ) before compute reads it, so the
           guest's page tables are filled in the stall; what the first read still costs lands on compute */
        if (populated_touch(mapping, length, 1) != 0 || populated_touch(mapping, length, 2) != 0) {
            return 1;
        }

        /* direct loading: read into a copy (fresh in round 1, then a spare), make it read-only, move it in */
        struct phase place = {.name = round == 1 ? "copy placed by mremap (fresh pages)" : "copy placed by mremap (a spare)"};
        double start = now_ms();
        for (uint64_t i = 0; i < n_slices; i++) {
            if (!spare[i]) {
                spare[i] = mmap(NULL, slice, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (spare[i] == MAP_FAILED) {
                    return fail("mmap");
                }
            }
        }
        place.syscall_ms += now_ms() - start;
        start = now_ms();
        ret = read_slices(io, direct_fd, spare, NULL, slice, n_slices);
        place.read_ms = now_ms() - start;
        if (ret != 0) {
            errno = -ret;
            return fail("O_DIRECT read");
        }
        start = now_ms();
        for (uint64_t i = 0; i < n_slices; i++) {
            if (mprotect(spare[i], slice, PROT_READ) != 0 ||
                mremap(spare[i], slice, slice, MREMAP_MAYMOVE | MREMAP_FIXED, mapping + i * slice) == MAP_FAILED) {
                return fail("placing");
            }
            spare[i] = NULL;
        }
        place.syscall_ms += now_ms() - start;
        faults = minor_faults();
        place.touch_ms = touch(mapping, length);
        place.touch_faults = minor_faults() - faults;
        report(&place, pages);
        if (memcmp(mapping, reference, length) != 0) {
            fprintf(stderr, "page_table_bench: a placed copy differs from the file\n");
            return 1;
        }
        struct phase warm = {.name = "placed copies, second touch"};
        warm.touch_ms = touch(mapping, length);
        report(&warm, pages);

        /* eviction: the copy moves out to a spare (the range stays mapped, empty), the file goes back over it */
        struct phase evict = {.name = "eviction to a spare, file mapped back"};
        start = now_ms();
        for (uint64_t i = 0; i < n_slices; i++) {
#ifdef MREMAP_DONTUNMAP
            spare[i] = mmap(NULL, slice, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (spare[i] == MAP_FAILED ||
                mremap(mapping + i * slice, slice, slice, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
                       spare[i]) == MAP_FAILED ||
                mprotect(spare[i], slice, PROT_READ | PROT_WRITE) != 0) {
                return fail("evicting");
            }
#endif
            if (mmap(mapping + i * slice, slice, PROT_READ, MAP_SHARED | MAP_FIXED, fd, (off_t)(i * slice)) ==
                MAP_FAILED) {
                return fail("mapping the file back");
            }
        }
        evict.syscall_ms = now_ms() - start;
        report(&evict, pages);

        /* the alternative: read in place into anonymous memory whose pages never move */
        struct phase still = {.name = "copy read in place (no page-table change)"};
        if (read_in_place(&still, io, direct_fd, in_place, slice, n_slices, reference) != 0) {
            return 1;
        }

        /* an arena's way: the pages go back to the kernel at eviction, and the next read gets fresh ones */
        struct phase fresh = {.name = "read in place after MADV_DONTNEED (arena)"};
        start = now_ms();
        if (madvise(in_place, length, MADV_DONTNEED) != 0) {
            return fail("madvise");
        }
        fresh.syscall_ms = now_ms() - start;
        if (read_in_place(&fresh, io, direct_fd, in_place, slice, n_slices, reference) != 0) {
            return 1;
        }
    }
    guanaco_io_destroy(io);
    return 0;
}
