/*
 * test_imatrix_reader.c - owns the unit tests of the imatrix prior
 * (src/imatrix.h) and of guanaco_policy_seed: counts read and normalised
 * from GGUF files written the way llama-imatrix writes them (the same gguf
 * calls, tools/imatrix/imatrix.cpp), every kind of bad input refused with a
 * message naming the flag and the file, the preload's choice rule against a
 * brute-force reference, and a seeded policy keeping what the prior says is
 * hot. Usage: test_imatrix_reader [SCRATCH_DIR]
 */
#include "check.h"
#include "imatrix.h"
#include "policy.h"

#include "ggml.h"
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_LAYER 4
#define N_EXPERT 8
#define IN_DIM 16

static char dir[4096];

/* A qwen3moe-like manifest: layer 0 dense, layers 1..3 with gate, up and down expert tensors. */
static void make_manifest(struct guanaco_manifest *m, struct guanaco_expert_tensor *tensors) {
    memset(m, 0, sizeof(*m));
    snprintf(m->arch, sizeof(m->arch), "qwen3moe");
    m->n_layer = N_LAYER;
    m->n_expert = N_EXPERT;
    m->n_expert_used = 2;
    m->n_moe_layers = 3;
    static const char *const kinds[] = {"ffn_down_exps", "ffn_gate_exps", "ffn_up_exps"}; /* name order */
    size_t n = 0;
    for (int layer = 1; layer < N_LAYER; layer++) {
        for (int k = 0; k < 3; k++) {
            struct guanaco_expert_tensor *t = &tensors[n++];
            memset(t, 0, sizeof(*t));
            snprintf(t->name, sizeof(t->name), "blk.%d.%s.weight", layer, kinds[k]);
            t->layer = layer;
            t->expert_stride = 4096;
            t->nbytes = 4096 * N_EXPERT;
        }
    }
    m->tensors = tensors;
    m->n_tensors = n;
}

struct entry {
    const char *weight;  /* e.g. blk.1.ffn_down_exps.weight */
    const float *counts; /* n_counts values */
    int n_counts;
};

/* Writes an imatrix GGUF as llama-imatrix does: general.type, datasets, chunks, then in_sum2 + counts per entry. */
static void write_imatrix(const char *path, const char *type, const struct entry *entries, int n_entries) {
    size_t size = 0;
    for (int i = 0; i < n_entries; i++) {
        size += 2 * ggml_tensor_overhead() + sizeof(float) * (size_t)entries[i].n_counts * (IN_DIM + 1) + 64;
    }
    struct ggml_init_params params = {.mem_size = size + 1024, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(params);
    struct gguf_context *gguf = gguf_init_empty();
    gguf_set_val_str(gguf, "general.type", type);
    const char *datasets[] = {"text.txt"};
    gguf_set_arr_str(gguf, "imatrix.datasets", datasets, 1);
    gguf_set_val_u32(gguf, "imatrix.chunk_count", 4);
    gguf_set_val_u32(gguf, "imatrix.chunk_size", 64);
    for (int i = 0; i < n_entries; i++) {
        int nmat = entries[i].n_counts;
        struct ggml_tensor *in_sum2 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, IN_DIM, nmat);
        struct ggml_tensor *counts = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, nmat);
        ggml_format_name(in_sum2, "%s.in_sum2", entries[i].weight);
        ggml_format_name(counts, "%s.counts", entries[i].weight);
        for (int j = 0; j < IN_DIM * nmat; j++) {
            ((float *)in_sum2->data)[j] = 1.0f;
        }
        memcpy(counts->data, entries[i].counts, sizeof(float) * (size_t)nmat);
        gguf_add_tensor(gguf, in_sum2);
        gguf_add_tensor(gguf, counts);
    }
    CHECK(gguf_write_to_file(gguf, path, false));
    gguf_free(gguf);
    ggml_free(ctx);
}

static void path_of(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", dir, name); }

/* Loads `path` with stderr captured; returns the result and fills `message` with what was printed. */
static int load_capturing(const char *path, const struct guanaco_manifest *m, struct guanaco_imatrix_prior *prior,
                          char *message, size_t size) {
    char log_path[4200];
    path_of(log_path, sizeof(log_path), "stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    int err = guanaco_imatrix_load(path, m, prior);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(log_path, "r");
    size_t n = f ? fread(message, 1, size - 1, f) : 0;
    message[n] = '\0';
    if (f) {
        fclose(f);
    }
    return err;
}

/* A bad file: the expected error, and a message naming the flag, the file and `why`. */
static void expect_refused(const char *path, const struct guanaco_manifest *m, int expected, const char *why) {
    struct guanaco_imatrix_prior prior;
    char message[4096];
    int err = load_capturing(path, m, &prior, message, sizeof(message));
    CHECK(err == expected);
    CHECK(strstr(message, "--guanaco-imatrix") != NULL);
    CHECK(strstr(message, path) != NULL);
    CHECK(strstr(message, why) != NULL);
    CHECK(prior.weight == NULL && prior.has_prior == NULL); /* nothing left to free */
    if (err != expected || !strstr(message, why)) {
        fprintf(stderr, "  (%s: got %d, expected %d; message: %s)\n", path, err, expected, message);
    }
}

static const float layer1[N_EXPERT] = {10, 0, 30, 5, 5, 40, 0, 10}; /* 100 routings */
static const float layer2[N_EXPERT] = {1, 1, 1, 1, 1, 1, 1, 1};
static const float zeros[N_EXPERT] = {0};

static void test_good_file(const struct guanaco_manifest *m) {
    char path[4200];
    path_of(path, sizeof(path), "good.imatrix.gguf");
    const float attention[1] = {256};
    struct entry entries[] = {
        {"blk.0.attn_q.weight", attention, 1},     /* not routed: ignored */
        {"blk.1.ffn_down_exps.weight", layer1, N_EXPERT},
        {"blk.1.ffn_gate_exps.weight", layer1, N_EXPERT},
        {"blk.1.ffn_up_exps.weight", layer1, N_EXPERT},
        {"blk.2.ffn_down_exps.weight", layer2, N_EXPERT},
        {"blk.3.ffn_up_exps.weight", zeros, N_EXPERT}, /* never routed to: no prior */
    };
    write_imatrix(path, "imatrix", entries, (int)(sizeof(entries) / sizeof(entries[0])));
    struct guanaco_imatrix_prior prior;
    char message[4096];
    int err = load_capturing(path, m, &prior, message, sizeof(message));
    CHECK(err == 0);
    if (err != 0) {
        fprintf(stderr, "  good file refused: %s\n", message);
        return;
    }
    CHECK(prior.n_layer == N_LAYER && prior.n_expert == N_EXPERT);
    CHECK(prior.n_layers_with_prior == 2);
    CHECK(guanaco_imatrix_layer(&prior, 0) == NULL); /* dense */
    CHECK(guanaco_imatrix_layer(&prior, 3) == NULL); /* only zeros */
    CHECK(guanaco_imatrix_layer(&prior, 4) == NULL); /* out of range */
    CHECK(guanaco_imatrix_layer(NULL, 1) == NULL);
    const float *w1 = guanaco_imatrix_layer(&prior, 1), *w2 = guanaco_imatrix_layer(&prior, 2);
    CHECK(w1 != NULL && w2 != NULL);
    for (int e = 0; w1 && w2 && e < N_EXPERT; e++) {
        CHECK(fabsf(w1[e] - layer1[e] / 100.0f) < 1e-6f);
        CHECK(fabsf(w2[e] - 1.0f / N_EXPERT) < 1e-6f);
    }
    CHECK(prior.routings[1] == 100 && prior.routings[2] == 8 && prior.routings[3] == 0);
    /* said once which MoE layer has no prior */
    CHECK(strstr(message, "no routing counts for MoE layer 3") != NULL);
    CHECK(strstr(message, "layer 0") == NULL);
    guanaco_imatrix_free(&prior);
    CHECK(prior.weight == NULL);
    guanaco_imatrix_free(&prior); /* twice is harmless */

    /* a truncated copy: the header parses, the counts are past the end */
    char cut[4200];
    path_of(cut, sizeof(cut), "truncated.imatrix.gguf");
    struct stat st;
    CHECK(stat(path, &st) == 0);
    FILE *in = fopen(path, "rb"), *out = fopen(cut, "wb");
    char *bytes = malloc((size_t)st.st_size);
    CHECK(in && out && bytes && fread(bytes, 1, (size_t)st.st_size, in) == (size_t)st.st_size);
    CHECK(fwrite(bytes, 1, (size_t)st.st_size - 40, out) == (size_t)st.st_size - 40);
    fclose(in);
    fclose(out);
    expect_refused(cut, m, -EIO, "truncated");
    /* cut inside the header: gguf cannot parse it */
    out = fopen(cut, "wb");
    CHECK(out && fwrite(bytes, 1, 100, out) == 100);
    fclose(out);
    expect_refused(cut, m, -EINVAL, "not a readable GGUF");
    free(bytes);
}

static void test_bad_files(const struct guanaco_manifest *m) {
    char path[4200];
    path_of(path, sizeof(path), "does-not-exist.gguf");
    expect_refused(path, m, -ENOENT, "No such file");
    expect_refused(dir, m, -EINVAL, "not a regular file");

    path_of(path, sizeof(path), "fifo.gguf");
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0);
    expect_refused(path, m, -EINVAL, "not a regular file"); /* at once: no writer is waited for */
    unlink(path);

    path_of(path, sizeof(path), "empty.gguf");
    FILE *f = fopen(path, "wb");
    fclose(f);
    expect_refused(path, m, -EINVAL, "empty");

    path_of(path, sizeof(path), "text.gguf");
    f = fopen(path, "wb");
    fputs("this is not a gguf file at all, just some text\n", f);
    fclose(f);
    expect_refused(path, m, -EINVAL, "not a GGUF file");

    /* the legacy format, laid out as save_imatrix_legacy writes it */
    path_of(path, sizeof(path), "legacy.dat");
    f = fopen(path, "wb");
    const char *name = "blk.1.ffn_down_exps.weight";
    int32_t entries = 1, len = (int32_t)strlen(name), ncall = 4, nval = IN_DIM * N_EXPERT, last_chunk = 4;
    fwrite(&entries, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite(name, 1, (size_t)len, f);
    fwrite(&ncall, 4, 1, f);
    fwrite(&nval, 4, 1, f);
    for (int i = 0; i < nval; i++) {
        float v = 1.0f;
        fwrite(&v, 4, 1, f);
    }
    fwrite(&last_chunk, 4, 1, f);
    fclose(f);
    expect_refused(path, m, -EINVAL, "legacy .dat");

    /* the model itself, or any GGUF that is not an imatrix */
    path_of(path, sizeof(path), "model-type.gguf");
    struct entry one[] = {{"blk.1.ffn_down_exps.weight", layer1, N_EXPERT}};
    write_imatrix(path, "model", one, 1);
    expect_refused(path, m, -EINVAL, "not an imatrix");
    /* a GGUF without general.type and without counts (mkmodel's models, older converters) */
    path_of(path, sizeof(path), "untyped.gguf");
    struct gguf_context *untyped = gguf_init_empty();
    gguf_set_val_str(untyped, "general.architecture", "qwen3moe");
    CHECK(gguf_write_to_file(untyped, path, false));
    gguf_free(untyped);
    expect_refused(path, m, -EINVAL, "no <weight>.counts tensors");

    /* another model: more experts, a layer it does not have, a dense layer of this one, another tensor */
    float sixteen[16] = {1, 2, 3};
    struct entry wide[] = {{"blk.1.ffn_down_exps.weight", sixteen, 16}};
    path_of(path, sizeof(path), "wide.gguf");
    write_imatrix(path, "imatrix", wide, 1);
    expect_refused(path, m, -EINVAL, "16 experts but this model has 8");

    struct entry deep[] = {{"blk.1.ffn_down_exps.weight", layer1, N_EXPERT},
                           {"blk.7.ffn_down_exps.weight", layer1, N_EXPERT}};
    path_of(path, sizeof(path), "deep.gguf");
    write_imatrix(path, "imatrix", deep, 2);
    expect_refused(path, m, -EINVAL, "another model");

    struct entry dense[] = {{"blk.0.ffn_down_exps.weight", layer1, N_EXPERT}};
    path_of(path, sizeof(path), "dense-layer.gguf");
    write_imatrix(path, "imatrix", dense, 1);
    expect_refused(path, m, -EINVAL, "blk.0.ffn_down_exps.weight");

    struct entry fused[] = {{"blk.1.ffn_gate_up_exps.weight", layer1, N_EXPERT}};
    path_of(path, sizeof(path), "fused.gguf");
    write_imatrix(path, "imatrix", fused, 1);
    expect_refused(path, m, -EINVAL, "another model");

    /* absurd counts */
    const float bad_values[] = {-1.0f, NAN, INFINITY, 1.5f, 1e30f};
    for (size_t i = 0; i < sizeof(bad_values) / sizeof(bad_values[0]); i++) {
        float counts[N_EXPERT] = {1, 2, 3, 4, 5, 6, 7, 8};
        counts[3] = bad_values[i];
        struct entry absurd[] = {{"blk.2.ffn_up_exps.weight", counts, N_EXPERT}};
        path_of(path, sizeof(path), "absurd.gguf");
        write_imatrix(path, "imatrix", absurd, 1);
        expect_refused(path, m, -EINVAL, "is not a count of routings");
    }

    /* gate and down of one layer saw the same routing: a disagreement is a damaged file */
    float other[N_EXPERT] = {10, 0, 30, 5, 5, 40, 1, 10};
    struct entry disagree[] = {{"blk.1.ffn_down_exps.weight", layer1, N_EXPERT},
                               {"blk.1.ffn_gate_exps.weight", other, N_EXPERT}};
    path_of(path, sizeof(path), "disagree.gguf");
    write_imatrix(path, "imatrix", disagree, 2);
    expect_refused(path, m, -EINVAL, "disagree on expert 6");

    /* nothing routed anywhere: no prior at all is an error, not a silent no-op */
    const float attention[1] = {256};
    struct entry none[] = {{"blk.0.attn_q.weight", attention, 1}, {"blk.1.ffn_up_exps.weight", zeros, N_EXPERT}};
    path_of(path, sizeof(path), "no-experts.gguf");
    write_imatrix(path, "imatrix", none, 2);
    expect_refused(path, m, -EINVAL, "no routing counts for any expert tensor");

    /* one count for all experts (a GGUF converted from .dat): that layer has no per-expert prior */
    const float single[1] = {512};
    struct entry converted[] = {{"blk.1.ffn_down_exps.weight", single, 1}, {"blk.2.ffn_down_exps.weight", layer2, N_EXPERT}};
    path_of(path, sizeof(path), "converted.gguf");
    write_imatrix(path, "imatrix", converted, 2);
    struct guanaco_imatrix_prior prior;
    char message[4096];
    CHECK(load_capturing(path, m, &prior, message, sizeof(message)) == 0);
    CHECK(guanaco_imatrix_layer(&prior, 1) == NULL && guanaco_imatrix_layer(&prior, 2) != NULL);
    CHECK(strstr(message, "MoE layers 1, 3") != NULL);
    guanaco_imatrix_free(&prior);
}

/* The rule by brute force: sort every expert by (weight desc, id asc), keep n, list them in reverse (without
   weights: by id). */
static uint32_t reference_choice(const float *w, uint32_t n_expert, const uint8_t *skip, uint32_t n, uint32_t *out) {
    uint32_t order[64], count = 0;
    for (uint32_t e = 0; e < n_expert; e++) {
        if (!skip || !skip[e]) {
            order[count++] = e;
        }
    }
    for (uint32_t i = 1; i < count; i++) { /* insertion sort, best first */
        for (uint32_t j = i; j > 0; j--) {
            uint32_t a = order[j - 1], b = order[j];
            float wa = w ? w[a] : 0, wb = w ? w[b] : 0;
            if (wb > wa || (wb == wa && b < a)) {
                order[j - 1] = b;
                order[j] = a;
            }
        }
    }
    count = count < n ? count : n;
    for (uint32_t i = 0; i < count; i++) {
        out[i] = w ? order[count - 1 - i] : order[i];
    }
    return count;
}

static void test_choice(void) {
    uint32_t out[16];
    const float w[6] = {0.1f, 0.3f, 0.3f, 0.0f, 0.2f, 0.1f};
    /* top 3: 1 and 2 (tied at 0.3, 1 preferred), then 4; handed over least preferred first, the best last */
    CHECK(guanaco_prior_preload_choice(w, 6, NULL, 3, out) == 3);
    CHECK(out[0] == 4 && out[1] == 2 && out[2] == 1);
    /* a tie at the cut goes to the lower id: 0 over 5 */
    CHECK(guanaco_prior_preload_choice(w, 6, NULL, 5, out) == 5);
    CHECK(out[0] == 5 && out[1] == 0 && out[2] == 4 && out[3] == 2 && out[4] == 1);
    CHECK(guanaco_prior_preload_choice(w, 6, NULL, 4, out) == 4);
    CHECK(out[0] == 0 && out[1] == 4 && out[2] == 2 && out[3] == 1);
    /* a warm start's experts are skipped and not counted */
    const uint8_t skip[6] = {0, 1, 0, 0, 0, 0};
    CHECK(guanaco_prior_preload_choice(w, 6, skip, 3, out) == 3);
    CHECK(out[0] == 0 && out[1] == 4 && out[2] == 2);
    /* no prior: the lowest-numbered, ascending, as the preload always did */
    CHECK(guanaco_prior_preload_choice(NULL, 6, NULL, 3, out) == 3);
    CHECK(out[0] == 0 && out[1] == 1 && out[2] == 2);
    CHECK(guanaco_prior_preload_choice(NULL, 6, skip, 3, out) == 3);
    CHECK(out[0] == 0 && out[1] == 2 && out[2] == 3);
    /* bounds */
    CHECK(guanaco_prior_preload_choice(w, 6, NULL, 0, out) == 0);
    CHECK(guanaco_prior_preload_choice(w, 6, NULL, 16, out) == 6);
    CHECK(out[0] == 3 && out[1] == 5 && out[5] == 1);
    CHECK(guanaco_prior_preload_choice(w, 6, NULL, 3, NULL) == 0);
    /* against brute force on random weights with many ties */
    srand(7);
    int mismatches = 0;
    for (int trial = 0; trial < 2000; trial++) {
        uint32_t n_expert = 1 + (uint32_t)(rand() % 40), n = (uint32_t)(rand() % 45);
        float weights[64];
        uint8_t flags[64];
        for (uint32_t e = 0; e < n_expert; e++) {
            weights[e] = (float)(rand() % 5) / 4.0f;
            flags[e] = rand() % 6 == 0;
        }
        uint32_t got[64], want[64];
        const uint8_t *s = trial % 2 ? flags : NULL;
        uint32_t n_got = guanaco_prior_preload_choice(trial % 7 ? weights : NULL, n_expert, s, n, got);
        uint32_t n_want = reference_choice(trial % 7 ? weights : NULL, n_expert, s, n, want);
        mismatches += n_got != n_want || memcmp(got, want, n_got * sizeof(*got)) != 0;
    }
    CHECK(mismatches == 0);
}

/*
 * Two layers of 4 experts, room for 3: layer 0 takes {0, 1, 2}, then layer 1
 * takes {0}, so one of layer 0's goes. Every access is at the same time, so
 * without a prior the counts tie and the lowest id goes (expert 0); with
 * rates {0.9, 0.1, 0.5, 0} the coldest by prior goes (expert 1).
 */
static uint32_t victim_after(enum guanaco_policy_kind kind, const double *rate) {
    const uint64_t bytes[2] = {100, 100};
    struct guanaco_policy_config config = {.kind = kind, .n_layer = 2, .n_expert = 4, .expert_bytes = bytes,
                                           .budget_bytes = 300};
    struct guanaco_policy *p = NULL;
    if (guanaco_policy_create(&config, &p) != 0) {
        return UINT32_MAX;
    }
    if (rate) {
        guanaco_policy_seed(p, 0, rate);
        guanaco_policy_seed(p, 7, rate); /* out of range: ignored */
    }
    uint32_t missing[4], victim_layers[4], victim_experts[4];
    size_t n_missing = 0, n_victims = 0;
    const uint32_t first[3] = {0, 1, 2}, second[1] = {0};
    uint32_t victim = UINT32_MAX;
    if (guanaco_policy_access(p, 0, first, 3, 0, missing, &n_missing) == 0 &&
        guanaco_policy_evict(p, 0, victim_layers, victim_experts, 4, &n_victims) == 0 && n_victims == 0 &&
        guanaco_policy_access(p, 1, second, 1, 0, missing, &n_missing) == 0 &&
        guanaco_policy_evict(p, 1, victim_layers, victim_experts, 4, &n_victims) == 0 && n_victims == 1 &&
        victim_layers[0] == 0) {
        victim = victim_experts[0];
    }
    guanaco_policy_free(p);
    return victim;
}

static void test_policy_seed(void) {
    const double rate[4] = {0.9, 0.1, 0.5, 0.0};
    CHECK(victim_after(GUANACO_POLICY_LFU, NULL) == 0);
    CHECK(victim_after(GUANACO_POLICY_LFU, rate) == 1);
    CHECK(victim_after(GUANACO_POLICY_GUANACO, NULL) == 0);
    CHECK(victim_after(GUANACO_POLICY_GUANACO, rate) == 1); /* its cold-first score starts from the prior */
    /* recency-only kinds keep recency: the seed changes nothing (the preload's order is their prior) */
    CHECK(victim_after(GUANACO_POLICY_LAYER_LRU, NULL) == victim_after(GUANACO_POLICY_LAYER_LRU, rate));
    CHECK(victim_after(GUANACO_POLICY_LRU, NULL) == victim_after(GUANACO_POLICY_LRU, rate));
    /* absurd rates are ignored, not believed */
    const double absurd[4] = {INFINITY, NAN, -1.0, 0.0};
    CHECK(victim_after(GUANACO_POLICY_LFU, absurd) == 1); /* only expert 0 (clamped to 1) was seeded */
    CHECK(victim_after(GUANACO_POLICY_GUANACO, absurd) == 1);
}

int main(int argc, char **argv) {
    snprintf(dir, sizeof(dir), "%s/imatrix-reader", argc > 1 ? argv[1] : "/tmp");
    mkdir(argc > 1 ? argv[1] : "/tmp", 0755);
    mkdir(dir, 0755);
    struct guanaco_manifest manifest;
    struct guanaco_expert_tensor tensors[9];
    make_manifest(&manifest, tensors);
    test_good_file(&manifest);
    test_bad_files(&manifest);
    test_choice();
    test_policy_seed();
    return check_summary();
}
