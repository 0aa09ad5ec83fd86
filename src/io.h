/*
 * io.h - owns exact, large, parallel reads from files into caller memory:
 * the engine hands over a batch of (fd, offset, length, destination) and gets
 * back every byte or an error per request. Two backends behind one API:
 * io_uring, and a pthread pool doing pread(2) for systems where io_uring is
 * missing or blocked (seccomp, io_uring_disabled).
 *
 * Ownership: the caller owns the requests and their destinations; the batch
 * call borrows them and is done with them when it returns (no read into a
 * destination happens after that). One guanaco_io runs one batch at a time:
 * it is not safe to call guanaco_io_read_batch on the same object from two
 * threads at once.
 */
#ifndef GUANACO_IO_H
#define GUANACO_IO_H

#include <stddef.h>
#include <stdint.h>

enum guanaco_io_backend { GUANACO_IO_URING, GUANACO_IO_THREADS };

/* Offsets, lengths and destinations on an O_DIRECT fd must be multiples of this. */
#define GUANACO_IO_DIRECT_ALIGNMENT 4096u

/* Limits checked by guanaco_io_create. */
#define GUANACO_IO_MAX_QUEUE_DEPTH 1024u
#define GUANACO_IO_MAX_CHUNK_BYTES (1u << 30) /* below Linux's 0x7ffff000 cap on one read */

struct guanaco_io_request {
    int fd;
    uint64_t offset;
    uint64_t length;
    void *destination;
    int result; /* 0 or -errno, filled on completion */
};

struct guanaco_io;

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

/* Frees the object; NULL is accepted. No batch may be running. */
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
