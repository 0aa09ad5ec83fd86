#!/usr/bin/env bash
# test_imatrix.sh - owns the check that Guanaco's router hook chains a user
# callback for real: llama-imatrix installs its own cb_eval, and with
# --guanaco-streaming it must still see every activation (the imatrix file is
# byte-identical to the run without streaming) while Guanaco counts every
# routing exactly once (4 chunks x 64 tokens x 4 MoE layers x top-2).
# Env: MKMODEL, LLAMA_BIN, WORKDIR, VOCAB_DIR.
set -u
: "${MKMODEL:?}" "${LLAMA_BIN:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
W="$WORKDIR/imatrix"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 3 -o "$W/model.gguf" >/dev/null 2>&1
check "tiny qwen3moe written" $? "mkmodel failed"
for i in $(seq 1 60); do echo "The quick brown fox jumps over the lazy dog, line $i, while the router picks experts."; done >"$W/text.txt"
run() { # run NAME [flags]
    local name=$1; shift
    timeout 300 "$LLAMA_BIN/llama-imatrix" -m "$W/model.gguf" -f "$W/text.txt" -o "$W/$name.imatrix.gguf" \
        -c 64 --chunks 4 -t 2 "$@" >"$W/$name.log" 2>&1
}
run off
check "llama-imatrix, streaming off" $? "$(tail -3 "$W/off.log")"
run on --guanaco-streaming
check "llama-imatrix, streaming on" $? "$(tail -3 "$W/on.log")"
cmp -s "$W/off.imatrix.gguf" "$W/on.imatrix.gguf"
check "imatrix identical with streaming (the chained callback saw everything)" $? "files differ"
grep -q 'summary: 256 tokens routed through 4 MoE layers: 2048 expert accesses' "$W/on.log"
check "Guanaco counted each of 256 tokens x 4 layers x top-2 once" $? "$(grep 'guanaco: summary' "$W/on.log")"
finish
