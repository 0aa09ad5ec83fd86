/*
 * encode.c - owns generating and encoding one chunk of a tensor's rows on
 * worker threads.  The rows are split among the threads and every value is a
 * pure function of the seed, the tensor and the row (weights.c), so the bytes
 * do not depend on the thread count.
 */

#define _POSIX_C_SOURCE 200809L

#include "mkmodel.h"

#include <pthread.h>

/* One worker: generates its rows, then converts them to the tensor's type. */
static void *run_encode_task(void *arg) {
    struct encode_task *task = arg;
    const struct tensor_spec *t = task->t;
    const int64_t n_per_row = t->ne[0];
    const int64_t n = task->n_rows * n_per_row;
    if (t->type == GGML_TYPE_F32) {
        fill_rows((float *)task->dst, t, task->tseed, task->row0, task->n_rows);
        task->out_size = (size_t)n * sizeof(float);
        return NULL;
    }
    fill_rows(task->src, t, task->tseed, task->row0, task->n_rows);
    if (t->type == GGML_TYPE_F16) {
        ggml_fp16_t *h = (ggml_fp16_t *)task->dst;
        for (int64_t i = 0; i < n; i++) {
            h[i] = ggml_fp32_to_fp16(task->src[i]);
        }
        task->out_size = (size_t)n * sizeof(ggml_fp16_t);
    } else {
        task->out_size = ggml_quantize_chunk(t->type, task->src, task->dst, 0, task->n_rows, n_per_row, NULL);
    }
    return NULL;
}

/* Below this many floats a thread costs more than it saves. */
#define MIN_FLOATS_PER_THREAD (1u << 16)

/* Starts encoding rows [row0, row0 + n_rows) into out->dst.  Rows are
 * independent, so the bytes do not depend on the thread count. */
void encode_start(struct encode_batch *b, const struct tensor_spec *t, uint64_t tseed,
                  int64_t row0, int64_t n_rows, const struct chunk_buffer *out, int n_threads) {
    const int64_t n_per_row = t->ne[0];
    const size_t row_size = ggml_row_size(t->type, n_per_row);
    int64_t n_workers = (n_rows * n_per_row) / MIN_FLOATS_PER_THREAD;
    if (n_workers > n_threads) n_workers = n_threads;
    if (n_workers > n_rows)    n_workers = n_rows;
    if (n_workers < 1)         n_workers = 1;

    b->n_workers = (int)n_workers;
    int64_t r = 0;
    for (int w = 0; w < b->n_workers; w++) {
        const int64_t share = n_rows / n_workers + (w < n_rows % n_workers ? 1 : 0);
        b->tasks[w] = (struct encode_task){
            .t = t, .tseed = tseed, .row0 = row0 + r, .n_rows = share,
            .src = out->src + r * n_per_row, .dst = out->dst + (size_t)r * row_size,
        };
        b->started[w] = pthread_create(&b->threads[w], NULL, run_encode_task, &b->tasks[w]) == 0;
        r += share;
    }
}

/* Waits for the chunk; returns its encoded size. */
size_t encode_finish(struct encode_batch *b) {
    size_t total = 0;
    for (int w = 0; w < b->n_workers; w++) {
        if (b->started[w]) {
            pthread_join(b->threads[w], NULL);
        } else {
            run_encode_task(&b->tasks[w]); /* no thread available: do it here */
        }
        total += b->tasks[w].out_size;
    }
    return total;
}

