/*
 * tracegen.c - guanaco-tracegen: writes synthetic routing traces in the
 * engine's trace format (docs/TRACE.md) so that guanaco-sim and
 * --guanaco-trace-replay can be driven by routing of any shape and any
 * statistics, and measures the routing statistics of any trace, synthetic or
 * recorded, so the two can be compared.
 *
 * This file owns only the command line and the output. The generator, the
 * presets and the statistics are offline/routing_synth.c's, shared with
 * guanaco-plan; the file is written through src/trace.h's writer.
 */
#include "routing_synth.h"
#include "trace.h"
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "guanaco-tracegen"
#define DEFAULT_TOKENS 256u

static void print_usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " [-o OUT.trace] [--stats] [--preset NAME] [--shape NAME]\n"
            "                        [--n-layer N] [--n-expert N] [--top-k K] [--tokens N] [--sequences N]\n"
            "                        [--seed S] [--zipf X] [--zipf-offset Q] [--zipf-spread F] [--reuse P]\n"
            "                        [--cross-layer P] [--topic-every N] [--topic-strength F] [--arch NAME]\n"
            "                        [--source TEXT]\n"
            "       " PROG " --measure FILE [--measure FILE ...]\n"
            "\n"
            "  -o OUT.trace        write the trace (its statistics are printed after it is written)\n"
            "  --stats             print the statistics of the generated routing (without -o: only that)\n"
            "  --measure FILE      print the same statistics for an existing trace, then exit; several\n"
            "                      traces of one shape are measured as one, their sequences kept apart\n"
            "  --preset NAME       shape and routing parameters tuned to a real model: %s;\n"
            "                      --stats then shows the statistics next to the model's\n"
            "  --shape NAME        shape only: qwen3-30b-a3b (48 layers, 128 experts, top-8) or\n"
            "                      mixtral-8x7b (32 layers, 8 experts, top-2)\n"
            "  --n-layer N, --n-expert N, --top-k K   the shape, overriding --preset and --shape\n"
            "  --tokens N          tokens per sequence (default: the preset's, else %u)\n"
            "  --sequences N       independent sequences, each its own sequence id from token 0 (default 1)\n"
            "  --seed S            any whole number 0..2^64-1 (default 1); a seed reproduces the file byte for byte\n"
            "  --zipf X            popularity skew: rank r of a layer is drawn with weight (r+Q)^-X\n"
            "                      (default 0, uniform)\n"
            "  --zipf-offset Q     flattens the hot head and, with a larger X, thins the cold tail (default 0)\n"
            "  --zipf-spread F     layers' exponents spread evenly over X*(1-F)..X*(1+F) (default 0)\n"
            "  --reuse P           each expert of the previous token in the same layer is chosen again with\n"
            "                      probability P (default 0)\n"
            "  --cross-layer P     each slot left is filled with probability P by a fixed map of an expert the\n"
            "                      previous layer chose for the same token (default 0)\n"
            "  --topic-every N     a topic shift every N tokens and at each sequence start (0, the default: never)\n"
            "  --topic-strength F  how far a shift moves experts in each layer's popularity ranking: the deviation\n"
            "                      of normal noise added to each log-rank, 0..16 (default 1; 4+ ~ a fresh ranking)\n"
            "  --arch NAME         the trace header's architecture (default: the preset's, else unknown)\n"
            "  --source TEXT       the trace header's source (default: synthetic and the parameters)\n"
            "\n"
            "Without --preset every routing knob is 0: uniform, independent routing.\n",
            guanaco_synth_preset_names(), DEFAULT_TOKENS);
}

struct tracegen_options {
    const char *out, *preset, *shape, *arch, *source;
    const char **measure; /* --measure files, measured as one trace */
    size_t n_measure;
    bool stats;
    /* explicit flags, applied over the preset and the shape whatever their order */
    unsigned long n_layer, n_expert, top_k, tokens, sequences, topic_every;
    bool have_topic_every, have_seed, have_zipf, have_zipf_spread, have_zipf_offset, have_reuse, have_cross,
        have_topic_strength;
    uint64_t seed;
    double zipf, zipf_spread, zipf_offset, reuse, cross, topic_strength;
};

static int parse_whole(const char *flag, const char *text, unsigned long max, unsigned long *out) {
    return guanaco_cli_parse_whole(PROG, flag, text, max, out);
}

static int parse_fraction(const char *flag, const char *text, double max, double *out) {
    return guanaco_cli_parse_real(PROG, flag, text, 0, max, false, out);
}

/* 0 on success, 2 for a usage error (after its message), -1 when --help was printed. */
static int parse_options(int argc, char **argv, struct tracegen_options *o) {
    static const char *const with_value[] = {
        "-o",          "--measure",   "--preset",      "--shape",        "--n-layer", "--n-expert", "--top-k",
        "--tokens",    "--sequences", "--seed",        "--zipf",         "--zipf-spread", "--zipf-offset",
        "--reuse",     "--cross-layer", "--topic-every", "--topic-strength", "--arch", "--source"};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            print_usage(stdout);
            return -1;
        }
        if (strcmp(arg, "--stats") == 0) {
            o->stats = true;
            continue;
        }
        const char *value = NULL;
        int err = guanaco_cli_flag_value(PROG, argc, argv, &i, with_value, sizeof(with_value) / sizeof(with_value[0]),
                                         &value);
        if (err != 0) {
            if (err == -ENOENT) print_usage(stderr);
            return 2;
        }
        if (strcmp(arg, "-o") == 0) {
            o->out = value;
        } else if (strcmp(arg, "--measure") == 0) {
            o->measure[o->n_measure++] = value;
        } else if (strcmp(arg, "--preset") == 0) {
            o->preset = value;
        } else if (strcmp(arg, "--shape") == 0) {
            o->shape = value;
        } else if (strcmp(arg, "--arch") == 0) {
            o->arch = value;
        } else if (strcmp(arg, "--source") == 0) {
            o->source = value;
        } else if (strcmp(arg, "--n-layer") == 0) {
            err = parse_whole(arg, value, 65536, &o->n_layer);
        } else if (strcmp(arg, "--n-expert") == 0) {
            err = parse_whole(arg, value, GUANACO_TRACE_MAX_EXPERTS, &o->n_expert);
        } else if (strcmp(arg, "--top-k") == 0) {
            err = parse_whole(arg, value, GUANACO_TRACE_MAX_EXPERTS, &o->top_k);
        } else if (strcmp(arg, "--tokens") == 0) {
            err = parse_whole(arg, value, UINT32_MAX, &o->tokens);
        } else if (strcmp(arg, "--sequences") == 0) {
            err = parse_whole(arg, value, UINT32_MAX, &o->sequences);
        } else if (strcmp(arg, "--topic-every") == 0) {
            /* 0 is meaningful here: it turns the topic shifts of a preset off */
            err = strcmp(value, "0") == 0 ? 0 : parse_whole(arg, value, UINT32_MAX, &o->topic_every);
            o->topic_every = err == 0 && strcmp(value, "0") == 0 ? 0 : o->topic_every;
            o->have_topic_every = true;
        } else if (strcmp(arg, "--seed") == 0) {
            err = guanaco_cli_parse_seed(PROG, arg, value, &o->seed);
            o->have_seed = true;
        } else if (strcmp(arg, "--zipf") == 0) {
            err = parse_fraction(arg, value, 16, &o->zipf);
            o->have_zipf = true;
        } else if (strcmp(arg, "--zipf-spread") == 0) {
            err = parse_fraction(arg, value, 1, &o->zipf_spread);
            o->have_zipf_spread = true;
        } else if (strcmp(arg, "--zipf-offset") == 0) {
            err = parse_fraction(arg, value, 1e6, &o->zipf_offset);
            o->have_zipf_offset = true;
        } else if (strcmp(arg, "--reuse") == 0) {
            err = parse_fraction(arg, value, 1, &o->reuse);
            o->have_reuse = true;
        } else if (strcmp(arg, "--cross-layer") == 0) {
            err = parse_fraction(arg, value, 1, &o->cross);
            o->have_cross = true;
        } else if (strcmp(arg, "--topic-strength") == 0) {
            err = parse_fraction(arg, value, 16, &o->topic_strength);
            o->have_topic_strength = true;
        }
        if (err != 0) {
            return 2;
        }
    }
    if (o->n_measure) {
        if ((size_t)argc != 1 + 2 * o->n_measure) {
            fprintf(stderr, PROG ": --measure FILE takes no other option than more --measure FILE\n");
            return 2;
        }
        return 0;
    }
    if (!o->out && !o->stats) {
        fprintf(stderr, PROG ": nothing to do: give -o OUT.trace to write a trace, --stats to measure one in "
                        "memory, or --measure FILE\n");
        print_usage(stderr);
        return 2;
    }
    if (!o->preset && !o->shape && !(o->n_layer && o->n_expert && o->top_k)) {
        fprintf(stderr, PROG ": no shape: give --preset NAME, --shape NAME, or all of --n-layer, --n-expert "
                        "and --top-k\n");
        return 2;
    }
    return 0;
}

struct tracegen_shape {
    const char *name;
    uint32_t n_layer, n_expert, top_k;
};

/* The same named shapes as guanaco-sim's --shape. */
static const struct tracegen_shape shapes[] = {
    {"qwen3-30b-a3b", 48, 128, 8},
    {"mixtral-8x7b", 32, 8, 2},
};

/* The parameters the options ask for: the preset, then the shape, then each explicit flag. */
static int resolve_params(const struct tracegen_options *o, struct guanaco_synth_params *p,
                          const struct guanaco_synth_preset **preset) {
    memset(p, 0, sizeof(*p));
    p->sequences = 1;
    p->tokens = DEFAULT_TOKENS;
    p->seed = 1;
    p->topic_strength = 1.0;
    *preset = NULL;
    if (o->preset) {
        *preset = guanaco_synth_preset_find(o->preset);
        if (!*preset) {
            fprintf(stderr, PROG ": unknown --preset \"%s\": expected one of %s\n", o->preset,
                    guanaco_synth_preset_names());
            return -EINVAL;
        }
        *p = (*preset)->params;
    }
    if (o->shape) {
        const struct tracegen_shape *shape = NULL;
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            if (strcmp(shapes[i].name, o->shape) == 0) {
                shape = &shapes[i];
            }
        }
        if (!shape) {
            fprintf(stderr, PROG ": unknown --shape \"%s\": expected one of qwen3-30b-a3b|mixtral-8x7b\n", o->shape);
            return -EINVAL;
        }
        p->n_layer = shape->n_layer;
        p->n_expert = shape->n_expert;
        p->top_k = shape->top_k;
    }
    if (o->n_layer) p->n_layer = (uint32_t)o->n_layer;
    if (o->n_expert) p->n_expert = (uint32_t)o->n_expert;
    if (o->top_k) p->top_k = (uint32_t)o->top_k;
    if (o->tokens) p->tokens = (uint32_t)o->tokens;
    if (o->sequences) p->sequences = (uint32_t)o->sequences;
    if (o->have_topic_every) p->topic_every = (uint32_t)o->topic_every;
    if (o->have_seed) p->seed = o->seed;
    if (o->have_zipf) p->zipf = o->zipf;
    if (o->have_zipf_spread) p->zipf_spread = o->zipf_spread;
    if (o->have_zipf_offset) p->zipf_offset = o->zipf_offset;
    if (o->have_reuse) p->reuse = o->reuse;
    if (o->have_cross) p->cross_layer = o->cross;
    if (o->have_topic_strength) p->topic_strength = o->topic_strength;
    if (p->n_layer == 0 || p->n_expert == 0 || p->top_k == 0) {
        fprintf(stderr, PROG ": the shape is incomplete: --n-layer, --n-expert and --top-k are all needed\n");
        return -EINVAL;
    }
    char why[160];
    if (guanaco_synth_check(p, why, sizeof(why)) != 0) {
        fprintf(stderr, PROG ": cannot generate this routing: %s\n", why);
        return -EINVAL;
    }
    return 0;
}

/* ---- output ---- */

static void print_value(double value) {
    if (isnan(value)) {
        printf(" %9s", "-");
    } else {
        printf(" %9.3f", value);
    }
}

static void print_statistic(const char *key, double measured, double target, const char *meaning) {
    printf("%-22s", key);
    print_value(measured);
    print_value(target);
    printf("   %s\n", meaning);
}

static void print_stats(const struct guanaco_trace_shape *shape, const struct guanaco_routing_stats *s,
                        const struct guanaco_synth_preset *preset) {
    printf("shape        %u layers, %u experts, top-%u (%s)\n", shape->n_layer, shape->n_expert, shape->top_k,
           shape->arch[0] ? shape->arch : "no arch");
    printf("routing      %llu records, %llu sequences, %llu token positions\n", (unsigned long long)s->records,
           (unsigned long long)s->sequences, (unsigned long long)s->tokens);
    if (preset) {
        printf("targets      %s: %s\n", preset->name, preset->target_source);
    }
    char meaning[200];
    printf("\n%-22s %9s %9s   %s\n", "statistic", "measured", "target", "meaning");
    snprintf(meaning, sizeof(meaning), "mean share of a layer's %u experts the next token chooses again (%llu pairs)",
             shape->top_k, (unsigned long long)s->adjacent_pairs);
    print_statistic("adjacent-share", s->adjacent_share, preset ? preset->target_adjacent_share : NAN, meaning);
    snprintf(meaning, sizeof(meaning),
             "share of a layer's selections carried by its top %u of %u experts: lowest layer", s->top_count,
             shape->n_expert);
    print_statistic("top-share-min", s->top_share_min, preset ? preset->target_top_share_min : NAN, meaning);
    print_statistic("top-share-median", s->top_share_median, preset ? preset->target_top_share_median : NAN,
                    "  ... the median layer");
    print_statistic("top-share-max", s->top_share_max, preset ? preset->target_top_share_max : NAN,
                    "  ... the highest layer");
    print_statistic("cross-layer", s->cross_layer, preset ? preset->target_cross_layer : NAN,
                    "the best fixed guess from an expert of a layer is among the next layer's choices");
    print_statistic("cross-layer-baseline", s->cross_layer_baseline, NAN,
                    "  ... guessing the next layer's most chosen expert instead");
    printf("\nchance: adjacent-share %.3f, top-share %.3f (uniform routing)\n",
           (double)shape->top_k / shape->n_expert, (double)s->top_count / shape->n_expert);
}

/* Appends `more`'s records to `all`, its sequence ids moved past all's, so they stay apart. The weights
   are left as they were: the statistics do not read them, and `all` is only measured, then freed. */
static int append_records(struct guanaco_trace *all, const struct guanaco_trace *more) {
    size_t n = all->n_records + more->n_records, k = all->shape.top_k;
    uint32_t offset = 0;
    for (size_t i = 0; i < all->n_records; i++) {
        offset = all->sequence[i] + 1 > offset ? all->sequence[i] + 1 : offset;
    }
    uint32_t *sequence = realloc(all->sequence, (n ? n : 1) * sizeof(*sequence));
    if (sequence) all->sequence = sequence;
    uint32_t *token = realloc(all->token, (n ? n : 1) * sizeof(*token));
    if (token) all->token = token;
    uint32_t *layer = realloc(all->layer, (n ? n : 1) * sizeof(*layer));
    if (layer) all->layer = layer;
    int32_t *ids = realloc(all->ids, (n ? n : 1) * k * sizeof(*ids));
    if (ids) all->ids = ids;
    if (!sequence || !token || !layer || !ids) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < more->n_records; i++) {
        all->sequence[all->n_records + i] = more->sequence[i] + offset;
    }
    memcpy(all->token + all->n_records, more->token, more->n_records * sizeof(*token));
    memcpy(all->layer + all->n_records, more->layer, more->n_records * sizeof(*layer));
    memcpy(all->ids + all->n_records * k, more->ids, more->n_records * k * sizeof(*ids));
    all->n_records = n;
    return 0;
}

static int measure_files(const char *const *paths, size_t n_paths) {
    struct guanaco_trace all, more;
    int err = guanaco_trace_load(paths[0], &all);
    if (err != 0) {
        fprintf(stderr, PROG ": cannot measure %s: %s\n", paths[0], strerror(-err));
        return 1;
    }
    printf("trace        %s (%s)\n", paths[0], all.shape.source[0] ? all.shape.source : "no source");
    for (size_t i = 1; i < n_paths && err == 0; i++) {
        err = guanaco_trace_load(paths[i], &more);
        if (err != 0) {
            fprintf(stderr, PROG ": cannot measure %s: %s\n", paths[i], strerror(-err));
            break;
        }
        if (more.shape.n_layer != all.shape.n_layer || more.shape.n_expert != all.shape.n_expert ||
            more.shape.top_k != all.shape.top_k) {
            fprintf(stderr, PROG ": %s has %u layers x %u experts, top-%u; %s has %u x %u, top-%u: "
                            "only traces of one shape are measured together\n",
                    paths[i], more.shape.n_layer, more.shape.n_expert, more.shape.top_k, paths[0],
                    all.shape.n_layer, all.shape.n_expert, all.shape.top_k);
            err = -EINVAL;
        } else if ((err = append_records(&all, &more)) != 0) {
            fprintf(stderr, PROG ": out of memory reading %s\n", paths[i]);
        } else {
            printf("  and        %s (%s)\n", paths[i], more.shape.source[0] ? more.shape.source : "no source");
        }
        guanaco_trace_free(&more);
    }
    struct guanaco_routing_stats stats;
    if (err == 0) {
        err = guanaco_routing_measure(&all, &stats);
        if (err == 0) {
            print_stats(&all.shape, &stats, NULL);
        } else {
            fprintf(stderr, PROG ": out of memory measuring the traces\n");
        }
    }
    guanaco_trace_free(&all);
    return err == 0 ? 0 : 1;
}

/* ---- writing ---- */

static int append_decision(void *user, uint32_t sequence, uint32_t token, uint32_t layer, const int32_t *ids) {
    return guanaco_trace_writer_append(user, sequence, token, layer, ids, NULL);
}

/* Streams the decisions into `path`: constant memory whatever the length. A partial regular file is removed. */
static int write_trace(const char *path, const struct guanaco_synth_params *params,
                       const struct guanaco_trace_shape *shape) {
    struct guanaco_trace_writer *writer = NULL;
    int err = guanaco_trace_writer_open(path, shape, &writer);
    if (err != 0) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(-err));
        return err;
    }
    err = guanaco_synth_generate(params, append_decision, writer);
    int closed = guanaco_trace_writer_close(writer);
    err = err ? err : closed;
    if (err != 0) {
        fprintf(stderr, PROG ": writing %s failed: %s\n", path, strerror(-err));
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            unlink(path);
        }
    }
    return err;
}

int main(int argc, char **argv) {
    struct tracegen_options options = {0};
    options.measure = calloc((size_t)argc, sizeof(*options.measure));
    if (!options.measure) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int status = parse_options(argc, argv, &options);
    if (status != 0 || options.n_measure) {
        status = status < 0 ? 0 : status ? status : measure_files(options.measure, options.n_measure);
        free(options.measure);
        return status;
    }
    free(options.measure);
    struct guanaco_synth_params params;
    const struct guanaco_synth_preset *preset = NULL;
    if (resolve_params(&options, &params, &preset) != 0) {
        return 2;
    }
    struct guanaco_trace_shape shape = {.n_layer = params.n_layer, .n_expert = params.n_expert,
                                        .top_k = params.top_k};
    snprintf(shape.arch, sizeof(shape.arch), "%s", options.arch ? options.arch : preset ? preset->arch : "unknown");
    if (options.source) {
        snprintf(shape.source, sizeof(shape.source), "%s", options.source);
    } else {
        snprintf(shape.source, sizeof(shape.source), "synthetic %s seed %llu", preset ? preset->name : "routing",
                 (unsigned long long)params.seed);
    }
    printf("parameters   zipf %g (offset %g, spread %g), reuse %g, cross-layer %g, "
           "topic every %u tokens (strength %g), %u x %u tokens, seed %llu\n",
           params.zipf, params.zipf_offset, params.zipf_spread, params.reuse, params.cross_layer, params.topic_every,
           params.topic_strength, params.sequences, params.tokens, (unsigned long long)params.seed);

    struct guanaco_trace trace;
    int err;
    if (options.out) {
        if (write_trace(options.out, &params, &shape) != 0) {
            return 1;
        }
        /* read back through the loader, so the statistics describe the file exactly as replay will see it */
        err = guanaco_trace_load(options.out, &trace);
        if (err != 0) {
            fprintf(stderr, PROG ": the written trace %s does not load back: %s\n", options.out, strerror(-err));
            return 1;
        }
        printf("wrote        %s: %zu records of %zu bytes\n", options.out, trace.n_records,
               guanaco_trace_record_bytes(shape.top_k));
    } else {
        err = guanaco_synth_trace(&params, shape.arch, shape.source, &trace);
        if (err != 0) {
            fprintf(stderr, PROG ": cannot generate the trace in memory: %s (write it with -o instead)\n",
                    strerror(-err));
            return 1;
        }
    }
    struct guanaco_routing_stats stats;
    err = guanaco_routing_measure(&trace, &stats);
    if (err == 0) {
        print_stats(&trace.shape, &stats, preset);
    } else {
        fprintf(stderr, PROG ": out of memory measuring the trace\n");
    }
    guanaco_trace_free(&trace);
    return err == 0 ? 0 : 1;
}
