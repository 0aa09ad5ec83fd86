/*
 * huge_pages.h - owns the tests' view of transparent huge pages: whether the
 * kernel has them at all, and whether the mapping holding an address is
 * advised MADV_HUGEPAGE (VmFlags "hg" in /proc/self/smaps), and how much of
 * it the kernel maps in huge pages now. The slot pool's tests (test_unit,
 * test_residency) ask these.
 */
#ifndef GUANACO_TEST_HUGE_PAGES_H
#define GUANACO_TEST_HUGE_PAGES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline bool transparent_huge_pages_available(void) {
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof(mode), f)) {
            mode[0] = '\0';
        }
        fclose(f);
    }
    return mode[0] && !strstr(mode, "[never]");
}

static inline bool mapping_advised_huge(const void *at) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) {
        return false;
    }
    char line[4096];
    bool inside = false, advised = false;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long a, b;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s ", &a, &b, perms) == 3) {
            inside = (uintptr_t)at >= a && (uintptr_t)at < b;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            advised = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return advised;
}

/* AnonHugePages of the mapping holding `at`, in bytes; 0 where it cannot be read. */
static inline uint64_t mapping_huge_bytes(const void *at) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) {
        return 0;
    }
    char line[4096];
    bool inside = false;
    uint64_t huge_kib = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long a, b, kib;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s ", &a, &b, perms) == 3) {
            inside = (uintptr_t)at >= a && (uintptr_t)at < b;
        } else if (inside && sscanf(line, "AnonHugePages: %llu kB", &kib) == 1) {
            huge_kib = kib;
            break;
        }
    }
    fclose(f);
    return huge_kib * 1024;
}

#endif
