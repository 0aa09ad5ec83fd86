#!/usr/bin/env bash
# test_progress.sh - owns the checks of the progress line for long work
# (log.h): on a terminal the preload shows one line rewritten in place
# ("\r\033[K" + "guanaco: preload: layer N of M") and clears it when done;
# with stderr in a file, or GUANACO_LOG=0 on a terminal, not a byte of it.
# `script` (util-linux) gives the run a pseudo-terminal.
# Env: MKMODEL, LLAMA_BIN, WORKDIR, VOCAB_DIR.
set -u
: "${MKMODEL:?}" "${LLAMA_BIN:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
command -v script >/dev/null || { echo "SKIP: script (util-linux) is not installed"; exit 77; }
W="$WORKDIR/progress"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 9 -o "$W/model.gguf" >/dev/null 2>&1
check "tiny qwen3moe written" $? "mkmodel failed"
run="$LLAMA_BIN/llama-completion -m $W/model.gguf -p hello -n 2 -no-cnv -t 1 --guanaco-streaming --guanaco-ram 3M --guanaco-preload on"

script -qec "$run" "$W/tty.log" >/dev/null 2>&1
rc=$?
grep -aq $'\r\033\\[Kguanaco: preload: layer [0-9]* of [0-9]*' "$W/tty.log" && grep -aq 'guanaco: preload: [0-9]* experts' "$W/tty.log"
check "on a terminal the preload shows its progress line, then its summary (rc=$rc)" $? "$(grep -a 'preload' "$W/tty.log" | head -3 | cat -v)"

$run >/dev/null 2>"$W/file.log"
rc=$?
[ $rc -eq 0 ] && ! grep -aq $'\r' "$W/file.log" && ! grep -aq 'preload: layer' "$W/file.log"
check "with stderr in a file there is no progress line (rc=$rc)" $? "$(grep -a 'preload' "$W/file.log" | head -3 | cat -v)"

GUANACO_LOG=0 script -qec "$run" "$W/quiet.log" >/dev/null 2>&1
! grep -aq 'preload: layer' "$W/quiet.log"
check "GUANACO_LOG=0 silences it on a terminal too" $? "$(grep -a 'preload' "$W/quiet.log" | head -3 | cat -v)"
finish
