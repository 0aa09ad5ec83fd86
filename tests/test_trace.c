/*
 * test_trace.c - owns the unit tests of the routing-trace file (src/trace.c)
 * and of its JSON Lines converter (offline/trace_jsonl.c): round trips, every
 * rejection the loader promises (bad magic, version, truncation, ids and
 * layers out of range, an id twice in a record, streams and sizes no memory
 * holds), write errors from /dev/full and a file-size limit, concurrent appends, and
 * converting small JSONL fixtures written here, malformed ones included.
 * Error messages are captured from stderr and checked for what they name.
 */
#include "trace.h"
#include "trace_jsonl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "check.h"
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>


static char directory[] = "/tmp/guanaco_test_trace.XXXXXX";
#include "capture.h"

static void path_in_directory(char *out, size_t size, const char *name) {
    snprintf(out, size, "%s/%s", directory, name);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static struct guanaco_trace_shape make_shape(uint32_t n_layer, uint32_t n_expert, uint32_t top_k) {
    struct guanaco_trace_shape shape;
    memset(&shape, 0, sizeof(shape));
    shape.n_layer = n_layer;
    shape.n_expert = n_expert;
    shape.top_k = top_k;
    snprintf(shape.arch, sizeof(shape.arch), "qwen3moe");
    snprintf(shape.source, sizeof(shape.source), "unit test");
    return shape;
}

/* Writes a valid 4-layer, 8-expert, top-2 trace of `n` records to `path`. */
static int write_small_trace(const char *path, int n) {
    struct guanaco_trace_shape shape = make_shape(4, 8, 2);
    struct guanaco_trace_writer *writer;
    int err = guanaco_trace_writer_open(path, &shape, &writer);
    for (int i = 0; i < n && err == 0; i++) {
        int32_t ids[2] = {i % 8, (i + 3) % 8};
        float weights[2] = {0.75f, 0.25f};
        err = guanaco_trace_writer_append(writer, 0, (uint32_t)(i / 4), (uint32_t)(i % 4), ids, weights);
    }
    int close_err = guanaco_trace_writer_close(writer);
    return err ? err : close_err;
}

static void patch_byte(const char *path, long offset, unsigned char value) {
    int fd = open(path, O_WRONLY);
    if (fd >= 0) {
        if (pwrite(fd, &value, 1, offset) != 1) {
            perror("pwrite");
        }
        close(fd);
    }
}

static void test_round_trip(void) {
    char path[256];
    path_in_directory(path, sizeof(path), "round.trace");
    struct guanaco_trace_shape shape = make_shape(48, 128, 8);
    struct guanaco_trace_writer *writer = NULL;
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0 && writer);
    int32_t ids[3][8];
    float weights[3][8];
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < 8; k++) {
            ids[r][k] = 127 - (r * 8 + k);
            weights[r][k] = 0.125f * (float)k - 0.5f + (float)r;
        }
    }
    CHECK(guanaco_trace_writer_append(writer, 7, 0, 0, ids[0], weights[0]) == 0);
    CHECK(guanaco_trace_writer_append(writer, 7, 0, 47, ids[1], weights[1]) == 0);
    CHECK(guanaco_trace_writer_append(writer, 4000000000u, 4000000001u, 3, ids[2], weights[2]) == 0);
    CHECK(guanaco_trace_writer_close(writer) == 0);

    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 120 + 3 * 60); /* 12 + 8*2 + 8*4 bytes per record */
    struct guanaco_trace trace;
    CHECK(guanaco_trace_load(path, &trace) == 0);
    CHECK(trace.n_records == 3);
    CHECK(trace.shape.n_layer == 48 && trace.shape.n_expert == 128 && trace.shape.top_k == 8);
    CHECK(strcmp(trace.shape.arch, "qwen3moe") == 0 && strcmp(trace.shape.source, "unit test") == 0);
    CHECK(trace.n_records == 3 && trace.sequence[0] == 7 && trace.token[0] == 0 && trace.layer[0] == 0);
    CHECK(trace.n_records == 3 && trace.layer[1] == 47);
    CHECK(trace.n_records == 3 && trace.sequence[2] == 4000000000u && trace.token[2] == 4000000001u &&
          trace.layer[2] == 3);
    bool same = trace.n_records == 3;
    for (int r = 0; same && r < 3; r++) {
        same = memcmp(trace.ids + r * 8, ids[r], sizeof(ids[r])) == 0 &&
               memcmp(trace.weights + r * 8, weights[r], sizeof(weights[r])) == 0;
    }
    CHECK(same);
    guanaco_trace_free(&trace);
    CHECK(trace.ids == NULL && trace.n_records == 0);

    /* An odd top_k pads its ids to 4 bytes, and text that fills its array is cut to leave a NUL. */
    shape = make_shape(2, 5, 3);
    memset(shape.arch, 'a', sizeof(shape.arch));
    memset(shape.source, 's', sizeof(shape.source));
    CHECK(guanaco_trace_record_bytes(3) == 12 + 8 + 12);
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    int32_t odd_ids[3] = {4, 0, 2};
    float odd_weights[3] = {0.5f, 0.3f, 0.2f};
    CHECK(guanaco_trace_writer_append(writer, 1, 2, 1, odd_ids, odd_weights) == 0);
    CHECK(guanaco_trace_writer_close(writer) == 0);
    CHECK(stat(path, &st) == 0 && st.st_size == 120 + 32);
    CHECK(guanaco_trace_load(path, &trace) == 0);
    CHECK(trace.n_records == 1 && trace.ids[0] == 4 && trace.ids[1] == 0 && trace.ids[2] == 2 &&
          trace.weights[2] == 0.2f);
    CHECK(strlen(trace.shape.arch) == 31 && strlen(trace.shape.source) == 63);
    guanaco_trace_free(&trace);

    /* A trace with no records is valid: a run that routed nothing. */
    CHECK(write_small_trace(path, 0) == 0);
    CHECK(guanaco_trace_load(path, &trace) == 0 && trace.n_records == 0);
    guanaco_trace_free(&trace);
    unlink(path);
}

static void test_null_weights(void) {
    char path[256];
    path_in_directory(path, sizeof(path), "null.trace");
    struct guanaco_trace_shape shape = make_shape(1, 8, 2);
    struct guanaco_trace_writer *writer;
    int32_t ids[2] = {7, 1};
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    CHECK(guanaco_trace_writer_append(writer, 0, 0, 0, ids, NULL) == 0);
    CHECK(guanaco_trace_writer_close(writer) == 0);
    struct guanaco_trace trace;
    CHECK(guanaco_trace_load(path, &trace) == 0);
    CHECK(trace.n_records == 1 && trace.ids[0] == 7 && trace.ids[1] == 1 && trace.weights[0] == 0.0f &&
          trace.weights[1] == 0.0f);
    guanaco_trace_free(&trace);
    unlink(path);
}

static void test_shape_check(void) {
    struct guanaco_trace_shape shape = make_shape(32, 8, 2);
    snprintf(shape.source, sizeof(shape.source), "mixtral-8x7b humaneval");
    CHECK(guanaco_trace_shape_check(&shape, 32, 8, 2) == 0);

    begin_capture();
    int err = guanaco_trace_shape_check(&shape, 48, 128, 8);
    end_capture();
    CHECK(err == -EINVAL);
    CHECK(said("layers: trace 32, model 48"));
    CHECK(said("experts per layer: trace 8, model 128"));
    CHECK(said("(top_k): trace 2, model 8"));
    CHECK(said("mixtral-8x7b humaneval"));

    begin_capture();
    err = guanaco_trace_shape_check(&shape, 32, 8, 4);
    end_capture();
    CHECK(err == -EINVAL && said("(top_k): trace 2, model 4") && !said("layers:") && !said("per layer:"));

    /* Shapes a trace cannot hold are refused at open. */
    char path[256];
    path_in_directory(path, sizeof(path), "shape.trace");
    struct guanaco_trace_writer *writer = NULL;
    shape = make_shape(4, 8, 9);
    begin_capture();
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == -EINVAL && writer == NULL);
    shape = make_shape(4, 70000, 2);
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == -EINVAL);
    shape = make_shape(0, 8, 2);
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == -EINVAL);
    end_capture();
    CHECK(said("impossible trace shape"));
    CHECK(access(path, F_OK) != 0);
}

static void test_rejected_files(void) {
    char path[256], missing[256];
    path_in_directory(path, sizeof(path), "bad.trace");
    path_in_directory(missing, sizeof(missing), "no/such/dir.trace");
    struct guanaco_trace trace;
    struct stat st;

    /* Truncated in the middle of record 5: names the file and the record. */
    CHECK(write_small_trace(path, 8) == 0);
    CHECK(truncate(path, 120 + 5 * 24 + 10) == 0);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL && trace.ids == NULL);
    end_capture();
    CHECK(said(path) && said("record 5 is partial (10 of its 24 bytes)"));

    /* Truncated inside the header. */
    CHECK(truncate(path, 60) == 0);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said(path) && said("truncated"));

    /* Empty file, bad magic. */
    CHECK(truncate(path, 0) == 0);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said("not a Guanaco routing trace"));
    CHECK(write_small_trace(path, 2) == 0);
    patch_byte(path, 0, 'X');
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said(path) && said("not a Guanaco routing trace"));

    /* Version from the future. */
    CHECK(write_small_trace(path, 2) == 0);
    patch_byte(path, 8, 2);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said("version 2"));

    /* Header shape with top_k > n_expert. */
    CHECK(write_small_trace(path, 2) == 0);
    patch_byte(path, 20, 9);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said("impossible trace shape"));

    /* Expert id 8 in an 8-expert trace, in record 1's second id. */
    CHECK(write_small_trace(path, 3) == 0);
    patch_byte(path, 120 + 24 + 12 + 2, 8);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said(path) && said("record 1 ") && said("names expert 8, but the trace declares 8 experts"));

    /* Layer 4 in a 4-layer trace, in record 2. */
    CHECK(write_small_trace(path, 3) == 0);
    patch_byte(path, 120 + 2 * 24 + 8, 4);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said("record 2 ") && said("layer 4, but the trace declares 4 layers"));

    /* Arch field without a NUL. */
    CHECK(write_small_trace(path, 1) == 0);
    for (int i = 24; i < 56; i++) patch_byte(path, i, 'z');
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL);
    end_capture();
    CHECK(said("arch field"));

    /* Missing file and directory: the errno comes back. */
    begin_capture();
    CHECK(guanaco_trace_load(missing, &trace) == -ENOENT);
    struct guanaco_trace_shape shape = make_shape(4, 8, 2);
    struct guanaco_trace_writer *writer = NULL;
    CHECK(guanaco_trace_writer_open(missing, &shape, &writer) == -ENOENT && writer == NULL);
    end_capture();
    CHECK(said(missing));

    /* The writer refuses a record outside its shape and writes nothing for it. */
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    int32_t too_big[2] = {1, 8}, negative[2] = {-1, 2}, fine[2] = {1, 2};
    begin_capture();
    CHECK(guanaco_trace_writer_append(writer, 0, 0, 0, too_big, NULL) == -EINVAL);
    CHECK(guanaco_trace_writer_append(writer, 0, 0, 0, negative, NULL) == -EINVAL);
    CHECK(guanaco_trace_writer_append(writer, 0, 0, 4, fine, NULL) == -EINVAL);
    end_capture();
    CHECK(said("expert id 8") && said("expert id -1") && said("layer 4"));
    CHECK(guanaco_trace_writer_append(writer, 0, 0, 3, fine, NULL) == 0);
    CHECK(guanaco_trace_writer_close(writer) == 0);
    CHECK(stat(path, &st) == 0 && st.st_size == 120 + 24);
    unlink(path);
}

static void test_device_full(void) {
    /* Only ever opened for writing: /dev/full is a device, never ours to create, remove or replace. */
    struct stat st;
    if (stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode)) {
        fprintf(stderr, "SKIP test_device_full: /dev/full is not a character device here\n");
        return;
    }
    struct guanaco_trace_shape shape = make_shape(4, 8, 2);
    struct guanaco_trace_writer *writer = NULL;

    /* The header is written at open, so a destination that cannot take it is refused before any
       decoding records into it (--guanaco-trace-out /dev/full fails the load, not the closing summary). */
    begin_capture();
    CHECK(guanaco_trace_writer_open("/dev/full", &shape, &writer) == -ENOSPC && writer == NULL);
    end_capture();
    CHECK(said("/dev/full") && said("No space left on device"));

    /* The converter reports it too, and leaves /dev/full alone. */
    char input[256];
    path_in_directory(input, sizeof(input), "full.jsonl");
    write_text(input, "{\"dataset\": \"d\", \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 0], \"token_idx\": 0}\n");
    begin_capture();
    CHECK(guanaco_trace_convert_jsonl(input, "/dev/full", NULL, NULL) == -ENOSPC);
    end_capture();
    CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode));
    unlink(input);
}

struct appender {
    struct guanaco_trace_writer *writer;
    uint32_t sequence;
    int errors;
};

static void *append_many(void *argument) {
    struct appender *appender = argument;
    for (uint32_t token = 0; token < 2000; token++) {
        int32_t ids[2] = {(int32_t)(token % 8), (int32_t)((token + 1) % 8)};
        float weights[2] = {(float)appender->sequence, (float)token};
        appender->errors += guanaco_trace_writer_append(appender->writer, appender->sequence, token, token % 4, ids,
                                                        weights) != 0;
    }
    return NULL;
}

/* A write error after open: RLIMIT_FSIZE makes a regular file "full" past a few KiB (EFBIG). */
static void test_write_error_sticky(void) {
    struct rlimit saved;
    if (getrlimit(RLIMIT_FSIZE, &saved) != 0) {
        CHECK(!"getrlimit");
        return;
    }
    void (*saved_handler)(int) = signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead of a signal */
    struct rlimit small = saved;
    small.rlim_cur = 4096;
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    char path[256];
    path_in_directory(path, sizeof(path), "limited.trace");
    struct guanaco_trace_shape shape = make_shape(4, 8, 2);
    struct guanaco_trace_writer *writer = NULL;
    int32_t ids[2] = {0, 1};

    /* Everything fits in the buffer: close is where the error shows. */
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    int appended = 0;
    for (int i = 0; i < 1000; i++) { /* 24 KB: past the limit, inside the 64 KiB buffer */
        appended += guanaco_trace_writer_append(writer, 0, (uint32_t)i, 0, ids, NULL) == 0;
    }
    CHECK(appended == 1000);
    begin_capture();
    CHECK(guanaco_trace_writer_close(writer) == -EFBIG);
    end_capture();
    CHECK(said(path) && said("File too large"));

    /* Enough records to overflow the buffer: append reports it, and keeps reporting it. */
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    int first_error = 0, n_ok = 0;
    begin_capture();
    for (int i = 0; i < 10000 && first_error == 0; i++) {
        first_error = guanaco_trace_writer_append(writer, 0, (uint32_t)i, 0, ids, NULL);
        n_ok += first_error == 0;
    }
    int again = guanaco_trace_writer_append(writer, 0, 10000, 0, ids, NULL);
    int closed = guanaco_trace_writer_close(writer);
    end_capture();
    CHECK(first_error == -EFBIG && n_ok > 0 && n_ok < 10000);
    CHECK(again == -EFBIG && closed == -EFBIG);
    CHECK(setrlimit(RLIMIT_FSIZE, &saved) == 0);
    signal(SIGXFSZ, saved_handler);
    unlink(path);
}

/*
 * Input with no size, or a size that cannot be true, is refused at once and
 * in bounded memory: /dev/zero and a FIFO (no writer: the open must not wait
 * for one) for the trace loader and the JSONL converter, a directory, and a
 * sparse file whose size claims more records than this machine could hold.
 */
static void test_unbounded_inputs(void) {
    char fifo[256], output[256], sparse[256];
    path_in_directory(fifo, sizeof(fifo), "stream.fifo");
    path_in_directory(output, sizeof(output), "stream.trace");
    path_in_directory(sparse, sizeof(sparse), "sparse.trace");
    CHECK(mkfifo(fifo, 0600) == 0);
    struct guanaco_trace trace;
    const char *streams[] = {"/dev/zero", fifo, directory};
    for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
        begin_capture();
        CHECK(guanaco_trace_load(streams[i], &trace) == -EINVAL && trace.ids == NULL);
        end_capture();
        CHECK(said(streams[i]) && said("not a regular file"));
        begin_capture();
        CHECK(guanaco_trace_convert_jsonl(streams[i], output, NULL, NULL) == -EINVAL);
        end_capture();
        CHECK(said(streams[i]) && said("not a regular file"));
        CHECK(access(output, F_OK) != 0);
    }
    unlink(fifo);

    /* A valid header, then 1.5 TiB of holes: 2^36 top-2 records, which no test machine holds in memory. */
    CHECK(write_small_trace(sparse, 0) == 0);
    CHECK(truncate(sparse, GUANACO_TRACE_HEADER_BYTES + ((off_t)24 << 36)) == 0);
    begin_capture();
    CHECK(guanaco_trace_load(sparse, &trace) == -ENOMEM && trace.ids == NULL);
    end_capture();
    CHECK(said(sparse) && said("68719476736 records") && said("more than this machine"));

    /* The converter reads a line of holes no further than its first NUL, not the whole gigabytes. */
    char jsonl[256];
    path_in_directory(jsonl, sizeof(jsonl), "sparse.jsonl");
    write_text(jsonl, "{\"dataset\": \"d\", \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 0], \"token_idx\": 0}\n{");
    CHECK(truncate(jsonl, (off_t)4 << 30) == 0);
    begin_capture();
    CHECK(guanaco_trace_convert_jsonl(jsonl, output, NULL, NULL) == -EINVAL);
    end_capture();
    CHECK(said(":2: column 2: NUL byte"));
    CHECK(access(output, F_OK) != 0);
    unlink(jsonl);
    unlink(sparse);
}

/* One rule for the writer, the loader and the converter: an expert is chosen at most once per decision. */
static void test_repeated_expert(void) {
    char path[256];
    path_in_directory(path, sizeof(path), "repeat.trace");
    struct guanaco_trace_shape shape = make_shape(4, 8, 2);
    struct guanaco_trace_writer *writer = NULL;
    int32_t twice[2] = {3, 3}, fine[2] = {3, 4};
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    begin_capture();
    CHECK(guanaco_trace_writer_append(writer, 0, 7, 1, twice, NULL) == -EINVAL);
    end_capture();
    CHECK(said("names expert 3 twice"));
    CHECK(guanaco_trace_writer_append(writer, 0, 7, 1, fine, NULL) == 0);
    CHECK(guanaco_trace_writer_append(writer, 0, 8, 1, fine, NULL) == 0); /* the same ids in the next record */
    CHECK(guanaco_trace_writer_close(writer) == 0);
    struct guanaco_trace trace;
    CHECK(guanaco_trace_load(path, &trace) == 0 && trace.n_records == 2);
    guanaco_trace_free(&trace);

    /* The second record's second id (byte 120 + 24 + 14) rewritten to its first: 3, 3. */
    int fd = open(path, O_WRONLY);
    unsigned char three[2] = {3, 0};
    CHECK(fd >= 0 && pwrite(fd, three, 2, GUANACO_TRACE_HEADER_BYTES + 24 + 14) == 2);
    close(fd);
    begin_capture();
    CHECK(guanaco_trace_load(path, &trace) == -EINVAL && trace.ids == NULL);
    end_capture();
    CHECK(said("record 1 (byte 144) names expert 3 twice"));
    unlink(path);
}

/* Several llama contexts share one writer: no record may be torn or lost. */
static void test_concurrent_appends(void) {
    char path[256];
    path_in_directory(path, sizeof(path), "threads.trace");
    struct guanaco_trace_shape shape = make_shape(4, 8, 2);
    struct guanaco_trace_writer *writer;
    CHECK(guanaco_trace_writer_open(path, &shape, &writer) == 0);
    pthread_t threads[4];
    struct appender appenders[4];
    for (int i = 0; i < 4; i++) {
        appenders[i] = (struct appender){.writer = writer, .sequence = (uint32_t)i};
        pthread_create(&threads[i], NULL, append_many, &appenders[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        CHECK(appenders[i].errors == 0);
    }
    CHECK(guanaco_trace_writer_close(writer) == 0);
    struct guanaco_trace trace;
    CHECK(guanaco_trace_load(path, &trace) == 0 && trace.n_records == 8000);
    uint32_t next_token[4] = {0};
    bool intact = trace.n_records == 8000;
    for (size_t i = 0; intact && i < trace.n_records; i++) {
        uint32_t s = trace.sequence[i], t = trace.token[i];
        intact = s < 4 && t == next_token[s]++ && trace.layer[i] == t % 4 && trace.ids[2 * i] == (int32_t)(t % 8) &&
                 trace.weights[2 * i] == (float)s && trace.weights[2 * i + 1] == (float)t;
    }
    CHECK(intact);
    guanaco_trace_free(&trace);
    unlink(path);
}

/* ---- JSONL conversion ---- */

static void test_convert_fixture(void) {
    char input[256], output[256];
    path_in_directory(input, sizeof(input), "fixture.jsonl");
    path_in_directory(output, sizeof(output), "fixture.trace");
    /* Two problems, lines out of order, a CRLF, a blank line, unknown keys (any JSON value), a string problem_id,
     * one position missing layer 1, and weights absent on one line. Layers 0 and 1 only, top-2. */
    write_text(input,
               "{\"dataset\": \"gsm8k\", \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 2], "
               "\"gating_probs\": [0.75, 0.25], \"token_idx\": 0}\n"
               "{\"dataset\": \"gsm8k\", \"problem_id\": 0, \"layer\": 0, \"experts\": [2, 3], "
               "\"gating_probs\": [0.5, 0.5], \"token_idx\": 1}\r\n"
               "\n"
               "{\"dataset\": \"gsm8k\", \"problem_id\": 0, \"layer\": 1, \"experts\": [4, 5], "
               "\"gating_probs\": [0.6, 0.4], \"token_idx\": 0, \"note\": [1, 2.5e-3, -4], "
               "\"meta\": {\"x\": [true, null, {\"y\": \"z\"}]}}\n"
               "{\"dataset\": \"humaneval\", \"problem_id\": \"HumanEval/\\u0033\", \"layer\": 1, "
               "\"experts\": [6, 7], \"token_idx\": 0}\n"
               "  { \"token_idx\" : 0 , \"experts\" : [ 0 , 6 ] , \"layer\" : 0 , \"problem_id\" : "
               "\"HumanEval/3\" , \"dataset\" : \"humaneval\" }  \n"
               "{\"dataset\": \"gsm8k\", \"problem_id\": 0, \"layer\": 1, \"experts\": [5, 4], "
               "\"gating_probs\": [0.9, 0.1], \"token_idx\": 2}\n");
    struct guanaco_trace_convert_options options = {.arch = "llama", .n_expert = 10};
    struct guanaco_trace_convert_report report;
    begin_capture();
    int err = guanaco_trace_convert_jsonl(input, output, &options, &report);
    end_capture();
    CHECK(err == 0);
    if (err != 0) {
        fprintf(stderr, "%s", captured);
        return;
    }
    CHECK(report.n_lines == 6 && report.n_records == 6);
    CHECK(report.shape.n_layer == 2 && report.shape.n_expert == 10 && report.shape.top_k == 2);
    CHECK(strcmp(report.shape.arch, "llama") == 0 && strcmp(report.shape.source, "fixture.jsonl") == 0);
    CHECK(report.n_sequences == 2);
    CHECK(report.n_sequences == 2 && strcmp(report.sequences[0].dataset, "gsm8k") == 0 &&
          strcmp(report.sequences[0].problem_id, "0") == 0 && report.sequences[0].n_tokens == 3);
    CHECK(report.n_sequences == 2 && strcmp(report.sequences[1].dataset, "humaneval") == 0 &&
          strcmp(report.sequences[1].problem_id, "HumanEval/3") == 0 && report.sequences[1].n_tokens == 1);
    /* gsm8k tokens 0 (both layers), 1 (layer 0 only), 2 (layer 1 only); humaneval token 0 (both). */
    CHECK(report.n_tokens == 4 && report.n_incomplete_tokens == 2 && report.n_moe_layers == 2);
    /* Only gsm8k layer 0 has t and t+1: {1,2} -> {2,3}: 1 hit of 2. */
    CHECK(report.reuse_pairs == 2 && report.reuse_hits == 1 && report.reuse_probability == 0.5);
    CHECK(report.reuse_chance == 0.2);
    guanaco_trace_convert_report_free(&report);

    struct guanaco_trace trace;
    CHECK(guanaco_trace_load(output, &trace) == 0 && trace.n_records == 6);
    if (trace.n_records == 6) {
        /* Sorted by (sequence, token, layer). */
        const uint32_t sequence[6] = {0, 0, 0, 0, 1, 1}, token[6] = {0, 0, 1, 2, 0, 0}, layer[6] = {0, 1, 0, 1, 0, 1};
        const int32_t ids[12] = {1, 2, 4, 5, 2, 3, 5, 4, 0, 6, 6, 7};
        const float weights[12] = {0.75f, 0.25f, 0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f, 0, 0, 0, 0};
        CHECK(memcmp(trace.sequence, sequence, sizeof(sequence)) == 0);
        CHECK(memcmp(trace.token, token, sizeof(token)) == 0);
        CHECK(memcmp(trace.layer, layer, sizeof(layer)) == 0);
        CHECK(memcmp(trace.ids, ids, sizeof(ids)) == 0);
        CHECK(memcmp(trace.weights, weights, sizeof(weights)) == 0);
    }
    guanaco_trace_free(&trace);

    /* --n-layer larger than the data is kept (dense layers); smaller is refused. */
    options = (struct guanaco_trace_convert_options){.n_layer = 48, .source = "mine"};
    CHECK(guanaco_trace_convert_jsonl(input, output, &options, &report) == 0);
    CHECK(report.shape.n_layer == 48 && report.shape.n_expert == 8 && strcmp(report.shape.source, "mine") == 0);
    CHECK(strcmp(report.shape.arch, "unknown") == 0);
    guanaco_trace_convert_report_free(&report);
    options = (struct guanaco_trace_convert_options){.n_layer = 1};
    begin_capture();
    CHECK(guanaco_trace_convert_jsonl(input, output, &options, &report) == -EINVAL);
    options = (struct guanaco_trace_convert_options){.n_expert = 7};
    CHECK(guanaco_trace_convert_jsonl(input, output, &options, &report) == -EINVAL);
    end_capture();
    CHECK(said("at least 2 layers, not 1") && said("at least 8 experts, not 7"));
    CHECK(report.sequences == NULL && report.n_records == 0);
    unlink(input);
    unlink(output);
}

/* One malformed line at line 2 must fail with a message naming the file and line 2, leaving no output. */
static void expect_rejected_line(const char *line, const char *message) {
    char input[256], output[256], text[1024];
    path_in_directory(input, sizeof(input), "bad.jsonl");
    path_in_directory(output, sizeof(output), "bad.trace");
    snprintf(text, sizeof(text),
             "{\"dataset\": \"d\", \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 0], \"token_idx\": 0}\n%s\n",
             line);
    write_text(input, text);
    unlink(output);
    begin_capture();
    int err = guanaco_trace_convert_jsonl(input, output, NULL, NULL);
    end_capture();
    char where[300];
    snprintf(where, sizeof(where), "%s:2:", input);
    bool ok = err == -EINVAL && said(where) && said(message) && access(output, F_OK) != 0;
    CHECK(ok);
    if (!ok) {
        fprintf(stderr, "  line: %s\n  got %d: %s", line, err, captured);
    }
    unlink(input);
}

static void test_convert_rejects(void) {
    const char *head = "{\"dataset\": \"d\", \"problem_id\": 0, ";
    char line[512];
#define REJECT(tail, message)                                   \
    do {                                                        \
        snprintf(line, sizeof(line), "%s%s", head, tail);       \
        expect_rejected_line(line, message);                    \
    } while (0)
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1", "column"); /* no closing brace */
    REJECT("\"layer\": 0, \"experts\": [1, 0]}", "no \"token_idx\" key");
    REJECT("\"layer\": 0, \"token_idx\": 1}", "no \"experts\" key");
    REJECT("\"layer\": 0, \"experts\": [1, 0, 2], \"token_idx\": 1}", "top_k must not change");
    REJECT("\"layer\": 1.5, \"experts\": [1, 0], \"token_idx\": 1}", "layer must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, -2], \"token_idx\": 1}", "an expert id must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, 65536], \"token_idx\": 1}", "an expert id must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, 1], \"token_idx\": 1}", "chosen twice");
    REJECT("\"layer\": 0, \"experts\": [], \"token_idx\": 1}", "\"experts\" is empty");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"gating_probs\": [1.0], \"token_idx\": 1}", "2 experts but 1");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"gating_probs\": [NaN, 1], \"token_idx\": 1}",
           "column 85: invalid token");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"gating_probs\": [1e999, 0], \"token_idx\": 1}",
           "real number overflow");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1} {}", "column 82: end of file expected");
    REJECT("\"layer\": 0, \"layer\": 1, \"experts\": [1, 0], \"token_idx\": 1}", "column 53: duplicate object key");
    /* Unknown keys may repeat no more than known ones. */
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1, \"x\": 1, \"x\": 1}", "duplicate object key");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 0x1}", "'}' expected near 'x'");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 01}", "invalid token");
    REJECT("\"layer\": 0, \"experts\": [1 0], \"token_idx\": 1}", "column 61: ']' expected");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 4294967296}", "token_idx must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 0}", "repeats line 1");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1, \"s\": \"open}", "premature end of input");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1, \"s\": \"\\q\"}", "invalid escape");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1, \"s\": \"\\ud800\"}", "invalid Unicode");
    expect_rejected_line("[1, 2, 3]", "not a JSON object");
    /* Number rules: a layer, token_idx or expert id is a JSON integer in range. 3.0 and 1e2 are refused
     * (a real number where an id belongs means the producer computed it); negative values and values past
     * the field's range are refused, never wrapped; past 64 bits jansson itself refuses the integer. */
    REJECT("\"layer\": 3.0, \"experts\": [1, 0], \"token_idx\": 1}", "layer must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 1e2}", "token_idx must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, 2.0], \"token_idx\": 1}", "an expert id must be a whole number");
    REJECT("\"layer\": -1, \"experts\": [1, 0], \"token_idx\": 1}", "layer must be a whole number");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": -1}", "not -1");
    REJECT("\"layer\": 4294967295, \"experts\": [1, 0], \"token_idx\": 1}", "from 0 to 4294967294");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"token_idx\": 99999999999999999999}", "too big integer");
    REJECT("\"layer\": \"0\", \"experts\": [1, 0], \"token_idx\": 1}", "not a string");
    REJECT("\"layer\": 0, \"experts\": 1, \"token_idx\": 1}", "\"experts\" must be an array");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"gating_probs\": [1e39, 0], \"token_idx\": 1}",
           "within float range");
    REJECT("\"layer\": 0, \"experts\": [1, 0], \"gating_probs\": [\"1\", 0], \"token_idx\": 1}",
           "within float range, not a string");
    expect_rejected_line("{\"dataset\": \"d\", \"problem_id\": 2.5, \"layer\": 0, \"experts\": [1, 0], "
                         "\"token_idx\": 1}", "problem_id must be a string or an integer");
    expect_rejected_line("{\"dataset\": 1, \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 0], "
                         "\"token_idx\": 1}", "dataset must be a string");
    /* Not UTF-8, and a NUL escaped inside a string: jansson refuses both. */
    expect_rejected_line("{\"dataset\": \"\xff\", \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 0], "
                         "\"token_idx\": 1}", "unable to decode byte 0xff");
    expect_rejected_line("{\"dataset\": \"a\\u0000b\", \"problem_id\": 0, \"layer\": 0, \"experts\": [1, 0], "
                         "\"token_idx\": 1}", "\\u0000 is not allowed");
    expect_rejected_line("{\"dataset\": \"d\", \"problem_id\": 0, \"layer\": 0, \"experts\": [9, 0], "
                         "\"gating_probs\": [0.5, 0.5], \"token_idx\": 1, ", "column");
    expect_rejected_line("{\"dataset\": \"0123456789012345678901234567890123456789012345678901234567890123456789\", "
                         "\"problem_id\": 0, \"layer\": 0, \"experts\": [9, 0], \"token_idx\": 1}", "longer than 63");
    expect_rejected_line("{}", "no \"dataset\" key");
#undef REJECT

    /* An empty input has nothing to convert; a missing one reports its errno. */
    char input[256], output[256];
    path_in_directory(input, sizeof(input), "empty.jsonl");
    path_in_directory(output, sizeof(output), "empty.trace");
    write_text(input, "\n\n");
    begin_capture();
    CHECK(guanaco_trace_convert_jsonl(input, output, NULL, NULL) == -EINVAL);
    end_capture();
    CHECK(said("no routing decisions"));
    unlink(input);
    begin_capture();
    CHECK(guanaco_trace_convert_jsonl(input, output, NULL, NULL) == -ENOENT);
    end_capture();
    CHECK(access(output, F_OK) != 0);
}

/* The largest values each integer field takes, integer gating_probs, and a negative problem_id, all accepted. */
static void test_convert_number_limits(void) {
    char input[256], output[256];
    path_in_directory(input, sizeof(input), "limits.jsonl");
    path_in_directory(output, sizeof(output), "limits.trace");
    write_text(input, "{\"dataset\": \"d\", \"problem_id\": -3, \"layer\": 4294967294, \"experts\": [65535, 0], "
                      "\"gating_probs\": [1, 0], \"token_idx\": 4294967295}\n");
    struct guanaco_trace_convert_report report;
    begin_capture();
    int err = guanaco_trace_convert_jsonl(input, output, NULL, &report);
    end_capture();
    CHECK(err == 0);
    if (err != 0) {
        fprintf(stderr, "%s", captured);
        unlink(input);
        return;
    }
    CHECK(report.n_records == 1 && report.n_sequences == 1 && strcmp(report.sequences[0].problem_id, "-3") == 0);
    CHECK(report.shape.n_layer == 4294967295u && report.shape.n_expert == 65536);
    guanaco_trace_convert_report_free(&report);
    struct guanaco_trace trace;
    CHECK(guanaco_trace_load(output, &trace) == 0 && trace.n_records == 1);
    if (trace.n_records == 1) {
        CHECK(trace.token[0] == 4294967295u && trace.layer[0] == 4294967294u);
        CHECK(trace.ids[0] == 65535 && trace.ids[1] == 0 && trace.weights[0] == 1.0f && trace.weights[1] == 0.0f);
    }
    guanaco_trace_free(&trace);
    unlink(input);
    unlink(output);
}

/* Every prefix and many random byte changes of a valid line: converted or -EINVAL, never a crash. */
static void test_convert_never_crashes(void) {
    static const char valid[] = "{\"dataset\": \"humaneval\", \"problem_id\": 1, \"layer\": 3, \"experts\": [6, 5], "
                                "\"gating_probs\": [0.6959583759307861, 0.30404168367385864], \"token_idx\": 12}";
    char input[256], output[256], line[sizeof(valid) + 2];
    path_in_directory(input, sizeof(input), "fuzz.jsonl");
    path_in_directory(output, sizeof(output), "fuzz.trace");
    int unexpected = 0;
    size_t length = strlen(valid);
    begin_capture();
    for (size_t cut = 0; cut <= length; cut++) {
        memcpy(line, valid, cut);
        line[cut] = '\n';
        line[cut + 1] = '\0';
        write_text(input, line);
        int err = guanaco_trace_convert_jsonl(input, output, NULL, NULL);
        /* Only the whole line is valid; a blank prefix has no records. */
        unexpected += cut == length ? err != 0 : err != -EINVAL;
    }
    uint32_t seed = 12345;
    static const char alphabet[] = "{}[]\":,.-+eE0123456789 \\u\tx";
    for (int round = 0; round < 400; round++) {
        memcpy(line, valid, length + 1);
        for (int changes = 0; changes < 1 + round % 3; changes++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % length;
            seed = seed * 1103515245u + 12345u;
            line[at] = alphabet[(seed >> 8) % (sizeof(alphabet) - 1)];
        }
        write_text(input, line);
        int err = guanaco_trace_convert_jsonl(input, output, NULL, NULL);
        unexpected += err != 0 && err != -EINVAL;
    }
    end_capture();
    CHECK(unexpected == 0);
    unlink(input);
    unlink(output);
}

int main(void) {
    if (!mkdtemp(directory)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_null_weights();
    test_shape_check();
    test_rejected_files();
    test_device_full();
    test_write_error_sticky();
    test_unbounded_inputs();
    test_repeated_expert();
    test_concurrent_appends();
    test_convert_fixture();
    test_convert_rejects();
    test_convert_number_limits();
    test_convert_never_crashes();
    rmdir(directory);
    return check_summary();
}
