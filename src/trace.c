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
    uint32_t *id_seen; /* n_expert entries: the append (stamp) that last named each id, to refuse a repeat */
    uint32_t stamp;
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
    writer->id_seen = calloc(shape->n_expert, sizeof(*writer->id_seen));
    if (!writer->buffer || !writer->path || !writer->id_seen) {
        free(writer->buffer);
        free(writer->path);
        free(writer->id_seen);
        free(writer);
        return -ENOMEM;
    }
    err = pthread_mutex_init(&writer->lock, NULL);
    if (err != 0) {
        free(writer->buffer);
        free(writer->path);
        free(writer->id_seen);
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
        free(writer->id_seen);
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
    /* The header goes out now: a destination that cannot take even that (/dev/full, a full disk)
       is refused here, before a run records into it, rather than at close when the run is over. */
    err = writer_flush(writer);
    if (err != 0) {
        guanaco_trace_writer_close(writer);
        return err;
    }
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
    /* One rule with the loader and the converter: an expert is chosen at most once per decision. */
    if (++writer->stamp == 0) {
        memset(writer->id_seen, 0, shape->n_expert * sizeof(*writer->id_seen));
        writer->stamp = 1;
    }
    for (uint32_t k = 0; k < shape->top_k; k++) {
        if (writer->id_seen[ids[k]] == writer->stamp) {
            pthread_mutex_unlock(&writer->lock);
            guanaco_log_error("%s: routing record for layer %u token %u names expert %d twice", writer->path,
                              layer, token, ids[k]);
            return -EINVAL;
        }
        writer->id_seen[ids[k]] = writer->stamp;
    }
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
    free(writer->id_seen);
    free(writer);
    return err;
}

/* ---- reader ---- */

/* Reads exactly `size` bytes at the file's current offset; -EINVAL after a message when the file ends first. */
static int read_exactly(const char *path, int fd, unsigned char *buffer, size_t size, unsigned long long offset) {
    size_t used = 0;
    while (used < size) {
        ssize_t n = read(fd, buffer + used, size - used);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            int err = errno;
            guanaco_log_error("%s: reading the routing trace failed: %s", path, strerror(err));
            return -err;
        }
        if (n == 0) {
            guanaco_log_error("%s: the file ended at byte %llu, before the size it had when opened: it shrank "
                              "while being read", path, offset + used);
            return -EINVAL;
        }
        used += (size_t)n;
    }
    return 0;
}

/*
 * Opens a trace for reading. Only a regular file: its size says how many
 * records it holds, so everything read below is bounded by it. A pipe or a
 * device (/dev/zero) has no size and could feed the reader forever. O_NONBLOCK
 * makes opening a FIFO return at once instead of waiting for a writer.
 */
static int open_trace_file(const char *path, int *fd_out, uint64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        guanaco_log_error("%s: cannot open the routing trace: %s", path, strerror(err));
        return -err;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        guanaco_log_error("%s: cannot stat the routing trace: %s", path, strerror(err));
        close(fd);
        return -err;
    }
    if (!S_ISREG(st.st_mode)) {
        guanaco_log_error("%s: not a regular file (a %s): a routing trace is read from a file, whose size gives "
                          "its number of records; save the stream to a file first",
                          path, S_ISFIFO(st.st_mode) ? "pipe" : S_ISDIR(st.st_mode) ? "directory"
                                : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "device" : "special file");
        close(fd);
        return -EINVAL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) {
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    *fd_out = fd;
    *size = (uint64_t)st.st_size;
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

/* Decodes and checks record `index`, which starts at `r`. id_seen (n_expert entries) holds, for each id, the
   index + 1 of the last record that named it, to refuse a repeat within a record. */
static int parse_record(const char *path, const unsigned char *r, size_t index, size_t *id_seen,
                        struct guanaco_trace *out) {
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
        /* The converter's rule, and guanaco_request_trace_check's: a router picks an expert at most once. */
        if (id_seen[id] == index + 1) {
            guanaco_log_error("%s: record %zu (byte %llu) names expert %u twice: corrupt record", path, index,
                              offset, id);
            return -EINVAL;
        }
        id_seen[id] = index + 1;
        out->ids[index * shape->top_k + k] = id;
        out->weights[index * shape->top_k + k] = get_f32(weight_bytes + 4 * k);
    }
    return 0;
}

/* Bytes of memory one loaded record takes: sequence, token and layer, and an int32 id and a float weight per k. */
static uint64_t loaded_record_bytes(uint32_t top_k) { return 12u + 8u * (uint64_t)top_k; }

/* Physical memory of this machine, or 0 when unknown. */
static uint64_t physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* Records are read in chunks of about this many bytes, so the file is never copied whole. */
#define READ_CHUNK_BYTES (1u << 20)

int guanaco_trace_load(const char *path, struct guanaco_trace *out) {
    memset(out, 0, sizeof(*out));
    int fd = -1;
    uint64_t size = 0;
    int err = open_trace_file(path, &fd, &size);
    if (err != 0) {
        return err;
    }
    /* The header first: a file that is not a trace is refused before its size is trusted for anything. */
    unsigned char header[GUANACO_TRACE_HEADER_BYTES];
    size_t header_bytes = size < sizeof(header) ? (size_t)size : sizeof(header);
    err = read_exactly(path, fd, header, header_bytes, 0);
    if (err == 0) {
        err = parse_header(path, header, header_bytes, &out->shape);
    }
    if (err != 0) {
        close(fd);
        memset(out, 0, sizeof(*out));
        return err;
    }
    /* The size gives the number of records; the header's shape gives their size. */
    size_t record_bytes = guanaco_trace_record_bytes(out->shape.top_k);
    uint64_t body = size - GUANACO_TRACE_HEADER_BYTES;
    uint64_t n_records = body / record_bytes;
    if (body % record_bytes != 0) {
        guanaco_log_error("%s: truncated: record %llu is partial (%llu of its %zu bytes); the file holds %llu "
                          "whole records", path, (unsigned long long)n_records,
                          (unsigned long long)(body % record_bytes), record_bytes, (unsigned long long)n_records);
        close(fd);
        return -EINVAL;
    }
    /* Loaded, a record takes about as much memory as in the file; refuse what this machine cannot hold
       rather than be killed for it. */
    uint64_t memory = physical_memory_bytes();
    uint64_t needed = n_records * loaded_record_bytes(out->shape.top_k);
    if (n_records > SIZE_MAX / out->shape.top_k / sizeof(int32_t) || (memory && needed > memory)) {
        guanaco_log_error("%s: %llu records of top-%u would take %.1f GiB of memory once loaded, more than this "
                          "machine's %.1f GiB", path, (unsigned long long)n_records, out->shape.top_k,
                          (double)needed / 1073741824.0, (double)memory / 1073741824.0);
        close(fd);
        return -ENOMEM;
    }
    size_t n_values = (size_t)n_records * out->shape.top_k;
    size_t n_allocated = n_records ? (size_t)n_records : 1; /* malloc(0) may return NULL */
    size_t n_values_allocated = n_values ? n_values : 1;
    out->sequence = malloc(n_allocated * sizeof(*out->sequence));
    out->token = malloc(n_allocated * sizeof(*out->token));
    out->layer = malloc(n_allocated * sizeof(*out->layer));
    out->ids = malloc(n_values_allocated * sizeof(*out->ids));
    out->weights = malloc(n_values_allocated * sizeof(*out->weights));
    size_t per_chunk = READ_CHUNK_BYTES / record_bytes ? READ_CHUNK_BYTES / record_bytes : 1;
    unsigned char *chunk = malloc(per_chunk * record_bytes);
    size_t *id_seen = calloc(out->shape.n_expert, sizeof(*id_seen));
    if (!out->sequence || !out->token || !out->layer || !out->ids || !out->weights || !chunk || !id_seen) {
        guanaco_log_error("%s: out of memory for %llu routing records (%.1f GiB)", path,
                          (unsigned long long)n_records, (double)needed / 1073741824.0);
        err = -ENOMEM;
    }
    out->n_records = (size_t)n_records;
    for (size_t first = 0; first < out->n_records && err == 0; first += per_chunk) {
        size_t n = out->n_records - first < per_chunk ? out->n_records - first : per_chunk;
        err = read_exactly(path, fd, chunk, n * record_bytes,
                           GUANACO_TRACE_HEADER_BYTES + (unsigned long long)first * record_bytes);
        for (size_t i = 0; i < n && err == 0; i++) {
            err = parse_record(path, chunk + i * record_bytes, first + i, id_seen, out);
        }
    }
    /* Appended to while being read: what was read may end inside a record the writer had not finished. */
    struct stat st;
    if (err == 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size != size) {
        guanaco_log_error("%s: its size changed from %llu to %llu bytes while it was read; read it once it is "
                          "complete", path, (unsigned long long)size, (unsigned long long)st.st_size);
        err = -EINVAL;
    }
    free(chunk);
    free(id_seen);
    close(fd);
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
