/*
 * weights.c - owns the deterministic weights: every value is a pure function
 * of --seed, the tensor name and the row, so write order, chunking and the
 * thread count never change a byte.
 */

#include "mkmodel.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t tensor_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        h = (h ^ *c) * 0x100000001B3ull;
    }
    uint64_t mix = seed ^ h;
    return splitmix64(&mix);
}

/* Each row gets its own stream, so a row's values never depend on how the
 * tensor is chunked or which thread generates it. Values are
 * offset + scale * u with u uniform in [-1, 1). */
static void random_row(float *dst, int64_t n, uint64_t tseed, int64_t row, float offset, float scale) {
    uint64_t state = tseed ^ ((uint64_t)row * 0xD1B54A32D192ED03ull);
    const float k = scale * (1.0f / 2147483648.0f);
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        const uint64_t r = splitmix64(&state);
        dst[i]     = offset + k * (float)(int32_t)(uint32_t)r;
        dst[i + 1] = offset + k * (float)(int32_t)(uint32_t)(r >> 32);
    }
    if (i < n) {
        dst[i] = offset + k * (float)(int32_t)(uint32_t)splitmix64(&state);
    }
}

void fill_rows(float *dst, const struct tensor_spec *t, uint64_t tseed,
                      int64_t row0, int64_t n_rows) {
    const int64_t n = t->ne[0];
    float offset = 0.0f;
    float scale;
    switch (t->kind) {
        case T_NORM:  offset = 1.0f;  scale = 0.05f; break;
        case T_BIAS:                  scale = 0.02f; break;
        case T_SSM_A: offset = -0.5f; scale = 0.4f;  break; /* negative: stable decay */
        case T_CONV:                  scale = 0.5f;  break;
        /* uniform with std 1/sqrt(fan_in): activations keep their scale */
        default:                      scale = sqrtf(3.0f / (float)n); break;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        random_row(dst + r * n, n, tseed, row0 + r, offset, scale);
    }
}
