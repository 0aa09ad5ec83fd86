/*
 * writer.c - owns writing the GGUF files: the tokenizer keys copied from a
 * vocab-only GGUF, metadata through ggml's gguf API, and tensor data streamed
 * in constant memory, one chunk written while encode.c's threads generate and
 * encode the next, optionally as gguf-split shards.
 */

#define _POSIX_C_SOURCE 200809L

#include "mkmodel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static bool copy_kv(struct gguf_context *dst, const struct gguf_context *src, int64_t id) {
    const char *key = gguf_get_key(src, id);
    switch (gguf_get_kv_type(src, id)) {
        case GGUF_TYPE_UINT8:   gguf_set_val_u8  (dst, key, gguf_get_val_u8  (src, id)); return true;
        case GGUF_TYPE_INT8:    gguf_set_val_i8  (dst, key, gguf_get_val_i8  (src, id)); return true;
        case GGUF_TYPE_UINT16:  gguf_set_val_u16 (dst, key, gguf_get_val_u16 (src, id)); return true;
        case GGUF_TYPE_INT16:   gguf_set_val_i16 (dst, key, gguf_get_val_i16 (src, id)); return true;
        case GGUF_TYPE_UINT32:  gguf_set_val_u32 (dst, key, gguf_get_val_u32 (src, id)); return true;
        case GGUF_TYPE_INT32:   gguf_set_val_i32 (dst, key, gguf_get_val_i32 (src, id)); return true;
        case GGUF_TYPE_FLOAT32: gguf_set_val_f32 (dst, key, gguf_get_val_f32 (src, id)); return true;
        case GGUF_TYPE_UINT64:  gguf_set_val_u64 (dst, key, gguf_get_val_u64 (src, id)); return true;
        case GGUF_TYPE_INT64:   gguf_set_val_i64 (dst, key, gguf_get_val_i64 (src, id)); return true;
        case GGUF_TYPE_FLOAT64: gguf_set_val_f64 (dst, key, gguf_get_val_f64 (src, id)); return true;
        case GGUF_TYPE_BOOL:    gguf_set_val_bool(dst, key, gguf_get_val_bool(src, id)); return true;
        case GGUF_TYPE_STRING:  gguf_set_val_str (dst, key, gguf_get_val_str (src, id)); return true;
        case GGUF_TYPE_ARRAY: {
            const enum gguf_type at = gguf_get_arr_type(src, id);
            const size_t n = gguf_get_arr_n(src, id);
            if (at == GGUF_TYPE_STRING) {
                const char **strs = malloc((n ? n : 1) * sizeof(*strs));
                if (!strs) {
                    print_error("out of memory copying %s", key);
                    return false;
                }
                for (size_t i = 0; i < n; i++) {
                    strs[i] = gguf_get_arr_str(src, id, i);
                }
                gguf_set_arr_str(dst, key, strs, n);
                free(strs);
                return true;
            }
            if (at == GGUF_TYPE_ARRAY) {
                print_error("vocab key %s: nested arrays are not supported", key);
                return false;
            }
            gguf_set_arr_data(dst, key, at, gguf_get_arr_data(src, id), n);
            return true;
        }
        default:
            print_error("vocab key %s has unknown type", key);
            return false;
    }
}

/* Loads the vocab-only GGUF; returns its context and the token count. */
struct gguf_context *load_vocab(const char *path, int64_t *n_vocab) {
    if (access(path, R_OK) != 0) {
        die("cannot read vocab file %s: %s", path, strerror(errno));
    }
    struct gguf_init_params params = { .no_alloc = true, .ctx = NULL };
    struct gguf_context *v = gguf_init_from_file(path, params);
    if (!v) {
        die("%s is not a valid GGUF file", path);
    }
    const int64_t id = gguf_find_key(v, "tokenizer.ggml.tokens");
    if (id < 0 || gguf_get_kv_type(v, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(v, id) != GGUF_TYPE_STRING) {
        die("%s has no tokenizer.ggml.tokens string array; is it a ggml-vocab-*.gguf?", path);
    }
    *n_vocab = (int64_t)gguf_get_arr_n(v, id);
    if (*n_vocab <= 0) {
        die("%s has an empty token list", path);
    }
    return v;
}

static bool copy_tokenizer_kv(struct gguf_context *dst, const struct gguf_context *vocab) {
    for (int64_t i = 0; i < gguf_get_n_kv(vocab); i++) {
        if (strncmp(gguf_get_key(vocab, i), "tokenizer.", 10) == 0 && !copy_kv(dst, vocab, i)) {
            return false;
        }
    }
    return true;
}

static void shard_path(const struct write_job *job, int shard, char *dst, size_t size) {
    if (job->split_count == 1) {
        snprintf(dst, size, "%s", job->out_path);
    } else {
        /* same format as llama_split_path, so the loader finds the siblings */
        snprintf(dst, size, "%s-%05d-of-%05d.gguf", job->prefix, shard + 1, job->split_count);
    }
}

static bool write_all(FILE *f, const void *data, size_t n, const char *path) {
    errno = 0;
    if (n && fwrite(data, 1, n, f) != n) {
        print_error("write to %s failed: %s", path, errno ? strerror(errno) : "short write");
        return false;
    }
    return true;
}

/* Two chunk buffers: workers fill one while the main thread writes the other,
 * so generation overlaps with disk I/O.  Memory stays constant. */
struct stream_buffers {
    struct chunk_buffer chunk[2];
    int n_threads;
};

static bool write_tensor_data(FILE *f, const char *path, const struct tensor_spec *t,
                              uint64_t seed, size_t alignment, struct stream_buffers *buf) {
    const int64_t n_per_row = t->ne[0];
    const int64_t n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    const size_t row_size = ggml_row_size(t->type, n_per_row);
    int64_t rows_per_chunk = (int64_t)(CHUNK_FLOATS / (size_t)n_per_row);
    if (rows_per_chunk < 1) {
        rows_per_chunk = 1;
    }
    const uint64_t tseed = tensor_seed(seed, t->name);

    struct encode_batch batch;
    size_t written = 0;
    size_t ready_size = 0; /* encoded bytes waiting in the other buffer */
    int cur = 0;
    bool ok = true;
    for (int64_t r = 0; r < n_rows && ok; r += rows_per_chunk) {
        const int64_t nr = (n_rows - r < rows_per_chunk) ? n_rows - r : rows_per_chunk;
        encode_start(&batch, t, tseed, r, nr, &buf->chunk[cur], buf->n_threads);
        if (ready_size > 0) {
            ok = write_all(f, buf->chunk[1 - cur].dst, ready_size, path);
            written += ready_size;
        }
        ready_size = encode_finish(&batch);
        if (ready_size != (size_t)nr * row_size) {
            print_error("internal error: %s encoded to %zu bytes, expected %zu",
                        t->name, ready_size, (size_t)nr * row_size);
            return false;
        }
        cur = 1 - cur;
    }
    if (!ok || !write_all(f, buf->chunk[1 - cur].dst, ready_size, path)) {
        return false;
    }
    written += ready_size;

    static const uint8_t zeros[64] = {0};
    size_t pad = GGML_PAD(written, alignment) - written;
    while (pad > 0) {
        const size_t n = pad < sizeof(zeros) ? pad : sizeof(zeros);
        if (!write_all(f, zeros, n, path)) {
            return false;
        }
        pad -= n;
    }
    return true;
}

static void add_model_kv(struct gguf_context *g, const struct write_job *job) {
    gguf_set_val_str(g, "general.architecture", job->arch->gguf_arch);
    gguf_set_val_str(g, "general.name", job->model_name);
    gguf_set_val_u32(g, "general.file_type", job->quant->llama_ftype);
    gguf_set_val_u32(g, "general.quantization_version", GGML_QNT_VERSION);
    job->arch->add_kv(g, job->arch->gguf_arch, job->shape);
}

/* The shard's GGUF header: the model's keys and the tokenizer in the first
 * shard, gguf-split's keys when split, and the descriptors of the shard's
 * tensors, whose ggml context goes to *meta_out.  NULL after a message. */
static struct gguf_context *shard_header(const struct write_job *job, const struct tensor_plan *plan, int shard,
                                         struct ggml_context **meta_out) {
    size_t n_tensors = 0;
    for (size_t i = 0; i < plan->n; i++) {
        n_tensors += plan->v[i].shard == shard;
    }

    struct gguf_context *g = gguf_init_empty();
    if (shard == 0) {
        add_model_kv(g, job);
        if (!copy_tokenizer_kv(g, job->vocab)) {
            gguf_free(g);
            return NULL;
        }
    }
    if (job->split_count > 1) {
        /* same keys and types as gguf-split writes them */
        gguf_set_val_u16(g, "split.no", (uint16_t)shard);
        gguf_set_val_u16(g, "split.count", (uint16_t)job->split_count);
        gguf_set_val_i32(g, "split.tensors.count", (int32_t)plan->n);
    }

    /* tensor descriptors only: no_alloc keeps the weights out of memory */
    struct ggml_init_params ip = {
        .mem_size   = (n_tensors + 1) * ggml_tensor_overhead(),
        .mem_buffer = NULL,
        .no_alloc   = true,
    };
    struct ggml_context *meta = ggml_init(ip);
    if (!meta) {
        print_error("out of memory creating tensor metadata");
        gguf_free(g);
        return NULL;
    }
    for (size_t i = 0; i < plan->n; i++) {
        const struct tensor_spec *t = &plan->v[i];
        if (t->shard != shard) {
            continue;
        }
        struct ggml_tensor *gt = ggml_new_tensor(meta, t->type, t->n_dims, t->ne);
        ggml_set_name(gt, t->name);
        gguf_add_tensor(g, gt);
    }
    *meta_out = meta;
    return g;
}

/* Writes the header, then every tensor of the shard streamed in row chunks,
 * each exactly where the header says it is; adds the bytes to *bytes_out. */
static bool write_shard_contents(FILE *f, const char *path, const struct gguf_context *g,
                                 const struct tensor_plan *plan, int shard, uint64_t seed,
                                 struct stream_buffers *buf, size_t *bytes_out) {
    const size_t meta_size = gguf_get_meta_size(g);
    const size_t alignment = gguf_get_alignment(g);
    uint8_t *meta_bytes = malloc(meta_size);
    if (!meta_bytes) {
        print_error("out of memory for %zu bytes of metadata", meta_size);
        return false;
    }
    gguf_get_meta_data(g, meta_bytes);
    const bool header_written = write_all(f, meta_bytes, meta_size, path);
    free(meta_bytes);
    if (!header_written) {
        return false;
    }

    size_t data_pos = 0;
    int64_t tensor_id = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const struct tensor_spec *t = &plan->v[i];
        if (t->shard != shard) {
            continue;
        }
        if (gguf_get_tensor_offset(g, tensor_id) != data_pos ||
            gguf_get_tensor_size(g, tensor_id) != t->nbytes) {
            print_error("internal error: layout of %s disagrees with the GGUF header", t->name);
            return false;
        }
        if (!write_tensor_data(f, path, t, seed, alignment, buf)) {
            return false;
        }
        data_pos += GGML_PAD(t->nbytes, alignment);
        tensor_id++;
    }

    if (fflush(f) != 0 || ferror(f)) {
        print_error("write to %s failed: %s", path, strerror(errno));
        return false;
    }
    *bytes_out += meta_size + data_pos;
    return true;
}

/* Writes one shard file: its header, then its tensors. */
static bool write_shard(const struct write_job *job, const struct tensor_plan *plan, int shard,
                        struct stream_buffers *buf, size_t *bytes_out) {
    char path[PATH_MAX + 32];
    shard_path(job, shard, path, sizeof(path));

    struct ggml_context *meta = NULL;
    struct gguf_context *g = shard_header(job, plan, shard, &meta);
    if (!g) {
        return false;
    }
    bool ok = false;
    FILE *f = fopen(path, "wb");
    if (!f) {
        print_error("cannot open %s for writing: %s", path, strerror(errno));
    } else {
        ok = write_shard_contents(f, path, g, plan, shard, job->seed, buf, bytes_out);
        if (fclose(f) != 0 && ok) {
            print_error("closing %s failed: %s", path, strerror(errno));
            ok = false;
        }
    }
    ggml_free(meta);
    gguf_free(g);
    return ok;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void free_stream_buffers(struct stream_buffers *buf) {
    for (int i = 0; i < 2; i++) {
        free(buf->chunk[i].src);
        free(buf->chunk[i].dst);
    }
}

int write_model(const struct write_job *job, struct tensor_plan *plan) {
    struct stream_buffers buf = { .n_threads = job->n_threads };
    int64_t max_row = 1;
    for (size_t i = 0; i < plan->n; i++) {
        if (plan->v[i].ne[0] > max_row) {
            max_row = plan->v[i].ne[0];
        }
    }
    const size_t n_floats = CHUNK_FLOATS > (size_t)max_row ? CHUNK_FLOATS : (size_t)max_row;
    bool have_memory = true;
    for (int i = 0; i < 2; i++) {
        buf.chunk[i].src = malloc(n_floats * sizeof(float));
        buf.chunk[i].dst = malloc(n_floats * sizeof(float)); /* no output type is wider than F32 */
        have_memory = have_memory && buf.chunk[i].src && buf.chunk[i].dst;
    }
    if (!have_memory) {
        free_stream_buffers(&buf);
        print_error("out of memory for stream buffers");
        return 1;
    }

    const double t0 = now_seconds();
    size_t bytes = 0;
    int shard = 0;
    bool ok = true;
    for (; shard < job->split_count && ok; shard++) {
        ok = write_shard(job, plan, shard, &buf, &bytes);
    }
    const double dt = now_seconds() - t0;
    free_stream_buffers(&buf);

    if (!ok) {
        /* never leave a truncated model behind: it would load as garbage.
         * Only regular files: -o may name a device such as /dev/full. */
        for (int s = 0; s < shard; s++) {
            char path[PATH_MAX + 32];
            struct stat st;
            shard_path(job, s, path, sizeof(path));
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                remove(path);
            }
        }
        return 1;
    }

    char first[PATH_MAX + 32];
    shard_path(job, 0, first, sizeof(first));
    fprintf(stderr, PROG ": wrote %s%s: %zu tensors, %.1f MiB in %.2f s (%.1f MB/s)\n",
            first, job->split_count > 1 ? " and the following shards" : "", plan->n,
            (double)bytes / (1024.0 * 1024.0), dt, dt > 0 ? (double)bytes / 1e6 / dt : 0.0);
    return 0;
}
