# tests.cmake - owns the registration of Guanaco's tests with ctest.
# Scripts get every path they need from the environment, so each can also be
# run by hand against any build.
set(GUANACO_TEST_DIR "${CMAKE_BINARY_DIR}/test-work" CACHE PATH "scratch space for generated test models")
set(GUANACO_VOCAB_DIR "${GUANACO_LLAMA_DIR}/models")
set(GUANACO_TEST_ENV
    "MKMODEL=$<TARGET_FILE:guanaco-mkmodel>"
    "LOGITS_DUMP=$<TARGET_FILE:logits_dump>"
    "EVICT_TOOL=$<TARGET_FILE:evict_file>"
    "VOCAB_DIR=${GUANACO_VOCAB_DIR}"
    "GUANACO_VOCAB_DIR=${GUANACO_VOCAB_DIR}"
    "LLAMA_BIN=${CMAKE_BINARY_DIR}/bin"
    "WORKDIR=${GUANACO_TEST_DIR}")

add_test(NAME unit COMMAND test_unit "${GUANACO_TEST_DIR}")

function(guanaco_script_test name script)
    add_test(NAME ${name} COMMAND bash "${CMAKE_SOURCE_DIR}/tests/${script}" ${ARGN})
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${GUANACO_TEST_ENV}" SKIP_RETURN_CODE 77)
endfunction()

foreach(script IN ITEMS test_mkmodel.sh test_bit_identical.sh test_bad_input.sh test_cgroup.sh)
    if (EXISTS "${CMAKE_SOURCE_DIR}/tests/${script}")
        string(REPLACE ".sh" "" name "${script}")
        string(REPLACE "test_" "" name "${name}")
        guanaco_script_test(${name} ${script})
    endif()
endforeach()
file(MAKE_DIRECTORY "${GUANACO_TEST_DIR}")
