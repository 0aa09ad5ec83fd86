// llama_test_util.h - owns the helpers the libllama test programs share (logits_dump,
// concurrent_decode): their one-line messages, whole-number flags, the fixed token generator,
// greedy argmax and the logits fingerprint. Each program defines TEST_PROGRAM (its name, the
// prefix of every message) before including this; everything here is static to that program.
#ifndef GUANACO_LLAMA_TEST_UTIL_H
#define GUANACO_LLAMA_TEST_UTIL_H

#include "llama.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef TEST_PROGRAM
#error "define TEST_PROGRAM before including llama_test_util.h"
#endif

static void say(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(TEST_PROGRAM ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static bool parse_int(const char * flag, const char * s, long lo, long hi, long * out) {
    if (s == NULL) {
        say("%s needs a value", flag);
        return false;
    }
    char * end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        say("invalid value '%s' for %s (expected an integer in [%ld, %ld])", s, flag, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

// Fixed LCG (Numerical Recipes constants): the token sequences must be identical across runs,
// builds and machines, so no rand()/time().
static uint32_t lcg_next(uint32_t * state) {
    *state = *state * 1664525u + 1013904223u;
    return *state;
}

// Greedy argmax; ties resolve to the lowest id so the choice is deterministic.
static llama_token argmax(const float * row, int32_t n_vocab) {
    llama_token best = 0;
    for (int32_t j = 1; j < n_vocab; ++j) {
        if (row[j] > row[best]) {
            best = j;
        }
    }
    return best;
}

// FNV-1a over the raw bytes: printed so a human can eyeball two runs without cmp.
static uint64_t fnv1a(uint64_t h, const void * data, size_t n) {
    const unsigned char * p = data;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

#endif
