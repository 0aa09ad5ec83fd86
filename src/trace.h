/*
 * trace.h - owns Guanaco's routing-trace file: every routing decision of a
 * run as (sequence, token, layer, expert ids, weights) under a header that
 * names the model shape. The engine writes one while it decodes; the
 * simulator and --guanaco-trace-replay read one back. docs/TRACE.md gives the
 * format byte by byte.
 *
 * The file is little-endian and its records have a fixed size, so a reader
 * can mmap it and find record i at GUANACO_TRACE_HEADER_BYTES + i * record
 * size without parsing what comes before.
 */
#ifndef GUANACO_TRACE_H
#define GUANACO_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define GUANACO_TRACE_MAGIC "GNCTRACE" /* 8 bytes, no NUL in the file */
#define GUANACO_TRACE_VERSION 1u
#define GUANACO_TRACE_HEADER_BYTES 120u
/* Expert ids are stored as u16, so a trace cannot name more experts than this. */
#define GUANACO_TRACE_MAX_EXPERTS 65536u

struct guanaco_trace_shape {
    uint32_t n_layer;  /* layers of the model, dense ones included: a record's layer is < n_layer */
    uint32_t n_expert; /* experts per MoE layer: an id is < n_expert */
    uint32_t top_k;    /* experts chosen per token and layer: ids and weights per record */
    char arch[32];     /* e.g. "qwen3moe"; at most 31 bytes are stored */
    char source[64];   /* free text, e.g. "mixtral-8x7b humaneval"; at most 63 bytes are stored */
};

/* Bytes of one record for a given top_k; see docs/TRACE.md for the layout. */
size_t guanaco_trace_record_bytes(uint32_t top_k);

/*
 * Writer. One writer may be shared by several llama contexts: append takes a
 * mutex inside it. open and close must not race with append.
 */
struct guanaco_trace_writer;

/* Creates (or truncates) `path` and writes the header through to it, so that
 * a destination that cannot take even that (/dev/full, a full disk) fails
 * here. -EINVAL for a shape a trace cannot hold, or the open's or the
 * write's negative errno (e.g. -ENOSPC); *out is NULL then. */
int guanaco_trace_writer_open(const char *path, const struct guanaco_trace_shape *shape,
                              struct guanaco_trace_writer **out);

/* Appends one routing decision: top_k ids, and top_k weights or NULL for all
 * zero. -EINVAL (nothing written) for a layer or id outside the shape or an
 * id named twice (the loader and the converter refuse that too); a
 * negative errno (e.g. -ENOSPC) when a write failed, after which the writer
 * keeps failing with that error. */
int guanaco_trace_writer_append(struct guanaco_trace_writer *writer, uint32_t sequence, uint32_t token,
                                uint32_t layer, const int32_t *ids, const float *weights);

/* Flushes, closes and frees the writer (always, even on error). Returns 0, or
 * the first write or close error of the writer's life, e.g. -ENOSPC. */
int guanaco_trace_writer_close(struct guanaco_trace_writer *writer);

/* A whole trace in memory, one array per field (record i is element i). */
struct guanaco_trace {
    struct guanaco_trace_shape shape;
    size_t n_records;
    uint32_t *sequence;
    uint32_t *token;
    uint32_t *layer;
    int32_t *ids;     /* n_records * top_k: record i's ids are ids[i*top_k .. i*top_k+top_k-1] */
    float *weights;   /* same indexing as ids */
};

/* Reads and validates a trace: magic, version, shape, whole records only,
 * every layer < n_layer and id < n_expert, no id twice in a record. Only a
 * regular file is read, and no more of it than its size at open: a pipe or a
 * device (/dev/zero) has no size to bound the read. Returns 0, or a negative
 * errno after a message naming the file (and the record where one is at
 * fault): -EINVAL for a file that is not a valid trace (a truncated one, one
 * whose size changed while it was read, a pipe or a device), -ENOMEM when its
 * records would not fit in this machine's memory. */
int guanaco_trace_load(const char *path, struct guanaco_trace *out);

void guanaco_trace_free(struct guanaco_trace *trace);

/* 0 when a trace recorded with `trace` fits a model of this shape; otherwise
 * -EINVAL after a message naming every field that differs. */
int guanaco_trace_shape_check(const struct guanaco_trace_shape *trace, uint32_t n_layer, uint32_t n_expert,
                              uint32_t top_k);

#endif
