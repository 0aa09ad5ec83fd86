/*
 * fuzz_trace.c - libFuzzer harness for the binary routing-trace reader
 * (guanaco_trace_load in src/trace.c): the input is a whole trace file.
 *
 * Besides "no crash, leak, hang or undefined behaviour", the reader and the
 * writer must keep one rule between them (issue 10): a trace the reader
 * accepts has every layer < n_layer, every id < n_expert and no id twice in a
 * record, and writing it back with guanaco_trace_writer_* must succeed and
 * read back identical, field by field (weights bit for bit, NaNs included).
 * A failure must be a negative errno with nothing left allocated.
 */
#include "fuzz_file.h"

#include "trace.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes `trace` to `path` with the library's writer; returns its first error. */
static int write_back(const struct guanaco_trace *trace, const char *path) {
    struct guanaco_trace_writer *writer = NULL;
    int err = guanaco_trace_writer_open(path, &trace->shape, &writer);
    for (size_t i = 0; err == 0 && i < trace->n_records; i++) {
        err = guanaco_trace_writer_append(writer, trace->sequence[i], trace->token[i], trace->layer[i],
                                          trace->ids + i * trace->shape.top_k, trace->weights + i * trace->shape.top_k);
    }
    int close_err = guanaco_trace_writer_close(writer);
    return err ? err : close_err;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct fuzz_file input, copy;
    fuzz_file_init(&input, "fuzz-trace-in");
    fuzz_file_init(&copy, "fuzz-trace-copy");
    fuzz_file_set(&input, data, size);

    struct guanaco_trace trace;
    int err = guanaco_trace_load(input.path, &trace);
    if (err != 0) {
        FUZZ_CHECK(err < 0);
        FUZZ_CHECK(trace.n_records == 0 && trace.ids == NULL && trace.weights == NULL);
        return 0;
    }
    const struct guanaco_trace_shape *shape = &trace.shape;
    FUZZ_CHECK(shape->n_layer >= 1 && shape->n_expert >= 1 && shape->n_expert <= GUANACO_TRACE_MAX_EXPERTS);
    FUZZ_CHECK(shape->top_k >= 1 && shape->top_k <= shape->n_expert);
    FUZZ_CHECK(memchr(shape->arch, '\0', sizeof(shape->arch)) && memchr(shape->source, '\0', sizeof(shape->source)));
    FUZZ_CHECK(size == GUANACO_TRACE_HEADER_BYTES + trace.n_records * guanaco_trace_record_bytes(shape->top_k));
    for (size_t i = 0; i < trace.n_records; i++) {
        FUZZ_CHECK(trace.layer[i] < shape->n_layer);
        const int32_t *ids = trace.ids + i * shape->top_k;
        for (uint32_t k = 0; k < shape->top_k; k++) {
            FUZZ_CHECK(ids[k] >= 0 && (uint32_t)ids[k] < shape->n_expert);
            for (uint32_t j = 0; j < k; j++) {
                FUZZ_CHECK(ids[j] != ids[k]);
            }
        }
    }

    FUZZ_CHECK(write_back(&trace, copy.path) == 0);
    struct guanaco_trace again;
    FUZZ_CHECK(guanaco_trace_load(copy.path, &again) == 0);
    FUZZ_CHECK(again.n_records == trace.n_records);
    FUZZ_CHECK(again.shape.n_layer == shape->n_layer && again.shape.n_expert == shape->n_expert &&
               again.shape.top_k == shape->top_k);
    FUZZ_CHECK(strcmp(again.shape.arch, shape->arch) == 0 && strcmp(again.shape.source, shape->source) == 0);
    size_t n = trace.n_records, values = n * shape->top_k;
    FUZZ_CHECK(n == 0 || (memcmp(again.sequence, trace.sequence, n * sizeof(*trace.sequence)) == 0 &&
                          memcmp(again.token, trace.token, n * sizeof(*trace.token)) == 0 &&
                          memcmp(again.layer, trace.layer, n * sizeof(*trace.layer)) == 0 &&
                          memcmp(again.ids, trace.ids, values * sizeof(*trace.ids)) == 0 &&
                          memcmp(again.weights, trace.weights, values * sizeof(*trace.weights)) == 0));
    guanaco_trace_free(&again);
    guanaco_trace_free(&trace);
    return 0;
}
