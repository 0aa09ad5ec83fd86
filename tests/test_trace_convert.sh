#!/usr/bin/env bash
# test_trace_convert.sh - owns the check that the real Mixtral routing traces
# (shared/traces/mixtral-8x7b) convert into Guanaco's trace format with the
# statistics their README publishes: 338 and 247 token positions, and an
# expert reused by the next token with probability 0.40 and 0.34.
# Env: TRACE_CONVERT, SHARED_DIR, WORKDIR.
set -u
: "${TRACE_CONVERT:?}" "${WORKDIR:?}"
traces="${SHARED_DIR:-}/traces/mixtral-8x7b"
[ -d "$traces" ] || { echo "SKIP: no shared traces at '$traces'"; exit 77; }
mkdir -p "$WORKDIR/traces"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for spec in "humaneval 338 0.40" "gsm8k 247 0.34"; do
    set -- $spec
    out="$WORKDIR/traces/$1.trace"
    report=$("$TRACE_CONVERT" "$traces/$1_2_routing.jsonl" "$out" --arch llama --n-expert 8 2>&1)
    check "$1 converts" $? "$report"
    echo "$report" | grep -qE "^tokens +$2 "
    check "$1 has $2 token positions" $? "$(echo "$report" | grep '^tokens')"
    reuse=$(echo "$report" | awk '$1 == "reuse" { printf "%.2f", $2 }')
    [ "$reuse" = "$3" ]
    check "$1 next-token reuse $3" $? "measured $reuse"
done
finish
