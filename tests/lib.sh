# lib.sh - owns what Guanaco's shell tests share: check NAME STATUS DETAIL
# records a PASS or FAIL line (check_has NAME TEXT OUTPUT: for a line an
# output must hold), and finish prints the "N passed, N failed" line CI reads,
# removes the scratch folder when everything passed, and exits.
# Source it after setting W (the test's scratch folder).
passed=0 failed=0
check() {
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1)); echo "PASS $1"
    else
        failed=$((failed + 1)); echo "FAIL $1: $3"
    fi
}
# check_has NAME TEXT OUTPUT: check that OUTPUT holds TEXT, as written (no pattern), and show OUTPUT when it does not
check_has() {
    grep -qF -- "$2" <<<"$3"
    check "$1" $? "$3"
}
finish() {
    [ "$failed" -eq 0 ] && [ -n "${W:-}" ] && rm -rf "$W"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}
# tiny_qwen3moe OUT: the simulator tests' model, a qwen3moe of 4 layers x 8 experts, top-2, 64 x 64 experts in Q8_0
# (3 * 64 * 64 * 34/32 = 13056 bytes per expert); its log beside it as OUT.log. Needs MKMODEL.
tiny_qwen3moe() {
    "$MKMODEL" --arch qwen3moe --n-layer 4 --n-embd 64 --n-ff-exp 64 --n-expert 8 --n-expert-used 2 --quant Q8_0 \
        -o "$1" >"$1.log" 2>&1
}
# write_trace OUT [N_LAYER N_EXPERT] < SPEC: a routing trace in the engine's recorded format (docs/TRACE.md), of
# tiny_qwen3moe's shape (4 layers, 8 experts) unless given, top-2; SPEC lines "sequence token layer id id" in file
# order, so a prompt ubatch keeps its rows together.
write_trace() {
    perl -e 'open(my $out, ">", $ARGV[0]) or die; binmode $out;
        print $out pack("a8 V V V V a32 a64", "GNCTRACE", 1, $ARGV[1], $ARGV[2], 2, "qwen3moe", "guanaco test");
        while (<STDIN>) { my ($s, $t, $l, $a, $b) = split; print $out pack("V V V v v f< f<", $t, $s, $l, $a, $b, 0, 0) }
        close($out) or die' "$1" "${2:-4}" "${3:-8}"
}
