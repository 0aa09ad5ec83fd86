/*
 * log.c - owns Guanaco's output to stderr. Each line is written with a single
 * fputs so that lines from concurrent contexts do not interleave mid-line.
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_bool log_enabled = true;

/* the progress line: shown now, and when it was last drawn; one writer at a time */
static pthread_mutex_t progress_lock = PTHREAD_MUTEX_INITIALIZER;
static bool progress_shown;
static uint64_t progress_drawn_ns;
#define PROGRESS_EVERY_NS 250000000ull
#define CLEAR_LINE "\r\033[K"

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
    pthread_mutex_lock(&progress_lock);
    if (progress_shown) {
        fputs(CLEAR_LINE, stderr);
        progress_shown = false;
    }
    fputs(line, stderr);
    pthread_mutex_unlock(&progress_lock);
}

static bool progress_wanted(void) {
    static int terminal = -1; /* asked once: stderr does not change from terminal to file mid-run */
    if (terminal < 0) {
        terminal = isatty(STDERR_FILENO) ? 1 : 0;
    }
    return terminal == 1 && atomic_load(&log_enabled);
}

void guanaco_log_progress(const char *format, ...) {
    if (!progress_wanted()) {
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    pthread_mutex_lock(&progress_lock);
    if (!progress_shown || now_ns - progress_drawn_ns >= PROGRESS_EVERY_NS) {
        char line[256];
        int n = snprintf(line, sizeof(line), CLEAR_LINE "guanaco: ");
        va_list args;
        va_start(args, format);
        if (n > 0 && (size_t)n < sizeof(line)) {
            vsnprintf(line + n, sizeof(line) - (size_t)n, format, args);
        }
        va_end(args);
        fputs(line, stderr);
        fflush(stderr);
        progress_shown = true;
        progress_drawn_ns = now_ns;
    }
    pthread_mutex_unlock(&progress_lock);
}

void guanaco_log_progress_end(void) {
    pthread_mutex_lock(&progress_lock);
    if (progress_shown) {
        fputs(CLEAR_LINE, stderr);
        fflush(stderr);
        progress_shown = false;
    }
    pthread_mutex_unlock(&progress_lock);
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
