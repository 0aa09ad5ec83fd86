/*
 * metrics.c - owns Guanaco's counters in Prometheus's text format, for
 * llama-server's /metrics (--metrics): the engines that are open register
 * here, and one call renders all of them, so the server's glue is a single
 * line and holds no logic. Names are guanaco_*; counters end in _total, and
 * each engine's lines carry its model file as a label.
 */
#include "engine.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENGINES 16

static pthread_mutex_t engines_lock = PTHREAD_MUTEX_INITIALIZER;
static struct guanaco_engine *engines[MAX_ENGINES];

void guanaco_metrics_register(struct guanaco_engine *engine) {
    pthread_mutex_lock(&engines_lock);
    for (int i = 0; i < MAX_ENGINES; i++) {
        if (!engines[i]) {
            engines[i] = engine;
            break;
        }
    }
    pthread_mutex_unlock(&engines_lock);
}

void guanaco_metrics_unregister(struct guanaco_engine *engine) {
    pthread_mutex_lock(&engines_lock);
    for (int i = 0; i < MAX_ENGINES; i++) {
        if (engines[i] == engine) {
            engines[i] = NULL;
        }
    }
    pthread_mutex_unlock(&engines_lock);
}

/* snprintf that keeps counting past the end, so the caller learns the size it needs */
struct text {
    char *buffer;
    size_t size, length;
};

static void append(struct text *t, const char *format, ...) {
    va_list args;
    va_start(args, format);
    size_t room = t->length < t->size ? t->size - t->length : 0;
    int n = vsnprintf(room ? t->buffer + t->length : NULL, room, format, args);
    va_end(args);
    t->length += n > 0 ? (size_t)n : 0;
}

struct metric {
    const char *name, *type, *help;
};

static const struct metric metrics[] = {
    {"guanaco_tokens_total", "counter", "tokens through the last MoE layer"},
    {"guanaco_expert_accesses_total", "counter", "distinct (layer, expert) uses the router asked for"},
    {"guanaco_hits_total", "counter", "accesses served from RAM, without a read"},
    {"guanaco_resident_ratio", "gauge", "hits over accesses since start"},
    {"guanaco_loads_total", "counter", "experts read because they were missing"},
    {"guanaco_bytes_read_total", "counter", "bytes read from the model file, on demand and ahead"},
    {"guanaco_read_seconds_total", "counter", "time the router waited for reads"},
    {"guanaco_stall_seconds_total", "counter", "time the router waited in all (reads, mapping, eviction)"},
    {"guanaco_evictions_total", "counter", "experts dropped to stay within the budget"},
    {"guanaco_churn_loads_total", "counter", "loads of an expert evicted shortly before"},
    {"guanaco_budget_bytes", "gauge", "expert bytes allowed resident"},
    {"guanaco_resident_bytes", "gauge", "expert bytes resident now"},
    {"guanaco_prefetch_issued_bytes_total", "counter", "bytes read ahead for the next layer"},
    {"guanaco_prefetch_used_bytes_total", "counter", "read-ahead bytes the next layer used"},
    {"guanaco_prefetch_wasted_bytes_total", "counter", "read-ahead bytes dropped unused"},
};
#define N_METRICS (sizeof(metrics) / sizeof(metrics[0]))

static double engine_value(const struct guanaco_engine *engine, const struct guanaco_residency_stats *st, size_t i) {
    switch (i) {
    case 0: return (double)atomic_load(&((struct guanaco_engine *)engine)->tokens_done);
    case 1: return (double)st->accesses;
    case 2: return (double)st->hits;
    case 3: return st->accesses ? (double)st->hits / (double)st->accesses : 0.0;
    case 4: return (double)st->expert_loads;
    case 5: return (double)st->bytes_read;
    case 6: return (double)st->read_ns / 1e9;
    case 7: return (double)st->stall_ns / 1e9;
    case 8: return (double)st->evictions;
    case 9: return (double)st->churn_loads;
    case 10: return (double)st->budget_bytes;
    case 11: return (double)st->resident_bytes;
    case 12: return (double)st->prefetch_issued_bytes;
    case 13: return (double)st->prefetch_used_bytes;
    case 14: return (double)st->prefetch_wasted_bytes;
    }
    return 0;
}

static size_t render(char *buffer, size_t size) {
    struct text t = {buffer, size, 0};
    if (buffer && size) {
        buffer[0] = '\0';
    }
    for (size_t i = 0; i < N_METRICS; i++) {
        bool header = false;
        for (int e = 0; e < MAX_ENGINES; e++) {
            const struct guanaco_engine *engine = engines[e];
            if (!engine || !engine->residency) {
                continue; /* without a budget there is nothing of these to report */
            }
            if (!header) {
                append(&t, "# HELP %s %s\n# TYPE %s %s\n", metrics[i].name, metrics[i].help, metrics[i].name,
                       metrics[i].type);
                header = true;
            }
            struct guanaco_residency_stats st;
            guanaco_residency_get_stats(engine->residency, &st);
            const char *path = engine->manifest.shard_paths[0];
            const char *slash = strrchr(path, '/');
            append(&t, "%s{model=\"", metrics[i].name);
            /* a label value escapes backslash, quote and newline */
            for (const char *c = slash ? slash + 1 : path; *c; c++) {
                append(&t, *c == '\\' ? "\\\\" : *c == '"' ? "\\\"" : *c == '\n' ? "\\n" : "%c", *c);
            }
            append(&t, "\"} %.17g\n", engine_value(engine, &st, i));
        }
    }
    return t.length;
}

/* per thread, so two scrapes at once cannot overwrite each other's text; freed when the thread ends */
static _Thread_local char *thread_text;
static _Thread_local size_t thread_text_size;
static pthread_key_t text_key;
static pthread_once_t text_key_once = PTHREAD_ONCE_INIT;

static void create_text_key(void) {
    (void)pthread_key_create(&text_key, free);
}

const char *guanaco_metrics_prometheus(void) {
    /* measured and written under one lock hold: the numbers cannot grow between the two passes */
    pthread_mutex_lock(&engines_lock);
    size_t length = render(NULL, 0);
    if (length + 1 > thread_text_size) {
        char *grown = realloc(thread_text, length + 1);
        if (grown) {
            thread_text = grown;
            thread_text_size = length + 1;
            pthread_once(&text_key_once, create_text_key);
            (void)pthread_setspecific(text_key, grown);
        }
    }
    const char *text = "";
    if (thread_text && length + 1 <= thread_text_size) {
        render(thread_text, thread_text_size);
        text = thread_text;
    }
    pthread_mutex_unlock(&engines_lock);
    return text;
}
