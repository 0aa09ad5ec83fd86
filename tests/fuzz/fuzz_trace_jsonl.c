/*
 * fuzz_trace_jsonl.c - libFuzzer harness for the JSON Lines routing-log
 * converter (guanaco_trace_convert_jsonl in offline/trace_jsonl.c): the input is
 * a whole .jsonl file; the trace goes to a second memfd.
 *
 * Besides "no crash, leak, hang or undefined behaviour", a conversion that
 * succeeds must write a trace that guanaco_trace_load accepts (one rule for
 * both, issue 10) with the shape and record count the report gives, records
 * in (sequence, token, layer) order with no position twice, and a report
 * whose counts agree with each other. A failure must be a negative errno.
 */
#include "fuzz_file.h"

#include "trace.h"
#include "trace_jsonl.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct fuzz_file input, output;
    fuzz_file_init(&input, "fuzz-routing.jsonl");
    fuzz_file_init(&output, "fuzz-routing.trace");
    fuzz_file_set(&input, data, size);
    fuzz_file_set(&output, NULL, 0);

    struct guanaco_trace_convert_options options = {.arch = "fuzz", .source = "fuzz"};
    struct guanaco_trace_convert_report report;
    int err = guanaco_trace_convert_jsonl(input.path, output.path, &options, &report);
    if (err != 0) {
        FUZZ_CHECK(err < 0);
        FUZZ_CHECK(report.sequences == NULL && report.n_records == 0);
        return 0;
    }
    FUZZ_CHECK(report.n_records == report.n_lines);
    FUZZ_CHECK(report.n_records == 0 || report.n_sequences >= 1);
    FUZZ_CHECK(report.n_tokens <= report.n_records && report.n_incomplete_tokens <= report.n_tokens);
    FUZZ_CHECK(report.n_moe_layers <= report.shape.n_layer);
    FUZZ_CHECK(report.reuse_hits <= report.reuse_pairs);

    struct guanaco_trace trace;
    FUZZ_CHECK(guanaco_trace_load(output.path, &trace) == 0);
    FUZZ_CHECK(trace.n_records == report.n_records);
    FUZZ_CHECK(trace.shape.n_layer == report.shape.n_layer && trace.shape.n_expert == report.shape.n_expert &&
               trace.shape.top_k == report.shape.top_k);
    for (size_t i = 1; i < trace.n_records; i++) {
        const uint32_t a[3] = {trace.sequence[i - 1], trace.token[i - 1], trace.layer[i - 1]};
        const uint32_t b[3] = {trace.sequence[i], trace.token[i], trace.layer[i]};
        int order = a[0] != b[0] ? (a[0] < b[0] ? -1 : 1) : a[1] != b[1] ? (a[1] < b[1] ? -1 : 1)
                  : a[2] != b[2] ? (a[2] < b[2] ? -1 : 1) : 0;
        FUZZ_CHECK(order < 0);
    }
    for (size_t i = 0; i < trace.n_records; i++) {
        FUZZ_CHECK(trace.sequence[i] < report.n_sequences);
    }
    guanaco_trace_free(&trace);
    guanaco_trace_convert_report_free(&report);
    return 0;
}
