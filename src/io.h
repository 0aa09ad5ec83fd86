/*
 * io.h - owns exact, large, parallel reads from files into caller memory:
 * the engine hands over a batch of (fd, offset, length, destination) and gets
 * back every byte or an error per request. Two backends behind one API:
 * io_uring, and a pthread pool doing pread(2) for systems where io_uring is
 * missing or blocked (seccomp, io_uring_disabled).
 *
 * Reads are asynchronous underneath: a job (one batch of requests) is
 * submitted and returns at once; background workers (one io_uring driver
 * thread, or queue_depth pread threads, and one thread for the jobs'
 * `then`, below) keep up to queue_depth chunks in
 * flight across every job queued, urgent jobs first. The caller polls,
 * waits for any subset of its jobs, or cancels one. guanaco_io_read_batch
 * is submit + wait.
 *
 * Ownership: the caller owns each job, its requests and their destinations;
 * the io object borrows them from submit until wait or cancel returns for
 * that job (no read into a destination happens after that). Every submitted
 * job must be waited for or cancelled before it is reused or freed, and
 * before guanaco_io_destroy. Any thread may submit, poll, wait or cancel.
 */
#ifndef GUANACO_IO_H
#define GUANACO_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

/* Linux 5.14; older headers lack it. Populate requests (below) and the residency engine's mapping use it. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

enum guanaco_io_backend { GUANACO_IO_URING, GUANACO_IO_THREADS };

/* Each backend's name, in enum order, X(name) per backend: guanaco_io_backend_name's answers, the log
   lines' and --guanaco-io's values (options.c expands it too, without linking io.c). */
#define GUANACO_IO_BACKEND_NAMES(X) X("io_uring") X("threads")

/* Offsets, lengths and destinations on an O_DIRECT fd must be multiples of this. */
#define GUANACO_IO_DIRECT_ALIGNMENT 4096u

/* A request with no destination fills the page cache without copying (POSIX_FADV_WILLNEED), in pieces of
   at most this size: the kernel reads at most max(read_ahead_kb, max_sectors_kb) per call. */
#define GUANACO_IO_ADVISE_BYTES (128u << 10)

/* A populate request is cut into pieces of this size: one 2 MiB folio at a time would be one request per
   folio. */
#define GUANACO_IO_POPULATE_BYTES (8u << 20)

/* Limits checked by guanaco_io_create. */
#define GUANACO_IO_MAX_QUEUE_DEPTH 1024u
#define GUANACO_IO_MAX_CHUNK_BYTES (1u << 30) /* below Linux's 0x7ffff000 cap on one read */

struct guanaco_io_request {
    int fd;
    uint64_t offset;
    uint64_t length;
    /* NULL: only start reading the range into the page cache, with no copy (not on an O_DIRECT fd). The
       request completes once the reads are issued; whoever maps the pages then waits for them. */
    void *destination;
    /* With destination NULL: fill the page cache by MADV_POPULATE_READ on this address, where the caller has
       the range [offset, offset + length) of fd mapped (MAP_SHARED). A mapping advised MADV_HUGEPAGE makes the
       kernel read 2 MiB folios, which cost a fraction of the CPU of WILLNEED's 4 KiB ones to read and to drop.
       The request completes once the bytes are in the page cache. */
    const char *populate;
    int result; /* 0 or -errno, filled on completion */
};

struct guanaco_io;

/*
 * One submitted batch. Caller-owned storage; its fields are io.c's own
 * between submit and the return of wait or cancel.
 */
struct guanaco_io_job {
    struct guanaco_io_request *requests;
    size_t n;
    /* the cursor: which chunk comes next */
    size_t next_request;
    uint64_t next_offset;  /* within requests[next_request] */
    uint64_t request_base; /* position of requests[next_request]'s first byte, counted across the job */
    int checked_fd;        /* fcntl(F_GETFL) is asked once per run of requests on the same fd */
    int checked_direct;
    size_t unaligned_reported;
    unsigned in_flight;    /* chunks being read */
    int queued;            /* still has chunks to issue: linked in a queue */
    int done;              /* every chunk issued has completed and none is left to issue */
    int urgent;
    struct guanaco_io_job *next_in_queue;
    /* guanaco_io_submit_then: run once every request has its result, before the job counts as done */
    void (*then)(struct guanaco_io_job *job, void *context);
    void *then_context;
    int then_pending;      /* its last chunk landed: `then` is waiting for a thread to run it */
    struct guanaco_io_job *next_then;
};

/*
 * queue_depth: chunks kept in flight at once (ring entries, or pool threads).
 * max_chunk_bytes: the largest single read; on an O_DIRECT fd it is rounded
 * down to a multiple of GUANACO_IO_DIRECT_ALIGNMENT (at least one block).
 * Returns 0 and sets *out, -EINVAL for a limit out of range, -ENOMEM, or
 * -ENOSYS when io_uring is unavailable (not built into the kernel, blocked by
 * seccomp, or disabled by sysctl): the caller then falls back to threads.
 */
int guanaco_io_create(enum guanaco_io_backend backend, unsigned queue_depth, unsigned max_chunk_bytes,
                      struct guanaco_io **out);

/*
 * Reads all n requests, splitting each into chunks of at most max_chunk_bytes
 * and keeping up to queue_depth chunks in flight across requests. Short reads
 * are continued; EINTR and EAGAIN are retried. Each request's result is set:
 * 0, -EINVAL (bad or, on O_DIRECT, unaligned request: nothing is read),
 * -EBADF, -ENODATA (end of file before length), or the read's -errno. A
 * request that failed stops issuing chunks; the others still complete.
 * Returns 0 when every byte of every request was read, else the result of the
 * lowest-indexed failed request. Never returns before every chunk it issued
 * has completed. A zero-length request or n == 0 succeeds without I/O.
 */
int guanaco_io_read_batch(struct guanaco_io *io, struct guanaco_io_request *requests, size_t n);

/*
 * Queues the job's n requests and returns at once; urgent jobs are read
 * before every non-urgent one not yet issued (a layer that is about to
 * compute goes ahead of a guess about the next one). Requests are checked
 * when their turn comes, as in read_batch. Returns 0, or -EINVAL (n > 0
 * with no requests, or a job already running) with the job not queued.
 */
int guanaco_io_submit(struct guanaco_io *io, struct guanaco_io_job *job, struct guanaco_io_request *requests,
                      size_t n, int urgent);

/*
 * guanaco_io_submit, and `then(job, context)` runs once every request of the
 * job has its result, before poll or wait says the job is done, outside io's
 * lock: CPU work on the bytes (the residency engine repacks an expert there)
 * overlaps the reads of the jobs behind it. Pending `then`s run in the order
 * their jobs completed, on io's then thread (never on the threads that keep
 * the disk busy: a driver thread repacking left the ring to drain), or on a
 * thread inside wait or cancel, which takes the oldest pending one, its own
 * or not (a job done at submit runs it on the submitter). It must not wait
 * for another job of this io object, and it may run on several threads at
 * once for different jobs.
 */
int guanaco_io_submit_then(struct guanaco_io *io, struct guanaco_io_job *job, struct guanaco_io_request *requests,
                           size_t n, int urgent, void (*then)(struct guanaco_io_job *job, void *context),
                           void *context);

/* 1 when every request of the job has its result, else 0. Never blocks on I/O. */
int guanaco_io_poll(struct guanaco_io *io, struct guanaco_io_job *job);

/* Waits until the job is done. Returns read_batch's value for its requests. */
int guanaco_io_wait(struct guanaco_io *io, struct guanaco_io_job *job);

/*
 * Stops issuing the job's chunks, waits for those in flight, and gives each
 * request that is not complete the result -ECANCELED (a request already
 * complete keeps its result). Returns the number of bytes that were read
 * into place in complete requests, i.e. the job's useful work.
 */
uint64_t guanaco_io_cancel(struct guanaco_io *io, struct guanaco_io_job *job);

/* Frees the object; NULL is accepted. No job may be queued or running. */
void guanaco_io_destroy(struct guanaco_io *io);

const char *guanaco_io_backend_name(enum guanaco_io_backend backend);

/*
 * Fault injection for tests, one-shot: the first read (of the next batches)
 * covering byte after_bytes of a batch -- bytes numbered across the batch's
 * requests in order, as if concatenated -- completes with `error` instead of
 * its real result, then the fault disarms. error is one of:
 *   -errno                  the read fails with it (-EINTR and -EAGAIN are
 *                           retried like real ones, so they must not fail the batch)
 *   GUANACO_IO_FAULT_SHORT  the read returns only the bytes before that byte
 *                           (at least one; whole blocks on O_DIRECT), which
 *                           must be continued transparently
 *   GUANACO_IO_FAULT_EOF    the read returns 0, as at end of file: -ENODATA
 *   0                       disarms a pending fault
 */
#define GUANACO_IO_FAULT_SHORT 1
#define GUANACO_IO_FAULT_EOF 2
void guanaco_io_inject_fault(struct guanaco_io *io, uint64_t after_bytes, int error);

#endif
