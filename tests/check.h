/*
 * check.h - owns the assertion macro every C test program shares: a failed
 * CHECK prints its file, line and expression and the run goes on, so one run
 * reports every failure; main() ends with check_summary(), whose
 * "N passed, N failed" line is what CI reads.
 */
#ifndef GUANACO_TEST_CHECK_H
#define GUANACO_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) {                                                                  \
            check_passed++;                                                          \
        } else {                                                                     \
            check_failed++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
        }                                                                            \
    } while (0)

/* Prints the summary line; returns the process exit status. */
static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
