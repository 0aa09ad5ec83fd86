/*
 * trace_jsonl.c - owns converting JSON Lines routing logs into a Guanaco
 * routing trace (trace.h). The input is a stream of flat objects whose values
 * are numbers, strings or arrays of numbers, so a small dedicated parser reads
 * exactly that and rejects everything else with the line number: a broken
 * input line must never become a wrong routing decision or a crash.
 */
#include "trace_jsonl.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- one line: a flat JSON object ---- */

#define TEXT_BYTES 64 /* dataset and problem_id text, and the longest key we care about */

struct parsed_line {
    char dataset[TEXT_BYTES];
    char problem_id[TEXT_BYTES];
    uint32_t layer, token;
    int32_t *ids;
    float *weights;
    size_t n_ids, n_weights, ids_capacity, weights_capacity;
    bool has_dataset, has_problem_id, has_layer, has_token, has_experts, has_weights;
};

struct line_parser {
    const char *start, *p, *end;
    const char *path;
    size_t line;
};

__attribute__((format(printf, 2, 3))) static int parse_error(const struct line_parser *parser, const char *format,
                                                             ...) {
    char what[256];
    va_list args;
    va_start(args, format);
    vsnprintf(what, sizeof(what), format, args);
    va_end(args);
    guanaco_log_error("%s:%zu: column %zu: %s", parser->path, parser->line, (size_t)(parser->p - parser->start) + 1,
                      what);
    return -EINVAL;
}

static void skip_space(struct line_parser *parser) {
    while (parser->p < parser->end &&
           (*parser->p == ' ' || *parser->p == '\t' || *parser->p == '\r' || *parser->p == '\n')) {
        parser->p++;
    }
}

/* Consumes `c` (after white space) or fails naming what was expected. */
static int expect(struct line_parser *parser, char c, const char *context) {
    skip_space(parser);
    if (parser->p >= parser->end || *parser->p != c) {
        return parse_error(parser, "expected '%c' %s", c, context);
    }
    parser->p++;
    return 0;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(struct line_parser *parser, unsigned *value) {
    if (parser->end - parser->p < 4) {
        return parse_error(parser, "\\u escape needs 4 hex digits");
    }
    *value = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_digit(parser->p[i]);
        if (digit < 0) {
            return parse_error(parser, "\\u escape needs 4 hex digits");
        }
        *value = *value * 16 + (unsigned)digit;
    }
    parser->p += 4;
    return 0;
}

/* Appends one byte to a bounded text buffer; remembers an overflow instead of writing past it. */
static void text_put(char *out, size_t size, size_t *used, bool *too_long, unsigned char byte) {
    if (*used + 1 < size) {
        out[(*used)++] = (char)byte;
        out[*used] = '\0';
    } else {
        *too_long = true;
    }
}

/* Parses a JSON string (the opening quote is next) into out (NUL-terminated; too_long set when cut). */
static int parse_string(struct line_parser *parser, char *out, size_t size, bool *too_long) {
    int err = expect(parser, '"', "to open a string");
    if (err != 0) {
        return err;
    }
    size_t used = 0;
    *too_long = false;
    out[0] = '\0';
    while (parser->p < parser->end && *parser->p != '"') {
        unsigned char c = (unsigned char)*parser->p;
        if (c < 0x20) {
            return parse_error(parser, "control character 0x%02x inside a string", c);
        }
        parser->p++;
        if (c != '\\') {
            text_put(out, size, &used, too_long, c);
            continue;
        }
        if (parser->p >= parser->end) {
            break;
        }
        char escape = *parser->p++;
        const char *simple = strchr("\"\\/bfnrt", escape);
        if (escape != '\0' && simple) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            text_put(out, size, &used, too_long, (unsigned char)decoded[simple - "\"\\/bfnrt"]);
            continue;
        }
        if (escape != 'u') {
            parser->p--;
            return parse_error(parser, "unknown escape \\%c in a string", escape);
        }
        unsigned code;
        if ((err = read_hex4(parser, &code)) != 0) {
            return err;
        }
        if (code >= 0xD800 && code <= 0xDBFF) { /* a UTF-16 surrogate pair spells one code point */
            unsigned low;
            if (parser->end - parser->p < 2 || parser->p[0] != '\\' || parser->p[1] != 'u') {
                return parse_error(parser, "lone UTF-16 surrogate \\u%04X in a string", code);
            }
            parser->p += 2;
            if ((err = read_hex4(parser, &low)) != 0) {
                return err;
            }
            if (low < 0xDC00 || low > 0xDFFF) {
                return parse_error(parser, "invalid UTF-16 surrogate pair in a string");
            }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code <= 0xDFFF) {
            return parse_error(parser, "lone UTF-16 surrogate \\u%04X in a string", code);
        }
        /* UTF-8 encode */
        if (code < 0x80) {
            text_put(out, size, &used, too_long, (unsigned char)code);
        } else if (code < 0x800) {
            text_put(out, size, &used, too_long, (unsigned char)(0xC0 | code >> 6));
            text_put(out, size, &used, too_long, (unsigned char)(0x80 | (code & 0x3F)));
        } else if (code < 0x10000) {
            text_put(out, size, &used, too_long, (unsigned char)(0xE0 | code >> 12));
            text_put(out, size, &used, too_long, (unsigned char)(0x80 | (code >> 6 & 0x3F)));
            text_put(out, size, &used, too_long, (unsigned char)(0x80 | (code & 0x3F)));
        } else {
            text_put(out, size, &used, too_long, (unsigned char)(0xF0 | code >> 18));
            text_put(out, size, &used, too_long, (unsigned char)(0x80 | (code >> 12 & 0x3F)));
            text_put(out, size, &used, too_long, (unsigned char)(0x80 | (code >> 6 & 0x3F)));
            text_put(out, size, &used, too_long, (unsigned char)(0x80 | (code & 0x3F)));
        }
    }
    if (parser->p >= parser->end) {
        return parse_error(parser, "string is not closed");
    }
    parser->p++; /* closing quote */
    return 0;
}

/*
 * Parses a JSON number by its grammar (strtod alone would also take "inf",
 * "0x1p3" or " 1"). Returns the value and, in `text`, the number as written.
 */
static int parse_number(struct line_parser *parser, double *value, char *text, size_t text_size) {
    skip_space(parser);
    const char *begin = parser->p, *q = parser->p, *end = parser->end;
    if (q < end && *q == '-') q++;
    if (q < end && *q == '0') {
        q++;
    } else if (q < end && *q >= '1' && *q <= '9') {
        while (q < end && *q >= '0' && *q <= '9') q++;
    } else {
        return parse_error(parser, "expected a number");
    }
    if (q < end && *q == '.') {
        q++;
        if (q >= end || *q < '0' || *q > '9') {
            parser->p = q;
            return parse_error(parser, "expected a digit after the decimal point");
        }
        while (q < end && *q >= '0' && *q <= '9') q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || *q < '0' || *q > '9') {
            parser->p = q;
            return parse_error(parser, "expected a digit in the exponent");
        }
        while (q < end && *q >= '0' && *q <= '9') q++;
    }
    size_t length = (size_t)(q - begin);
    if (length + 1 > text_size) {
        return parse_error(parser, "number of %zu characters is too long", length);
    }
    memcpy(text, begin, length);
    text[length] = '\0';
    *value = strtod(text, NULL);
    if (!isfinite(*value)) {
        return parse_error(parser, "number %s is out of range", text);
    }
    parser->p = q;
    return 0;
}

/* A number that must be a whole value in [0, max]: a layer, a token position, an expert id. */
static int parse_count(struct line_parser *parser, const char *key, double max, uint32_t *out) {
    const char *at = parser->p;
    char text[TEXT_BYTES];
    double value;
    int err = parse_number(parser, &value, text, sizeof(text));
    if (err != 0) {
        return err;
    }
    if (value < 0 || value > max || value != floor(value)) {
        parser->p = at;
        return parse_error(parser, "%s must be a whole number from 0 to %.0f, not %s", key, max, text);
    }
    *out = (uint32_t)value;
    return 0;
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

/* Parses "[n, n, ...]"; ids when `ids` is true (whole numbers < 65536), else weights (any finite number). */
static int parse_number_array(struct line_parser *parser, const char *key, bool ids, struct parsed_line *line) {
    int err = expect(parser, '[', ids ? "to open the experts array" : "to open the gating_probs array");
    if (err != 0) {
        return err;
    }
    size_t *count = ids ? &line->n_ids : &line->n_weights;
    *count = 0;
    skip_space(parser);
    if (parser->p < parser->end && *parser->p == ']') {
        parser->p++;
        return 0;
    }
    for (;;) {
        if (*count >= GUANACO_TRACE_MAX_EXPERTS) {
            return parse_error(parser, "%s has more than %u elements", key, GUANACO_TRACE_MAX_EXPERTS);
        }
        if (ids) {
            uint32_t id = 0;
            if ((err = grow((void **)&line->ids, &line->ids_capacity, *count + 1, sizeof(*line->ids))) != 0 ||
                (err = parse_count(parser, "an expert id", GUANACO_TRACE_MAX_EXPERTS - 1, &id)) != 0) {
                return err;
            }
            line->ids[(*count)++] = (int32_t)id;
        } else {
            double value = 0.0;
            char text[TEXT_BYTES];
            if ((err = grow((void **)&line->weights, &line->weights_capacity, *count + 1,
                            sizeof(*line->weights))) != 0 ||
                (err = parse_number(parser, &value, text, sizeof(text))) != 0) {
                return err;
            }
            line->weights[(*count)++] = (float)value;
        }
        skip_space(parser);
        if (parser->p < parser->end && *parser->p == ',') {
            parser->p++;
            continue;
        }
        return expect(parser, ']', "or ',' in an array of numbers");
    }
}

/* Skips the value of a key this converter does not use; it must still be a number, string or number array. */
static int skip_value(struct line_parser *parser) {
    skip_space(parser);
    double value;
    char text[TEXT_BYTES];
    if (parser->p < parser->end && *parser->p == '"') {
        char ignored[2];
        bool too_long;
        return parse_string(parser, ignored, sizeof(ignored), &too_long);
    }
    if (parser->p >= parser->end || *parser->p != '[') {
        return parse_number(parser, &value, text, sizeof(text));
    }
    parser->p++;
    skip_space(parser);
    if (parser->p < parser->end && *parser->p == ']') {
        parser->p++;
        return 0;
    }
    for (;;) {
        int err = parse_number(parser, &value, text, sizeof(text));
        if (err != 0) {
            return err;
        }
        skip_space(parser);
        if (parser->p < parser->end && *parser->p == ',') {
            parser->p++;
            continue;
        }
        return expect(parser, ']', "or ',' in an array of numbers");
    }
}

static int parse_line(struct line_parser *parser, struct parsed_line *line) {
    line->has_dataset = line->has_problem_id = line->has_layer = line->has_token = false;
    line->has_experts = line->has_weights = false;
    line->n_ids = line->n_weights = 0;
    int err = expect(parser, '{', "to open the line's object");
    skip_space(parser);
    if (err == 0 && parser->p < parser->end && *parser->p == '}') {
        parser->p++;
    } else {
        while (err == 0) {
            char key[TEXT_BYTES];
            bool too_long;
            const char *key_at = parser->p;
            if ((err = parse_string(parser, key, sizeof(key), &too_long)) != 0 ||
                (err = expect(parser, ':', "after a key")) != 0) {
                break;
            }
            bool *seen = NULL;
            if (strcmp(key, "dataset") == 0) seen = &line->has_dataset;
            else if (strcmp(key, "problem_id") == 0) seen = &line->has_problem_id;
            else if (strcmp(key, "layer") == 0) seen = &line->has_layer;
            else if (strcmp(key, "token_idx") == 0) seen = &line->has_token;
            else if (strcmp(key, "experts") == 0) seen = &line->has_experts;
            else if (strcmp(key, "gating_probs") == 0) seen = &line->has_weights;
            if (seen && *seen) {
                parser->p = key_at;
                err = parse_error(parser, "key \"%s\" appears twice", key);
                break;
            }
            if (seen) {
                *seen = true;
            }
            skip_space(parser);
            if (seen == &line->has_dataset) {
                const char *at = parser->p;
                err = parse_string(parser, line->dataset, sizeof(line->dataset), &too_long);
                if (err == 0 && too_long) {
                    parser->p = at;
                    err = parse_error(parser, "dataset name is longer than %d bytes", TEXT_BYTES - 1);
                }
            } else if (seen == &line->has_problem_id) {
                /* Either a number or a string ("HumanEval/3"); kept as text, it only has to tell problems apart. */
                const char *at = parser->p;
                if (parser->p < parser->end && *parser->p == '"') {
                    err = parse_string(parser, line->problem_id, sizeof(line->problem_id), &too_long);
                } else {
                    double value;
                    too_long = false;
                    err = parse_number(parser, &value, line->problem_id, sizeof(line->problem_id));
                }
                if (err == 0 && too_long) {
                    parser->p = at;
                    err = parse_error(parser, "problem_id is longer than %d bytes", TEXT_BYTES - 1);
                }
            } else if (seen == &line->has_layer) {
                err = parse_count(parser, "layer", (double)UINT32_MAX - 1, &line->layer);
            } else if (seen == &line->has_token) {
                err = parse_count(parser, "token_idx", (double)UINT32_MAX, &line->token);
            } else if (seen == &line->has_experts) {
                err = parse_number_array(parser, "experts", true, line);
            } else if (seen == &line->has_weights) {
                err = parse_number_array(parser, "gating_probs", false, line);
            } else {
                err = skip_value(parser);
            }
            if (err != 0) {
                break;
            }
            skip_space(parser);
            if (parser->p < parser->end && *parser->p == ',') {
                parser->p++;
                continue;
            }
            err = expect(parser, '}', "or ',' after a value");
            break;
        }
    }
    if (err != 0) {
        return err;
    }
    skip_space(parser);
    if (parser->p != parser->end) {
        return parse_error(parser, "unexpected text after the object (one object per line)");
    }
    static const char *const required[] = {"dataset", "problem_id", "layer", "token_idx", "experts"};
    const bool present[] = {line->has_dataset, line->has_problem_id, line->has_layer, line->has_token,
                            line->has_experts};
    for (size_t i = 0; i < sizeof(present) / sizeof(present[0]); i++) {
        if (!present[i]) {
            parser->p = parser->start;
            return parse_error(parser, "the object has no \"%s\" key", required[i]);
        }
    }
    if (line->n_ids == 0) {
        return parse_error(parser, "\"experts\" is empty");
    }
    if (line->has_weights && line->n_weights != line->n_ids) {
        return parse_error(parser, "%zu experts but %zu gating_probs", line->n_ids, line->n_weights);
    }
    for (size_t i = 0; i < line->n_ids; i++) {
        for (size_t j = 0; j < i; j++) {
            if (line->ids[i] == line->ids[j]) {
                return parse_error(parser, "expert %d is chosen twice in one routing decision", line->ids[i]);
            }
        }
    }
    return 0;
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
        if (length == -2) {
            size_t at = strlen(text); /* the NUL's column - 1 */
            struct line_parser parser = {.start = text, .p = text + at, .end = text + at + 1,
                                         .path = conversion->path, .line = line_number};
            err = parse_error(&parser, "NUL byte in the line");
            break;
        }
        /* The line break is not part of the object; a '\r' before it neither. */
        while (length > 0 && text[length - 1] == '\r') {
            length--;
        }
        struct line_parser parser = {.start = text, .p = text, .end = text + length, .path = conversion->path,
                                     .line = line_number};
        skip_space(&parser);
        if (parser.p == parser.end) {
            continue; /* a blank line, e.g. a trailing newline */
        }
        (*n_lines)++;
        err = parse_line(&parser, &line);
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
