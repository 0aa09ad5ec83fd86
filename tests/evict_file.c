// evict_file: drop the page cache of specific files (and only those).
//
// Owns: making a Guanaco streaming test really read the model from disk, without the big
// hammer of `echo 3 > /proc/sys/vm/drop_caches` (which would perturb every other process on
// the machine and needs the whole system to re-warm). Used by tests/cgroup_run.sh through
// env GUANACO_EVICT_TOOL.
//
// Usage: evict_file FILE...
// For each file: open read-only, fdatasync (dirty pages cannot be dropped, so a file that was
// just written by guanaco-mkmodel must be flushed first), then posix_fadvise(DONTNEED) over the
// whole file. DONTNEED is only advice (pages mapped by a live process stay), so it reports
// what is still resident, measured with mincore(): "evict_file: FILE: resident A -> B of N pages".
// Exit status: 0 if every file was processed, 1 if any failed (each failure printed).

// mincore() is not POSIX; _DEFAULT_SOURCE exposes it under -std=c11.
#define _DEFAULT_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// Number of the file's pages currently in the page cache, or -1 if it cannot be measured
// (measurement failure is not an eviction failure, so callers only print it).
static long resident_pages(int fd, off_t size, long * total) {
    const long psz = sysconf(_SC_PAGESIZE);
    *total = (long) ((size + psz - 1) / psz);
    if (size == 0) {
        return 0;
    }
    void * map = mmap(NULL, (size_t) size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        return -1;
    }
    unsigned char * vec = malloc((size_t) *total);
    long n = -1;
    if (vec != NULL && mincore(map, (size_t) size, vec) == 0) {
        n = 0;
        for (long i = 0; i < *total; ++i) {
            n += vec[i] & 1;
        }
    }
    free(vec);
    munmap(map, (size_t) size);
    return n;
}

static int evict(const char * path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "evict_file: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fprintf(stderr, "evict_file: cannot stat '%s': %s\n", path, strerror(errno));
        close(fd);
        return 1;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "evict_file: '%s' is not a regular file\n", path);
        close(fd);
        return 1;
    }
    long total = 0;
    const long before = resident_pages(fd, st.st_size, &total);
    // fdatasync on an O_RDONLY fd is allowed on Linux and flushes the file's dirty pages,
    // which DONTNEED would otherwise silently skip.
    if (fdatasync(fd) != 0) {
        fprintf(stderr, "evict_file: fdatasync '%s' failed: %s\n", path, strerror(errno));
        close(fd);
        return 1;
    }
    // offset 0, len 0 = to the end of the file. posix_fadvise returns the error, not errno.
    int err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (err != 0) {
        fprintf(stderr, "evict_file: posix_fadvise(DONTNEED) '%s' failed: %s\n", path, strerror(err));
        close(fd);
        return 1;
    }
    const long after = resident_pages(fd, st.st_size, &total);
    printf("evict_file: %s: resident %ld -> %ld of %ld pages\n", path, before, after, total);
    if (close(fd) != 0) {
        fprintf(stderr, "evict_file: close '%s' failed: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: evict_file FILE...\n");
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; ++i) {
        if (evict(argv[i]) != 0) {
            rc = 1;
        }
    }
    return rc;
}
