/*
 * huge_pages.h - owns the tests' view of transparent huge pages: whether the
 * kernel has them at all, and whether the mapping holding an address is
 * advised MADV_HUGEPAGE (VmFlags "hg" in /proc/self/smaps). The slot pool's
 * tests (test_unit, test_residency) ask both.
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

#endif
