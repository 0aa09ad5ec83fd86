# lib.sh - owns what Guanaco's shell tests share: check NAME STATUS DETAIL
# records a PASS or FAIL line, and finish prints the "N passed, N failed" line
# CI reads, removes the scratch folder when everything passed, and exits.
# Source it after setting W (the test's scratch folder).
passed=0 failed=0
check() {
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1)); echo "PASS $1"
    else
        failed=$((failed + 1)); echo "FAIL $1: $3"
    fi
}
finish() {
    [ "$failed" -eq 0 ] && [ -n "${W:-}" ] && rm -rf "$W"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}
