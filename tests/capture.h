/*
 * capture.h - owns what the C tests share for checking expected errors: stderr
 * goes to a temporary file between begin_capture() and end_capture(), whose
 * text is then in `captured` for said(), so an expected error is asserted on
 * and does not clutter the test's output.
 */
#ifndef GUANACO_TEST_CAPTURE_H
#define GUANACO_TEST_CAPTURE_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char captured[8192]; /* stderr of the last captured call */
static int saved_stderr = -1;
static char capture_path[64];

static inline void begin_capture(void) {
    fflush(stderr);
    snprintf(capture_path, sizeof(capture_path), "/tmp/guanaco_test_stderr.XXXXXX");
    int fd = mkstemp(capture_path);
    saved_stderr = dup(2);
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    }
}

static inline void end_capture(void) {
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    captured[0] = '\0';
    FILE *f = fopen(capture_path, "r");
    if (f) {
        size_t n = fread(captured, 1, sizeof(captured) - 1, f);
        captured[n] = '\0';
        fclose(f);
    }
    unlink(capture_path);
}

static inline bool said(const char *text) { return strstr(captured, text) != NULL; }

#endif
