/*
 * expert_repack.h - owns running streamed experts on ggml-cpu's repacked
 * kernels: on x86, llama.cpp moves Q4_0, Q4_K, IQ4_NL and MXFP4 weights (and
 * Q2_K with AVX-512) into CPU_REPACK buffers, whose interleaved rows run
 * 10-30% faster than the file's layout (issue 9).
 *
 * A streamed expert tensor cannot be repacked at load: its bytes are read
 * from the file on demand. So each such tensor gets an arena, anonymous
 * memory of the tensor's size that is reserved but not committed, and the
 * tensor is pointed at it with ggml's CPU_REPACK buffer type and the tensor
 * traits ggml chose for it. ggml-cpu then runs its MUL_MAT_ID through the
 * repacked kernel, which reads only the selected experts' slices. The
 * residency engine fills one expert's slice at a time: it reads the file's
 * bytes and calls guanaco_expert_repack_transform, which hands a one-expert
 * view of the tensor to ggml's own repack code (ggml_backend_tensor_set on a
 * CPU_REPACK tensor). Interleaving groups rows inside one expert (a slice is
 * a whole set of rows), so a slice repacked alone equals the same bytes of
 * the whole tensor repacked at once: the logits equal plain llama.cpp's
 * default, bit for bit.
 *
 * Only the public ggml API is used for the arena and the repack. With
 * fixed slots (residency.h) the repacked expert lives in a slot instead, and
 * the repacked MUL_MAT_ID asks where, through patch 0006's
 * ggml_cpu_expert_weights_wait: the only glue.
 */
#ifndef GUANACO_EXPERT_REPACK_H
#define GUANACO_EXPERT_REPACK_H

#include <stdbool.h>
#include <stdint.h>

struct ggml_tensor;
struct guanaco_expert_repack;

/* 0 and *out NULL when this ggml has no CPU_REPACK buffer type (not x86/ARM, or a build without it);
   0 with an object; -ENOMEM. */
int guanaco_expert_repack_create(struct guanaco_expert_repack **out);

/*
 * If ggml repacks `tensor` (an expert tensor, [n_in, n_out, n_expert]) on
 * this CPU: reserves its arena and points the tensor at it (data, buffer,
 * extra), so that from now on ggml computes it with the repacked kernel;
 * *arena is the arena's first byte, page aligned, all of it zero until
 * slices are transformed into it. *arena NULL (and the tensor unchanged)
 * when its type or shape has no repacked kernel here. 0 or -ENOMEM.
 */
int guanaco_expert_repack_adopt(struct guanaco_expert_repack *repack, struct ggml_tensor *tensor, char **arena);

/*
 * The residency engine's transform (guanaco_residency_tensor.transform):
 * writes expert `expert` of `tensor` (an adopted struct ggml_tensor *), read
 * from the file into `source` (one expert's bytes), repacked into
 * `destination` (its slice of the arena). 0, or -EINVAL for an expert out of
 * range.
 */
int guanaco_expert_repack_transform(void *tensor, uint32_t expert, const void *source, void *destination);

/* Whether ggml repacks `tensor` on this CPU: what adopt would do, without adopting. */
bool guanaco_expert_repack_applies(const struct guanaco_expert_repack *repack, const struct ggml_tensor *tensor);

/*
 * Expert `expert` of `tensor` (not adopted: only its type and shape count),
 * the file's bytes at `source`, written in ggml's repacked layout to
 * `destination`: what the engine would compute from. 1, 0 when the tensor
 * keeps the file's layout here (nothing written), or -EINVAL. For the repack
 * cache (repack_cache.h): its tool, and the engine's check of a cache.
 */
int guanaco_expert_repack_layout(const struct guanaco_expert_repack *repack, const struct ggml_tensor *tensor,
                                 uint32_t expert, const void *source, void *destination);

/* Unmaps every arena and frees the object; NULL is accepted. The tensors must not compute again. */
void guanaco_expert_repack_destroy(struct guanaco_expert_repack *repack);

#endif
