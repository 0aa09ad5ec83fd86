/*
 * mapping_guard.h - a SIGBUS in the model file's mapping (the file shrank
 * while running) becomes a flag instead of a crash; mapping_guard.c says how.
 */
#ifndef GUANACO_MAPPING_GUARD_H
#define GUANACO_MAPPING_GUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* Guard [begin, begin + bytes): a fault there maps zeros over the rest of the range and sets *faulted to 1.
   Installs the SIGBUS handler on first use. 0, -EINVAL, -ENOSPC (64 ranges at most) or sigaction's error. */
int guanaco_mapping_guard_add(const void *begin, size_t bytes, _Atomic int *faulted);

/* Stop guarding the range that starts at begin (before it is unmapped). */
void guanaco_mapping_guard_remove(const void *begin);

#endif
