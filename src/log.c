/*
 * log.c - owns Guanaco's output to stderr. Each line is written with a single
 * fputs so that lines from concurrent contexts do not interleave mid-line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_bool log_enabled = true;

void guanaco_log_set_enabled(bool enabled) { atomic_store(&log_enabled, enabled); }

bool guanaco_log_enabled(void) { return atomic_load(&log_enabled); }

static void write_line(const char *level, const char *format, va_list args) {
    char line[1024];
    int n = snprintf(line, sizeof(line), "guanaco: %s", level);
    if (n < 0 || (size_t)n >= sizeof(line)) {
        return;
    }
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, format, args);
    if (m < 0) {
        return;
    }
    size_t len = (size_t)n + ((size_t)m < sizeof(line) - (size_t)n - 1 ? (size_t)m : sizeof(line) - (size_t)n - 2);
    line[len] = '\n';
    line[len + 1] = '\0';
    fputs(line, stderr);
}

void guanaco_log_info(const char *format, ...) {
    if (!atomic_load(&log_enabled)) {
        return;
    }
    va_list args;
    va_start(args, format);
    write_line("", format, args);
    va_end(args);
}

void guanaco_log_error(const char *format, ...) {
    va_list args;
    va_start(args, format);
    write_line("error: ", format, args);
    va_end(args);
}
