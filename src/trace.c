/*
 * trace.c - owns writing and reading Guanaco's routing-trace file (format in
 * docs/TRACE.md). Every multi-byte field is encoded byte by byte as
 * little-endian, so a trace written on one machine reads the same on any
 * other, whatever the host's byte order.
 */
#include "trace.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Field offsets inside the 120-byte header. */
enum {
    HEADER_MAGIC = 0,
    HEADER_VERSION = 8,
    HEADER_N_LAYER = 12,
    HEADER_N_EXPERT = 16,
    HEADER_TOP_K = 20,
    HEADER_ARCH = 24,
    HEADER_SOURCE = 56,
    HEADER_END = 120,
};
_Static_assert(HEADER_END == GUANACO_TRACE_HEADER_BYTES, "header layout and its documented size disagree");
_Static_assert(HEADER_SOURCE - HEADER_ARCH == sizeof(((struct guanaco_trace_shape *)0)->arch), "arch field size");
_Static_assert(HEADER_END - HEADER_SOURCE == sizeof(((struct guanaco_trace_shape *)0)->source), "source field size");

/* Bytes of the fixed part of a record: token, sequence, layer. */
#define RECORD_FIXED_BYTES 12u

/* The ids take 2 bytes each, padded to a multiple of 4 so that the weights
 * (and the next record) stay 4-byte aligned when the file is mmapped. */
static size_t ids_bytes(uint32_t top_k) { return ((size_t)top_k * 2 + 3) / 4 * 4; }

size_t guanaco_trace_record_bytes(uint32_t top_k) {
    return RECORD_FIXED_BYTES + ids_bytes(top_k) + (size_t)top_k * 4;
}

static void put_u16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_f32(unsigned char *p, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    put_u32(p, bits);
}

static float get_f32(const unsigned char *p) {
    uint32_t bits = get_u32(p);
    float v;
    memcpy(&v, &bits, sizeof(v));
    return v;
}

/* Checks the numbers of a shape; `what` names the file or caller in the message. */
static int check_shape_numbers(const char *what, uint32_t n_layer, uint32_t n_expert, uint32_t top_k) {
    if (n_layer == 0 || n_expert == 0 || n_expert > GUANACO_TRACE_MAX_EXPERTS || top_k == 0 || top_k > n_expert) {
        guanaco_log_error("%s: impossible trace shape: %u layers, %u experts, top-%u (need at least one layer, "
                          "1..%u experts and 1 <= top_k <= experts)",
                          what, n_layer, n_expert, top_k, GUANACO_TRACE_MAX_EXPERTS);
        return -EINVAL;
    }
    return 0;
}

/* ---- writer ---- */

#define WRITER_BUFFER_BYTES (64u * 1024u)

struct guanaco_trace_writer {
    pthread_mutex_t lock;
    int fd;
    char *path;
    struct guanaco_trace_shape shape;
    size_t record_bytes;
    unsigned char *buffer;
    size_t buffered;
    int error;         /* first write error, sticky: a trace with a hole in it is worse than none */
    size_t n_records;  /* appended, for the error message */
};

/* Writes everything buffered. Called with the lock held (or before sharing). */
static int writer_flush(struct guanaco_trace_writer *writer) {
    size_t done = 0;
    while (done < writer->buffered) {
        ssize_t n = write(writer->fd, writer->buffer + done, writer->buffered - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;
            guanaco_log_error("%s: writing the routing trace failed after %zu records: %s", writer->path,
                              writer->n_records, strerror(err));
            writer->error = -err;
            return writer->error;
        }
        done += (size_t)n;
    }
    writer->buffered = 0;
    return 0;
}

int guanaco_trace_writer_open(const char *path, const struct guanaco_trace_shape *shape,
                              struct guanaco_trace_writer **out) {
    *out = NULL;
    int err = check_shape_numbers(path, shape->n_layer, shape->n_expert, shape->top_k);
    if (err != 0) {
        return err;
    }
    struct guanaco_trace_writer *writer = calloc(1, sizeof(*writer));
    if (!writer) {
        return -ENOMEM;
    }
    writer->fd = -1;
    writer->shape = *shape;
    /* The caller's strings may fill their arrays; the file keeps room for a NUL. */
    memset(writer->shape.arch, 0, sizeof(writer->shape.arch));
    memset(writer->shape.source, 0, sizeof(writer->shape.source));
    memcpy(writer->shape.arch, shape->arch, strnlen(shape->arch, sizeof(shape->arch) - 1));
    memcpy(writer->shape.source, shape->source, strnlen(shape->source, sizeof(shape->source) - 1));
    writer->record_bytes = guanaco_trace_record_bytes(shape->top_k);
    /* A record never straddles a flush decision: the buffer holds at least one whole record. */
    size_t capacity = WRITER_BUFFER_BYTES > writer->record_bytes ? WRITER_BUFFER_BYTES : writer->record_bytes;
    writer->buffer = malloc(capacity);
    writer->path = strdup(path);
    if (!writer->buffer || !writer->path) {
        free(writer->buffer);
        free(writer->path);
        free(writer);
        return -ENOMEM;
    }
    err = pthread_mutex_init(&writer->lock, NULL);
    if (err != 0) {
        free(writer->buffer);
        free(writer->path);
        free(writer);
        return -err;
    }
    writer->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (writer->fd < 0) {
        err = errno;
        guanaco_log_error("%s: cannot create the routing trace: %s", path, strerror(err));
        pthread_mutex_destroy(&writer->lock);
        free(writer->buffer);
        free(writer->path);
        free(writer);
        return -err;
    }

    unsigned char *h = writer->buffer;
    memset(h, 0, GUANACO_TRACE_HEADER_BYTES);
    memcpy(h + HEADER_MAGIC, GUANACO_TRACE_MAGIC, 8);
    put_u32(h + HEADER_VERSION, GUANACO_TRACE_VERSION);
    put_u32(h + HEADER_N_LAYER, shape->n_layer);
    put_u32(h + HEADER_N_EXPERT, shape->n_expert);
    put_u32(h + HEADER_TOP_K, shape->top_k);
    memcpy(h + HEADER_ARCH, writer->shape.arch, sizeof(writer->shape.arch));
    memcpy(h + HEADER_SOURCE, writer->shape.source, sizeof(writer->shape.source));
    writer->buffered = GUANACO_TRACE_HEADER_BYTES;
    *out = writer;
    return 0;
}

int guanaco_trace_writer_append(struct guanaco_trace_writer *writer, uint32_t sequence, uint32_t token,
                                uint32_t layer, const int32_t *ids, const float *weights) {
    const struct guanaco_trace_shape *shape = &writer->shape;
    /* Validated before the lock: the shape never changes after open. */
    if (layer >= shape->n_layer) {
        guanaco_log_error("%s: routing record for layer %u, but the trace declares %u layers", writer->path, layer,
                          shape->n_layer);
        return -EINVAL;
    }
    for (uint32_t k = 0; k < shape->top_k; k++) {
        if (ids[k] < 0 || (uint32_t)ids[k] >= shape->n_expert) {
            guanaco_log_error("%s: routing record for layer %u token %u has expert id %d, but the trace declares "
                              "%u experts", writer->path, layer, token, ids[k], shape->n_expert);
            return -EINVAL;
        }
    }

    pthread_mutex_lock(&writer->lock);
    int err = writer->error;
    if (err == 0 && writer->buffered + writer->record_bytes > WRITER_BUFFER_BYTES) {
        err = writer_flush(writer);
    }
    if (err == 0) {
        unsigned char *r = writer->buffer + writer->buffered;
        put_u32(r, token);
        put_u32(r + 4, sequence);
        put_u32(r + 8, layer);
        unsigned char *id_bytes = r + RECORD_FIXED_BYTES;
        memset(id_bytes, 0, ids_bytes(shape->top_k)); /* the pad u16 of an odd top_k is zero */
        unsigned char *weight_bytes = id_bytes + ids_bytes(shape->top_k);
        for (uint32_t k = 0; k < shape->top_k; k++) {
            put_u16(id_bytes + 2 * k, (uint16_t)ids[k]);
            put_f32(weight_bytes + 4 * k, weights ? weights[k] : 0.0f);
        }
        writer->buffered += writer->record_bytes;
        writer->n_records++;
    }
    pthread_mutex_unlock(&writer->lock);
    return err;
}

int guanaco_trace_writer_close(struct guanaco_trace_writer *writer) {
    if (!writer) {
        return 0;
    }
    int err = writer->error;
    if (err == 0) {
        err = writer_flush(writer);
    }
    /* close() is where some filesystems (NFS) first report a failed write. */
    if (close(writer->fd) != 0 && err == 0) {
        err = -errno;
        guanaco_log_error("%s: closing the routing trace failed: %s", writer->path, strerror(-err));
    }
    pthread_mutex_destroy(&writer->lock);
    free(writer->buffer);
    free(writer->path);
    free(writer);
    return err;
}

/* ---- reader ---- */

/* Reads the whole file into memory; a trace is small next to the model it describes. */
static int read_whole_file(const char *path, unsigned char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        guanaco_log_error("%s: cannot open the routing trace: %s", path, strerror(err));
        return -err;
    }
    struct stat st;
    size_t capacity = 1 << 16;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size < SIZE_MAX - 1) {
        capacity = (size_t)st.st_size + 1; /* +1 so that reading EOF needs no growth */
    }
    unsigned char *buffer = malloc(capacity);
    if (!buffer) {
        close(fd);
        return -ENOMEM;
    }
    size_t used = 0;
    for (;;) {
        if (used == capacity) {
            unsigned char *grown = capacity <= SIZE_MAX / 2 ? realloc(buffer, capacity * 2) : NULL;
            if (!grown) {
                free(buffer);
                close(fd);
                return -ENOMEM;
            }
            buffer = grown;
            capacity *= 2;
        }
        ssize_t n = read(fd, buffer + used, capacity - used);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int err = errno;
            guanaco_log_error("%s: reading the routing trace failed: %s", path, strerror(err));
            free(buffer);
            close(fd);
            return -err;
        }
        if (n == 0) {
            break;
        }
        used += (size_t)n;
    }
    close(fd);
    *data = buffer;
    *size = used;
    return 0;
}

/* Copies a fixed-size, NUL-padded text field; -EINVAL when it holds no NUL. */
static int read_text_field(const char *path, const char *name, const unsigned char *field, char *out,
                           size_t size) {
    if (memchr(field, '\0', size) == NULL) {
        guanaco_log_error("%s: the %s field of the trace header is not NUL-terminated: corrupt header", path,
                          name);
        return -EINVAL;
    }
    memcpy(out, field, size);
    return 0;
}

static int parse_header(const char *path, const unsigned char *data, size_t size,
                        struct guanaco_trace_shape *shape) {
    if (size < 8 || memcmp(data + HEADER_MAGIC, GUANACO_TRACE_MAGIC, 8) != 0) {
        guanaco_log_error("%s: not a Guanaco routing trace (no \"%s\" magic at its start)", path,
                          GUANACO_TRACE_MAGIC);
        return -EINVAL;
    }
    if (size < GUANACO_TRACE_HEADER_BYTES) {
        guanaco_log_error("%s: truncated: %zu bytes, but the trace header alone takes %u", path, size,
                          GUANACO_TRACE_HEADER_BYTES);
        return -EINVAL;
    }
    uint32_t version = get_u32(data + HEADER_VERSION);
    if (version != GUANACO_TRACE_VERSION) {
        guanaco_log_error("%s: trace format version %u; this Guanaco reads version %u", path, version,
                          GUANACO_TRACE_VERSION);
        return -EINVAL;
    }
    memset(shape, 0, sizeof(*shape));
    shape->n_layer = get_u32(data + HEADER_N_LAYER);
    shape->n_expert = get_u32(data + HEADER_N_EXPERT);
    shape->top_k = get_u32(data + HEADER_TOP_K);
    int err = check_shape_numbers(path, shape->n_layer, shape->n_expert, shape->top_k);
    if (err == 0) {
        err = read_text_field(path, "arch", data + HEADER_ARCH, shape->arch, sizeof(shape->arch));
    }
    if (err == 0) {
        err = read_text_field(path, "source", data + HEADER_SOURCE, shape->source, sizeof(shape->source));
    }
    return err;
}

/* Decodes and checks record `index`, which starts at `r`. */
static int parse_record(const char *path, const unsigned char *r, size_t index, struct guanaco_trace *out) {
    const struct guanaco_trace_shape *shape = &out->shape;
    size_t record_bytes = guanaco_trace_record_bytes(shape->top_k);
    unsigned long long offset = GUANACO_TRACE_HEADER_BYTES + (unsigned long long)index * record_bytes;
    out->token[index] = get_u32(r);
    out->sequence[index] = get_u32(r + 4);
    out->layer[index] = get_u32(r + 8);
    if (out->layer[index] >= shape->n_layer) {
        guanaco_log_error("%s: record %zu (byte %llu) is for layer %u, but the trace declares %u layers", path,
                          index, offset, out->layer[index], shape->n_layer);
        return -EINVAL;
    }
    const unsigned char *id_bytes = r + RECORD_FIXED_BYTES;
    const unsigned char *weight_bytes = id_bytes + ids_bytes(shape->top_k);
    if (shape->top_k % 2 == 1 && get_u16(id_bytes + 2 * shape->top_k) != 0) {
        guanaco_log_error("%s: record %zu (byte %llu) has a non-zero pad after its ids: corrupt record", path,
                          index, offset);
        return -EINVAL;
    }
    for (uint32_t k = 0; k < shape->top_k; k++) {
        uint16_t id = get_u16(id_bytes + 2 * k);
        if (id >= shape->n_expert) {
            guanaco_log_error("%s: record %zu (byte %llu) names expert %u, but the trace declares %u experts",
                              path, index, offset, id, shape->n_expert);
            return -EINVAL;
        }
        out->ids[index * shape->top_k + k] = id;
        out->weights[index * shape->top_k + k] = get_f32(weight_bytes + 4 * k);
    }
    return 0;
}

int guanaco_trace_load(const char *path, struct guanaco_trace *out) {
    memset(out, 0, sizeof(*out));
    unsigned char *data = NULL;
    size_t size = 0;
    int err = read_whole_file(path, &data, &size);
    if (err != 0) {
        return err;
    }
    err = parse_header(path, data, size, &out->shape);
    if (err != 0) {
        free(data);
        return err;
    }
    size_t record_bytes = guanaco_trace_record_bytes(out->shape.top_k);
    size_t body = size - GUANACO_TRACE_HEADER_BYTES;
    size_t n_records = body / record_bytes;
    if (body % record_bytes != 0) {
        guanaco_log_error("%s: truncated: record %zu is partial (%zu of its %zu bytes); the file holds %zu "
                          "whole records", path, n_records, body % record_bytes, record_bytes, n_records);
        free(data);
        return -EINVAL;
    }
    size_t n_values = n_records * out->shape.top_k; /* cannot overflow: n_values * 6 < size */
    size_t n_allocated = n_records ? n_records : 1; /* malloc(0) may return NULL */
    size_t n_values_allocated = n_values ? n_values : 1;
    out->sequence = malloc(n_allocated * sizeof(*out->sequence));
    out->token = malloc(n_allocated * sizeof(*out->token));
    out->layer = malloc(n_allocated * sizeof(*out->layer));
    out->ids = malloc(n_values_allocated * sizeof(*out->ids));
    out->weights = malloc(n_values_allocated * sizeof(*out->weights));
    if (!out->sequence || !out->token || !out->layer || !out->ids || !out->weights) {
        free(data);
        guanaco_trace_free(out);
        return -ENOMEM;
    }
    out->n_records = n_records;
    const unsigned char *records = data + GUANACO_TRACE_HEADER_BYTES;
    for (size_t i = 0; i < n_records && err == 0; i++) {
        err = parse_record(path, records + i * record_bytes, i, out);
    }
    free(data);
    if (err != 0) {
        guanaco_trace_free(out);
    }
    return err;
}

void guanaco_trace_free(struct guanaco_trace *trace) {
    free(trace->sequence);
    free(trace->token);
    free(trace->layer);
    free(trace->ids);
    free(trace->weights);
    memset(trace, 0, sizeof(*trace));
}

int guanaco_trace_shape_check(const struct guanaco_trace_shape *trace, uint32_t n_layer, uint32_t n_expert,
                              uint32_t top_k) {
    if (trace->n_layer == n_layer && trace->n_expert == n_expert && trace->top_k == top_k) {
        return 0;
    }
    /* Name every field that differs, so one message says the whole story. */
    char differences[256] = "";
    size_t used = 0;
    const struct {
        const char *name;
        uint32_t trace_value, model_value;
    } fields[] = {
        {"layers", trace->n_layer, n_layer},
        {"experts per layer", trace->n_expert, n_expert},
        {"experts used per token (top_k)", trace->top_k, top_k},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].trace_value == fields[i].model_value || used >= sizeof(differences)) {
            continue;
        }
        int n = snprintf(differences + used, sizeof(differences) - used, "%s%s: trace %u, model %u",
                         used ? "; " : "", fields[i].name, fields[i].trace_value, fields[i].model_value);
        used += n > 0 ? (size_t)n : 0;
    }
    guanaco_log_error("routing trace (arch \"%.31s\", source \"%.63s\") does not fit this model: %s",
                      trace->arch, trace->source, differences);
    return -EINVAL;
}
