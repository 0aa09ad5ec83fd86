/*
 * cli.h - owns what Guanaco's command-line tools share when reading their
 * arguments: a whole number in [1, max], a seed, a real number in a range,
 * and taking the value of a known flag, each with a message naming the flag
 * when the argument is bad.
 */
#ifndef GUANACO_TOOLS_CLI_H
#define GUANACO_TOOLS_CLI_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Own value parsers: strto* alone take " 5" and wrap "-1"; no Debian library checks a range and names the flag. */
static inline int guanaco_cli_parse_whole(const char *program, const char *flag, const char *text,
                                          unsigned long max, unsigned long *out) {
    char *end = NULL;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || value == 0 || value > max) {
        fprintf(stderr, "%s: %s needs a whole number from 1 to %lu, not \"%s\"\n", program, flag, max, text);
        return -EINVAL;
    }
    *out = value;
    return 0;
}

/* Any whole number from 0 to 2^64 - 1, as seeds are. */
static inline int guanaco_cli_parse_seed(const char *program, const char *flag, const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || text[0] == '+') {
        fprintf(stderr, "%s: %s needs a whole number from 0 to 18446744073709551615, not \"%s\"\n", program, flag,
                text);
        return -EINVAL;
    }
    *out = value;
    return 0;
}

/* A finite number in [min, max], or in (min, max] when min_excluded. */
static inline int guanaco_cli_parse_real(const char *program, const char *flag, const char *text, double min,
                                         double max, bool min_excluded, double *out) {
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) || value < min || value > max ||
        (min_excluded && value == min)) {
        if (isinf(max)) {
            fprintf(stderr, "%s: %s needs a number %s %g, not \"%s\"\n", program, flag,
                    min_excluded ? "greater than" : "of at least", min, text);
        } else {
            fprintf(stderr, "%s: %s needs a number from %g to %g%s, not \"%s\"\n", program, flag, min, max,
                    min_excluded ? " (not the lower end)" : "", text);
        }
        return -EINVAL;
    }
    *out = value;
    return 0;
}

/*
 * argv[*i] must be one of the n_flags flags that take a value: 0 with *value
 * the next argument and *i moved onto it; -ENOENT after a message when the
 * flag is not one of them (the caller may print its usage); -EINVAL after a
 * message when the value is missing.
 */
static inline int guanaco_cli_flag_value(const char *program, int argc, char **argv, int *i,
                                         const char *const *flags, size_t n_flags, const char **value) {
    const char *arg = argv[*i];
    bool known = false;
    for (size_t f = 0; f < n_flags; f++) {
        known = known || strcmp(arg, flags[f]) == 0;
    }
    if (!known) {
        fprintf(stderr, "%s: %s %s\n", program, arg[0] == '-' ? "unknown option" : "unexpected argument", arg);
        return -ENOENT;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", program, arg);
        return -EINVAL;
    }
    *value = argv[++*i];
    return 0;
}

#endif
