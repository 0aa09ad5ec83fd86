/*
 * imatrix.c - owns reading the imatrix prior (see imatrix.h): the file's
 * checks, the expert counts per layer, and the preload's choice rule.
 *
 * ggml's gguf reader parses the header only (no_alloc, no tensor data), so
 * a multi-gigabyte imatrix costs one pread per counts tensor. The path is
 * opened non-blocking and must be a regular file: opening a FIFO for reading
 * would otherwise wait for a writer forever, and gguf seeks.
 */
#include "imatrix.h"
#include "log.h"

#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FLAG "--guanaco-imatrix"
#define COUNTS_SUFFIX ".counts"
/* A count is a float of an integer; past 2^53 routings no calibration run has ever gone. */
#define MAX_COUNT 9007199254740992.0

void guanaco_imatrix_free(struct guanaco_imatrix_prior *prior) {
    if (!prior) {
        return;
    }
    free(prior->has_prior);
    free(prior->weight);
    free(prior->routings);
    memset(prior, 0, sizeof(*prior));
}

const float *guanaco_imatrix_layer(const struct guanaco_imatrix_prior *prior, uint32_t layer) {
    if (!prior || !prior->weight || layer >= prior->n_layer || !prior->has_prior[layer]) {
        return NULL;
    }
    return prior->weight + (size_t)layer * prior->n_expert;
}

/* The legacy .dat layout starts with int32 n_entries, then int32 name length and the name ("blk.0..."). */
static bool looks_like_legacy_dat(const unsigned char *head, size_t n) {
    if (n < 12) {
        return false;
    }
    int32_t entries, len;
    memcpy(&entries, head, 4);
    memcpy(&len, head + 4, 4);
    if (entries <= 0 || len <= 0 || len > 4096) {
        return false;
    }
    for (size_t i = 8; i < n && i < 8 + (size_t)len; i++) {
        if (head[i] < 0x20 || head[i] > 0x7e) {
            return false;
        }
    }
    return true;
}

/* "imatrix" or absent; anything else is some other GGUF (often the model itself, passed by mistake). */
static int check_type(const struct gguf_context *gguf, const char *path) {
    int64_t id = gguf_find_key(gguf, "general.type");
    if (id < 0) {
        return 0;
    }
    if (gguf_get_kv_type(gguf, id) != GGUF_TYPE_STRING || strcmp(gguf_get_val_str(gguf, id), "imatrix") != 0) {
        guanaco_log_error("%s %s: this GGUF is not an imatrix (general.type is %s%s%s)", FLAG, path,
                          gguf_get_kv_type(gguf, id) == GGUF_TYPE_STRING ? "\"" : "not a string",
                          gguf_get_kv_type(gguf, id) == GGUF_TYPE_STRING ? gguf_get_val_str(gguf, id) : "",
                          gguf_get_kv_type(gguf, id) == GGUF_TYPE_STRING ? "\"" : "");
        return -EINVAL;
    }
    return 0;
}

/*
 * One "<weight>.counts" tensor of an expert weight: checked against the
 * model and read into `counts` (n_expert). 1 when read, 0 when it carries no
 * per-expert counts (a single count, as a file converted from .dat has), or
 * a negative errno after a message.
 */
static int read_counts(const struct gguf_context *gguf, int64_t id, int fd, uint64_t file_size, const char *path,
                       const char *weight, const struct guanaco_manifest *m, float *counts) {
    const int64_t *ne = gguf_get_tensor_ne(gguf, id);
    if (gguf_get_tensor_type(gguf, id) != GGML_TYPE_F32 || ne[0] != 1 || ne[2] != 1 || ne[3] != 1) {
        guanaco_log_error("%s %s: %s.counts is not an F32 column of counts (type %s, %lld x %lld x %lld x %lld)",
                          FLAG, path, weight, ggml_type_name(gguf_get_tensor_type(gguf, id)), (long long)ne[0],
                          (long long)ne[1], (long long)ne[2], (long long)ne[3]);
        return -EINVAL;
    }
    if (ne[1] == 1 && m->n_expert > 1) {
        return 0;
    }
    if (ne[1] != m->n_expert) {
        guanaco_log_error("%s %s: %s has counts for %lld experts but this model has %d: the imatrix was made "
                          "from another model", FLAG, path, weight, (long long)ne[1], m->n_expert);
        return -EINVAL;
    }
    uint64_t offset = (uint64_t)gguf_get_data_offset(gguf) + (uint64_t)gguf_get_tensor_offset(gguf, id);
    size_t bytes = (size_t)ne[1] * sizeof(float);
    if (offset + bytes > file_size) {
        guanaco_log_error("%s %s: %s.counts needs bytes up to %llu but the file has %llu: truncated", FLAG, path,
                          weight, (unsigned long long)(offset + bytes), (unsigned long long)file_size);
        return -EIO;
    }
    ssize_t got = pread(fd, counts, bytes, (off_t)offset);
    if (got != (ssize_t)bytes) {
        int err = got < 0 ? -errno : -EIO;
        guanaco_log_error("%s %s: reading %s.counts: %s", FLAG, path, weight, got < 0 ? strerror(-err) : "short read");
        return err;
    }
    for (int e = 0; e < m->n_expert; e++) {
        float c = counts[e];
        if (!isfinite(c) || c < 0 || c > MAX_COUNT || c != floorf(c)) {
            guanaco_log_error("%s %s: %s.counts[%d] = %g is not a count of routings (a whole number from 0 to 2^53)",
                              FLAG, path, weight, e, (double)c);
            return -EINVAL;
        }
    }
    return 1;
}

/* Every expert counts tensor of the file into out (counts in out->weight for now). */
static int read_all_counts(const struct gguf_context *gguf, int fd, uint64_t file_size, const char *path,
                           const struct guanaco_manifest *m, struct guanaco_imatrix_prior *out,
                           char (*first_tensor)[GGML_MAX_NAME], size_t *n_counts_tensors) {
    float *counts = malloc((size_t)m->n_expert * sizeof(*counts));
    if (!counts) {
        return -ENOMEM;
    }
    int err = 0;
    const size_t suffix = strlen(COUNTS_SUFFIX);
    for (int64_t id = 0; id < gguf_get_n_tensors(gguf) && err == 0; id++) {
        const char *name = gguf_get_tensor_name(gguf, id);
        size_t len = strlen(name);
        if (len <= suffix || strcmp(name + len - suffix, COUNTS_SUFFIX) != 0 || len - suffix >= GGML_MAX_NAME) {
            continue;
        }
        (*n_counts_tensors)++;
        char weight[GGML_MAX_NAME];
        memcpy(weight, name, len - suffix);
        weight[len - suffix] = '\0';
        int layer = -1;
        if (!guanaco_tensor_name_is_expert(weight, &layer)) {
            continue; /* attention, dense FFN, shared experts: not routed */
        }
        if (layer >= m->n_layer || !guanaco_manifest_find(m, weight)) {
            guanaco_log_error("%s %s: it has counts for %s, which this %s model (%d layers) does not have: the "
                              "imatrix was made from another model", FLAG, path, weight, m->arch, m->n_layer);
            err = -EINVAL;
            break;
        }
        int got = read_counts(gguf, id, fd, file_size, path, weight, m, counts);
        if (got <= 0) {
            err = got;
            continue;
        }
        float *row = out->weight + (size_t)layer * m->n_expert;
        if (!out->has_prior[layer]) {
            memcpy(row, counts, (size_t)m->n_expert * sizeof(*counts));
            snprintf(first_tensor[layer], GGML_MAX_NAME, "%s", weight);
            out->has_prior[layer] = 1;
            continue;
        }
        for (int e = 0; e < m->n_expert; e++) {
            if (row[e] != counts[e]) {
                /* one routing fed every expert tensor of the layer: different counts are a damaged file */
                guanaco_log_error("%s %s: %s and %s disagree on expert %d's routings (%g and %g)", FLAG, path,
                                  first_tensor[layer], weight, e, (double)row[e], (double)counts[e]);
                err = -EINVAL;
                break;
            }
        }
    }
    free(counts);
    return err;
}

/* Counts to shares; layers with only zeros lose their prior. Lists the MoE layers without one, once. */
static int normalise(const char *path, const struct guanaco_manifest *m, const int *moe_layer,
                     struct guanaco_imatrix_prior *out) {
    char missing[512] = "";
    size_t used = 0;
    uint32_t n_missing = 0;
    for (int layer = 0; layer < m->n_layer; layer++) {
        float *row = out->weight + (size_t)layer * m->n_expert;
        double sum = 0;
        for (int e = 0; out->has_prior[layer] && e < m->n_expert; e++) {
            sum += row[e];
        }
        if (sum > 0) {
            for (int e = 0; e < m->n_expert; e++) {
                row[e] = (float)(row[e] / sum);
            }
            out->routings[layer] = sum;
            out->n_layers_with_prior++;
            continue;
        }
        out->has_prior[layer] = 0;
        memset(row, 0, (size_t)m->n_expert * sizeof(*row));
        if (moe_layer[layer]) {
            n_missing++;
            if (used < sizeof(missing)) {
                int n = snprintf(missing + used, sizeof(missing) - used, "%s%d", n_missing > 1 ? ", " : "", layer);
                used += n > 0 ? (size_t)n : 0;
            }
        }
    }
    if (out->n_layers_with_prior == 0) {
        guanaco_log_error("%s %s: it has no routing counts for any expert tensor of this %s model (made from a "
                          "dense model, or from text that never reached the experts?)", FLAG, path, m->arch);
        return -EINVAL;
    }
    if (n_missing) {
        guanaco_log_info("%s %s: no routing counts for MoE layer%s %s%s: %s no prior (the preload takes the "
                         "lowest-numbered experts there)", FLAG, path, n_missing > 1 ? "s" : "", missing,
                         used >= sizeof(missing) ? " ..." : "", n_missing > 1 ? "they have" : "it has");
    }
    return 0;
}

int guanaco_imatrix_load(const char *path, const struct guanaco_manifest *manifest,
                         struct guanaco_imatrix_prior *out) {
    memset(out, 0, sizeof(*out));
    const struct guanaco_manifest *m = manifest;
    if (!path || !path[0] || !m || m->n_layer <= 0 || m->n_expert <= 0) {
        return -EINVAL;
    }
    /* O_NONBLOCK: a FIFO opens at once instead of waiting for a writer, and is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = -errno;
        guanaco_log_error("%s %s: %s", FLAG, path, strerror(-err));
        return err;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        guanaco_log_error("%s %s: not a regular file (a pipe, device or directory cannot be an imatrix)", FLAG, path);
        close(fd);
        return -EINVAL;
    }
    unsigned char head[64] = {0};
    ssize_t got = pread(fd, head, sizeof(head), 0);
    if (got < 4 || memcmp(head, "GGUF", 4) != 0) {
        if (got >= 0 && looks_like_legacy_dat(head, (size_t)got)) {
            guanaco_log_error("%s %s: this is the legacy .dat imatrix format, which keeps no per-expert routing "
                              "counts; write a GGUF imatrix (llama-imatrix's default, -o FILE.gguf)", FLAG, path);
        } else {
            guanaco_log_error("%s %s: not a GGUF file%s", FLAG, path, got == 0 ? " (it is empty)" : "");
        }
        close(fd);
        return got < 0 ? -EIO : -EINVAL;
    }
    FILE *file = fdopen(fd, "rb");
    if (!file) {
        int err = -errno;
        close(fd);
        return err;
    }
    struct gguf_init_params params = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *gguf = gguf_init_from_file_ptr(file, params);
    if (!gguf) {
        guanaco_log_error("%s %s: not a readable GGUF file (truncated or corrupt)", FLAG, path);
        fclose(file);
        return -EINVAL;
    }
    int err = check_type(gguf, path);
    out->n_layer = (uint32_t)m->n_layer;
    out->n_expert = (uint32_t)m->n_expert;
    out->has_prior = calloc((size_t)m->n_layer, 1);
    out->weight = calloc((size_t)m->n_layer * (size_t)m->n_expert, sizeof(*out->weight));
    out->routings = calloc((size_t)m->n_layer, sizeof(*out->routings));
    char(*first_tensor)[GGML_MAX_NAME] = calloc((size_t)m->n_layer, sizeof(*first_tensor));
    int *moe_layer = calloc((size_t)m->n_layer, sizeof(*moe_layer));
    if (err == 0 && (!out->has_prior || !out->weight || !out->routings || !first_tensor || !moe_layer)) {
        err = -ENOMEM;
    }
    size_t n_counts_tensors = 0;
    if (err == 0) {
        err = read_all_counts(gguf, fileno(file), (uint64_t)st.st_size, path, m, out, first_tensor, &n_counts_tensors);
    }
    if (err == 0 && n_counts_tensors == 0) {
        guanaco_log_error("%s %s: not an imatrix: it has no <weight>.counts tensors (is it the model?)", FLAG, path);
        err = -EINVAL;
    }
    if (err == 0) {
        for (size_t i = 0; i < m->n_tensors; i++) {
            moe_layer[m->tensors[i].layer] = 1;
        }
        err = normalise(path, m, moe_layer, out);
    }
    free(first_tensor);
    free(moe_layer);
    gguf_free(gguf);
    fclose(file);
    if (err < 0) {
        guanaco_imatrix_free(out);
    }
    return err;
}

/* ---- the preload's choice ---- */

/* Whether a is kept over b: more weight, ties by the lower id. */
static bool kept_over(const float *weights, uint32_t a, uint32_t b) {
    float wa = weights ? weights[a] : 0.0f, wb = weights ? weights[b] : 0.0f;
    return wa != wb ? wa > wb : a < b;
}

/* Whether a comes after b in the preload's access order: the preferred later; without a prior, by id. */
static bool order_after(const float *weights, uint32_t a, uint32_t b) {
    return weights ? kept_over(weights, a, b) : a > b;
}

/* Restores a binary heap below `index` in which before(heap[parent], heap[child]) holds. */
static void sift_down(uint32_t *heap, uint32_t count, uint32_t index, const float *weights,
                      bool (*before)(const float *, uint32_t, uint32_t)) {
    uint32_t id = heap[index];
    for (;;) {
        uint32_t child = 2 * index + 1;
        if (child >= count) {
            break;
        }
        if (child + 1 < count && before(weights, heap[child + 1], heap[child])) {
            child++;
        }
        if (!before(weights, heap[child], id)) {
            break;
        }
        heap[index] = heap[child];
        index = child;
    }
    heap[index] = id;
}

static void heapify(uint32_t *heap, uint32_t count, const float *weights,
                    bool (*before)(const float *, uint32_t, uint32_t)) {
    for (uint32_t i = count / 2; i-- > 0;) {
        sift_down(heap, count, i, weights, before);
    }
}

/* Heap orders: the weakest candidate on top (the one a better expert replaces), and the latest in access order. */
static bool weaker(const float *weights, uint32_t a, uint32_t b) { return kept_over(weights, b, a); }
static bool later(const float *weights, uint32_t a, uint32_t b) { return order_after(weights, a, b); }

uint32_t guanaco_prior_preload_choice(const float *weights, uint32_t n_expert, const uint8_t *skip, uint32_t n,
                                      uint32_t *out) {
    uint32_t count = 0;
    if (!out) {
        return 0;
    }
    /* the n kept so far, weakest on top once there are n: O(n_expert log n) */
    for (uint32_t e = 0; e < n_expert && n > 0; e++) {
        if (skip && skip[e]) {
            continue;
        }
        if (count < n) {
            out[count++] = e;
            if (count == n) {
                heapify(out, count, weights, weaker);
            }
        } else if (kept_over(weights, e, out[0])) {
            out[0] = e;
            sift_down(out, count, 0, weights, weaker);
        }
    }
    /* heap sort into access order: the latest goes to the end */
    heapify(out, count, weights, later);
    for (uint32_t end = count; end > 1; end--) {
        uint32_t top = out[0];
        out[0] = out[end - 1];
        out[end - 1] = top;
        sift_down(out, end - 1, 0, weights, later);
    }
    return count;
}
