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
 * Jobs: a batch submitted returns at once. Its chunks join a queue of
 * every job not yet fully issued (urgent jobs first), and background
 * workers keep up to queue_depth chunks in flight across all of them, so
 * reads for the next layer proceed while the caller computes the current
 * one. A caller waits only for the jobs it needs now, or cancels a guess.
 *
 * Both backends share the job cursor (which chunk comes next, request
 * checks), the queues and the completion rule (chunk_advance: short reads
 * continue, EINTR and EAGAIN retry, 0 bytes is end of file). They differ only
 * in who waits: the io_uring backend has one driver thread that owns the
 * ring, refills it as completions arrive and is woken through an eventfd
 * read kept in the ring; the threads backend runs queue_depth blocking
 * preads at once.
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
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* A read that keeps failing with EINTR or EAGAIN is given up on rather than spun on forever. */
#define MAX_RETRIES 1000

/* One piece of one request of one job; `done` grows as (possibly short) reads complete. */
struct chunk {
    struct guanaco_io_job *job;
    bool urgent;
    size_t request;
    int fd;
    bool direct;
    uint64_t offset;       /* file offset of the chunk's first byte */
    uint64_t job_position; /* the same byte numbered across the job, for fault injection */
    char *destination;
    const char *populate; /* with destination NULL: MADV_POPULATE_READ here instead of a WILLNEED */
    uint64_t length;
    uint64_t done;
    unsigned retries;
};

/* Jobs with chunks left to issue, oldest first: urgent ones are always taken before the rest. */
struct job_queue {
    struct guanaco_io_job *head, *tail;
};

struct guanaco_io {
    enum guanaco_io_backend backend;
    unsigned queue_depth;
    unsigned max_chunk_bytes;
    int broken; /* a ring failure left reads unaccounted for: every later job fails with it */

    /* Fault injection: fault_byte and fault_error are written before fault_armed is released. */
    _Atomic bool fault_armed;
    uint64_t fault_byte;
    int fault_error;

    /* Shared by both backends; lock guards the queues, every queued job's cursor and counters. */
    pthread_mutex_t lock;
    pthread_cond_t work_ready; /* threads: a chunk may be waiting */
    pthread_cond_t job_done;   /* some job finished */
    bool sync_ready;
    struct job_queue urgent, normal;
    /* Jobs whose last chunk landed and whose `then` no thread has taken yet, oldest first. The then thread runs
       them, so that the threads that keep the disk busy never do CPU work; a waiter runs them too. */
    struct guanaco_io_job *thens, *thens_tail;
    pthread_cond_t then_ready;
    pthread_t then_thread;
    bool then_thread_started;
    unsigned normal_in_flight; /* chunks of non-urgent jobs being read */
    bool stopping;
    pthread_t *threads;
    unsigned n_threads;

    /* GUANACO_IO_URING: one driver thread owns the ring; submitters wake it through the eventfd */
    struct io_uring ring;
    bool ring_ready;
    struct chunk *slots;   /* queue_depth entries; the user_data of a read is its slot index */
    unsigned *free_slots;  /* stack of free slot indices */
    unsigned n_free;
    int wake_fd;
    uint64_t wake_buffer;
};

/* user_data of the eventfd read that wakes the driver */
#define WAKE_TAG UINT64_MAX

#define NAME_ENTRY(name) name,
static const char *const backend_names[] = {GUANACO_IO_BACKEND_NAMES(NAME_ENTRY)};
_Static_assert(sizeof(backend_names) / sizeof(backend_names[0]) == GUANACO_IO_THREADS + 1, "one name per backend");

const char *guanaco_io_backend_name(enum guanaco_io_backend backend) {
    return (unsigned)backend <= GUANACO_IO_THREADS ? backend_names[backend] : "unknown";
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

/* ---- the job cursor and queues, shared by both backends (io->lock held) ---- */

static unsigned chunk_limit(const struct guanaco_io *io, bool direct, bool advise, bool populate) {
    if (populate) {
        return GUANACO_IO_POPULATE_BYTES;
    }
    if (advise) {
        /* the kernel reads at most max(read_ahead_kb, max_sectors_kb) per WILLNEED: stay under both defaults */
        return io->max_chunk_bytes < GUANACO_IO_ADVISE_BYTES ? io->max_chunk_bytes : GUANACO_IO_ADVISE_BYTES;
    }
    if (!direct) {
        return io->max_chunk_bytes;
    }
    /* Every chunk of an aligned O_DIRECT request must stay aligned, so chunks are whole blocks. */
    unsigned blocks = io->max_chunk_bytes / GUANACO_IO_DIRECT_ALIGNMENT;
    return (blocks ? blocks : 1) * GUANACO_IO_DIRECT_ALIGNMENT;
}

/* Returns 0 when the request may be read, or the -errno it completes with untouched. */
static int check_request(struct guanaco_io_job *job, struct guanaco_io_request *r, size_t index) {
    if (r->length == 0) {
        return 0;
    }
    if (r->fd < 0) {
        return -EBADF;
    }
    /* pread takes a signed off_t: the whole range must fit in it. */
    if (r->offset > (uint64_t)INT64_MAX || r->length > (uint64_t)INT64_MAX - r->offset) {
        return -EINVAL;
    }
    if (r->fd != job->checked_fd) {
        int flags = fcntl(r->fd, F_GETFL);
        if (flags < 0) {
            return -errno;
        }
        job->checked_fd = r->fd;
        job->checked_direct = (flags & O_DIRECT) != 0;
    }
    if (job->checked_direct && !r->destination) {
        return -EINVAL; /* O_DIRECT bypasses the page cache: there is nothing to fill */
    }
    if (job->checked_direct) {
        const uint64_t a = GUANACO_IO_DIRECT_ALIGNMENT;
        if (r->offset % a || r->length % a || (uintptr_t)r->destination % a) {
            /* The kernel's own answer would be a bare EINVAL from deep inside the read; say which request. */
            if (job->unaligned_reported++ == 0) {
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
static void enter_next_request(struct guanaco_io_job *job, bool skip_current) {
    if (skip_current) {
        job->request_base += job->requests[job->next_request].length;
        job->next_request++;
        job->next_offset = 0;
    }
    while (job->next_request < job->n) {
        struct guanaco_io_request *r = &job->requests[job->next_request];
        r->result = check_request(job, r, job->next_request);
        if (r->result == 0 && r->length > 0) {
            return;
        }
        job->request_base += r->length;
        job->next_request++;
    }
}

static bool job_exhausted(const struct guanaco_io_job *job) {
    return job->next_request >= job->n;
}

static void queue_push(struct job_queue *q, struct guanaco_io_job *job) {
    job->next_in_queue = NULL;
    if (q->tail) {
        q->tail->next_in_queue = job;
    } else {
        q->head = job;
    }
    q->tail = job;
    job->queued = 1;
}

static void queue_remove(struct job_queue *q, struct guanaco_io_job *job) {
    struct guanaco_io_job *previous = NULL;
    for (struct guanaco_io_job *j = q->head; j; previous = j, j = j->next_in_queue) {
        if (j == job) {
            if (previous) {
                previous->next_in_queue = j->next_in_queue;
            } else {
                q->head = j->next_in_queue;
            }
            if (q->tail == j) {
                q->tail = previous;
            }
            job->queued = 0;
            return;
        }
    }
}

/* A job leaves its queue when its cursor runs out, and is done once its last chunk lands and its `then` ran. */
static void finish_if_complete(struct guanaco_io *io, struct guanaco_io_job *job) {
    if (!job->done && !job->then_pending && !job->queued && job->in_flight == 0) {
        if (job->then) {
            job->then_pending = 1;
            job->next_then = NULL;
            if (io->thens_tail) {
                io->thens_tail->next_then = job;
            } else {
                io->thens = job;
            }
            io->thens_tail = job;
            pthread_cond_signal(&io->then_ready);
            pthread_cond_broadcast(&io->job_done); /* a waiter may run it */
            return;
        }
        job->done = 1;
        pthread_cond_broadcast(&io->job_done);
    }
}

/* Runs every pending `then`, each outside the lock (held on entry and on return); false when there was none. */
static bool run_thens(struct guanaco_io *io) {
    bool ran = false;
    while (io->thens) {
        struct guanaco_io_job *job = io->thens;
        io->thens = job->next_then;
        io->thens_tail = io->thens ? io->thens_tail : NULL;
        pthread_mutex_unlock(&io->lock);
        job->then(job, job->then_context);
        pthread_mutex_lock(&io->lock);
        job->done = 1;
        pthread_cond_broadcast(&io->job_done);
        ran = true;
    }
    return ran;
}

/* Takes the next chunk of `job`; false when it has none left to issue. */
static bool job_next_chunk(const struct guanaco_io *io, struct guanaco_io_job *job, struct chunk *c) {
    /* A request that already failed issues no more chunks; its remaining bytes would be wasted I/O. */
    while (!job_exhausted(job) && job->requests[job->next_request].result != 0) {
        enter_next_request(job, true);
    }
    if (job_exhausted(job)) {
        return false;
    }
    struct guanaco_io_request *r = &job->requests[job->next_request];
    uint64_t remaining = r->length - job->next_offset;
    uint64_t limit = chunk_limit(io, job->checked_direct, r->destination == NULL, r->populate != NULL);
    *c = (struct chunk){
        .job = job,
        .urgent = job->urgent,
        .request = job->next_request,
        .fd = r->fd,
        .direct = job->checked_direct,
        .offset = r->offset + job->next_offset,
        .job_position = job->request_base + job->next_offset,
        .destination = r->destination ? (char *)r->destination + job->next_offset : NULL,
        .populate = !r->destination && r->populate ? r->populate + job->next_offset : NULL,
        .length = remaining < limit ? remaining : limit,
    };
    job->next_offset += c->length;
    if (job->next_offset == r->length) {
        enter_next_request(job, true);
    }
    return true;
}

/*
 * The next chunk of all queued work, urgent jobs first; false when there is
 * none. Non-urgent jobs get at most half the queue: an urgent read that
 * arrives later waits for at most that many chunks ahead of it on the disk.
 */
static bool take_chunk(struct guanaco_io *io, struct chunk *c) {
    struct job_queue *queues[2] = {&io->urgent, &io->normal};
    const unsigned normal_limit = io->queue_depth > 1 ? io->queue_depth / 2 : 1;
    for (int q = 0; q < 2; q++) {
        while (queues[q]->head && (q == 0 || io->normal_in_flight < normal_limit)) {
            struct guanaco_io_job *job = queues[q]->head;
            if (job_next_chunk(io, job, c)) {
                job->in_flight++;
                io->normal_in_flight += q == 1;
                if (job_exhausted(job)) {
                    queue_remove(queues[q], job);
                }
                return true;
            }
            queue_remove(queues[q], job);
            finish_if_complete(io, job);
        }
    }
    return false;
}

/* A chunk is over: its outcome (0 or -errno) goes to its request, and its job may be done. */
static void chunk_finished(struct guanaco_io *io, struct chunk *c, int state) {
    struct guanaco_io_request *r = &c->job->requests[c->request];
    if (state < 0 && r->result == 0) {
        r->result = state;
    }
    c->job->in_flight--;
    io->normal_in_flight -= !c->urgent;
    finish_if_complete(io, c->job);
}

/* Replaces a successful read's result when an armed fault covers its bytes. */
static int64_t apply_fault(struct guanaco_io *io, const struct chunk *c, int64_t result) {
    if (!atomic_load_explicit(&io->fault_armed, memory_order_acquire)) {
        return result;
    }
    uint64_t start = c->job_position + c->done;
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
    if (c->populate && (result == -EINVAL || result == -EOPNOTSUPP)) {
        c->populate = NULL; /* a kernel before 5.14 (or a ring without IORING_OP_MADVISE): WILLNEED instead */
        return 1;
    }
    if (!c->destination && result == 0) {
        result = (int64_t)(c->length - c->done); /* a WILLNEED that was accepted covers its whole range */
    }
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

/* Fails every request of every queued job with err (io->lock held): the reader cannot serve them. */
static void fail_queued(struct guanaco_io *io, int err) {
    struct job_queue *queues[2] = {&io->urgent, &io->normal};
    for (int q = 0; q < 2; q++) {
        while (queues[q]->head) {
            struct guanaco_io_job *job = queues[q]->head;
            for (size_t i = job->next_request; i < job->n; i++) {
                if (job->requests[i].result == 0 && job->requests[i].length > 0) {
                    job->requests[i].result = err;
                }
            }
            job->next_request = job->n;
            queue_remove(queues[q], job);
            finish_if_complete(io, job);
        }
    }
}

/* ---- io_uring backend: one driver thread owns the ring ---- */

static void uring_prepare(struct guanaco_io *io, unsigned slot) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    /* Never NULL: at most queue_depth reads and the wake-up read are in the ring, which has that many entries. */
    const struct chunk *c = &io->slots[slot];
    if (c->populate) {
        io_uring_prep_madvise(sqe, (void *)(uintptr_t)(c->populate + c->done), (off_t)(c->length - c->done),
                              MADV_POPULATE_READ);
    } else if (!c->destination) {
        io_uring_prep_fadvise(sqe, c->fd, c->offset + c->done, (off_t)(c->length - c->done), POSIX_FADV_WILLNEED);
    } else {
        io_uring_prep_read(sqe, c->fd, c->destination + c->done, (unsigned)(c->length - c->done), c->offset + c->done);
    }
    io_uring_sqe_set_data64(sqe, slot);
}

static void uring_arm_wake(struct guanaco_io *io) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    io_uring_prep_read(sqe, io->wake_fd, &io->wake_buffer, sizeof(io->wake_buffer), 0);
    io_uring_sqe_set_data64(sqe, WAKE_TAG);
}

/*
 * The ring failed in a way that leaves its reads unaccounted for. Waits for
 * the reads the kernel holds, so no destination is written after their jobs
 * finish, fails every chunk in flight and every queued job, and marks the
 * object broken: prepared but unsubmitted entries must never be submitted.
 */
static void uring_fail(struct guanaco_io *io, unsigned in_ring, int err) {
    guanaco_log_error("io_uring failed: %s; this reader is unusable from now on", strerror(-err));
    io->broken = err;
    unsigned held_by_kernel = in_ring - io_uring_sq_ready(&io->ring);
    pthread_mutex_unlock(&io->lock);
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
    pthread_mutex_lock(&io->lock);
    for (unsigned s = 0; s < io->queue_depth; s++) {
        if (io->slots[s].job) {
            chunk_finished(io, &io->slots[s], err);
            io->slots[s].job = NULL;
        }
    }
    fail_queued(io, err);
}

static void *uring_driver(void *arg) {
    struct guanaco_io *io = arg;
    bool wake_armed = false;
    unsigned in_ring = 0; /* reads in the ring, the wake-up read included */
    pthread_mutex_lock(&io->lock);
    while (!io->stopping && !io->broken) {
        /* Refill: every free slot gets the next chunk before we wait again. */
        struct chunk c;
        while (io->n_free > 0 && take_chunk(io, &c)) {
            unsigned slot = io->free_slots[--io->n_free];
            io->slots[slot] = c;
            uring_prepare(io, slot);
            in_ring++;
        }
        if (!wake_armed) {
            uring_arm_wake(io);
            wake_armed = true;
            in_ring++;
        }
        pthread_mutex_unlock(&io->lock);
        int ret = io_uring_submit_and_wait(&io->ring, 1);
        pthread_mutex_lock(&io->lock);
        if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) {
            /* Unsubmitted entries stay in the ring and go with the next call. */
            if (ret != -EINTR) {
                pthread_mutex_unlock(&io->lock);
                sched_yield();
                pthread_mutex_lock(&io->lock);
            }
            continue;
        }
        if (ret < 0) {
            uring_fail(io, in_ring, ret);
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&io->ring, head, cqe) {
            seen++;
            uint64_t tag = io_uring_cqe_get_data64(cqe);
            if (tag == WAKE_TAG) {
                wake_armed = false; /* new work, or stopping: the loop looks at both */
                in_ring--;
                continue;
            }
            unsigned slot = (unsigned)tag;
            struct chunk *chunk = &io->slots[slot];
            struct guanaco_io_request *r = &chunk->job->requests[chunk->request];
            int state = chunk_advance(io, chunk, cqe->res);
            if (state == 1 && r->result == 0) {
                uring_prepare(io, slot); /* the rest of a short read, or a retry; the slot stays in flight */
                continue;
            }
            chunk_finished(io, chunk, state);
            chunk->job = NULL;
            io->free_slots[io->n_free++] = slot;
            in_ring--;
        }
        io_uring_cq_advance(&io->ring, seen);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

static int uring_create(struct guanaco_io *io) {
    int ret = io_uring_queue_init(io->queue_depth + 1, &io->ring, 0);
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
    bool can_read = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                    io_uring_opcode_supported(probe, IORING_OP_FADVISE);
    io_uring_free_probe(probe);
    if (!can_read) {
        return -ENOSYS;
    }
    io->slots = calloc(io->queue_depth, sizeof(*io->slots));
    io->free_slots = calloc(io->queue_depth, sizeof(*io->free_slots));
    if (!io->slots || !io->free_slots) {
        return -ENOMEM;
    }
    for (unsigned s = 0; s < io->queue_depth; s++) {
        io->free_slots[s] = s;
    }
    io->n_free = io->queue_depth;
    io->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (io->wake_fd < 0) {
        return -errno;
    }
    io->threads = calloc(1, sizeof(*io->threads));
    if (!io->threads) {
        return -ENOMEM;
    }
    int err = pthread_create(&io->threads[0], NULL, uring_driver, io);
    if (err != 0) {
        return -err;
    }
    io->n_threads = 1;
    return 0;
}

static void uring_wake(struct guanaco_io *io) {
    uint64_t one = 1;
    /* Only a full counter (2^64 - 2 unread wake-ups) could refuse, and then the driver is awake anyway. */
    (void)!write(io->wake_fd, &one, sizeof(one));
}

/* ---- threads backend: queue_depth blocking preads at once ---- */

/* Reads one chunk with blocking preads until it is complete or failed. */
static int read_chunk(struct guanaco_io *io, struct chunk *c) {
    for (;;) {
        int64_t got;
        if (c->populate) {
            int err = madvise((void *)(uintptr_t)(c->populate + c->done), c->length - c->done, MADV_POPULATE_READ);
            got = err ? -(int64_t)errno : (int64_t)(c->length - c->done);
        } else if (!c->destination) {
            int err = posix_fadvise(c->fd, (off_t)(c->offset + c->done), (off_t)(c->length - c->done),
                                    POSIX_FADV_WILLNEED);
            got = err ? -(int64_t)err : (int64_t)(c->length - c->done);
        } else {
            ssize_t n = pread(c->fd, c->destination + c->done, (size_t)(c->length - c->done),
                              (off_t)(c->offset + c->done));
            got = n < 0 ? -(int64_t)errno : (int64_t)n;
        }
        int state = chunk_advance(io, c, got);
        if (state != 1) {
            return state;
        }
    }
}

static void *worker_main(void *arg) {
    struct guanaco_io *io = arg;
    pthread_mutex_lock(&io->lock);
    while (!io->stopping) {
        struct chunk c;
        if (!take_chunk(io, &c)) {
            pthread_cond_wait(&io->work_ready, &io->lock);
            continue;
        }
        pthread_mutex_unlock(&io->lock);
        int state = read_chunk(io, &c);
        pthread_mutex_lock(&io->lock);
        chunk_finished(io, &c, state);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

static void *then_main(void *arg) {
    struct guanaco_io *io = arg;
    pthread_mutex_lock(&io->lock);
    while (!io->stopping) {
        if (!run_thens(io)) {
            pthread_cond_wait(&io->then_ready, &io->lock);
        }
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

static int threads_create(struct guanaco_io *io) {
    io->threads = calloc(io->queue_depth, sizeof(*io->threads));
    if (!io->threads) {
        return -ENOMEM;
    }
    for (unsigned i = 0; i < io->queue_depth; i++) {
        int err = pthread_create(&io->threads[i], NULL, worker_main, io);
        if (err != 0) {
            return -err;
        }
        io->n_threads++;
    }
    return 0;
}

/* ---- lifecycle ---- */

static int sync_create(struct guanaco_io *io) {
    if (pthread_mutex_init(&io->lock, NULL) != 0) {
        return -ENOMEM;
    }
    if (pthread_cond_init(&io->work_ready, NULL) != 0) {
        pthread_mutex_destroy(&io->lock);
        return -ENOMEM;
    }
    if (pthread_cond_init(&io->job_done, NULL) != 0) {
        pthread_cond_destroy(&io->work_ready);
        pthread_mutex_destroy(&io->lock);
        return -ENOMEM;
    }
    if (pthread_cond_init(&io->then_ready, NULL) != 0) {
        pthread_cond_destroy(&io->job_done);
        pthread_cond_destroy(&io->work_ready);
        pthread_mutex_destroy(&io->lock);
        return -ENOMEM;
    }
    io->sync_ready = true;
    int err = pthread_create(&io->then_thread, NULL, then_main, io);
    io->then_thread_started = err == 0;
    return -err;
}

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
    io->wake_fd = -1;
    atomic_init(&io->fault_armed, false);
    int ret = sync_create(io);
    if (ret == 0) {
        ret = backend == GUANACO_IO_URING ? uring_create(io) : threads_create(io);
    }
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
    if (io->sync_ready) {
        pthread_mutex_lock(&io->lock);
        io->stopping = true;
        pthread_cond_broadcast(&io->work_ready);
        pthread_cond_broadcast(&io->then_ready);
        pthread_mutex_unlock(&io->lock);
        if (io->wake_fd >= 0) {
            uring_wake(io);
        }
        for (unsigned i = 0; i < io->n_threads; i++) {
            pthread_join(io->threads[i], NULL);
        }
        if (io->then_thread_started) {
            pthread_join(io->then_thread, NULL);
        }
    }
    if (io->ring_ready) {
        io_uring_queue_exit(&io->ring);
    }
    if (io->wake_fd >= 0) {
        close(io->wake_fd);
    }
    if (io->sync_ready) {
        pthread_cond_destroy(&io->then_ready);
        pthread_cond_destroy(&io->job_done);
        pthread_cond_destroy(&io->work_ready);
        pthread_mutex_destroy(&io->lock);
    }
    free(io->slots);
    free(io->free_slots);
    free(io->threads);
    free(io);
}

int guanaco_io_submit(struct guanaco_io *io, struct guanaco_io_job *job, struct guanaco_io_request *requests,
                      size_t n, int urgent) {
    return guanaco_io_submit_then(io, job, requests, n, urgent, NULL, NULL);
}

int guanaco_io_submit_then(struct guanaco_io *io, struct guanaco_io_job *job, struct guanaco_io_request *requests,
                           size_t n, int urgent, void (*then)(struct guanaco_io_job *job, void *context),
                           void *context) {
    if (!job || (n > 0 && !requests)) {
        return -EINVAL;
    }
    pthread_mutex_lock(&io->lock);
    *job = (struct guanaco_io_job){
        .requests = requests, .n = n, .checked_fd = -1, .then = then, .then_context = context};
    if (io->broken) {
        for (size_t i = 0; i < n; i++) {
            requests[i].result = io->broken;
        }
        job->next_request = n;
    } else {
        enter_next_request(job, false);
    }
    if (job_exhausted(job)) {
        pthread_mutex_unlock(&io->lock);
        if (then) {
            then(job, context);
        }
        pthread_mutex_lock(&io->lock);
        job->done = 1; /* nothing to read: empty, or every request refused before any I/O */
        pthread_mutex_unlock(&io->lock);
        return 0;
    }
    job->urgent = urgent != 0;
    queue_push(urgent ? &io->urgent : &io->normal, job);
    if (io->backend == GUANACO_IO_THREADS) {
        pthread_cond_broadcast(&io->work_ready);
    }
    pthread_mutex_unlock(&io->lock);
    if (io->backend == GUANACO_IO_URING) {
        uring_wake(io);
    }
    return 0;
}

int guanaco_io_poll(struct guanaco_io *io, struct guanaco_io_job *job) {
    pthread_mutex_lock(&io->lock);
    int done = job->done;
    pthread_mutex_unlock(&io->lock);
    return done;
}

int guanaco_io_wait(struct guanaco_io *io, struct guanaco_io_job *job) {
    pthread_mutex_lock(&io->lock);
    while (!job->done) {
        if (!run_thens(io)) {
            pthread_cond_wait(&io->job_done, &io->lock);
        }
    }
    pthread_mutex_unlock(&io->lock);
    return first_failure(job->requests, job->n);
}

uint64_t guanaco_io_cancel(struct guanaco_io *io, struct guanaco_io_job *job) {
    pthread_mutex_lock(&io->lock);
    if (job->queued) {
        queue_remove(&io->urgent, job);
        queue_remove(&io->normal, job);
        /* the request the cursor is inside may be partly issued: it cannot complete now; the ones after it were
           never checked, so their result is still whatever the caller left there */
        for (size_t i = job->next_request; i < job->n; i++) {
            if ((i > job->next_request || job->requests[i].result == 0) && job->requests[i].length > 0) {
                job->requests[i].result = -ECANCELED;
            } else if (i > job->next_request) {
                job->requests[i].result = 0; /* empty: nothing to read */
            }
        }
        job->next_request = job->n;
        finish_if_complete(io, job);
    }
    while (!job->done) {
        if (!run_thens(io)) {
            pthread_cond_wait(&io->job_done, &io->lock);
        }
    }
    pthread_mutex_unlock(&io->lock);
    uint64_t useful = 0;
    for (size_t i = 0; i < job->n; i++) {
        useful += job->requests[i].result == 0 ? job->requests[i].length : 0;
    }
    return useful;
}

int guanaco_io_read_batch(struct guanaco_io *io, struct guanaco_io_request *requests, size_t n) {
    struct guanaco_io_job job;
    int ret = guanaco_io_submit(io, &job, requests, n, 1);
    return ret < 0 ? ret : guanaco_io_wait(io, &job);
}
