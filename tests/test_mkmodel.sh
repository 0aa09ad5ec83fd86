#!/usr/bin/env bash
# Checks guanaco-mkmodel's contract without llama.cpp: same seed gives the same
# bytes, a different seed gives different bytes, bad arguments fail cleanly,
# and --split-count writes the shard names llama.cpp's loader looks for.
#
# usage: tests/test_mkmodel.sh PATH/TO/guanaco-mkmodel VOCAB_DIR
#   VOCAB_DIR holds llama.cpp's models/ggml-vocab-*.gguf files.

set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 MKMODEL_BINARY VOCAB_DIR" >&2
    exit 2
fi

# absolute paths: the test runs inside its own scratch directory
MKMODEL=$(realpath -- "$1")
VOCAB_DIR=$(realpath -- "$2")
VOCAB="$VOCAB_DIR/ggml-vocab-llama-spm.gguf"

if [ ! -x "$MKMODEL" ]; then
    echo "FAIL: $MKMODEL is not an executable" >&2
    exit 1
fi
if [ ! -r "$VOCAB" ]; then
    echo "FAIL: $VOCAB not readable" >&2
    exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/test_mkmodel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# a crash must show up as a core file or a signal exit status, never be hidden
ulimit -c unlimited 2>/dev/null || true
cd "$WORK" || exit 1

failures=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# tiny model for ARCH QUANT SEED OUT [extra args...]
make_model() {
    local arch=$1 quant=$2 seed=$3 out=$4
    shift 4
    "$MKMODEL" --arch "$arch" --quant "$quant" --seed "$seed" --vocab "$VOCAB" -o "$out" "$@" \
        >"$out.log" 2>&1
}

# --- determinism ---------------------------------------------------------
for arch in qwen3moe mixtral deepseek2 gpt-oss lfm2moe nemotron_h_moe afmoe; do
    quant=Q4_0
    [ "$arch" = gpt-oss ] && quant=MXFP4
    if make_model "$arch" "$quant" 7 a.gguf && make_model "$arch" "$quant" 7 b.gguf --threads 1; then
        if cmp -s a.gguf b.gguf; then
            pass "$arch: same seed gives identical files (also across thread counts)"
        else
            fail "$arch: same seed gave different files"
        fi
    else
        fail "$arch: generation failed: $(cat a.gguf.log b.gguf.log 2>/dev/null)"
    fi
    if make_model "$arch" "$quant" 8 c.gguf; then
        if cmp -s a.gguf c.gguf; then
            fail "$arch: different seeds gave identical files"
        else
            pass "$arch: different seed gives a different file"
        fi
    else
        fail "$arch: generation with seed 8 failed: $(cat c.gguf.log)"
    fi
    rm -f a.gguf b.gguf c.gguf ./*.log
done

# --- bad arguments -------------------------------------------------------
# each case: a description, then the arguments
expect_error() {
    local what=$1
    shift
    rm -f core core.* bad.gguf
    "$MKMODEL" "$@" >out.txt 2>err.txt
    local rc=$?
    if [ $rc -eq 0 ]; then
        fail "$what: exited 0"
    elif [ $rc -gt 128 ]; then
        fail "$what: killed by signal $((rc - 128))"
    elif ls core core.* >/dev/null 2>&1; then
        fail "$what: dumped core"
    elif ! grep -q '^guanaco-mkmodel: ' err.txt; then
        fail "$what: no 'guanaco-mkmodel: <message>' on stderr (got: $(head -c 200 err.txt))"
    else
        pass "$what: exit $rc, $(grep -m 1 '^guanaco-mkmodel: ' err.txt)"
    fi
}

V=(--vocab "$VOCAB")
expect_error "unknown arch"          --arch nosuch "${V[@]}" -o bad.gguf
expect_error "unknown quant"         --arch qwen3moe --quant Q3_K "${V[@]}" -o bad.gguf
expect_error "unknown preset"        --arch qwen3moe --preset huge "${V[@]}" -o bad.gguf
expect_error "preset/arch mismatch"  --arch mixtral --preset qwen3-30b-a3b "${V[@]}" -o bad.gguf
expect_error "missing arch"          "${V[@]}" -o bad.gguf
expect_error "missing output"        --arch qwen3moe "${V[@]}"
expect_error "missing value"         --arch qwen3moe "${V[@]}" -o
expect_error "unknown flag"          --arch qwen3moe --frobnicate "${V[@]}" -o bad.gguf
expect_error "non-numeric n-layer"   --arch qwen3moe --n-layer abc "${V[@]}" -o bad.gguf
expect_error "zero n-layer"          --arch qwen3moe --n-layer 0 "${V[@]}" -o bad.gguf
expect_error "huge n-layer"          --arch qwen3moe --n-layer 100000 "${V[@]}" -o bad.gguf
expect_error "negative n-embd"       --arch qwen3moe --n-embd -256 "${V[@]}" -o bad.gguf
expect_error "n-embd not /32"        --arch qwen3moe --n-embd 300 "${V[@]}" -o bad.gguf
expect_error "n-ff-exp not /32"      --arch qwen3moe --n-ff-exp 100 "${V[@]}" -o bad.gguf
expect_error "used > experts"        --arch qwen3moe --n-expert 4 --n-expert-used 8 "${V[@]}" -o bad.gguf
expect_error "trailing junk number"  --arch qwen3moe --n-expert 8x "${V[@]}" -o bad.gguf
expect_error "negative seed"         --arch qwen3moe --seed -1 "${V[@]}" -o bad.gguf
expect_error "split-count 0"         --arch qwen3moe --split-count 0 "${V[@]}" -o bad.gguf
expect_error "fused on non-fused arch" --arch qwen3moe --fused-gate-up "${V[@]}" -o bad.gguf
expect_error "fused on nemotron_h_moe" --arch nemotron_h_moe --fused-gate-up "${V[@]}" -o bad.gguf
expect_error "lfm2moe without attention" --arch lfm2moe --n-layer 1 "${V[@]}" -o bad.gguf
expect_error "nemotron_h_moe without every block kind" --arch nemotron_h_moe --n-layer 2 "${V[@]}" -o bad.gguf
expect_error "missing vocab file"    --arch qwen3moe --vocab "$WORK/none.gguf" -o bad.gguf
expect_error "vocab not a gguf"      --arch qwen3moe --vocab /etc/hostname -o bad.gguf
expect_error "unwritable output"     --arch qwen3moe "${V[@]}" -o "$WORK/no/such/dir/m.gguf"
GUANACO_VOCAB_DIR= expect_error "no vocab configured" --arch qwen3moe -o bad.gguf
if [ -c /dev/full ] && [ -w /dev/full ]; then
    expect_error "disk full"         --arch qwen3moe "${V[@]}" -o /dev/full
    # cleanup of partial output must only ever remove regular files
    if [ -c /dev/full ]; then
        pass "disk full: /dev/full left in place"
    else
        fail "disk full: /dev/full was removed"
    fi
fi

# --- split ---------------------------------------------------------------
if make_model qwen3moe Q4_0 3 split.gguf --split-count 3; then
    ok=1
    for k in 1 2 3; do
        f=$(printf 'split-%05d-of-00003.gguf' "$k")
        if [ ! -s "$f" ]; then
            fail "split: $f missing or empty"
            ok=0
        fi
    done
    if [ -e split.gguf ]; then
        fail "split: unsplit split.gguf written as well"
        ok=0
    fi
    [ $ok -eq 1 ] && pass "split: split-0000{1,2,3}-of-00003.gguf written"
    # shards are deterministic too
    mkdir -p again
    if make_model qwen3moe Q4_0 3 again/split.gguf --split-count 3 &&
        cmp -s split-00002-of-00003.gguf again/split-00002-of-00003.gguf; then
        pass "split: shards are reproducible"
    else
        fail "split: shards differ between runs"
    fi
else
    fail "split: generation failed: $(cat split.gguf.log)"
fi

# --- list / help ---------------------------------------------------------
if "$MKMODEL" --list | grep -q '^arch qwen3moe$' && "$MKMODEL" --help | grep -q 'usage:'; then
    pass "--list and --help"
else
    fail "--list or --help output"
fi

if [ $failures -ne 0 ]; then
    echo "test_mkmodel: $failures FAILED"
    exit 1
fi
echo "test_mkmodel: all passed"
