/*
 * trace_convert.c - guanaco-trace-convert: turns a JSON Lines routing log
 * (shared/traces/) into a Guanaco routing trace and prints the statistics
 * that check the conversion against the published numbers. All the work is
 * in offline/trace_jsonl.c, so the unit tests exercise exactly what runs here.
 */
#include "log.h"
#include "trace.h"
#include "trace_jsonl.h"
#include "cli.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "guanaco-trace-convert"

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " IN.jsonl OUT.trace [--arch NAME] [--n-layer N] [--n-expert N] [--source TEXT]\n"
            "\n"
            "  IN.jsonl         one object per line: dataset, problem_id, layer, experts, gating_probs, token_idx\n"
            "  OUT.trace        Guanaco routing trace (docs/TRACE.md)\n"
            "  --arch NAME      model architecture for the header (default: unknown)\n"
            "  --n-layer N      layers of the model, dense ones included (default: highest layer + 1)\n"
            "  --n-expert N     experts per layer (default: highest expert id + 1)\n"
            "  --source TEXT    free text for the header, up to 63 bytes (default: IN's file name)\n");
}

/* A whole number in [1, max]; anything else is an error naming the flag. */
static int parse_count(const char *flag, const char *text, unsigned long max, uint32_t *out) {
    unsigned long value;
    int err = guanaco_cli_parse_whole(PROG, flag, text, max, &value);
    if (err == 0) {
        *out = (uint32_t)value;
    }
    return err;
}

int main(int argc, char **argv) {
    struct guanaco_trace_convert_options options = {0};
    const char *paths[2] = {NULL, NULL};
    int n_paths = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            print_usage(stdout);
            return 0;
        }
        bool takes_value = strcmp(arg, "--arch") == 0 || strcmp(arg, "--n-layer") == 0 ||
                           strcmp(arg, "--n-expert") == 0 || strcmp(arg, "--source") == 0;
        if (takes_value && i + 1 >= argc) {
            fprintf(stderr, PROG ": %s needs a value\n", arg);
            return 2;
        }
        if (strcmp(arg, "--arch") == 0) {
            options.arch = argv[++i];
            if (strlen(options.arch) >= sizeof(((struct guanaco_trace_shape *)0)->arch)) {
                fprintf(stderr, PROG ": --arch \"%s\" is longer than 31 bytes\n", options.arch);
                return 2;
            }
        } else if (strcmp(arg, "--source") == 0) {
            options.source = argv[++i];
        } else if (strcmp(arg, "--n-layer") == 0) {
            if (parse_count(arg, argv[++i], UINT32_MAX, &options.n_layer) != 0) return 2;
        } else if (strcmp(arg, "--n-expert") == 0) {
            if (parse_count(arg, argv[++i], GUANACO_TRACE_MAX_EXPERTS, &options.n_expert) != 0) return 2;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            fprintf(stderr, PROG ": unknown option %s\n", arg);
            print_usage(stderr);
            return 2;
        } else if (n_paths < 2) {
            paths[n_paths++] = arg;
        } else {
            fprintf(stderr, PROG ": unexpected argument %s\n", arg);
            print_usage(stderr);
            return 2;
        }
    }
    if (n_paths != 2) {
        print_usage(stderr);
        return 2;
    }

    struct guanaco_trace_convert_report report;
    int err = guanaco_trace_convert_jsonl(paths[0], paths[1], &options, &report);
    if (err != 0) {
        fprintf(stderr, PROG ": %s not converted: %s\n", paths[0], strerror(-err));
        return 1;
    }
    const struct guanaco_trace_shape *shape = &report.shape;
    printf("wrote %s: arch %s, source \"%s\", %u layers, %u experts, top-%u, %zu bytes per record\n", paths[1],
           shape->arch, shape->source, shape->n_layer, shape->n_expert, shape->top_k,
           guanaco_trace_record_bytes(shape->top_k));
    printf("sequences        %zu\n", report.n_sequences);
    for (size_t i = 0; i < report.n_sequences; i++) {
        printf("  sequence %zu     %s problem %s: %zu tokens\n", i, report.sequences[i].dataset,
               report.sequences[i].problem_id, report.sequences[i].n_tokens);
    }
    printf("tokens           %zu (positions; %zu with all %zu MoE layers)\n", report.n_tokens,
           report.n_tokens - report.n_incomplete_tokens, report.n_moe_layers);
    printf("incomplete       %zu (positions missing some layer)\n", report.n_incomplete_tokens);
    printf("records          %zu\n", report.n_records);
    printf("reuse            %.4f (%llu of %llu experts chosen at token t are chosen again at t+1 in the same "
           "layer; chance %.4f)\n", report.reuse_probability, (unsigned long long)report.reuse_hits,
           (unsigned long long)report.reuse_pairs, report.reuse_chance);
    guanaco_trace_convert_report_free(&report);
    return 0;
}
