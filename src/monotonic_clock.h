/*
 * monotonic_clock.h - owns the runtime's one way to read the time: the
 * monotonic clock in nanoseconds, for stalls, read batches and the
 * read-ahead throttle's ubatch times. CLOCK_MONOTONIC, not the wall clock:
 * a clock step must not show up as a stall.
 */
#ifndef GUANACO_MONOTONIC_CLOCK_H
#define GUANACO_MONOTONIC_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t guanaco_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
