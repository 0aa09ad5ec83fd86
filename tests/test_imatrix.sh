#!/usr/bin/env bash
# test_imatrix.sh - owns the check that Guanaco's router hook chains a user
# callback for real: llama-imatrix installs its own cb_eval, and with
# --guanaco-streaming it must still see every activation (the imatrix file is
# byte-identical to the run without streaming) while Guanaco counts every
# routing exactly once (4 chunks x 64 tokens x 4 MoE layers x top-2).
# It also owns the end-to-end check of the imatrix prior (--guanaco-imatrix):
# that imatrix, fed back with a small budget and the preload, makes the
# preload read each layer's most-routed experts, as counted independently
# from the routing trace the same llama-imatrix run recorded, and the logits
# stay bit-identical to streaming off; bad imatrix files (legacy .dat, another
# model's, a FIFO, a missing path) are refused by name, without a crash.
# Env: MKMODEL, LLAMA_BIN, WORKDIR, VOCAB_DIR, LOGITS_DUMP, EVICT_TOOL.
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
run on --guanaco-streaming --guanaco-trace-out "$W/routing.trace"
check "llama-imatrix, streaming on" $? "$(tail -3 "$W/on.log")"
cmp -s "$W/off.imatrix.gguf" "$W/on.imatrix.gguf"
check "imatrix identical with streaming (the chained callback saw everything)" $? "files differ"
grep -q 'summary: 256 tokens routed through 4 MoE layers: 2048 expert accesses' "$W/on.log"
check "Guanaco counted each of 256 tokens x 4 layers x top-2 once" $? "$(grep 'guanaco: summary' "$W/on.log")"

# ---- the imatrix prior ----
: "${LOGITS_DUMP:?}" "${EVICT_TOOL:?}"
PRIOR=$W/on.imatrix.gguf
# Each (layer, expert)'s routings, counted from the trace (120-byte header; top-2 records are 12 u16:
# token, sequence, layer as u32 pairs, then the two ids), then each layer's N most-routed, ties by the lower id.
expected_choice() { # expected_choice N
    od -An -v -tu2 -w24 -j120 "$W/routing.trace" |
        awk '{ layer = $5 + 65536 * $6; count[layer " " $7]++; count[layer " " $8]++ }
             END { for (k in count) print k, count[k] }' |
        sort -k1,1n -k3,3nr -k2,2n |
        awk -v n="$1" 'NR == 1 || $1 != layer { if (line) printf "%s ", line; layer = $1; taken = 0; line = layer ":" }
                       taken < n { line = line (taken ? "," : "") $2; taken++ }
                       END { print line }'
}
"$LOGITS_DUMP" "$W/model.gguf" "$W/off.bin" >"$W/dump-off.log" 2>&1
check "logits, streaming off" $? "$(tail -3 "$W/dump-off.log")"
# a cold page cache: a warm start would adopt cached experts before the prior has a say
"$EVICT_TOOL" "$W/model.gguf" >/dev/null
GUANACO_STREAMING=1 GUANACO_RAM=3M GUANACO_PRELOAD=1 GUANACO_IMATRIX=$PRIOR \
    "$LOGITS_DUMP" "$W/model.gguf" "$W/prior.bin" >"$W/dump-prior.log" 2>&1
check "logits, streaming with a 3 MiB budget, preload and the imatrix prior" $? "$(tail -3 "$W/dump-prior.log")"
cmp -s "$W/off.bin" "$W/prior.bin"
check "logits bit-identical to streaming off with the prior (it changes timing only)" $? "dumps differ"
line=$(grep 'guanaco: preload by the imatrix prior' "$W/dump-prior.log")
n=$(sed -n 's/.*up to \([0-9]*\) experts per MoE layer.*/\1/p' <<<"$line")
chosen=$(sed 's/.*not the lowest-numbered: //' <<<"$line")
expected=$(expected_choice "${n:-0}")
[ -n "$line" ] && [ "${n:-0}" -ge 2 ] && [ "$chosen" = "$expected" ] && ! grep -q 'guanaco: warm start' "$W/dump-prior.log"
check "the preload read each layer's $n most-routed experts, as the trace counts them: $expected" $? \
    "engine chose '$chosen' ($line; $(grep -c 'guanaco: warm start' "$W/dump-prior.log") warm-start lines)"
lowest=$(for l in 0 1 2 3; do printf '%s:%s ' $l "$(seq -s, 0 $((n - 1)))"; done)
[ "$expected" != "${lowest% }" ]
check "that choice is not the lowest-numbered one (the check can tell them apart)" $? "$expected"

refused() { # refused NAME FILE WHY: the prior FILE is refused with a message naming the flag, FILE and WHY
    local name=$1 file=$2 why=$3
    GUANACO_STREAMING=1 GUANACO_RAM=3M GUANACO_IMATRIX=$file timeout 60 \
        "$LOGITS_DUMP" "$W/model.gguf" "$W/bad.bin" >"$W/bad-$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "--guanaco-imatrix $file: .*$why" "$W/bad-$name.log"
    check "imatrix prior refused: $name" $? "rc=$rc $(grep guanaco "$W/bad-$name.log" | tail -2)"
}
run legacy --output-format dat --guanaco-streaming
mv "$W/legacy.imatrix.gguf" "$W/legacy.dat"
refused "the legacy .dat format (llama-imatrix --output-format dat)" "$W/legacy.dat" "legacy .dat"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 3 --n-expert 16 -o "$W/wide.gguf" >/dev/null 2>&1
timeout 300 "$LLAMA_BIN/llama-imatrix" -m "$W/wide.gguf" -f "$W/text.txt" -o "$W/wide.imatrix.gguf" \
    -c 64 --chunks 1 -t 2 >"$W/wide.log" 2>&1
refused "another model's (16 experts)" "$W/wide.imatrix.gguf" "16 experts but this model has 8"
refused "the model itself" "$W/model.gguf" "not an imatrix"
mkfifo "$W/fifo"
refused "a FIFO (no writer is waited for)" "$W/fifo" "not a regular file"
refused "a missing file" "$W/missing.gguf" "No such file"
head -c 2000 "$PRIOR" >"$W/truncated.gguf"
refused "a truncated file" "$W/truncated.gguf" "truncated"
"$LLAMA_BIN/llama-completion" --help 2>/dev/null | grep -q -- '--guanaco-imatrix FILE'
check "--help lists --guanaco-imatrix" $? "not in llama-completion --help"
# the flag form, through llama-completion: the same choice as the environment form above
"$EVICT_TOOL" "$W/model.gguf" >/dev/null
timeout 120 "$LLAMA_BIN/llama-completion" -m "$W/model.gguf" -p "The quick brown fox" -n 4 -no-cnv -t 2 \
    --guanaco-streaming --guanaco-ram 3M --guanaco-preload --guanaco-imatrix "$PRIOR" >"$W/cli.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -qF -- "not the lowest-numbered: $expected" "$W/cli.log"
check "llama-completion --guanaco-imatrix: the preload chose $expected" $? \
    "rc=$rc $(grep 'guanaco: preload\|error' "$W/cli.log" | tail -2)"
timeout 120 "$LLAMA_BIN/llama-completion" -m "$W/model.gguf" -p "hi" -n 1 -no-cnv -t 2 \
    --guanaco-streaming --guanaco-ram 3M --guanaco-imatrix "$W/legacy.dat" >"$W/cli-legacy.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "--guanaco-imatrix $W/legacy.dat: .*legacy .dat" "$W/cli-legacy.log"
check "llama-completion --guanaco-imatrix with a legacy .dat: refused by name, no crash" $? \
    "rc=$rc $(grep 'guanaco' "$W/cli-legacy.log" | tail -2)"
finish
