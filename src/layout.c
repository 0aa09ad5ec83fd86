/*
 * layout.c - owns the one decision Guanaco makes about where llama.cpp puts a
 * weight: which tensors must keep the file's layout (llama.cpp's plain CPU
 * buffer type) instead of llama.cpp's own choice, which on x86 moves Q4_0,
 * Q4_K, IQ4_NL and MXFP4 weights into CPU_REPACK buffers with interleaved
 * rows and faster kernels.
 *
 * Streamed experts must stay as they are in the file, because they are read
 * from the file mapping on demand. Every other weight (attention, shared
 * experts, embeddings, output) is loaded once, so it keeps llama.cpp's choice
 * and its repacked kernels. The repacked and file-layout kernels sum in a
 * different order, so streaming's logits equal plain llama.cpp's only when the
 * experts there keep the file's layout too: that is --guanaco-reference.
 */
#include "guanaco.h"
#include "manifest.h"

bool guanaco_weight_keeps_file_layout(const struct guanaco_engine *engine, const char *tensor_name) {
    if (guanaco_engine_is_expert_tensor(engine, tensor_name)) {
        return true; /* streamed */
    }
    if (!guanaco_tensor_name_is_expert(tensor_name, NULL)) {
        return false;
    }
    /* The loader already failed on invalid options (guanaco_engine_open reads them first). */
    struct guanaco_options options;
    return guanaco_options_get(&options) == 0 && options.reference;
}
