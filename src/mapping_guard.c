/*
 * mapping_guard.c - owns what happens when the model file shrinks under its
 * mapping while llama.cpp computes: the next read past the new end of file
 * raises SIGBUS, in whichever thread touches it first (an expert matmul, or a
 * non-expert one the engine never sees). The engine checks the file before
 * every layer it prepares, but a truncation can land between that check and
 * the matmul, and without a budget nothing is checked at all. The same fault
 * comes from a read the disk fails while a matmul waits for it, since with
 * --guanaco-overlap-layer the matmuls fault the missing experts' pages in.
 *
 * The handler turns that fault into an error that travels: when the address
 * lies in a guarded mapping, it maps zero pages from the faulting page to the
 * mapping's end, marks the owner's flag and returns, so the instruction reads
 * zeros and the graph finishes. The hook then fails that graph and every later
 * one (guanaco_hook_take_error), so no result computed from those zeros is ever
 * used, and llama.cpp reports the error. A fault anywhere else goes to the
 * handler that was there before, or gets the default action, as if this file
 * did not exist.
 *
 * Process-wide by nature (a signal handler is): the ranges live in a fixed
 * table the handler reads without locks.
 */
#include "mapping_guard.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_GUARDED 64

struct guarded {
    _Atomic uintptr_t begin, end; /* end 0: a free entry */
    _Atomic(_Atomic int *) faulted;
};

static struct guarded guarded[MAX_GUARDED];
static struct sigaction previous;
static uintptr_t page_size;
static bool installed;
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_sigbus(int signal_number, siginfo_t *info, void *context) {
    uintptr_t address = (uintptr_t)info->si_addr;
    for (int i = 0; i < MAX_GUARDED; i++) {
        uintptr_t begin = atomic_load(&guarded[i].begin), end = atomic_load(&guarded[i].end);
        if (address < begin || address >= end) {
            continue;
        }
        uintptr_t page = address & ~(page_size - 1);
        /* mmap is a plain system call: safe here in practice, though POSIX does not list it */
        void *zeros = mmap((void *)page, end - page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        _Atomic int *faulted = atomic_load(&guarded[i].faulted);
        if (zeros != MAP_FAILED) {
            atomic_store(faulted, 1);
            return;
        }
        break;
    }
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(signal_number, info, context);
    } else if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
        /* returning re-runs the faulting access, which now gets the default action: a core dump, as before */
        signal(SIGBUS, SIG_DFL);
    } else {
        previous.sa_handler(signal_number);
    }
}

int guanaco_mapping_guard_add(const void *begin, size_t bytes, _Atomic int *faulted) {
    if (!begin || bytes == 0 || !faulted) {
        return -EINVAL;
    }
    pthread_mutex_lock(&guard_lock);
    int err = 0;
    if (!installed) {
        long page = sysconf(_SC_PAGESIZE);
        page_size = page > 0 ? (uintptr_t)page : 4096;
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = on_sigbus;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGBUS, &action, &previous) != 0) {
            err = -errno;
        } else {
            installed = true;
        }
    }
    int slot = -1;
    for (int i = 0; i < MAX_GUARDED && err == 0 && slot < 0; i++) {
        if (atomic_load(&guarded[i].end) == 0) {
            slot = i;
        }
    }
    if (err == 0 && slot < 0) {
        err = -ENOSPC;
    }
    if (err == 0) {
        /* end last: the handler only looks at entries whose end is set */
        atomic_store(&guarded[slot].faulted, faulted);
        atomic_store(&guarded[slot].begin, (uintptr_t)begin);
        atomic_store(&guarded[slot].end, (uintptr_t)begin + bytes);
    }
    pthread_mutex_unlock(&guard_lock);
    return err;
}

void guanaco_mapping_guard_remove(const void *begin) {
    pthread_mutex_lock(&guard_lock);
    for (int i = 0; i < MAX_GUARDED; i++) {
        if (atomic_load(&guarded[i].end) != 0 && atomic_load(&guarded[i].begin) == (uintptr_t)begin) {
            atomic_store(&guarded[i].end, 0);
        }
    }
    pthread_mutex_unlock(&guard_lock);
}
