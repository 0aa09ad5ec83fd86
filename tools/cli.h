/*
 * cli.h - owns what Guanaco's command-line tools share when reading their
 * arguments: a whole number in [1, max], or a message naming the flag.
 */
#ifndef GUANACO_TOOLS_CLI_H
#define GUANACO_TOOLS_CLI_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
