# tests.cmake - owns the registration of Guanaco's tests with ctest.
# Scripts get every path they need from the environment, so each can also be
# run by hand against any build.
set(GUANACO_TEST_DIR "${CMAKE_BINARY_DIR}/test-work" CACHE PATH "scratch space for generated test models")
set(GUANACO_VOCAB_DIR "${GUANACO_LLAMA_DIR}/models")
set(GUANACO_TEST_ENV
    "MKMODEL=$<TARGET_FILE:guanaco-mkmodel>"
    "LOGITS_DUMP=$<TARGET_FILE:logits_dump>"
    "EVICT_TOOL=$<TARGET_FILE:evict_file>"
    "REPACK_CACHE_TOOL=$<TARGET_FILE:guanaco-repack-cache>"
    "VOCAB_DIR=${GUANACO_VOCAB_DIR}"
    "GUANACO_VOCAB_DIR=${GUANACO_VOCAB_DIR}"
    "LLAMA_BIN=${CMAKE_BINARY_DIR}/bin"
    "WORKDIR=${GUANACO_TEST_DIR}")

add_test(NAME unit COMMAND test_unit "${GUANACO_TEST_DIR}")

function(guanaco_script_test name script)
    add_test(NAME ${name} COMMAND bash "${CMAKE_SOURCE_DIR}/tests/${script}" ${ARGN})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${GUANACO_TEST_ENV}" SKIP_RETURN_CODE 77)
endfunction()

guanaco_script_test(mkmodel test_mkmodel.sh "$<TARGET_FILE:guanaco-mkmodel>" "${GUANACO_VOCAB_DIR}")
guanaco_script_test(bad_input test_bad_input.sh)
set_property(TEST bad_input APPEND PROPERTY ENVIRONMENT "LLAMA_CLI=${CMAKE_BINARY_DIR}/bin/llama-completion")
# The central invariant, across every architecture and quant type mkmodel writes.
guanaco_script_test(bit_identical test_bit_identical.sh)
# The repack cache: guanaco-repack-cache, a budgeted run reading it, and every cache the engine must refuse.
guanaco_script_test(repack_cache test_repack_cache.sh)
# The same invariant inside a cgroup memory limit smaller than the model, cold page cache.
guanaco_script_test(bit_identical_cgroup test_bit_identical.sh)
set_property(TEST bit_identical_cgroup APPEND PROPERTY ENVIRONMENT "CGROUP=1" "ARCHS=none")

# Sharded GGUFs: every shard's experts are found and logits equal the unsplit model.
guanaco_script_test(shards test_shards.sh)
file(MAKE_DIRECTORY "${GUANACO_TEST_DIR}")
# A user eval callback (llama-imatrix's) still sees everything while Guanaco's hook is chained.
guanaco_script_test(imatrix_chain test_imatrix.sh)
# The imatrix prior: counts read from GGUFs written as llama-imatrix writes them, bad files refused by name,
# the preload's choice rule against brute force, and guanaco_policy_seed keeping what the prior calls hot.
add_test(NAME imatrix_reader COMMAND test_imatrix_reader "${GUANACO_TEST_DIR}")
# The real llama-server over loopback, three parallel slots, greedy tokens equal with and without streaming.
guanaco_script_test(server test_server.sh)
# A model file truncated or overwritten mid-run: exit 1 with a message from llama-completion, one failed
# request from llama-server, never a signal (mapping_guard, guanaco_hook_take_error).
guanaco_script_test(failure test_failure.sh)
# Long work shows one progress line on a terminal, and nothing in a file or with GUANACO_LOG=0.
guanaco_script_test(progress test_progress.sh)
# Trace format unit tests, and the real Mixtral traces converted with their published statistics.
add_test(NAME trace COMMAND test_trace "${GUANACO_TEST_DIR}")
guanaco_script_test(trace_convert_mixtral test_trace_convert.sh)
set_property(TEST trace_convert_mixtral APPEND PROPERTY ENVIRONMENT
    "TRACE_CONVERT=$<TARGET_FILE:guanaco-trace-convert>" "SHARED_DIR=${CMAKE_SOURCE_DIR}/../shared")
# Exact parallel reads: io_uring and the pread thread pool, short reads, O_DIRECT, injected faults.
add_test(NAME io COMMAND test_io)
# Pure replacement policies against Belady's optimum; the timing run is a benchmark, kept short here.
add_test(NAME policy COMMAND test_policy)
set_tests_properties(policy PROPERTIES ENVIRONMENT "GUANACO_PERF_TOKENS=2000")
# The expert predictors: pilot's learnt maps predicted exactly, decay follows a changed map, bad arguments
# refused; gate's ranking, fallback and per-rank calibration.
add_test(NAME predictor COMMAND test_predictor)
# gate's router evaluation against ggml computing the same router graphs (softmax, biases, sigmoid, quantized).
add_test(NAME router_gate COMMAND test_router_gate)
# --guanaco-trace-out records what was counted; --guanaco-trace-replay makes another model route the same way.
guanaco_script_test(trace_replay test_trace_replay.sh)
# The policy simulator on the real Mixtral traces: no policy above Belady, compulsory misses at 100%, CSV and PNG.
guanaco_script_test(sim_mixtral test_sim.sh)
set_property(TEST sim_mixtral APPEND PROPERTY ENVIRONMENT
    "SIM=$<TARGET_FILE:guanaco-sim>" "TRACE_CONVERT=$<TARGET_FILE:guanaco-trace-convert>"
    "SHARED_DIR=${CMAKE_SOURCE_DIR}/../shared")
# guanaco-sim's checks that need no recorded routing: --model, the pipeline's timing, pilot on synthetic traces.
guanaco_script_test(sim_pipeline test_sim_pipeline.sh)
set_property(TEST sim_pipeline APPEND PROPERTY ENVIRONMENT
    "SIM=$<TARGET_FILE:guanaco-sim>" "TRACE_CONVERT=$<TARGET_FILE:guanaco-trace-convert>"
    "TRACEGEN=$<TARGET_FILE:guanaco-tracegen>")
# bench/report.sh on a hand-made run: direct loading's costs from the status lines, the replay's call, PMD bytes.
guanaco_script_test(report test_report.sh)
# bench/readme_table.sh: the README's summary cells from the reports, spliced between its markers.
guanaco_script_test(readme_table test_readme_table.sh)
# bench/benchmarks.sh --assemble: BENCHMARKS.md and the README's table from the committed reports, byte for byte.
guanaco_script_test(benchmarks_assemble test_benchmarks_assemble.sh)
# bench/sim_accuracy.sh: the count of cells the simulator predicts within 15%, from the reports.
guanaco_script_test(sim_accuracy test_sim_accuracy.sh)
# The residency module alone: budgeted expert pages over a synthetic mapped file, mincore audit, faults.
add_test(NAME residency COMMAND test_residency)
set_tests_properties(residency PROPERTIES SKIP_RETURN_CODE 77) # tmpfs has no page cache to budget
# The residency engine in a real decode: bit-identical under budgets, and the page cache really bounded.
guanaco_script_test(residency_live test_residency_live.sh)
# One engine shared by several contexts decoding from several threads at once, with and without a budget.
guanaco_script_test(concurrent test_concurrent.sh)
set_property(TEST concurrent APPEND PROPERTY ENVIRONMENT "CONCURRENT_DECODE=$<TARGET_FILE:concurrent_decode>")
# guanaco-tracegen: a seed reproduces a trace, ids are distinct, each knob moves its statistic, and the
# presets' measured statistics and LRU hit rates stay within stated tolerances of the real models'.
guanaco_script_test(tracegen test_tracegen.sh)
set_property(TEST tracegen APPEND PROPERTY ENVIRONMENT
    "TRACEGEN=$<TARGET_FILE:guanaco-tracegen>" "SIM=$<TARGET_FILE:guanaco-sim>"
    "TRACE_CONVERT=$<TARGET_FILE:guanaco-trace-convert>" "SHARED_DIR=${CMAKE_SOURCE_DIR}/../shared")
# guanaco-plan on tiny synthetic models: a monotone table under the optimum, the --ram budget by the
# engine's own rule, measured disk and estimated compute labelled, clean failures.
guanaco_script_test(plan test_plan.sh)
# The README's first two commands, as a user runs them from a clone.
guanaco_script_test(readme_commands test_readme_commands.sh)
set_property(TEST plan APPEND PROPERTY ENVIRONMENT
    "PLAN=$<TARGET_FILE:guanaco-plan>" "TRACEGEN=$<TARGET_FILE:guanaco-tracegen>")

# Device offload without a GPU: ggml-rpc-server on loopback as the device (--n-gpu-layers 99 --cpu-moe), experts
# streaming on the host; logits equal the same offload without streaming, ids read off the device, page cache.
guanaco_script_test(rpc test_rpc.sh)

# The pure C tests again, built with ASan+UBSan (asan_*) and, for those that start threads, TSan (tsan_*):
# any report fails the test (GUANACO_SANITIZERS in CMakeLists.txt says what is and is not covered).
if (GUANACO_SANITIZERS)
    set(GUANACO_ASAN_ENV "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1"
        "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
    set(GUANACO_TSAN_ENV "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1")
    foreach (kind asan tsan)
        string(TOUPPER ${kind} upper)
        file(MAKE_DIRECTORY "${GUANACO_TEST_DIR}/${kind}")
        foreach (test unit trace policy predictor router_gate residency io imatrix_reader)
            if (NOT TARGET test_${test}-${kind})
                continue()
            endif()
            # Arguments as the plain test has them; a scratch directory of its own keeps fixed file names apart.
            set(arguments)
            if (test MATCHES "^(unit|trace|imatrix_reader)$")
                set(arguments "${GUANACO_TEST_DIR}/${kind}")
            endif()
            add_test(NAME ${kind}_${test} COMMAND test_${test}-${kind} ${arguments})
            set_tests_properties(${kind}_${test} PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "${GUANACO_${upper}_ENV}")
        endforeach()
    endforeach()
    # The timing run of policy is a benchmark; under a sanitizer it only has to run.
    set_property(TEST asan_policy APPEND PROPERTY ENVIRONMENT "GUANACO_PERF_TOKENS=200")
endif()

# Each libFuzzer harness (tests/fuzz) for 60 s from the committed corpus, after replaying its saved
# crashes; only when the clang-built harnesses exist (GUANACO_FUZZ in CMakeLists.txt).
if (TARGET guanaco-fuzz)
    foreach (entry manifest:8192 trace:4096 trace_jsonl:4096 options:4608)
        string(REPLACE ":" ";" entry "${entry}")
        list(GET entry 0 target)
        list(GET entry 1 max_len)
        add_test(NAME fuzz_${target} COMMAND bash "${CMAKE_SOURCE_DIR}/tests/fuzz/run.sh"
                 "${CMAKE_BINARY_DIR}/fuzz/bin/fuzz_${target}" ${target} "${GUANACO_TEST_DIR}/fuzz/${target}" 60 ${max_len})
        set_tests_properties(fuzz_${target} PROPERTIES TIMEOUT 300)
    endforeach()
endif()
