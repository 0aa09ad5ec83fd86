#!/usr/bin/env bash
# test_bad_input.sh -- Guanaco must fail cleanly, never hang or crash, on bad input.
#
# Owns: feeding broken models and absurd settings to logits_dump (and to the patched
# llama-cli/llama-completion when given) with streaming off and on, and checking each ends
# with a clear message and an ordinary non-zero exit -- not a hang, SIGBUS/SIGSEGV, abort or
# core dump. Streaming makes this a real risk: expert pages that are only touched at decode
# time are where a truncated file would otherwise surface as SIGBUS on the mmap.
# Also: a model without experts must pass through streaming untouched (same logits as off).
#
# Environment:
#   LOGITS_DUMP  tests/logits_dump binary                           (required)
#   MKMODEL      guanaco-mkmodel binary                             (required)
#   WORKDIR      scratch directory (created)                        (required)
#   VOCAB_DIR    exported as GUANACO_VOCAB_DIR for mkmodel          (optional)
#   LLAMA_CLI    patched llama-cli / llama-completion; unset -> its cases are SKIPped
#   CASE_TIMEOUT seconds per case (default 120); hitting it is a FAIL (hang)
#
# Output: one line per case "PASS|FAIL|SKIP name (reason)", last line
# "N passed, N failed, N skipped". Exit 1 if any failed.

set -u

: "${LOGITS_DUMP:?set LOGITS_DUMP to the logits_dump binary}"
: "${MKMODEL:?set MKMODEL to the guanaco-mkmodel binary}"
: "${WORKDIR:?set WORKDIR to a scratch directory}"
[ -x "$LOGITS_DUMP" ] || { echo "test_bad_input: LOGITS_DUMP '$LOGITS_DUMP' is not executable" >&2; exit 2; }
[ -x "$MKMODEL" ] || { echo "test_bad_input: MKMODEL '$MKMODEL' is not executable" >&2; exit 2; }
mkdir -p "$WORKDIR" || exit 2
[ -n "${VOCAB_DIR:-}" ] && export GUANACO_VOCAB_DIR="$VOCAB_DIR"
CASE_TIMEOUT=${CASE_TIMEOUT:-120}
W="$WORKDIR"

n_pass=0 n_fail=0 n_skip=0
record() {   # STATUS NAME REASON
    case "$1" in
        PASS) n_pass=$((n_pass + 1)) ;;
        FAIL) n_fail=$((n_fail + 1)) ;;
        SKIP) n_skip=$((n_skip + 1)) ;;
    esac
    echo "$1 $2 ($3)"
}

# run_case NAME EXPECT(fail|ok) WORDS_REGEX STREAMING(0|1|VALUE) CMD...
#   fail: rc must be in 1..127 and stderr must match WORDS_REGEX (grep -Ei)
#   ok:   rc must be 0
#   Always FAIL on timeout (hang), rc >= 128 (signal: abort, SIGBUS, SIGSEGV, OOM) or a crash
#   marker in the output.
#   STREAMING 0 unsets GUANACO_STREAMING, anything else is exported as its value.
run_case() {
    local name=$1 expect=$2 words=$3 streaming=$4
    shift 4
    local log="$W/$name.log"
    local -a envs=(env -u GUANACO_STREAMING)
    [ "$streaming" != 0 ] && envs=(env "GUANACO_STREAMING=$streaming")
    # stdin from /dev/null: an interactive CLI that wrongly accepted a bad flag would otherwise
    # wait on the terminal and look like a hang for the wrong reason.
    "${envs[@]}" timeout -k 10 "$CASE_TIMEOUT" "$@" < /dev/null > "$log" 2>&1
    local rc=$?
    if [ $rc -eq 124 ]; then
        record FAIL "$name" "hang: no exit within ${CASE_TIMEOUT}s"; return
    fi
    if [ $rc -ge 128 ]; then
        record FAIL "$name" "killed by signal $((rc - 128)) (rc=$rc): $(tail -1 "$log")"; return
    fi
    if grep -qE 'Aborted|core dumped|Segmentation fault|Bus error|GGML_ASSERT|terminate called' "$log"; then
        record FAIL "$name" "crash marker in output: $(grep -m1 -E 'Aborted|core dumped|Segmentation fault|Bus error|GGML_ASSERT|terminate called' "$log")"; return
    fi
    if [ "$expect" = ok ]; then
        if [ $rc -eq 0 ]; then
            record PASS "$name" "rc=0"
        else
            record FAIL "$name" "expected success, rc=$rc: $(tail -1 "$log")"
        fi
        return
    fi
    if [ $rc -eq 0 ]; then
        record FAIL "$name" "expected a non-zero exit, got rc=0"; return
    fi
    if ! grep -qEi -- "$words" "$log"; then
        record FAIL "$name" "rc=$rc but no message matching /$words/: $(tail -1 "$log")"; return
    fi
    record PASS "$name" "rc=$rc: $(grep -m1 -Ei -- "$words" "$log" | tr -cd "[:print:]" | cut -c1-140)"
}

# Byte offset of the middle of the first expert tensor (name contains "_exps"), from the GGUF
# header, so the truncation provably lands inside expert data. Tensor sizes are taken as the
# distance to the next tensor's offset (data is laid out in offset order), which needs no
# per-type size table. Prints nothing if it cannot parse (caller falls back to 70%).
expert_mid_offset() {
    command -v python3 >/dev/null 2>&1 || return 0
    python3 - "$1" <<'PY' 2>/dev/null
import struct, sys, os
p = sys.argv[1]; f = open(p, "rb"); size = os.path.getsize(p)
def rd(fmt): return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
def rstr(): n = rd("Q"); return f.read(n).decode("utf-8", "replace")
SC = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
def rval(t):
    if t in SC: return rd(SC[t])
    if t == 8: return rstr()
    if t == 9:
        et = rd("I"); n = rd("Q")
        if et in SC: f.seek(n * struct.calcsize(SC[et]), 1); return None
        return [rval(et) for _ in range(n)]
    raise ValueError(t)
assert f.read(4) == b"GGUF"
rd("I"); nt = rd("Q"); nkv = rd("Q"); align = 32
for _ in range(nkv):
    k = rstr(); v = rval(rd("I"))
    if k == "general.alignment": align = v
infos = []
for _ in range(nt):
    name = rstr(); nd = rd("I"); [rd("Q") for _ in range(nd)]; rd("I"); off = rd("Q")
    infos.append((off, name))
base = (f.tell() + align - 1) // align * align
infos.sort()
for i, (off, name) in enumerate(infos):
    if "_exps" in name:
        end = infos[i + 1][0] if i + 1 < len(infos) else size - base
        print(base + off + (end - off) // 2, name)
        break
PY
}

# --------------------------------------------------------------------------------- models
MODEL="$W/bad-input-tiny.gguf"
if ! "$MKMODEL" --arch qwen3moe --quant Q8_0 --seed 1 -o "$MODEL" > "$W/mkmodel.log" 2>&1; then
    echo "test_bad_input: cannot build the base model: $(tail -1 "$W/mkmodel.log")" >&2
    exit 2
fi
size=$(stat -c %s "$MODEL")

head -c 100000 /dev/urandom > "$W/random.gguf"
: > "$W/empty.gguf"
head -c 4096 "$MODEL" > "$W/trunc-header.gguf"     # cut inside the metadata

read -r cut cut_tensor < <(expert_mid_offset "$MODEL")
if [ -z "${cut:-}" ]; then
    cut=$((size * 70 / 100)); cut_tensor="(no parser: 70% of the file, experts dominate it)"
fi
head -c "$cut" "$MODEL" > "$W/trunc-experts.gguf"
echo "truncating $MODEL ($size bytes) at $cut, inside $cut_tensor"

LOADFAIL='failed to load|error loading|logits_dump:.*model'

# ---------------------------------------------------------------------------------- cases
for s in 0 1; do
    tag=$([ $s = 1 ] && echo on || echo off)
    run_case "missing-file-$tag"   fail "$LOADFAIL|no such file|not found" $s \
        "$LOGITS_DUMP" "$W/does-not-exist.gguf" "$W/out.bin"
    run_case "random-bytes-$tag"   fail "$LOADFAIL|magic|not a gguf" $s \
        "$LOGITS_DUMP" "$W/random.gguf" "$W/out.bin"
    run_case "empty-file-$tag"     fail "$LOADFAIL|magic" $s \
        "$LOGITS_DUMP" "$W/empty.gguf" "$W/out.bin"
    run_case "trunc-header-$tag"   fail "$LOADFAIL|truncat|read" $s \
        "$LOGITS_DUMP" "$W/trunc-header.gguf" "$W/out.bin"
    run_case "trunc-experts-$tag"  fail "$LOADFAIL|bounds|truncat|corrupt|incomplete|short" $s \
        "$LOGITS_DUMP" "$W/trunc-experts.gguf" "$W/out.bin"
done

# Dense passthrough: needs a model without experts. mkmodel is MoE-only unless it lists a
# dense arch; try the likely names it would use.
dense_arch=""
for a in llama qwen3 qwen2 dense; do
    if "$MKMODEL" --list 2>/dev/null | awk '$1 == "arch" { print $2 }' | grep -qx "$a"; then
        dense_arch=$a; break
    fi
done
if [ -z "$dense_arch" ]; then
    record SKIP dense-passthrough "mkmodel --list has no dense (expert-free) arch"
elif ! "$MKMODEL" --arch "$dense_arch" --seed 1 -o "$W/dense.gguf" > "$W/mkmodel-dense.log" 2>&1; then
    record SKIP dense-passthrough "mkmodel --arch $dense_arch failed: $(tail -1 "$W/mkmodel-dense.log")"
else
    run_case dense-off ok "" 0 "$LOGITS_DUMP" "$W/dense.gguf" "$W/dense-off.bin"
    run_case dense-on  ok "" 1 "$LOGITS_DUMP" "$W/dense.gguf" "$W/dense-on.bin"
    if [ -e "$W/dense-off.bin" ] && [ -e "$W/dense-on.bin" ] && cmp -s "$W/dense-off.bin" "$W/dense-on.bin"; then
        record PASS dense-logits "on == off, bit-identical"
    else
        record FAIL dense-logits "on and off dumps differ or are missing"
    fi
fi

# Absurd values must be rejected by name, not ignored. This suite always runs against the
# patched build, so an absurd GUANACO_STREAMING that loads anyway is a failure, not a skip.
run_case env-banana fail "GUANACO_STREAMING" banana "$LOGITS_DUMP" "$MODEL" "$W/out.bin"

if [ -z "${LLAMA_CLI:-}" ]; then
    record SKIP cli-streaming-maybe "LLAMA_CLI unset"
    record SKIP cli-readahead-nonsense "LLAMA_CLI unset"
    record SKIP cli-env-banana "LLAMA_CLI unset"
elif ! timeout 60 "$LLAMA_CLI" --help < /dev/null 2>&1 | grep -q -- '--guanaco-streaming'; then
    # An unpatched CLI rejects the flag as unknown, which would "pass" for the wrong reason.
    record SKIP cli-streaming-maybe "$LLAMA_CLI --help does not list --guanaco-streaming: unpatched build"
    record SKIP cli-readahead-nonsense "$LLAMA_CLI --help does not list --guanaco-streaming: unpatched build"
    record SKIP cli-env-banana "$LLAMA_CLI --help does not list --guanaco-streaming: unpatched build"
else
    cli_args=(-m "$MODEL" -n 1 -p hi)
    run_case cli-streaming-maybe    fail "guanaco-streaming" 0 "$LLAMA_CLI" "${cli_args[@]}" --guanaco-streaming=maybe
    run_case cli-readahead-nonsense fail "guanaco-readahead" 0 "$LLAMA_CLI" "${cli_args[@]}" --guanaco-readahead nonsense
    run_case cli-env-banana         fail "GUANACO_STREAMING" banana "$LLAMA_CLI" "${cli_args[@]}"
fi
# The CLI path loads through common/ (different params, warmup run), so it gets its own
# truncated-model cases; these need no Guanaco flag and run against any LLAMA_CLI.
if [ -n "${LLAMA_CLI:-}" ]; then
    for s in 0 1; do
        tag=$([ $s = 1 ] && echo on || echo off)
        run_case "cli-trunc-experts-$tag" fail "failed to load|error|bounds|truncat|corrupt" $s \
            "$LLAMA_CLI" -m "$W/trunc-experts.gguf" -n 1 -p hi
    done
fi

echo "$n_pass passed, $n_fail failed, $n_skip skipped"
[ $n_fail -gt 0 ] && exit 1
exit 0
