/*
 * repack_bench.c - owns measuring what repacking streamed experts would cost
 * and save (issue 9, item 2), with ggml's own code on both sides:
 *   - the cost: one expert slice (rows x cols of one expert) repacked into
 *     ggml-cpu's interleaved layout by ggml_backend_tensor_set on a tensor in
 *     a CPU_REPACK buffer, single-threaded as the loader does it; MB/s;
 *   - the saving: GGML_OP_MUL_MAT_ID over an [cols, rows, experts] weight,
 *     top-k experts per token, once in a plain CPU buffer (the file's layout,
 *     what streamed experts use) and once in a CPU_REPACK buffer, for several
 *     token counts; ms per call and ms per (token, expert) use.
 * The break-even is how many uses one load of an expert must see before the
 * repack pays for itself. Not a test: it checks nothing but errors.
 *
 * usage: guanaco-repack-bench [-q q4_K|q4_0|iq4_nl|mxfp4|q8_0] [-c cols] [-r rows] [-e experts] [-k used]
 *                             [-n tokens,tokens,...] [-t threads] [-i iterations]
 * Defaults: Q4_K, one Qwen3-30B-A3B gate/up slice (2048 x 768), 128 experts, top-8, tokens 1,8,128, 2 threads.
 */
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_TOKEN_COUNTS 16

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *values, int n) {
    qsort(values, (size_t)n, sizeof(*values), compare_double);
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

/* ggml-cpu logs every repack at debug level; printing it would be timed with the repack */
static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level != GGML_LOG_LEVEL_DEBUG) {
        fputs(text, stderr);
    }
}

static ggml_backend_buffer_type_t repack_buffer_type(void) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    typedef ggml_backend_buffer_type_t *(*get_extra_t)(ggml_backend_dev_t);
    get_extra_t get_extra = (get_extra_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t *b = get_extra ? get_extra(cpu) : NULL; b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
            return *b;
        }
    }
    return NULL;
}

static enum ggml_type parse_type(const char *name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((enum ggml_type)t);
        if (n && strcasecmp(n, name) == 0) {
            return (enum ggml_type)t;
        }
    }
    return GGML_TYPE_COUNT;
}

/* One weight tensor of ne = {cols, rows, experts} allocated in `buft`, filled from `data` (file layout). */
static ggml_backend_buffer_t make_weight(ggml_backend_buffer_type_t buft, struct ggml_context *ctx,
                                        enum ggml_type type, int64_t cols, int64_t rows, int64_t experts,
                                        const void *data, struct ggml_tensor **out) {
    struct ggml_tensor *w = ggml_new_tensor_3d(ctx, type, cols, rows, experts);
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(buft, ggml_backend_buft_get_alloc_size(buft, w));
    if (!buffer) {
        return NULL;
    }
    ggml_backend_tensor_alloc(buffer, w, ggml_backend_buffer_get_base(buffer));
    ggml_backend_tensor_set(w, data, 0, ggml_nbytes(w));
    *out = w;
    return buffer;
}

/*
 * Median ms of one MUL_MAT_ID of `w` with `tokens` tokens, `used` experts each (distinct, random), and in
 * *fastest the minimum: on a shared machine the minimum is the run that other processes did not slow down.
 */
static double time_mul_mat_id(ggml_backend_t backend, struct ggml_tensor *w, int64_t used, int64_t tokens,
                              int iterations, double *fastest) {
    struct ggml_init_params params = {.mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead(),
                                      .mem_buffer = NULL, .no_alloc = true};
    struct ggml_context *ctx = ggml_init(params);
    struct ggml_tensor *b = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w->ne[0], used, tokens);
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, used, tokens);
    struct ggml_tensor *out = ggml_mul_mat_id(ctx, w, b, ids);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors(ctx, backend);

    float *x = malloc(ggml_nbytes(b));
    int32_t *chosen = malloc(ggml_nbytes(ids));
    for (int64_t i = 0; i < ggml_nelements(b); i++) {
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t k = 0; k < used; k++) {
            int32_t e;
            bool again;
            do { /* distinct experts per token, as a router's top-k */
                e = rand() % (int32_t)w->ne[2];
                again = false;
                for (int64_t j = 0; j < k; j++) {
                    again |= chosen[t * used + j] == e;
                }
            } while (again);
            chosen[t * used + k] = e;
        }
    }
    ggml_backend_tensor_set(b, x, 0, ggml_nbytes(b));
    ggml_backend_tensor_set(ids, chosen, 0, ggml_nbytes(ids));
    ggml_backend_graph_compute(backend, graph); /* warm-up */
    double *ms = malloc(sizeof(double) * (size_t)iterations);
    for (int i = 0; i < iterations; i++) {
        double start = now_ms();
        ggml_backend_graph_compute(backend, graph);
        ms[i] = now_ms() - start;
    }
    double result = median(ms, iterations);
    *fastest = ms[0]; /* median() sorted them */
    free(ms);
    free(x);
    free(chosen);
    ggml_backend_buffer_free(buffer);
    ggml_free(ctx);
    return result;
}

int main(int argc, char **argv) {
    enum ggml_type type = GGML_TYPE_Q4_K;
    int64_t cols = 2048, rows = 768, experts = 128, used = 8;
    int64_t token_counts[MAX_TOKEN_COUNTS] = {1, 8, 128};
    int n_token_counts = 3, threads = 2, iterations = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "guanaco-repack-bench: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "-q") == 0) {
            type = parse_type(v);
        } else if (strcmp(a, "-c") == 0) {
            cols = atoll(v);
        } else if (strcmp(a, "-r") == 0) {
            rows = atoll(v);
        } else if (strcmp(a, "-e") == 0) {
            experts = atoll(v);
        } else if (strcmp(a, "-k") == 0) {
            used = atoll(v);
        } else if (strcmp(a, "-t") == 0) {
            threads = atoi(v);
        } else if (strcmp(a, "-i") == 0) {
            iterations = atoi(v);
        } else if (strcmp(a, "-n") == 0) {
            n_token_counts = 0;
            for (char *s = (char *)v; *s && n_token_counts < MAX_TOKEN_COUNTS; s += *s == ',') {
                token_counts[n_token_counts++] = strtoll(s, &s, 10);
            }
        } else {
            fprintf(stderr, "guanaco-repack-bench: unknown flag %s (see the file header)\n", a);
            return 2;
        }
    }
    if (type == GGML_TYPE_COUNT || cols <= 0 || rows <= 0 || experts < used || used <= 0 || iterations <= 0 ||
        threads <= 0) {
        fprintf(stderr, "guanaco-repack-bench: bad -q/-c/-r/-e/-k/-t/-i value\n");
        return 2;
    }
    ggml_log_set(quiet_log, NULL);
    ggml_backend_buffer_type_t repack = repack_buffer_type();
    if (!repack) {
        fprintf(stderr, "guanaco-repack-bench: this ggml-cpu has no CPU_REPACK buffer type\n");
        return 1;
    }
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, threads);

    /* the weights, quantized from random floats: the file's layout */
    const size_t expert_bytes = ggml_row_size(type, cols) * (size_t)rows;
    const size_t total_bytes = expert_bytes * (size_t)experts;
    char *file = malloc(total_bytes);
    float *row_values = malloc(sizeof(float) * (size_t)(cols * rows));
    for (int64_t e = 0; e < experts; e++) {
        for (int64_t i = 0; i < cols * rows; i++) {
            row_values[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        }
        ggml_quantize_chunk(type, row_values, file + (size_t)e * expert_bytes, 0, rows, cols, NULL);
    }

    struct ggml_init_params params = {.mem_size = 8 * ggml_tensor_overhead(), .mem_buffer = NULL, .no_alloc = true};
    struct ggml_context *ctx = ggml_init(params);

    /* the cost: repack one expert slice, as set_tensor on a 2-D tensor of the CPU_REPACK buffer does */
    struct ggml_tensor *slice = NULL;
    ggml_backend_buffer_t slice_buffer = make_weight(repack, ctx, type, cols, rows, 1, file, &slice);
    if (!slice_buffer || !slice->extra) {
        fprintf(stderr, "guanaco-repack-bench: ggml-cpu does not repack %s %lldx%lld on this CPU\n",
                ggml_type_name(type), (long long)cols, (long long)rows);
        return 1;
    }
    double repack_ms[64];
    int n_repack = 0;
    for (int i = 0; i < 64; i++) {
        const char *from = file + (size_t)(i % experts) * expert_bytes;
        double start = now_ms();
        ggml_backend_tensor_set(slice, from, 0, expert_bytes);
        repack_ms[n_repack++] = now_ms() - start;
    }
    double repack_median = median(repack_ms, n_repack), repack_fastest = repack_ms[0];
    double copy_ms[64];
    char *copy = malloc(expert_bytes);
    for (int i = 0; i < 64; i++) {
        double start = now_ms();
        memcpy(copy, file + (size_t)(i % experts) * expert_bytes, expert_bytes);
        copy_ms[i] = now_ms() - start;
    }
    printf("type %s, expert slice %lld x %lld = %.3f MiB, %lld experts, top-%lld, %d threads\n", ggml_type_name(type),
           (long long)cols, (long long)rows, (double)expert_bytes / 1048576.0, (long long)experts, (long long)used,
           threads);
    printf("repack one slice (1 thread): median %.3f ms = %.0f MB/s, fastest %.3f ms = %.0f MB/s "
           "(memcpy of the same: %.3f ms = %.0f MB/s)\n",
           repack_median, (double)expert_bytes / 1e3 / repack_median, repack_fastest,
           (double)expert_bytes / 1e3 / repack_fastest, median(copy_ms, 64), (double)expert_bytes / 1e3 / median(copy_ms, 64));

    /* the saving: the same MUL_MAT_ID on the file's layout and on the repacked layout */
    struct ggml_tensor *plain_w = NULL, *repacked_w = NULL;
    ggml_backend_buffer_t plain_buffer = make_weight(ggml_backend_cpu_buffer_type(), ctx, type, cols, rows, experts,
                                                     file, &plain_w);
    ggml_backend_buffer_t repacked_buffer = make_weight(repack, ctx, type, cols, rows, experts, file, &repacked_w);
    if (!plain_buffer || !repacked_buffer) {
        fprintf(stderr, "guanaco-repack-bench: out of memory for %zu-byte weights\n", total_bytes);
        return 1;
    }
    printf("medians (fastest) over %d iterations; break-even = repack ms / saved ms per use, from the fastest runs\n",
           iterations);
    printf("%8s %18s %18s %10s %16s %16s\n", "tokens", "file ms", "repacked ms", "speed-up", "saved ms/use",
           "break-even uses");
    for (int i = 0; i < n_token_counts; i++) {
        int64_t tokens = token_counts[i];
        double plain_fastest, repacked_fastest;
        double plain = time_mul_mat_id(backend, plain_w, used, tokens, iterations, &plain_fastest);
        double repacked = time_mul_mat_id(backend, repacked_w, used, tokens, iterations, &repacked_fastest);
        double saved_per_use = (plain_fastest - repacked_fastest) / (double)(tokens * used);
        char even[32] = "never";
        if (saved_per_use > 0) {
            snprintf(even, sizeof(even), "%.1f", repack_fastest / saved_per_use);
        }
        char file_text[40], repacked_text[40];
        snprintf(file_text, sizeof(file_text), "%.3f (%.3f)", plain, plain_fastest);
        snprintf(repacked_text, sizeof(repacked_text), "%.3f (%.3f)", repacked, repacked_fastest);
        printf("%8lld %18s %18s %9.2fx %16.4f %16s\n", (long long)tokens, file_text, repacked_text,
               plain_fastest / repacked_fastest, saved_per_use, even);
    }
    ggml_backend_buffer_free(plain_buffer);
    ggml_backend_buffer_free(repacked_buffer);
    ggml_backend_buffer_free(slice_buffer);
    ggml_free(ctx);
    ggml_backend_free(backend);
    free(copy);
    free(file);
    free(row_values);
    return 0;
}
