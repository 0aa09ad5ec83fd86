/*
 * expert_repack.c - owns the arenas of repacked expert tensors and the
 * handover of one expert's bytes to ggml's repack code (expert_repack.h).
 */
#include "expert_repack.h"
#include "log.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct arena {
    void *base;
    size_t length;
};

struct guanaco_expert_repack {
    ggml_backend_buffer_type_t buffer_type; /* ggml-cpu's CPU_REPACK */
    /* A CPU_REPACK buffer that owns no tensor's memory: each adopted tensor names it as its buffer, which is
       what ggml-cpu checks before it runs the repacked kernel, and its set_tensor is ggml's repack. */
    ggml_backend_buffer_t buffer;
    struct arena *arenas;
    size_t n_arenas, arena_capacity;
};

static ggml_backend_buffer_type_t find_repack_buffer_type(void) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = cpu ? ggml_backend_dev_backend_reg(cpu) : NULL;
    ggml_backend_dev_get_extra_bufts_t extra_buffer_types =
        reg ? (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
            : NULL;
    ggml_backend_buffer_type_t *types = extra_buffer_types ? extra_buffer_types(cpu) : NULL;
    for (size_t i = 0; types && types[i]; i++) {
        if (strcmp(ggml_backend_buft_name(types[i]), "CPU_REPACK") == 0) {
            return types[i];
        }
    }
    return NULL;
}

int guanaco_expert_repack_create(struct guanaco_expert_repack **out) {
    *out = NULL;
    ggml_backend_buffer_type_t type = find_repack_buffer_type();
    if (!type) {
        return 0;
    }
    struct guanaco_expert_repack *repack = calloc(1, sizeof(*repack));
    if (!repack) {
        return -ENOMEM;
    }
    repack->buffer_type = type;
    repack->buffer = ggml_backend_buft_alloc_buffer(type, (size_t)sysconf(_SC_PAGESIZE));
    if (!repack->buffer) {
        free(repack);
        return -ENOMEM;
    }
    ggml_backend_buffer_set_usage(repack->buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    *out = repack;
    return 0;
}

/* ggml's own choice of repacked layout for this type, shape and CPU, as its buffer would make at load: *probe is
   the tensor as adopted (its extra and buffer set, its data not), or false when it keeps the file's layout. */
static bool probe_layout(const struct guanaco_expert_repack *repack, const struct ggml_tensor *tensor,
                         struct ggml_tensor *probe) {
    if (!repack || ggml_n_dims(tensor) != 3 || !ggml_is_contiguous(tensor) || tensor->ne[0] % 8 != 0) {
        return false; /* ggml's repack needs whole interleave groups of rows; a bias or an odd shape stays as it is */
    }
    *probe = *tensor;
    probe->extra = NULL;
    if (ggml_backend_buffer_init_tensor(repack->buffer, probe) != GGML_STATUS_SUCCESS || !probe->extra) {
        return false;
    }
    probe->buffer = repack->buffer;
    return true;
}

bool guanaco_expert_repack_applies(const struct guanaco_expert_repack *repack, const struct ggml_tensor *tensor) {
    struct ggml_tensor probe;
    return probe_layout(repack, tensor, &probe);
}

int guanaco_expert_repack_layout(const struct guanaco_expert_repack *repack, const struct ggml_tensor *tensor,
                                 uint32_t expert, const void *source, void *destination) {
    struct ggml_tensor probe;
    if (!probe_layout(repack, tensor, &probe)) {
        return 0;
    }
    int err = guanaco_expert_repack_transform(&probe, expert, source, destination);
    return err ? err : 1;
}

int guanaco_expert_repack_adopt(struct guanaco_expert_repack *repack, struct ggml_tensor *tensor, char **arena) {
    *arena = NULL;
    struct ggml_tensor probe;
    if (!probe_layout(repack, tensor, &probe)) {
        return 0;
    }
    if (repack->n_arenas == repack->arena_capacity) {
        size_t capacity = repack->arena_capacity ? 2 * repack->arena_capacity : 64;
        struct arena *grown = realloc(repack->arenas, capacity * sizeof(*grown));
        if (!grown) {
            return -ENOMEM;
        }
        repack->arenas = grown;
        repack->arena_capacity = capacity;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t length = (ggml_nbytes(tensor) + page - 1) / page * page;
    /* Reserved, not committed: only the slices the residency engine fills take memory. */
    void *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        int err = -errno;
        guanaco_log_error("no address space for the repacked expert tensor %s (%zu bytes): %s", tensor->name,
                          length, strerror(-err));
        return err;
    }
    /* A huge page would commit 2 MiB for one slice and the budget would no longer be the RAM it costs. */
    (void)madvise(base, length, MADV_NOHUGEPAGE);
    repack->arenas[repack->n_arenas++] = (struct arena){base, length};
    tensor->data = base;
    tensor->buffer = repack->buffer;
    tensor->extra = probe.extra;
    *arena = base;
    return 0;
}

int guanaco_expert_repack_transform(void *context, uint32_t expert, const void *source, void *destination) {
    const struct ggml_tensor *tensor = context;
    if ((int64_t)expert >= tensor->ne[2]) {
        return -EINVAL;
    }
    /* One expert as a tensor of its own: ggml's repack works on whole tensors and writes to view.data. */
    struct ggml_tensor view = *tensor;
    view.ne[2] = 1;
    view.nb[3] = view.nb[2];
    view.view_src = NULL;
    view.data = destination;
    ggml_backend_tensor_set(&view, source, 0, ggml_nbytes(&view));
    return 0;
}

void guanaco_expert_repack_destroy(struct guanaco_expert_repack *repack) {
    if (!repack) {
        return;
    }
    for (size_t i = 0; i < repack->n_arenas; i++) {
        munmap(repack->arenas[i].base, repack->arenas[i].length);
    }
    free(repack->arenas);
    ggml_backend_buffer_free(repack->buffer);
    free(repack);
}
