/*
 * trace_jsonl.c - owns converting JSON Lines routing logs into a Guanaco
 * routing trace (trace.h). Each line is parsed by libjansson (JSON grammar,
 * escapes, UTF-8, duplicate keys); this file owns the routing rules on top:
 * which keys a line needs, what their values may be, and what a whole file
 * may hold. A broken input line must never become a wrong routing decision
 * or a crash, so every rule fails with the file and line number.
 */
#include "trace_jsonl.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- one line: a flat JSON object ---- */

#define TEXT_BYTES 64 /* dataset and problem_id text */

struct parsed_line {
    char dataset[TEXT_BYTES];
    char problem_id[TEXT_BYTES];
    uint32_t layer, token;
    int32_t *ids;
    float *weights;
    size_t n_ids, ids_capacity, weights_capacity;
    bool has_weights;
};

/* Where a message about one input line points: "PATH:LINE: ...". */
struct line_place {
    const char *path;
    size_t line;
};

__attribute__((format(printf, 2, 3))) static int line_error(const struct line_place *place, const char *format,
                                                            ...) {
    char what[320];
    va_list args;
    va_start(args, format);
    vsnprintf(what, sizeof(what), format, args);
    va_end(args);
    guanaco_log_error("%s:%zu: %s", place->path, place->line, what);
    return -EINVAL;
}

static int grow(void **array, size_t *capacity, size_t needed, size_t element) {
    if (needed <= *capacity) {
        return 0;
    }
    size_t grown = *capacity ? *capacity * 2 : 16;
    while (grown < needed) grown *= 2;
    void *bigger = realloc(*array, grown * element);
    if (!bigger) {
        return -ENOMEM;
    }
    *array = bigger;
    *capacity = grown;
    return 0;
}

/* How a value that broke a rule was written, for the message: the number, or the JSON type. */
static void describe(const json_t *value, char *out, size_t size) {
    switch (json_typeof(value)) {
    case JSON_INTEGER: snprintf(out, size, "%" JSON_INTEGER_FORMAT, json_integer_value(value)); break;
    case JSON_REAL: snprintf(out, size, "%.17g", json_real_value(value)); break;
    case JSON_STRING: snprintf(out, size, "a string"); break;
    case JSON_ARRAY: snprintf(out, size, "an array"); break;
    case JSON_OBJECT: snprintf(out, size, "an object"); break;
    case JSON_TRUE: case JSON_FALSE: snprintf(out, size, "a boolean"); break;
    default: snprintf(out, size, "null"); break;
    }
}

/*
 * A layer, a token position or an expert id: a JSON integer (written without
 * '.' or exponent: 3.0 and 1e2 are refused, since an id written as a real
 * number means the producer computed it, and we would rather hear about it)
 * in [0, max]. Negative values and values past max are refused, not wrapped.
 */
static int read_count(const struct line_place *place, const json_t *value, const char *key, uint32_t max,
                      uint32_t *out) {
    if (json_is_integer(value) && json_integer_value(value) >= 0 && json_integer_value(value) <= (json_int_t)max) {
        *out = (uint32_t)json_integer_value(value);
        return 0;
    }
    char text[48];
    describe(value, text, sizeof(text));
    return line_error(place, "%s must be a whole number from 0 to %" PRIu32 ", written without '.' or exponent, "
                      "not %s", key, max, text);
}

/* dataset, or a problem_id given as a string: at most TEXT_BYTES - 1 bytes (jansson refuses \u0000). */
static int read_text(const struct line_place *place, const json_t *value, const char *key, char *out) {
    if (json_string_length(value) >= TEXT_BYTES) {
        return line_error(place, "%s is longer than %d bytes", key, TEXT_BYTES - 1);
    }
    memcpy(out, json_string_value(value), json_string_length(value) + 1);
    return 0;
}

/* "experts": ids, whole numbers below GUANACO_TRACE_MAX_EXPERTS, none twice; at least one. */
static int read_experts(const struct line_place *place, const json_t *array, struct parsed_line *line) {
    if (!json_is_array(array)) {
        return line_error(place, "\"experts\" must be an array of expert ids");
    }
    size_t n = json_array_size(array);
    if (n == 0) {
        return line_error(place, "\"experts\" is empty");
    }
    if (n > GUANACO_TRACE_MAX_EXPERTS) {
        return line_error(place, "experts has more than %u elements", GUANACO_TRACE_MAX_EXPERTS);
    }
    if (grow((void **)&line->ids, &line->ids_capacity, n, sizeof(*line->ids)) != 0) {
        return line_error(place, "out of memory for %zu expert ids", n);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t id;
        int err = read_count(place, json_array_get(array, i), "an expert id", GUANACO_TRACE_MAX_EXPERTS - 1, &id);
        if (err != 0) {
            return err;
        }
        line->ids[i] = (int32_t)id;
    }
    line->n_ids = n;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            if (line->ids[i] == line->ids[j]) {
                return line_error(place, "expert %d is chosen twice in one routing decision", line->ids[i]);
            }
        }
    }
    return 0;
}

/* "gating_probs": one number per expert (integer or real), each finite as a float. */
static int read_weights(const struct line_place *place, const json_t *array, struct parsed_line *line) {
    if (!json_is_array(array)) {
        return line_error(place, "\"gating_probs\" must be an array of numbers");
    }
    size_t n = json_array_size(array);
    if (n != line->n_ids) {
        return line_error(place, "%zu experts but %zu gating_probs", line->n_ids, n);
    }
    if (grow((void **)&line->weights, &line->weights_capacity, n, sizeof(*line->weights)) != 0) {
        return line_error(place, "out of memory for %zu gating_probs", n);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *value = json_array_get(array, i);
        double weight = json_number_value(value);
        /* jansson refuses NaN, Infinity and doubles that overflow; a float is narrower still. */
        if (!json_is_number(value) || !(fabs(weight) <= FLT_MAX)) {
            char text[48];
            describe(value, text, sizeof(text));
            return line_error(place, "a gating_probs value must be a number within float range, not %s", text);
        }
        line->weights[i] = (float)weight;
    }
    line->has_weights = true;
    return 0;
}

/*
 * Parses one line (`length` bytes, no NUL inside) into `line`. Keys other than
 * the six below are allowed and ignored, whatever their value; every key at
 * most once (JSON_REJECT_DUPLICATES). A syntax error's message gives
 * jansson's column, counted in characters from 1.
 */
static int parse_line(const struct line_place *place, const char *text, size_t length, struct parsed_line *line) {
    json_error_t error;
    json_t *root = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
    if (!root) {
        return line_error(place, "column %d: %s", error.column, error.text);
    }
    int err = 0;
    line->n_ids = 0;
    line->has_weights = false;
    static const char *const required[] = {"dataset", "problem_id", "layer", "token_idx", "experts"};
    const json_t *values[5], *weights = json_object_get(root, "gating_probs");
    if (!json_is_object(root)) {
        err = line_error(place, "column 1: the line is not a JSON object (one object per line)");
    }
    for (size_t i = 0; i < 5 && err == 0; i++) {
        values[i] = json_object_get(root, required[i]);
        if (!values[i]) {
            err = line_error(place, "the object has no \"%s\" key", required[i]);
        }
    }
    if (err == 0) {
        err = json_is_string(values[0]) ? read_text(place, values[0], "dataset name", line->dataset)
                                        : line_error(place, "dataset must be a string");
    }
    if (err == 0) {
        /* A string ("HumanEval/3") or an integer; kept as text, it only has to tell problems apart. */
        if (json_is_string(values[1])) {
            err = read_text(place, values[1], "problem_id", line->problem_id);
        } else if (json_is_integer(values[1])) {
            snprintf(line->problem_id, sizeof(line->problem_id), "%" JSON_INTEGER_FORMAT,
                     json_integer_value(values[1]));
        } else {
            char what[48];
            describe(values[1], what, sizeof(what));
            err = line_error(place, "problem_id must be a string or an integer, not %s", what);
        }
    }
    if (err == 0) err = read_count(place, values[2], "layer", UINT32_MAX - 1, &line->layer);
    if (err == 0) err = read_count(place, values[3], "token_idx", UINT32_MAX, &line->token);
    if (err == 0) err = read_experts(place, values[4], line);
    if (err == 0 && weights) err = read_weights(place, weights, line);
    json_decref(root);
    return err;
}

/* ---- the whole file ---- */

struct record {
    uint32_t sequence, token, layer;
    size_t line;   /* input line number, for messages */
    size_t values; /* index of its first id and weight in the value arrays */
};

struct conversion {
    const char *path;
    struct record *records;
    size_t n_records, records_capacity;
    int32_t *ids;
    float *weights;
    size_t values_capacity;
    uint32_t top_k;
    size_t top_k_line;
    uint32_t max_layer, max_id;
    struct guanaco_trace_convert_sequence *sequences;
    size_t n_sequences, sequences_capacity, last_sequence;
};

static int find_or_add_sequence(struct conversion *conversion, const struct parsed_line *line, uint32_t *out) {
    /* Lines come grouped by problem, so the previous line's sequence is almost always the answer. */
    for (size_t n = 0; n < conversion->n_sequences; n++) {
        size_t i = (conversion->last_sequence + n) % conversion->n_sequences;
        const struct guanaco_trace_convert_sequence *s = &conversion->sequences[i];
        if (strcmp(s->dataset, line->dataset) == 0 && strcmp(s->problem_id, line->problem_id) == 0) {
            conversion->last_sequence = i;
            *out = (uint32_t)i;
            return 0;
        }
    }
    if (conversion->n_sequences >= UINT32_MAX) {
        return -EOVERFLOW;
    }
    int err = grow((void **)&conversion->sequences, &conversion->sequences_capacity, conversion->n_sequences + 1,
                   sizeof(*conversion->sequences));
    if (err != 0) {
        return err;
    }
    struct guanaco_trace_convert_sequence *s = &conversion->sequences[conversion->n_sequences];
    memset(s, 0, sizeof(*s));
    memcpy(s->dataset, line->dataset, sizeof(s->dataset));
    memcpy(s->problem_id, line->problem_id, sizeof(s->problem_id));
    conversion->last_sequence = conversion->n_sequences;
    *out = (uint32_t)conversion->n_sequences++;
    return 0;
}

static int add_record(struct conversion *conversion, const struct parsed_line *line, size_t line_number) {
    if (conversion->n_records == 0) {
        conversion->top_k = (uint32_t)line->n_ids;
        conversion->top_k_line = line_number;
    } else if (line->n_ids != conversion->top_k) {
        guanaco_log_error("%s:%zu: %zu experts in this routing decision, but line %zu has %u: top_k must not "
                          "change within a trace", conversion->path, line_number, line->n_ids,
                          conversion->top_k_line, conversion->top_k);
        return -EINVAL;
    }
    struct record record = {.token = line->token, .layer = line->layer, .line = line_number};
    int err = find_or_add_sequence(conversion, line, &record.sequence);
    if (err == 0) {
        err = grow((void **)&conversion->records, &conversion->records_capacity, conversion->n_records + 1,
                   sizeof(*conversion->records));
    }
    size_t first = conversion->n_records * conversion->top_k;
    size_t capacity = conversion->values_capacity;
    if (err == 0) {
        err = grow((void **)&conversion->ids, &capacity, first + conversion->top_k, sizeof(*conversion->ids));
    }
    if (err == 0) {
        capacity = conversion->values_capacity;
        err = grow((void **)&conversion->weights, &capacity, first + conversion->top_k,
                   sizeof(*conversion->weights));
        conversion->values_capacity = capacity;
    }
    if (err != 0) {
        return err;
    }
    record.values = first;
    for (uint32_t k = 0; k < conversion->top_k; k++) {
        conversion->ids[first + k] = line->ids[k];
        conversion->weights[first + k] = line->has_weights ? line->weights[k] : 0.0f;
        if ((uint32_t)line->ids[k] > conversion->max_id) conversion->max_id = (uint32_t)line->ids[k];
    }
    if (line->layer > conversion->max_layer) conversion->max_layer = line->layer;
    conversion->records[conversion->n_records++] = record;
    return 0;
}

/*
 * Opens the routing log. Only a regular file: its size bounds what is read
 * (and so the memory the records take), where a pipe or a device such as
 * /dev/zero could feed the converter forever. O_NONBLOCK makes opening a FIFO
 * return at once instead of waiting for a writer.
 */
static int open_input(const char *path, FILE **out, uint64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        guanaco_log_error("%s: cannot open the routing log: %s", path, strerror(err));
        return -err;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = errno;
        if (err == 0 || S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode)) {
            guanaco_log_error("%s: not a regular file (a %s): the routing log is read from a file, whose size "
                              "bounds the read; save the stream to a file first",
                              path, S_ISFIFO(st.st_mode) ? "pipe" : S_ISDIR(st.st_mode) ? "directory"
                                    : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "device" : "special file");
            err = EINVAL;
        } else {
            guanaco_log_error("%s: cannot stat the routing log: %s", path, strerror(err));
        }
        close(fd);
        return -err;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) {
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    *out = fdopen(fd, "r");
    if (!*out) {
        int err = errno;
        close(fd);
        return -err;
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

/*
 * Reads one line, without its '\n', into *text. Returns its length, -1 at
 * the end of the file, or -2 when a NUL byte arrives: the read stops there,
 * so a file of zeros costs one byte of buffer, not its whole size. *consumed
 * counts every byte taken from the file.
 */
static ssize_t read_line(FILE *in, char **text, size_t *capacity, uint64_t *consumed) {
    size_t length = 0;
    int c;
    flockfile(in);
    while ((c = getc_unlocked(in)) != EOF) {
        (*consumed)++;
        if (length + 1 >= *capacity) {
            size_t grown = *capacity ? *capacity * 2 : 256;
            char *bigger = realloc(*text, grown);
            if (!bigger) {
                funlockfile(in);
                errno = ENOMEM;
                return -3;
            }
            *text = bigger;
            *capacity = grown;
        }
        if (c == '\n') {
            break;
        }
        (*text)[length++] = (char)c;
        if (c == '\0') {
            funlockfile(in);
            (*text)[length] = '\0';
            return -2; /* the NUL is the last byte of *text */
        }
    }
    funlockfile(in);
    if (c == EOF && length == 0) {
        return -1;
    }
    (*text)[length] = '\0';
    return (ssize_t)length;
}

static int read_input(struct conversion *conversion, size_t *n_lines) {
    FILE *in = NULL;
    uint64_t size = 0, consumed = 0;
    int err = open_input(conversion->path, &in, &size);
    if (err != 0) {
        return err;
    }
    struct parsed_line line;
    memset(&line, 0, sizeof(line));
    char *text = NULL;
    size_t text_capacity = 0, line_number = 0;
    ssize_t length;
    *n_lines = 0;
    errno = 0;
    while (err == 0 && (length = read_line(in, &text, &text_capacity, &consumed)) != -1) {
        line_number++;
        if (length == -3) {
            guanaco_log_error("%s:%zu: out of memory for the line", conversion->path, line_number);
            err = -ENOMEM;
            break;
        }
        if (consumed > size) {
            guanaco_log_error("%s: grew past the %llu bytes it had when opened while being read; convert it once "
                              "it is complete", conversion->path, (unsigned long long)size);
            err = -EINVAL;
            break;
        }
        struct line_place place = {.path = conversion->path, .line = line_number};
        if (length == -2) {
            /* Byte column: the NUL may follow bytes that are not valid UTF-8, so characters are not countable. */
            err = line_error(&place, "column %zu: NUL byte in the line", strlen(text) + 1);
            break;
        }
        /* The line break is not part of the object (jansson takes '\r' as white space). */
        if (strspn(text, " \t\r") == (size_t)length) {
            continue; /* a blank line, e.g. a trailing newline */
        }
        (*n_lines)++;
        err = parse_line(&place, text, (size_t)length, &line);
        if (err == 0) {
            err = add_record(conversion, &line, line_number);
        }
    }
    if (err == 0 && ferror(in)) {
        err = errno ? -errno : -EIO;
        guanaco_log_error("%s: reading the routing log failed: %s", conversion->path, strerror(-err));
    }
    free(text);
    free(line.ids);
    free(line.weights);
    fclose(in);
    if (err == 0 && conversion->n_records == 0) {
        guanaco_log_error("%s: no routing decisions in the file", conversion->path);
        err = -EINVAL;
    }
    return err;
}

static int compare_records(const void *a, const void *b) {
    const struct record *x = a, *y = b;
    if (x->sequence != y->sequence) return x->sequence < y->sequence ? -1 : 1;
    if (x->token != y->token) return x->token < y->token ? -1 : 1;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return 0;
}

static int compare_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Counts positions, incomplete positions, distinct layers and reuse over the sorted records. */
static int measure(const struct conversion *conversion, struct guanaco_trace_convert_report *report) {
    const struct record *records = conversion->records;
    size_t n = conversion->n_records;
    uint32_t top_k = conversion->top_k;

    uint32_t *layers = malloc(n * sizeof(*layers));
    if (!layers) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) layers[i] = records[i].layer;
    qsort(layers, n, sizeof(*layers), compare_u32);
    size_t n_layers = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || layers[i] != layers[i - 1]) n_layers++;
    }
    free(layers);
    report->n_moe_layers = n_layers;

    /* Records of one position are adjacent after the sort, each with a different layer. */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && records[j].sequence == records[i].sequence && records[j].token == records[i].token) j++;
        report->n_tokens++;
        conversion->sequences[records[i].sequence].n_tokens++;
        if (j - i < n_layers) report->n_incomplete_tokens++;
        i = j;
    }

    for (size_t i = 0; i < n; i++) {
        if (records[i].token == UINT32_MAX) continue;
        struct record key = {.sequence = records[i].sequence, .token = records[i].token + 1,
                             .layer = records[i].layer};
        const struct record *next = bsearch(&key, records, n, sizeof(key), compare_records);
        if (!next) continue;
        const int32_t *now = conversion->ids + records[i].values, *then = conversion->ids + next->values;
        for (uint32_t a = 0; a < top_k; a++) {
            report->reuse_pairs++;
            for (uint32_t b = 0; b < top_k; b++) {
                if (now[a] == then[b]) {
                    report->reuse_hits++;
                    break;
                }
            }
        }
    }
    report->reuse_probability = report->reuse_pairs ? (double)report->reuse_hits / (double)report->reuse_pairs : 0;
    report->reuse_chance = (double)top_k / (double)report->shape.n_expert;
    return 0;
}

/* Picks the header's shape from the data and the options; -EINVAL when the options cannot hold the data. */
static int choose_shape(const struct conversion *conversion, const struct guanaco_trace_convert_options *options,
                        struct guanaco_trace_shape *shape) {
    memset(shape, 0, sizeof(*shape));
    uint32_t needed_layers = conversion->max_layer + 1, needed_experts = conversion->max_id + 1;
    if (options && options->n_layer && options->n_layer < needed_layers) {
        guanaco_log_error("%s: layer %u appears, so the model has at least %u layers, not %u", conversion->path,
                          conversion->max_layer, needed_layers, options->n_layer);
        return -EINVAL;
    }
    if (options && options->n_expert && options->n_expert < needed_experts) {
        guanaco_log_error("%s: expert %u appears, so the model has at least %u experts, not %u",
                          conversion->path, conversion->max_id, needed_experts, options->n_expert);
        return -EINVAL;
    }
    if (options && options->n_expert > GUANACO_TRACE_MAX_EXPERTS) {
        guanaco_log_error("%s: %u experts; a trace holds at most %u", conversion->path, options->n_expert,
                          GUANACO_TRACE_MAX_EXPERTS);
        return -EINVAL;
    }
    shape->n_layer = options && options->n_layer ? options->n_layer : needed_layers;
    shape->n_expert = options && options->n_expert ? options->n_expert : needed_experts;
    shape->top_k = conversion->top_k;
    if (shape->top_k > shape->n_expert) {
        guanaco_log_error("%s: top-%u routing but only %u experts; pass the model's expert count",
                          conversion->path, shape->top_k, shape->n_expert);
        return -EINVAL;
    }
    const char *arch = options && options->arch ? options->arch : "unknown";
    const char *source = options ? options->source : NULL;
    if (!source) {
        const char *slash = strrchr(conversion->path, '/');
        source = slash ? slash + 1 : conversion->path;
    }
    snprintf(shape->arch, sizeof(shape->arch), "%s", arch);
    snprintf(shape->source, sizeof(shape->source), "%s", source);
    return 0;
}

static int write_trace(const struct conversion *conversion, const char *out_path,
                       const struct guanaco_trace_shape *shape) {
    struct guanaco_trace_writer *writer;
    int err = guanaco_trace_writer_open(out_path, shape, &writer);
    if (err != 0) {
        return err;
    }
    for (size_t i = 0; i < conversion->n_records && err == 0; i++) {
        const struct record *r = &conversion->records[i];
        err = guanaco_trace_writer_append(writer, r->sequence, r->token, r->layer, conversion->ids + r->values,
                                          conversion->weights + r->values);
    }
    int close_err = guanaco_trace_writer_close(writer);
    if (err == 0) {
        err = close_err;
    }
    if (err != 0) {
        /* Never leave a plausible-looking partial trace; only a regular file is ours to remove (not /dev/full). */
        struct stat st;
        if (lstat(out_path, &st) == 0 && S_ISREG(st.st_mode)) {
            unlink(out_path);
        }
    }
    return err;
}

int guanaco_trace_convert_jsonl(const char *in_path, const char *out_path,
                                const struct guanaco_trace_convert_options *options,
                                struct guanaco_trace_convert_report *report) {
    struct guanaco_trace_convert_report local;
    if (!report) {
        report = &local;
    }
    memset(report, 0, sizeof(*report));
    struct conversion conversion = {.path = in_path};
    int err = read_input(&conversion, &report->n_lines);
    if (err == 0) {
        qsort(conversion.records, conversion.n_records, sizeof(*conversion.records), compare_records);
        for (size_t i = 1; i < conversion.n_records; i++) {
            const struct record *a = &conversion.records[i - 1], *b = &conversion.records[i];
            if (compare_records(a, b) == 0) {
                const struct record *later = a->line > b->line ? a : b, *earlier = a->line > b->line ? b : a;
                guanaco_log_error("%s:%zu: routing decision for %s problem %s, token %u, layer %u repeats line "
                                  "%zu", in_path, later->line, conversion.sequences[a->sequence].dataset,
                                  conversion.sequences[a->sequence].problem_id, a->token, a->layer, earlier->line);
                err = -EINVAL;
                break;
            }
        }
    }
    if (err == 0) {
        err = choose_shape(&conversion, options, &report->shape);
    }
    if (err == 0) {
        err = measure(&conversion, report);
    }
    if (err == 0) {
        err = write_trace(&conversion, out_path, &report->shape);
    }
    free(conversion.records);
    free(conversion.ids);
    free(conversion.weights);
    if (err != 0 || report == &local) {
        free(conversion.sequences);
        memset(report, 0, sizeof(*report));
        return err;
    }
    report->n_records = conversion.n_records;
    report->sequences = conversion.sequences;
    report->n_sequences = conversion.n_sequences;
    return 0;
}

void guanaco_trace_convert_report_free(struct guanaco_trace_convert_report *report) {
    free(report->sequences);
    memset(report, 0, sizeof(*report));
}
