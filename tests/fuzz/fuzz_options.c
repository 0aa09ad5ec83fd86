/*
 * fuzz_options.c - libFuzzer harness for Guanaco's flag, environment and
 * size parsers (src/options.c): guanaco_options_parse_argv with a fuzzed
 * argv, guanaco_options_get with a fuzzed environment, and parse_size alone.
 *
 * The input is a list of NUL-separated strings. One that starts with
 * GUANACO_ or LLAMA_ARG_GUANACO_ and holds '=' becomes an environment
 * variable for this input only; every other one is an argv entry after
 * argv[0]. options.c is included, not linked, to reach its static
 * parse_size and to clear the process-wide flag state before each input,
 * so that each input is judged alone (and a crash reproduces from its file).
 *
 * Properties, beyond "no crash, leak or undefined behaviour":
 *  - parse_argv returns 0 or -EINVAL; what it leaves in argv is the input's
 *    arguments minus the ones it took, in order, NULL-terminated;
 *  - on success nothing left starts with --guanaco- and the options in force
 *    are in range: a RAM budget of 0 (auto) or 1 MiB..1024 TiB, at most 65536
 *    experts, a pilot mass in [0, 1], a status interval of at least 1, and
 *    every choice a valid index;
 *  - parse_size gives 0 or a size in range, and only for text that starts
 *    with a digit (or '.' and a digit) and ends in a known unit.
 */
#include "options.c" /* src/options.c, from the include path */

#include "fuzz_file.h"

#include <stdint.h>

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool is_environment_entry(const char *text) {
    return (strncmp(text, "GUANACO_", 8) == 0 || strncmp(text, "LLAMA_ARG_GUANACO_", 18) == 0) &&
           strchr(text, '=') != NULL;
}

static int count_choices(const char *const *choices) {
    int n = 0;
    while (choices[n]) {
        n++;
    }
    return n;
}

static void check_size(const char *text) {
    uint64_t bytes = parse_size(text);
    if (bytes == 0) {
        return;
    }
    FUZZ_CHECK(bytes >= RAM_MIN_BYTES && bytes <= RAM_MAX_BYTES);
    FUZZ_CHECK((text[0] >= '0' && text[0] <= '9') || (text[0] == '.' && text[1] >= '0' && text[1] <= '9'));
    size_t length = strlen(text);
    char last = text[length - 1];
    FUZZ_CHECK((last >= '0' && last <= '9') || last == '.' || strchr("kKmMgGtTiB", last) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private, NUL-terminated copy: the input is split in place. */
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL);
    memcpy(text, data, size);
    text[size] = '\0';

    char *argv[MAX_ARGS + 1];
    char *given[MAX_ARGS + 1];
    char *environment[MAX_ARGS];
    int argc = 0, n_environment = 0;
    argv[argc++] = "fuzz_options";
    for (char *p = text; p <= text + size && argc < MAX_ARGS;) {
        size_t length = strlen(p);
        if (is_environment_entry(p) && n_environment < MAX_ARGS) {
            /* putenv keeps our buffer, where setenv would keep a copy of every value ever set */
            environment[n_environment++] = p;
            FUZZ_CHECK(putenv(p) == 0);
        } else {
            argv[argc++] = p;
        }
        check_size(p);
        p += length + 1;
    }
    argv[argc] = NULL;
    memcpy(given, argv, sizeof(char *) * (size_t)(argc + 1));
    int given_argc = argc;

    memset(&flag_state, 0, sizeof(flag_state));
    int err = guanaco_options_parse_argv(&argc, argv);
    FUZZ_CHECK(err == 0 || err == -EINVAL);
    FUZZ_CHECK(argc >= 1 && argc <= given_argc && argv[argc] == NULL && argv[0] == given[0]);
    /* What is left is a subsequence of what was given, in order. */
    int j = 1;
    for (int i = 1; i < argc; i++) {
        while (j < given_argc && given[j] != argv[i]) {
            j++;
        }
        FUZZ_CHECK(j < given_argc);
        j++;
    }
    if (err == 0) {
        for (int i = 1; i < argc; i++) {
            FUZZ_CHECK(strncmp(argv[i], "--guanaco-", 10) != 0);
        }
        struct guanaco_options options;
        FUZZ_CHECK(guanaco_options_get(&options) == 0);
        FUZZ_CHECK(options.ram_bytes == 0 || (options.ram_bytes >= RAM_MIN_BYTES && options.ram_bytes <= RAM_MAX_BYTES));
        FUZZ_CHECK(options.max_experts <= MAX_EXPERTS_LIMIT);
        FUZZ_CHECK(options.pilot_mass >= 0.0 && options.pilot_mass <= 1.0);
        FUZZ_CHECK(options.status_every >= 1);
        FUZZ_CHECK((int)options.readahead >= 0 && (int)options.readahead < count_choices(readahead_choices));
        FUZZ_CHECK(options.policy >= 0 && options.policy < count_choices(policy_choices));
        FUZZ_CHECK(options.io >= 0 && options.io < count_choices(io_choices));
        FUZZ_CHECK((int)options.load >= 0 && (int)options.load < count_choices(load_choices));
        FUZZ_CHECK(options.prefetch >= 0 && options.prefetch < count_choices(prefetch_choices));
        FUZZ_CHECK(memchr(options.trace_out, '\0', sizeof(options.trace_out)) != NULL);
    }
    for (int i = 0; i < n_environment; i++) {
        char *name = strndup(environment[i], (size_t)(strchr(environment[i], '=') - environment[i]));
        FUZZ_CHECK(name != NULL);
        unsetenv(name);
        free(name);
    }
    memset(&flag_state, 0, sizeof(flag_state));
    free(text);
    return 0;
}
