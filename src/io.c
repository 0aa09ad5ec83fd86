/*
 * io.c - owns exact, large, parallel reads: a batch of requests is cut into
 * chunks of at most max_chunk_bytes, and up to queue_depth chunks are kept in
 * flight until every byte is read or the request has failed.
 *
 * Why chunks: an NVMe drive needs several commands outstanding to reach its
 * bandwidth (REFERENCE.md section 7: queue depth matters more than size), and
 * one expert slice is only a few of them. Cutting requests into chunks lets
 * one large request, or many small ones, fill the queue the same way.
 *
 * Both backends share the batch cursor (which chunk comes next, request
 * checks) and the completion rule (chunk_advance: short reads continue, EINTR
 * and EAGAIN retry, 0 bytes is end of file). They differ only in who waits:
 * the io_uring backend refills the ring from one thread as completions
 * arrive; the threads backend runs queue_depth blocking preads at once, the
 * caller being one of them.
 */
#include "io.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A read that keeps failing with EINTR or EAGAIN is given up on rather than spun on forever. */
#define MAX_RETRIES 1000

/* One piece of one request; `done` grows as (possibly short) reads complete. */
struct chunk {
    size_t request;
    int fd;
    bool direct;
    uint64_t offset;         /* file offset of the chunk's first byte */
    uint64_t batch_position; /* the same byte numbered across the batch, for fault injection */
    char *destination;
    uint64_t length;
    uint64_t done;
    unsigned retries;
};

/* Which chunk comes next. Requests are checked when the cursor reaches them. */
struct batch {
    struct guanaco_io_request *requests;
    size_t n;
    size_t next_request;
    uint64_t next_offset;   /* within requests[next_request] */
    uint64_t request_base;  /* batch position of requests[next_request]'s first byte */
    int checked_fd;         /* fcntl(F_GETFL) is asked once per run of requests on the same fd */
    bool checked_direct;
    size_t unaligned_reported;
};

struct uring_slot {
    struct chunk chunk;
};

struct guanaco_io {
    enum guanaco_io_backend backend;
    unsigned queue_depth;
    unsigned max_chunk_bytes;
    int broken; /* a ring failure left submissions unaccounted for: every later batch fails with it */

    /* Fault injection: fault_byte and fault_error are written before fault_armed is released. */
    _Atomic bool fault_armed;
    uint64_t fault_byte;
    int fault_error;

    /* GUANACO_IO_URING */
    struct io_uring ring;
    bool ring_ready;
    struct uring_slot *slots;  /* queue_depth entries; the user_data of a read is its slot index */
    unsigned *free_slots;      /* stack of free slot indices */

    /* GUANACO_IO_THREADS: queue_depth - 1 workers, the caller of read_batch is the last one */
    pthread_t *threads;
    unsigned n_threads;
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    bool sync_ready;
    struct batch *batch; /* the running batch, NULL between batches; guarded by lock */
    unsigned busy;       /* chunks being read by some thread; guarded by lock */
    bool stopping;
};

const char *guanaco_io_backend_name(enum guanaco_io_backend backend) {
    switch (backend) {
    case GUANACO_IO_URING: return "io_uring";
    case GUANACO_IO_THREADS: return "threads";
    }
    return "unknown";
}

void guanaco_io_inject_fault(struct guanaco_io *io, uint64_t after_bytes, int error) {
    atomic_store_explicit(&io->fault_armed, false, memory_order_relaxed);
    if (error == 0) {
        return;
    }
    io->fault_byte = after_bytes;
    io->fault_error = error;
    atomic_store_explicit(&io->fault_armed, true, memory_order_release);
}

/* ---- the batch cursor, shared by both backends ---- */

static unsigned chunk_limit(const struct guanaco_io *io, bool direct) {
    if (!direct) {
        return io->max_chunk_bytes;
    }
    /* Every chunk of an aligned O_DIRECT request must stay aligned, so chunks are whole blocks. */
    unsigned blocks = io->max_chunk_bytes / GUANACO_IO_DIRECT_ALIGNMENT;
    return (blocks ? blocks : 1) * GUANACO_IO_DIRECT_ALIGNMENT;
}

/* Returns 0 when the request may be read, or the -errno it completes with untouched. */
static int check_request(struct batch *b, struct guanaco_io_request *r, size_t index) {
    if (r->length == 0) {
        return 0;
    }
    if (r->fd < 0) {
        return -EBADF;
    }
    /* pread takes a signed off_t: the whole range must fit in it. */
    if (!r->destination || r->offset > (uint64_t)INT64_MAX || r->length > (uint64_t)INT64_MAX - r->offset) {
        return -EINVAL;
    }
    if (r->fd != b->checked_fd) {
        int flags = fcntl(r->fd, F_GETFL);
        if (flags < 0) {
            return -errno;
        }
        b->checked_fd = r->fd;
        b->checked_direct = (flags & O_DIRECT) != 0;
    }
    if (b->checked_direct) {
        const uint64_t a = GUANACO_IO_DIRECT_ALIGNMENT;
        if (r->offset % a || r->length % a || (uintptr_t)r->destination % a) {
            /* The kernel's own answer would be a bare EINVAL from deep inside the read; say which request. */
            if (b->unaligned_reported++ == 0) {
                guanaco_log_error("read request %zu on O_DIRECT fd %d is not aligned: offset %llu, length %llu and "
                             "destination %p must all be multiples of %llu",
                             index, r->fd, (unsigned long long)r->offset, (unsigned long long)r->length,
                             r->destination, (unsigned long long)a);
            }
            return -EINVAL;
        }
    }
    return 0;
}

/* Moves the cursor past the current request (done, failed or empty) to the next readable one. */
static void enter_next_request(struct batch *b, bool skip_current) {
    if (skip_current) {
        b->request_base += b->requests[b->next_request].length;
        b->next_request++;
        b->next_offset = 0;
    }
    while (b->next_request < b->n) {
        struct guanaco_io_request *r = &b->requests[b->next_request];
        r->result = check_request(b, r, b->next_request);
        if (r->result == 0 && r->length > 0) {
            return;
        }
        b->request_base += r->length;
        b->next_request++;
    }
}

static void batch_start(struct batch *b, struct guanaco_io_request *requests, size_t n) {
    memset(b, 0, sizeof(*b));
    b->requests = requests;
    b->n = n;
    b->checked_fd = -1;
    enter_next_request(b, false);
}

static bool batch_exhausted(const struct batch *b) {
    return b->next_request >= b->n;
}

/* Takes the next chunk to read; false when the batch has none left to issue. */
static bool next_chunk(const struct guanaco_io *io, struct batch *b, struct chunk *c) {
    /* A request that already failed issues no more chunks; its remaining bytes would be wasted I/O. */
    while (!batch_exhausted(b) && b->requests[b->next_request].result != 0) {
        enter_next_request(b, true);
    }
    if (batch_exhausted(b)) {
        return false;
    }
    struct guanaco_io_request *r = &b->requests[b->next_request];
    uint64_t remaining = r->length - b->next_offset;
    uint64_t limit = chunk_limit(io, b->checked_direct);
    *c = (struct chunk){
        .request = b->next_request,
        .fd = r->fd,
        .direct = b->checked_direct,
        .offset = r->offset + b->next_offset,
        .batch_position = b->request_base + b->next_offset,
        .destination = (char *)r->destination + b->next_offset,
        .length = remaining < limit ? remaining : limit,
    };
    b->next_offset += c->length;
    if (b->next_offset == r->length) {
        enter_next_request(b, true);
    }
    return true;
}

/* Replaces a successful read's result when an armed fault covers its bytes. */
static int64_t apply_fault(struct guanaco_io *io, const struct chunk *c, int64_t result) {
    if (!atomic_load_explicit(&io->fault_armed, memory_order_acquire)) {
        return result;
    }
    uint64_t start = c->batch_position + c->done;
    if (io->fault_byte < start || io->fault_byte - start >= (uint64_t)result) {
        return result;
    }
    /* Several threads may see the same armed fault; only the one that disarms it applies it. */
    if (!atomic_exchange_explicit(&io->fault_armed, false, memory_order_acq_rel)) {
        return result;
    }
    switch (io->fault_error) {
    case GUANACO_IO_FAULT_EOF: return 0;
    case GUANACO_IO_FAULT_SHORT: {
        uint64_t keep = io->fault_byte - start;
        if (c->direct) {
            keep -= keep % GUANACO_IO_DIRECT_ALIGNMENT;
            if (keep == 0) {
                keep = GUANACO_IO_DIRECT_ALIGNMENT;
            }
        } else if (keep == 0) {
            keep = 1;
        }
        return keep < (uint64_t)result ? (int64_t)keep : result;
    }
    default: return io->fault_error < 0 ? io->fault_error : -EIO;
    }
}

/*
 * Applies one read's outcome to its chunk. Returns 1 when the chunk needs
 * another read (a retry, or the rest after a short read), 0 when it is
 * complete, or the -errno it failed with.
 */
static int chunk_advance(struct guanaco_io *io, struct chunk *c, int64_t result) {
    if (result > 0) {
        result = apply_fault(io, c, result);
    }
    if (result == -EINTR || result == -EAGAIN) {
        return ++c->retries <= MAX_RETRIES ? 1 : (int)result;
    }
    if (result < 0) {
        return (int)result;
    }
    if (result == 0) {
        return -ENODATA; /* end of file before the requested length */
    }
    c->done += (uint64_t)result;
    if (c->done >= c->length) {
        return 0;
    }
    /* O_DIRECT reads stop mid-block only at end of file; reading on from there would fail with EINVAL. */
    if (c->direct && c->done % GUANACO_IO_DIRECT_ALIGNMENT != 0) {
        return -ENODATA;
    }
    return 1;
}

static int first_failure(const struct guanaco_io_request *requests, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (requests[i].result != 0) {
            return requests[i].result;
        }
    }
    return 0;
}

/* ---- io_uring backend ---- */

static int uring_create(struct guanaco_io *io) {
    int ret = io_uring_queue_init(io->queue_depth, &io->ring, 0);
    if (ret == -ENOSYS || ret == -EPERM || ret == -EACCES) {
        /* Missing from the kernel, blocked by seccomp (Docker answers EPERM), or kernel.io_uring_disabled. */
        return -ENOSYS;
    }
    if (ret < 0) {
        return ret;
    }
    io->ring_ready = true;
    /* IORING_OP_READ arrived in Linux 5.6; on an older ring every read would fail with EINVAL. */
    struct io_uring_probe *probe = io_uring_get_probe_ring(&io->ring);
    bool can_read = probe && io_uring_opcode_supported(probe, IORING_OP_READ);
    io_uring_free_probe(probe);
    if (!can_read) {
        return -ENOSYS;
    }
    io->slots = calloc(io->queue_depth, sizeof(*io->slots));
    io->free_slots = calloc(io->queue_depth, sizeof(*io->free_slots));
    if (!io->slots || !io->free_slots) {
        return -ENOMEM;
    }
    return 0;
}

static void uring_prepare(struct guanaco_io *io, unsigned slot) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    /* Never NULL: at most queue_depth reads are prepared or in flight, and the ring has that many entries. */
    const struct chunk *c = &io->slots[slot].chunk;
    io_uring_prep_read(sqe, c->fd, c->destination + c->done, (unsigned)(c->length - c->done), c->offset + c->done);
    io_uring_sqe_set_data64(sqe, slot);
}

/*
 * The ring failed in a way that leaves its reads unaccounted for. Waits for
 * the ones the kernel holds, so no destination is written after return, fails
 * every request not known complete, and marks the object broken: prepared
 * but unsubmitted entries stay in the ring and must never be submitted later.
 */
static void uring_fail(struct guanaco_io *io, struct batch *b, unsigned in_flight, const bool *slot_busy, int err) {
    guanaco_log_error("io_uring failed: %s; this reader is unusable from now on", strerror(-err));
    io->broken = err;
    unsigned held_by_kernel = in_flight - io_uring_sq_ready(&io->ring);
    while (held_by_kernel > 0) {
        struct io_uring_cqe *cqe;
        int ret = io_uring_wait_cqe(&io->ring, &cqe);
        if (ret == -EINTR || ret == -EAGAIN) {
            continue;
        }
        if (ret < 0) {
            guanaco_log_error("io_uring: cannot wait for %u reads in flight: %s", held_by_kernel, strerror(-ret));
            break;
        }
        io_uring_cqe_seen(&io->ring, cqe);
        held_by_kernel--;
    }
    /* Chunks are issued in request order: any request before the cursor with no chunk in flight is complete. */
    for (unsigned s = 0; s < io->queue_depth; s++) {
        if (slot_busy[s] && b->requests[io->slots[s].chunk.request].result == 0) {
            b->requests[io->slots[s].chunk.request].result = err;
        }
    }
    for (size_t i = b->next_request; i < b->n; i++) {
        if (b->requests[i].result == 0 && b->requests[i].length > 0) {
            b->requests[i].result = err;
        }
    }
}

static int uring_read_batch(struct guanaco_io *io, struct batch *b) {
    unsigned n_free = io->queue_depth, in_flight = 0;
    bool slot_busy[GUANACO_IO_MAX_QUEUE_DEPTH] = {0};
    for (unsigned s = 0; s < io->queue_depth; s++) {
        io->free_slots[s] = s;
    }
    for (;;) {
        /* Refill: every slot freed by the last completions gets the next chunk before we wait again. */
        while (n_free > 0 && next_chunk(io, b, &io->slots[io->free_slots[n_free - 1]].chunk)) {
            unsigned slot = io->free_slots[--n_free];
            slot_busy[slot] = true;
            uring_prepare(io, slot);
            in_flight++;
        }
        if (in_flight == 0) {
            return 0;
        }
        int ret = io_uring_submit_and_wait(&io->ring, 1);
        if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) {
            /* Unsubmitted entries stay in the ring and go with the next call. */
            if (ret != -EINTR) {
                sched_yield();
            }
            continue;
        }
        if (ret < 0) {
            uring_fail(io, b, in_flight, slot_busy, ret);
            return ret;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&io->ring, head, cqe) {
            seen++;
            unsigned slot = (unsigned)io_uring_cqe_get_data64(cqe);
            struct chunk *c = &io->slots[slot].chunk;
            struct guanaco_io_request *r = &b->requests[c->request];
            int state = chunk_advance(io, c, cqe->res);
            if (state == 1 && r->result == 0) {
                uring_prepare(io, slot); /* the rest of a short read, or a retry; the slot stays in flight */
                continue;
            }
            if (state < 0 && r->result == 0) {
                r->result = state;
            }
            slot_busy[slot] = false;
            io->free_slots[n_free++] = slot;
            in_flight--;
        }
        io_uring_cq_advance(&io->ring, seen);
    }
}

/* ---- threads backend ---- */

/* Reads one chunk with blocking preads until it is complete or failed. */
static int read_chunk(struct guanaco_io *io, struct chunk *c) {
    for (;;) {
        ssize_t got = pread(c->fd, c->destination + c->done, (size_t)(c->length - c->done), (off_t)(c->offset + c->done));
        int state = chunk_advance(io, c, got < 0 ? -(int64_t)errno : (int64_t)got);
        if (state != 1) {
            return state;
        }
    }
}

/* Takes and reads chunks until the batch has none left; called and returns with io->lock held. */
static void run_chunks(struct guanaco_io *io, struct batch *b) {
    struct chunk c;
    while (next_chunk(io, b, &c)) {
        io->busy++;
        pthread_mutex_unlock(&io->lock);
        int state = read_chunk(io, &c);
        pthread_mutex_lock(&io->lock);
        io->busy--;
        if (state < 0 && b->requests[c.request].result == 0) {
            b->requests[c.request].result = state;
        }
    }
    if (io->busy == 0) {
        pthread_cond_signal(&io->work_done);
    }
}

static void *worker_main(void *arg) {
    struct guanaco_io *io = arg;
    pthread_mutex_lock(&io->lock);
    while (!io->stopping) {
        if (io->batch && !batch_exhausted(io->batch)) {
            run_chunks(io, io->batch);
        } else {
            pthread_cond_wait(&io->work_ready, &io->lock);
        }
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

static int threads_create(struct guanaco_io *io) {
    if (pthread_mutex_init(&io->lock, NULL) != 0) {
        return -ENOMEM;
    }
    if (pthread_cond_init(&io->work_ready, NULL) != 0) {
        pthread_mutex_destroy(&io->lock);
        return -ENOMEM;
    }
    if (pthread_cond_init(&io->work_done, NULL) != 0) {
        pthread_cond_destroy(&io->work_ready);
        pthread_mutex_destroy(&io->lock);
        return -ENOMEM;
    }
    io->sync_ready = true;
    io->threads = calloc(io->queue_depth, sizeof(*io->threads));
    if (!io->threads) {
        return -ENOMEM;
    }
    for (unsigned i = 0; i + 1 < io->queue_depth; i++) {
        int err = pthread_create(&io->threads[i], NULL, worker_main, io);
        if (err != 0) {
            return -err;
        }
        io->n_threads++;
    }
    return 0;
}

static int threads_read_batch(struct guanaco_io *io, struct batch *b) {
    pthread_mutex_lock(&io->lock);
    io->batch = b;
    pthread_cond_broadcast(&io->work_ready);
    run_chunks(io, b);
    /* The cursor is exhausted; other threads may still be reading into the caller's buffers. */
    while (io->busy > 0) {
        pthread_cond_wait(&io->work_done, &io->lock);
    }
    io->batch = NULL;
    pthread_mutex_unlock(&io->lock);
    return 0;
}

/* ---- lifecycle ---- */

int guanaco_io_create(enum guanaco_io_backend backend, unsigned queue_depth, unsigned max_chunk_bytes,
                      struct guanaco_io **out) {
    *out = NULL;
    if (backend != GUANACO_IO_URING && backend != GUANACO_IO_THREADS) {
        return -EINVAL;
    }
    if (queue_depth == 0 || queue_depth > GUANACO_IO_MAX_QUEUE_DEPTH || max_chunk_bytes == 0 ||
        max_chunk_bytes > GUANACO_IO_MAX_CHUNK_BYTES) {
        guanaco_log_error("io: queue depth %u must be in 1..%u and chunk size %u in 1..%u", queue_depth,
                     GUANACO_IO_MAX_QUEUE_DEPTH, max_chunk_bytes, GUANACO_IO_MAX_CHUNK_BYTES);
        return -EINVAL;
    }
    struct guanaco_io *io = calloc(1, sizeof(*io));
    if (!io) {
        return -ENOMEM;
    }
    io->backend = backend;
    io->queue_depth = queue_depth;
    io->max_chunk_bytes = max_chunk_bytes;
    atomic_init(&io->fault_armed, false);
    int ret = backend == GUANACO_IO_URING ? uring_create(io) : threads_create(io);
    if (ret < 0) {
        guanaco_io_destroy(io);
        return ret;
    }
    *out = io;
    return 0;
}

void guanaco_io_destroy(struct guanaco_io *io) {
    if (!io) {
        return;
    }
    if (io->ring_ready) {
        io_uring_queue_exit(&io->ring);
    }
    free(io->slots);
    free(io->free_slots);
    if (io->sync_ready) {
        pthread_mutex_lock(&io->lock);
        io->stopping = true;
        pthread_cond_broadcast(&io->work_ready);
        pthread_mutex_unlock(&io->lock);
        for (unsigned i = 0; i < io->n_threads; i++) {
            pthread_join(io->threads[i], NULL);
        }
        pthread_cond_destroy(&io->work_done);
        pthread_cond_destroy(&io->work_ready);
        pthread_mutex_destroy(&io->lock);
    }
    free(io->threads);
    free(io);
}

int guanaco_io_read_batch(struct guanaco_io *io, struct guanaco_io_request *requests, size_t n) {
    if (n > 0 && !requests) {
        return -EINVAL;
    }
    if (io->broken) {
        for (size_t i = 0; i < n; i++) {
            requests[i].result = io->broken;
        }
        return n > 0 ? io->broken : 0;
    }
    struct batch b;
    batch_start(&b, requests, n);
    int ret = io->backend == GUANACO_IO_URING ? uring_read_batch(io, &b) : threads_read_batch(io, &b);
    int failure = first_failure(requests, n);
    return failure ? failure : ret;
}
