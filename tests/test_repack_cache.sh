#!/usr/bin/env bash
# test_repack_cache.sh - owns the checks of the repack cache around its happy
# path (bit_identical asserts its logits on every architecture and type):
# guanaco-repack-cache writes only what repacks and takes space only for it;
# a budgeted run reads its experts from the cache and repacks none; and every
# cache the engine must not trust is refused by name, with `on` failing the
# load and `auto` going on without it: a model changed since, a cache of other
# bytes, a truncated one, a FIFO in its place, none at all. The tool refuses
# bad arguments and files by name.
# Env: MKMODEL, LOGITS_DUMP, REPACK_CACHE_TOOL, WORKDIR, VOCAB_DIR.
set -u
: "${MKMODEL:?}" "${LOGITS_DUMP:?}" "${REPACK_CACHE_TOOL:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
W="$WORKDIR/repack_cache"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
M=$W/model.gguf C=$W/model.gguf.guanaco-repack

"$MKMODEL" --arch qwen3moe --quant Q4_0 --seed 5 -o "$M" >"$W/mkmodel.log" 2>&1
check "tiny qwen3moe Q4_0 written" $? "$(tail -2 "$W/mkmodel.log")"
out=$("$REPACK_CACHE_TOOL" "$M" 2>&1)
if [ $? -eq 0 ] && grep -q "has a repacked kernel on this CPU: no cache" <<<"$out"; then
    echo "SKIP: ggml has no repacked Q4_0 kernel on this CPU: nothing to test"; exit 77
fi
check_has "the tool writes the cache beside the model" "wrote $C" "$out"
# the cache mirrors the model's offsets: its size is the model's rounded up to a page, plus the 64-byte trailer
model_bytes=$(stat -c %s "$M") cache_bytes=$(stat -c %s "$C")
[ "$cache_bytes" -eq $(((model_bytes + 4095) / 4096 * 4096 + 64)) ]
check "the cache is the model's size rounded to a page plus its trailer" $? "model $model_bytes, cache $cache_bytes"
[ ! -e "$C.partial" ]
check "no .partial file left behind" $? "$(ls "$W")"

run() { # run NAME CACHE_MODE: a budgeted, repacked run of logits_dump; its log in NAME.log
    env -u GUANACO_RAM GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 GUANACO_REPACK=on GUANACO_REPACK_CACHE="$2" \
        timeout 300 "$LOGITS_DUMP" "$M" "$W/$1.bin" >"$W/$1.log" 2>&1
}
run repacked off
check "a repacking run without the cache" $? "$(tail -3 "$W/repacked.log")"
run cached on
check "a run that reads the cache" $? "$(tail -3 "$W/cached.log")"
grep -q "guanaco: repack cache: $C holds" "$W/cached.log" && grep -q 'repacked as reads landed 0.0 ms/token' "$W/cached.log"
check "it says it reads the cache, and repacked nothing as reads landed" $? "$(grep -m3 'repack' "$W/cached.log")"
cmp -s "$W/repacked.bin" "$W/cached.bin"
check "the same logits as repacking each read" $? "the dumps differ"
# The 48-token prompt needs most of each layer: with the cache it streams into the stream buffers, ready for the
# repacked kernels, instead of evicting what decode keeps. Repacking each read streams nothing (a prompt's layer
# repacked per ubatch costs more than it saves), and neither does the cache without the buffers: a streamed
# page-cache mapping would give the repacked kernels the file's layout.
streamed_direct() { # the MiB the run's last status line says it read direct into the stream buffers
    grep 'guanaco: residency: ' "$W/$1.log" | tail -1 | sed -n 's/.*, \([0-9.]*\) read direct into the stream buffers.*/\1/p'
}
s=$(streamed_direct cached)
awk -v s="${s:-0}" 'BEGIN { exit !(s > 0) }' && grep -q "prompts stream with O_DIRECT into two layer buffers" "$W/cached.log"
check "the cached run's prompt streams into the stream buffers" $? "streamed ${s:-none}: $(grep -m1 'streamed' "$W/cached.log")"
s=$(streamed_direct repacked)
[ "${s:-x}" = 0.0 ]
check "repacking each read streams no prompt" $? "streamed ${s:-none}"
env -u GUANACO_RAM GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 GUANACO_REPACK=on GUANACO_REPACK_CACHE=on \
    GUANACO_STREAM_DIRECT=0 timeout 300 "$LOGITS_DUMP" "$M" "$W/cached-no-buffers.bin" >"$W/cached-no-buffers.log" 2>&1
rc=$?
line=$(grep 'guanaco: residency: ' "$W/cached-no-buffers.log" | tail -1)
[ $rc -eq 0 ] && [[ $line == *"streamed 0.0 MiB"* ]] && cmp -s "$W/cached-no-buffers.bin" "$W/cached.bin"
check "the cache without the stream buffers streams nothing, with the same logits" $? "rc $rc: ${line:0:200}"

# --guanaco-repack auto (the default) under a budget reads Q4_0 from the cache, and gpt-oss's MXFP4 too: the
# logits of the runs that read the cache with --guanaco-repack on; without a cache auto keeps the file's layout
env -u GUANACO_RAM -u GUANACO_REPACK GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 timeout 300 "$LOGITS_DUMP" "$M" \
    "$W/auto.bin" >"$W/auto.log" 2>&1
line=$(grep -m1 "guanaco: repack cache: $C holds" "$W/auto.log")
[[ $line =~ holds\ ([0-9]+)\ repacked.*:\ ([0-9]+)\ read ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] &&
    [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && cmp -s "$W/auto.bin" "$W/cached.bin"
check "auto under a budget reads every Q4_0 tensor from the cache, with the repacked logits" $? "$line"
X=$W/mxfp4.gguf
"$MKMODEL" --arch gpt-oss --quant MXFP4 --seed 5 -o "$X" >"$W/mxfp4.mkmodel.log" 2>&1 && "$REPACK_CACHE_TOOL" "$X" >/dev/null 2>&1
for mode in auto on off; do
    repack=auto
    [ $mode = on ] && repack=on
    env -u GUANACO_RAM GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 GUANACO_REPACK=$repack GUANACO_REPACK_CACHE=$mode \
        timeout 300 "$LOGITS_DUMP" "$X" "$W/mxfp4-$mode.bin" >"$W/mxfp4-$mode.log" 2>&1
done
if [ -f "$X.guanaco-repack" ]; then
    line=$(grep -m1 "guanaco: repack cache: $X.guanaco-repack holds" "$W/mxfp4-auto.log")
    [[ $line =~ holds\ ([0-9]+)\ repacked.*:\ ([0-9]+)\ read ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] &&
        [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] && cmp -s "$W/mxfp4-auto.bin" "$W/mxfp4-on.bin" &&
        grep -q "0 expert tensors run repacked" "$W/mxfp4-off.log"
    check "auto reads every MXFP4 tensor from the cache (the logits of on), and without it keeps the file's layout" \
        $? "$line; $(grep -m1 'run repacked' "$W/mxfp4-off.log" | cut -c1-160)"
fi

# `on` with repacking off reads nothing and says why, rather than failing a load that needs no cache
env -u GUANACO_RAM GUANACO_STREAMING=1 GUANACO_MAX_EXPERTS=2 GUANACO_REPACK=off GUANACO_REPACK_CACHE=on \
    timeout 300 "$LOGITS_DUMP" "$M" "$W/repack-off.bin" >"$W/repack-off.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "repack-cache on: no cache is read, as no expert is repacked (--guanaco-repack off" \
    "$W/repack-off.log" && ! grep -q "repack cache: $C holds" "$W/repack-off.log"
check "--guanaco-repack-cache on with --guanaco-repack off loads, reads no cache and says why" $? \
    "rc $rc: $(grep -m2 'repack' "$W/repack-off.log")"

refused() { # refused NAME TEXT: `on` fails the load naming why; `auto` runs without the cache and says why
    run "$1-on" on
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "--guanaco-repack-cache on: $C: .*$2" "$W/$1-on.log"
    check "$1: --guanaco-repack-cache on refuses to load, naming why" $? "rc $rc: $(grep -m2 'repack' "$W/$1-on.log")"
    run "$1-auto" auto
    rc=$?
    [ $rc -eq 0 ] && cmp -s "$W/repacked.bin" "$W/$1-auto.bin" && ! grep -q "repack cache: $C holds" "$W/$1-auto.log"
    check "$1: auto runs without it, with the same logits" $? "rc $rc: $(grep -m2 'repack' "$W/$1-auto.log")"
}
cp -p "$C" "$W/good.cache"

touch "$M"
refused changed-model "the model changed since"
grep -q "repack cache $C not used: .*the model changed since" "$W/changed-model-auto.log"
check "changed-model: auto says why it is not used" $? "$(grep -m2 'repack' "$W/changed-model-auto.log")"
"$REPACK_CACHE_TOOL" "$M" >"$W/rewrite.log" 2>&1
check "the tool writes it again" $? "$(tail -2 "$W/rewrite.log")"
cp -p "$C" "$W/good.cache"

# other bytes under a valid trailer: everything before the trailer zeroed
trailer_at=$(((model_bytes + 4095) / 4096 * 4096))
dd if=/dev/zero of="$C" bs=4096 count=$((trailer_at / 4096)) conv=notrunc status=none
refused other-bytes "differs from this CPU's repack"

truncate -s $((trailer_at / 2)) "$C"
refused truncated "too short"

rm -f "$C" && mkfifo "$C"
refused fifo "not a regular file"

rm -f "$C"
refused missing "No such file"

# the tool's own refusals
out=$("$REPACK_CACHE_TOOL" --frobnicate "$M" 2>&1)
[ $? -eq 2 ] && grep -q "unknown option --frobnicate" <<<"$out"
check "the tool refuses an unknown option" $? "$out"
printf 'not a gguf' >"$W/junk.gguf"
out=$("$REPACK_CACHE_TOOL" "$W/junk.gguf" 2>&1)
[ $? -eq 1 ] && [ ! -e "$W/junk.gguf.guanaco-repack" ]
check "the tool refuses a file that is not GGUF, writing nothing" $? "$out"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 5 -o "$W/q8.gguf" >/dev/null 2>&1
out=$("$REPACK_CACHE_TOOL" "$W/q8.gguf" 2>&1)
[ $? -eq 0 ] && grep -q "none of its expert tensors has a repacked kernel on this CPU: no cache" <<<"$out" &&
    [ ! -e "$W/q8.gguf.guanaco-repack" ]
check "a type that does not repack gets no cache, and says so" $? "$out"
finish
