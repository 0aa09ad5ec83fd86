#!/usr/bin/env bash
# test_residency_live.sh - owns the end-to-end checks of the residency engine
# (--guanaco-ram / --guanaco-max-experts) through a real decode:
#   - logits under a budget far below the expert bytes are bit-identical to
#     streaming off --guanaco-reference, for several architectures (fused
#     gate_up included), both io backends and every policy;
#   - the budget is real without any cgroup, for page-cache and direct
#     loading (details at that check);
#   - expert slices over 4 MiB load their 2 MiB-aligned middles in huge folios, with the same logits;
#   - absurd budgets are refused by name.
# Env: MKMODEL, LOGITS_DUMP, WORKDIR, VOCAB_DIR, EVICT_TOOL.
set -u
: "${MKMODEL:?}" "${LOGITS_DUMP:?}" "${WORKDIR:?}"
export GUANACO_VOCAB_DIR=${VOCAB_DIR:-${GUANACO_VOCAB_DIR:-}}
W="$WORKDIR/residency-live"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The read-ahead throttle would keep read-ahead off in ubatches it measures that way: here every run with a
# predictor must read ahead in every ubatch, so it is off except where a run turns it on.
export GUANACO_PREFETCH_THROTTLE=off

# Logits: on with a budget == the reference the engine names on its "N expert tensors run repacked, so results
# equal ..." line: plain llama.cpp's default where experts run repacked (--guanaco-repack on; auto only when every
# expert fits, which these budgets never allow), else off --guanaco-reference (experts in the file's layout, the rest repacked as llama.cpp chooses).
# Either way the same kernels as streaming, and a wrong claim fails the cmp.
# lfm2moe and nemotron_h_moe are hybrids (short-convolution or mamba2 blocks between attention and MoE);
# their quant types keep the expert bytes above the budgets below.
for spec in "qwen3moe Q8_0" "gpt-oss MXFP4" "qwen35moe Q4_0" "mixtral Q4_K" "lfm2moe Q8_0" "nemotron_h_moe F16" "afmoe Q8_0"; do
    set -- $spec
    arch=$1 quant=$2 m="$W/$1-$2.gguf"
    "$MKMODEL" --arch "$arch" --quant "$quant" --seed 11 -o "$m" >/dev/null 2>&1
    check "$arch $quant written" $? "mkmodel failed"
    env -u GUANACO_STREAMING GUANACO_REFERENCE=1 "$LOGITS_DUMP" "$m" "$W/$arch.off.bin" >"$W/$arch.off.log" 2>&1
    check "$arch $quant off" $? "$(tail -2 "$W/$arch.off.log")"
    env -u GUANACO_STREAMING -u GUANACO_REFERENCE "$LOGITS_DUMP" "$m" "$W/$arch.default.bin" >"$W/$arch.default.log" 2>&1
    check "$arch $quant plain default" $? "$(tail -2 "$W/$arch.default.log")"
    # The last field is the read-ahead: every predictor (gate too), and the whole next layer for the 48-token prompt
    # (--ubatch 16 makes three prompt ubatches, so the pilot also guesses for multi-token batches).
    for run in "guanaco io_uring 3M direct pilot" "lru threads 3M page-cache pilot" \
               "layer-lru io_uring 2M page-cache none" "layer-lru threads 2M direct none+overlap=off" \
               "lfu threads 4M direct pilot+overlap=off" "guanaco threads 3M page-cache pilot" \
               "layer-lru io_uring 4M page-cache pilot --ubatch 16" "lru io_uring 3M page-cache gate" "guanaco io_uring 3M direct gate" \
               "guanaco io_uring 3M direct gate+overlap=off" "lru io_uring 2M direct pilot+slots=off" \
               "guanaco threads 2M page-cache gate --ubatch 16" \
               "lru io_uring 3M page-cache throttled-gate --gen-tokens 40" \
               "layer-lru io_uring 3M direct pilot+repack=on" "lru threads 2M page-cache none+repack=off" \
               "layer-lru io_uring 4M page-cache pilot+stream --ubatch 16" "guanaco threads 3M page-cache gate+stream" \
               "lru threads 2M direct pilot+stream --ubatch 16" "guanaco io_uring 3M direct gate+stream+sdirect=off" \
               "lru threads 2M direct pilot+stream --turns 3" \
               "lru io_uring 3M page-cache pilot+nostream --ubatch 16" \
               "layer-lru threads 3M page-cache pilot+overlap=off --ubatch 16"; do
        set -- $run
        name="$1.$2.$5${6:+.${6#--}$7}"
        # throttled-X: predictor X with the throttle on, so read-ahead changes between ubatches (40 tokens: decode
        # starts off, tries read-ahead in its third epoch of 4 tokens and again at most one epoch in 8)
        # X+repack=Y: --guanaco-repack Y (the default is auto)
        # --turns 3: prompt and decode three times in one context, so that prompts come after decode
        # X+stream: --guanaco-stream-prompts on (the default), checked to stream (direct loading too: its prompts
        # read into the stream buffers with O_DIRECT, or with X+sdirect=off through the page cache, its decode
        # into slots); X+nostream: off
        # X+slots=off: --guanaco-fixed-slots off (direct loading places its copies in the mapping; the others
        # compute each expert from its slot)
        # X+overlap=off: --guanaco-overlap-layer off (the default: every call maps its reads before the layer
        # computes); the others run with it on, so the logits are checked both ways, for page-cache loading
        # (the matmuls fault the pages in) and direct loading (MUL_MAT_ID asks for each expert)
        throttle=off predictor=${5%%+*} repack=auto stream=default overlap=on slots=on sdirect=on
        [ "${5#*+sdirect=}" != "$5" ] && sdirect=${5#*+sdirect=}
        [ "${5#*+slots=}" != "$5" ] && slots=${5#*+slots=}
        [ "${5#*+repack=}" != "$5" ] && repack=${5#*+repack=}
        [ "${5#*+stream}" != "$5" ] && stream=on
        [ "${5#*+nostream}" != "$5" ] && stream=off
        [ "${5#*+overlap=}" != "$5" ] && overlap=${5#*+overlap=}
        stream_env=(GUANACO_OVERLAP_LAYER=$overlap GUANACO_FIXED_SLOTS=$slots GUANACO_STREAM_DIRECT=$sdirect)
        [ $stream = default ] || stream_env+=(GUANACO_STREAM_PROMPTS=$stream)
        [ "${predictor#throttled-}" != "$predictor" ] && throttle=on predictor=${predictor#throttled-}
        GUANACO_STREAMING=1 GUANACO_POLICY=$1 GUANACO_IO=$2 GUANACO_RAM=$3 GUANACO_MAX_EXPERTS=6 GUANACO_LOAD=$4 \
            GUANACO_PREFETCH=$predictor GUANACO_PREFETCH_THROTTLE=$throttle GUANACO_REPACK=$repack \
            env "${stream_env[@]}" "$LOGITS_DUMP" "$m" "$W/$arch.$name.bin" ${6:+$6 $7} >"$W/$arch.$name.log" 2>&1
        rc=$?
        reference=off ref_name="off --guanaco-reference" ref_env=(GUANACO_REFERENCE=1)
        if grep -q "so results equal plain llama.cpp's default" "$W/$arch.$name.log"; then
            reference=default ref_name="plain default (experts repacked)" ref_env=()
        fi
        [ "$repack" = on ] && [ "$reference" = off ] && ref_name="plain default, as --guanaco-repack on promises"
        [ "$repack" = off ] && [ "$reference" = default ] && ref_name="off --guanaco-reference, as --guanaco-repack off promises"
        ref="$W/$arch.$reference.bin"
        if [ "${6:-}" = --gen-tokens ] || [ "${6:-}" = --turns ]; then
            ref="$W/$arch.$reference.${6#--}$7.bin"
            [ -f "$ref" ] || env -u GUANACO_STREAMING -u GUANACO_REFERENCE "${ref_env[@]}" "$LOGITS_DUMP" "$m" "$ref" $6 $7 \
                >/dev/null 2>&1
        fi
        grep -q "residency: budget" "$W/$arch.$name.log" && [ $rc -eq 0 ] && cmp -s "$ref" "$W/$arch.$name.bin" &&
            [ "$ref_name" = "${ref_name%promises}" ]
        check "$arch $quant: budget $3, policy $1, io $2, load $4, prefetch $5 ${6:-} ${7:-}== $ref_name" $? \
            "rc=$rc $(grep -E 'guanaco: (error|residency)' "$W/$arch.$name.log" | head -3)"
        # each layer's reads overlap its compute unless told not to (experts repacked into arenas never do); with
        # direct loading the matmuls asked for some of the loads while their layer computed (the rest had landed
        # when the call ended)
        if [ "$repack" != on ]; then
            grep -qE 'load [a-z-]+ \(a layer computes while its reads land\)' "$W/$arch.$name.log"
            [ $? -eq $([ $overlap = on ] && echo 0 || echo 1) ]
            check "$arch $quant: $name overlaps its layers' reads: $overlap" $? "$(grep -o 'load [a-z-]* [^,]*' "$W/$arch.$name.log" | head -1)"
        fi
        if [ "$4" = direct ] && grep -q 'load direct (a layer computes' "$W/$arch.$name.log"; then
            grep 'guanaco: residency: [0-9]' "$W/$arch.$name.log" | grep -oE '[0-9]+ loads settled while their layer computed' |
                awk '{ exit !($1 > 0) }'
            check "$arch $quant: $name settled loads while their layer computed" $? \
                "$(grep -oE '[0-9]+ loads settled[^,]*' "$W/$arch.$name.log" | tail -1)"
            # its experts computed from their fixed slots unless told not to
            grep -q 'while its reads land) into fixed slots' "$W/$arch.$name.log"
            [ $? -eq $([ $slots = on ] && echo 0 || echo 1) ]
            check "$arch $quant: $name computes from fixed slots: $slots" $? "$(grep -o 'load direct[^,]*' "$W/$arch.$name.log" | head -1)"
        fi
        # a predictor must really read ahead and use some of it, into the page cache or (direct, gate: its decode
        # guesses are sure enough on these tiny models, where pilot's are not) into
        # copies. Direct with the overlap reads ahead too, but its calls end later, so other experts miss, and on
        # these few dozen accesses whether a sure guess meets a miss is chance: only its logits are checked.
        if [ "$predictor" != none ] && [ $throttle = off ] &&
            { [ "$4" = page-cache ] || { [ "$predictor" = gate ] && [ $overlap = off ]; }; }; then
            grep 'guanaco: residency: [0-9]' "$W/$arch.$name.log" | grep -o 'read-ahead [0-9.]* MiB issued, [0-9.]* used' |
                awk '{ exit !($2 > 0 && $5 > 0) }'
            check "$arch $quant: $name read ahead and used some of it" $? \
                "$(grep -o 'read-ahead[^;]*' "$W/$arch.$name.log" | tail -1)"
        fi
        # streamed prompts really streamed: the prompt's reads were used once and not kept
        if [ $stream = on ]; then
            grep 'guanaco: residency: [0-9]' "$W/$arch.$name.log" | grep -o 'streamed [0-9.]* MiB' |
                awk '{ s += $2 } END { exit !(s > 0) }'
            check "$arch $quant: $name streamed its prompt" $? "$(grep -o 'streamed [^)]*)' "$W/$arch.$name.log" | tail -2)"
            if [ "$4" = direct ] && [ $slots = on ] && [ $overlap = on ] && [ "$repack" != on ]; then
                # into the stream buffers with O_DIRECT, unless told not to
                grep 'guanaco: residency: [0-9]' "$W/$arch.$name.log" | grep -oE '[0-9.]+ read direct into the stream' |
                    awk -v on=$([ $sdirect = on ] && echo 1 || echo 0) '{ s += $1 } END { exit !(NR > 0 && (s > 0) == on) }'
                check "$arch $quant: $name streamed into the stream buffers: $sdirect" $? \
                    "$(grep -o 'streamed [^)]*)' "$W/$arch.$name.log" | tail -2)"
            fi
            # a prompt after decode gives slots back (the spares, its streamed layers' evictions), splitting the 2 MiB
            # pages they share with resident neighbours; the next decode rebuilds them, and the cmp above says the
            # neighbours' bytes survived
            if [ "${6:-}" = --turns ] && [ "$4" = direct ] && [ $slots = on ]; then
                if grep -q 'cannot rebuild huge pages' "$W/$arch.$name.log" ||
                    grep -q '\[never\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
                    echo "SKIP $arch $quant: $name rebuilt huge pages (no transparent huge pages or MADV_COLLAPSE here)"
                else
                    grep 'guanaco: residency: [0-9]' "$W/$arch.$name.log" | grep -oE 'huge pages rebuilt [0-9]+' |
                        awk '{ s += $4 } END { exit !(s > 0) }'
                    check "$arch $quant: $name rebuilt the huge pages its later prompts split" $? \
                        "$(grep -oE 'huge pages rebuilt [^)]*\)' "$W/$arch.$name.log" | sort | uniq -c | tr '\n' ' ')"
                fi
            fi
        elif [ $stream = off ]; then
            grep 'guanaco: residency: [0-9]' "$W/$arch.$name.log" | grep -o 'streamed [0-9.]* MiB' |
                awk '{ s += $2 } END { exit !(NR > 0 && s == 0) }'
            check "$arch $quant: $name kept what its prompt read (streaming off)" $? \
                "$(grep -o 'streamed [^)]*)' "$W/$arch.$name.log" | tail -2)"
        fi
        # gate follows every one of these routers (plain, biased, softmax-weighted) and scores its guesses
        # the throttle measured both sides of the decode and said which one it kept
        if [ $throttle = on ]; then
            grep -E 'read-ahead throttle, decode: on in [1-9][0-9]* of [0-9]+ ubatches; [0-9.]+ ms per token off, [0-9.]+ ms on' \
                "$W/$arch.$name.log" | grep -qvE ' 0\.0 ms (per token off|on)'
            check "$arch $quant: $name measured decode with read-ahead off and on" $? \
                "$(grep -E 'read-ahead throttle' "$W/$arch.$name.log" | head -2)"
        fi
        if [ "$predictor" = gate ] && [ $throttle = off ]; then
            grep -oE 'prefetch gate recall, top [0-9]+ / top [0-9]+: [0-9.]+ / [0-9.]+ over [0-9]+ token-layers' \
                "$W/$arch.$name.log" | awk '{ exit !($NF == "token-layers" && $(NF-1) > 0 && $(NF-3) > 0) }'
            check "$arch $quant: $name scored its guesses with the next layer's router" $? \
                "$(grep -E 'prefetch gate' "$W/$arch.$name.log" | head -2)"
        fi
    done
done

# The throttle times a ubatch by the tokens it started with: llama.cpp's last layer keeps only the rows that give
# logits, so a prompt's last MoE layer sees one token, and its time used to land in the decode throttle. llama-bench
# asks for one logit row per prompt: its warmup and timed prompts are the prompt throttle's two ubatches, and its
# 1 + 8 single tokens are the decode throttle's nine.
if [ -x "${LLAMA_BIN:-}/llama-bench" ]; then
    GUANACO_STREAMING=1 GUANACO_RAM=3M GUANACO_PREFETCH=pilot GUANACO_PREFETCH_THROTTLE=on \
        "$LLAMA_BIN/llama-bench" -m "$W/qwen3moe-Q8_0.gguf" -p 64 -n 8 -r 1 -t 1 >"$W/throttle-bench.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q 'read-ahead throttle, prompt: on in 2 of 2 ubatches' "$W/throttle-bench.log" &&
        grep -q 'read-ahead throttle, decode: on in [0-9]* of 9 ubatches' "$W/throttle-bench.log"
    check "llama-bench -p 64 -n 8: 2 prompt ubatches in the prompt throttle, 9 tokens in the decode one" $? \
        "rc=$rc $(grep -E 'read-ahead throttle|error' "$W/throttle-bench.log" | head -3)"
fi

# The budget is real, without any cgroup, in both ways of loading:
#   - from outside: the model file's page cache (fincore) while decoding. page-cache loading keeps the experts
#     there, so it is bounded by non-expert + budget + one layer's working set; direct loading reads around it,
#     so only the non-expert weights and the slices' shared edge pages may be cached;
#   - from inside: every status line (one per token) compares the engine's accounting with mincore over the
#     expert mappings (page cache or anonymous copies): they agree within page rounding, and mincore stays
#     within budget + one layer's working set.
if command -v fincore >/dev/null; then
    m="$W/mid.gguf"
    "$MKMODEL" --arch qwen3moe --quant Q8_0 --n-layer 8 --n-embd 1024 --n-ff-exp 384 --n-expert 32 --seed 3 \
        -o "$m" >/dev/null 2>&1
    size=$(stat -c %s "$m")
    budget=$((64 * 1024 * 1024))
    # One layer's working set: 48 prompt tokens touch every expert of a layer (32 x 3 slices of 1024x384 Q8_0).
    layer_set=$((32 * 3 * 1024 * 384 * 34 / 32))
    rounding=$((8 * 1024 * 1024)) # 2 edge pages per resident slice and per tensor: < 2 MiB here
    for load in page-cache direct; do
        [ -n "${EVICT_TOOL:-}" ] && "$EVICT_TOOL" "$m" >/dev/null
        GUANACO_STREAMING=1 GUANACO_RAM=$budget GUANACO_LOAD=$load GUANACO_STATUS_EVERY=1 GUANACO_AUDIT=1 \
            "$LOGITS_DUMP" "$m" "$W/mid.$load.bin" --gen-tokens 24 >"$W/mid.$load.log" 2>&1 &
        pid=$!
        peak=0
        while kill -0 $pid 2>/dev/null; do
            now=$(fincore --bytes --noheadings --output RES "$m" 2>/dev/null | tr -d ' ')
            [ -n "$now" ] && [ "$now" -gt "$peak" ] && peak=$now
            sleep 0.05
        done
        wait $pid
        check "mid-size decode under a 64 MiB budget, $load loading" $? "$(tail -3 "$W/mid.$load.log")"
        grep -q "load $load" "$W/mid.$load.log"
        check "$load loading in force" $? "$(grep 'residency:' "$W/mid.$load.log" | head -2)"
        experts=$(grep -o 'streaming [0-9]* expert tensors ([0-9.]* GiB' "$W/mid.$load.log" | grep -o '[0-9.]* GiB' | cut -d' ' -f1)
        non_expert=$(awk -v s="$size" -v e="$experts" 'BEGIN { printf "%d", s - e * 1073741824 }')
        # The first pass faults the non-expert weights in, and the device's read-ahead around those faults
        # reaches into expert ranges until the end of that pass drops what the accounting does not hold
        # (guanaco_residency_drop_unaccounted), as plain llama.cpp's mmap would read them: one window of it
        # is allowed (direct loading was caught once at 11 MiB over the non-expert bytes under CI load).
        dev=$(stat -c '%Hd:%Ld' "$m" 2>/dev/null)
        ra_kb=$(cat "/sys/dev/block/$dev/queue/read_ahead_kb" 2>/dev/null ||
            cat "/sys/dev/block/$dev/../queue/read_ahead_kb" 2>/dev/null || echo 8192)
        read_ahead=$((ra_kb * 1024))
        if [ $load = page-cache ]; then
            allowed=$((non_expert + budget + layer_set + rounding + read_ahead))
        else
            allowed=$((non_expert + rounding + read_ahead))
        fi
        [ "$peak" -gt 0 ] && [ "$peak" -le "$allowed" ]
        check "$load: page cache of the file peaked at $((peak / 1048576)) MiB <= $((allowed / 1048576)) MiB (non-expert $((non_expert / 1048576)) MiB, read-ahead $ra_kb KiB, file $((size / 1048576)) MiB)" $? \
            "peak $peak > allowed $allowed"
        # status lines: "... streamed S MiB ... RAM: accounted A MiB, mincore M MiB (F of it the file's page cache)".
        # A line logged at a prompt's last layer (its interval streamed) also holds that layer's streamed pages,
        # which its matmuls are about to read and the next call drops; they are no expert the policy holds, so they
        # may exceed the accounting by one layer's working set (in page-cache loading: the file's pages; direct
        # loading streams into buffers). Direct loading holds its experts in its own copies, so there the copies
        # (M - F) must agree with the accounting: the file's pages in expert ranges are never its own but what the
        # kernel read around faults on the other weights (the peak check above bounds them; CI once saw 9.8 MiB of
        # them after the first pass, when the whole of M was compared).
        report=$(grep 'RAM: accounted' "$W/mid.$load.log" | sed -E \
            's/.*streamed ([0-9.]+) MiB.*RAM: accounted ([0-9.]+) MiB, mincore ([0-9.]+) MiB \(([0-9.]+) of it the file.*/\1 \2 \3 \4/' |
            awk -v limit=$(((budget + layer_set + rounding) / 1048576)) -v slack=$((rounding / 1048576)) \
                -v layer=$(((layer_set + 1048575) / 1048576)) -v direct=$([ $load = direct ] && echo 1 || echo 0) '
            NF == 4 { s = $1; a = $2; m = $3; own = direct ? m - $4 : m; n++; if (m > peak) peak = m
              d = own - a; if (d < 0) d = -d; if (s > 0) d -= layer; if (d > worst) worst = d
              if (m > limit || d > slack) bad++ }
            END { printf "%d %d %.1f %.1f", n, bad, peak, worst }')
        set -- $report
        [ "${1:-0}" -ge 24 ] && [ "${2:-1}" -eq 0 ]
        what=$([ $load = direct ] && echo "its copies (mincore less the file's page cache)" || echo "mincore")
        check "$load: $1 status lines, mincore peaked at $3 MiB <= $(((budget + layer_set + rounding) / 1048576)) MiB, and $what agreed with the accounting within $4 MiB <= $((rounding / 1048576)) MiB (beyond a streamed layer)" $? \
            "$(grep 'RAM:' "$W/mid.$load.log" | sort -t, -k4 | tail -2)"
        cmp -s "$W/mid.page-cache.bin" "$W/mid.$load.bin"
        check "$load: same logits as page-cache loading" $? "logits differ"
    done
else
    echo "SKIP budget-is-real: fincore (util-linux) is not installed"
fi

# A warm start: the model is in the page cache from the runs above; the second of two runs adopts the experts
# the first left cached instead of reading them again, and computes the same logits.
m="$W/qwen3moe-Q8_0.gguf"
cat "$m" >/dev/null
GUANACO_STREAMING=1 GUANACO_RAM=3M "$LOGITS_DUMP" "$m" "$W/warm.bin" >"$W/warm.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -qE 'warm start: [1-9][0-9]* experts' "$W/warm.log" && grep -q 'preload: 0 experts' "$W/warm.log" &&
    cmp -s "$W/qwen3moe.off.bin" "$W/warm.bin"
check "warm start: cached experts adopted, nothing preloaded from disk, same logits" $? \
    "rc=$rc $(grep -E 'warm start|preload' "$W/warm.log")"

# A budget that keeps every expert: once all are resident the hook stops reading the router's ids (no graph
# split per MoE layer), and the logits stay those of streaming off. The 3M run above never gets there.
GUANACO_STREAMING=1 GUANACO_RAM=1G GUANACO_WHEN_FITS=engine "$LOGITS_DUMP" "$m" "$W/all.bin" >"$W/all.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q 'every expert is resident and the budget keeps them all' "$W/all.log" &&
    grep -q 'summary: 0 tokens routed' "$W/all.log" && cmp -s "$W/qwen3moe.off.bin" "$W/all.bin" &&
    ! grep -q 'every expert is resident' "$W/warm.log" && ! grep -q 'summary: 0 tokens routed' "$W/warm.log"
check "budget above every expert: router ids not read, same logits; under 3M they are read" $? \
    "rc=$rc $(grep -E 'every expert|summary' "$W/all.log" "$W/warm.log")"

# The same budget by default (--guanaco-when-fits plain): nothing would ever be read and this machine holds
# llama.cpp's own load, so the engine hands the experts to llama.cpp, which repacks them as it does without
# Guanaco. Its logits are plain default's, and so are those of the engine holding them itself (repacked, as the
# budget holds every expert). Inside a memory limit below llama.cpp's own load (the file, a repacked copy of the
# experts, 1 GiB) the engine keeps them.
CGROUP_RUN=${CGROUP_RUN:-$(dirname "${BASH_SOURCE[0]}")/cgroup_run.sh}
for spec in "gpt-oss MXFP4" "qwen35moe Q4_0" "mixtral Q4_K" "qwen3moe Q8_0"; do
    set -- $spec
    arch=$1 m="$W/$1-$2.gguf"
    GUANACO_STREAMING=1 GUANACO_RAM=1G "$LOGITS_DUMP" "$m" "$W/$arch.fits.bin" >"$W/$arch.fits.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && grep -q 'llama.cpp loads the experts as it does without Guanaco' "$W/$arch.fits.log" &&
        ! grep -q 'residency: budget' "$W/$arch.fits.log" && cmp -s "$W/$arch.default.bin" "$W/$arch.fits.bin"
    check "$arch $2: a budget above every expert hands them to llama.cpp, logits == plain default" $? \
        "rc=$rc $(grep -E 'guanaco: (error|--guanaco-ram|residency: budget)' "$W/$arch.fits.log" | head -2)"
    GUANACO_STREAMING=1 GUANACO_RAM=1G GUANACO_WHEN_FITS=engine "$LOGITS_DUMP" "$m" "$W/$arch.held.bin" \
        >"$W/$arch.held.log" 2>&1
    rc=$?
    ref=off
    grep -q "so results equal plain llama.cpp's default" "$W/$arch.held.log" && ref=default
    [ $rc -eq 0 ] && grep -q 'residency: budget' "$W/$arch.held.log" &&
        ! grep -q 'loads the experts as it does without Guanaco' "$W/$arch.held.log" &&
        cmp -s "$W/$arch.$ref.bin" "$W/$arch.held.bin"
    check "$arch $2: --guanaco-when-fits engine holds them, logits == plain $ref" $? \
        "rc=$rc $(grep -E 'guanaco: (error|residency: budget)' "$W/$arch.held.log" | head -2)"
    limit=$(($(stat -c %s "$m") + 512 * 1024 * 1024))
    GUANACO_STREAMING=1 GUANACO_RAM=1G timeout 300 "$CGROUP_RUN" "$limit" -- "$LOGITS_DUMP" "$m" "$W/$arch.limited.bin" \
        >"$W/$arch.limited.log" 2>&1
    rc=$?
    if [ $rc -eq 77 ]; then
        echo "SKIP $arch: inside a limit below llama.cpp's own load: $(grep -m1 '^SKIP' "$W/$arch.limited.log")"
        continue
    fi
    [ $rc -eq 0 ] && grep -q 'residency: budget' "$W/$arch.limited.log" &&
        ! grep -q 'loads the experts as it does without Guanaco' "$W/$arch.limited.log" &&
        cmp -s "$W/$arch.$ref.bin" "$W/$arch.limited.bin"
    check "$arch $2: in a limit of the file + 512 MiB the engine keeps them, logits == plain $ref" $? \
        "rc=$rc $(grep -E 'guanaco: (error|residency: budget)|^cgroup' "$W/$arch.limited.log" | head -3)"
done

# Expert slices of 4.5 MB (Mixtral's are 33 MB): demand loads read each slice's 2 MiB-aligned middle through a
# huge mapping (--guanaco-huge-folios, on by default) and the rest the 4 KiB way; the logits are the reference's
# either way, and the huge mapping really carried bytes where THP is not "never".
m="$W/big-slices.gguf"
"$MKMODEL" --arch qwen3moe --quant Q8_0 --n-layer 3 --n-embd 1024 --n-ff-exp 4096 --n-expert 8 --seed 5 -o "$m" \
    >/dev/null 2>&1
check "big-slice model written" $? "mkmodel failed"
env -u GUANACO_STREAMING GUANACO_REFERENCE=1 "$LOGITS_DUMP" "$m" "$W/big.off.bin" --gen-tokens 8 >"$W/big.off.log" 2>&1
check "big slices: off --guanaco-reference" $? "$(tail -2 "$W/big.off.log")"
env -u GUANACO_STREAMING -u GUANACO_REFERENCE "$LOGITS_DUMP" "$m" "$W/big.default.bin" --gen-tokens 8 >"$W/big.default.log" 2>&1
check "big slices: plain default" $? "$(tail -2 "$W/big.default.log")"
thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo "[never]")
for huge in on off; do
    [ -n "${EVICT_TOOL:-}" ] && "$EVICT_TOOL" "$m" >/dev/null
    GUANACO_STREAMING=1 GUANACO_RAM=40M GUANACO_LOAD=page-cache GUANACO_HUGE_FOLIOS=$huge GUANACO_STATUS_EVERY=1 \
        "$LOGITS_DUMP" "$m" "$W/big.$huge.bin" --gen-tokens 8 >"$W/big.$huge.log" 2>&1
    rc=$?
    loaded=$(grep 'guanaco: residency: [0-9]' "$W/big.$huge.log" | grep -o 'loaded [0-9.]* MiB via the huge mapping' |
        awk '{ print $2 }')
    ref=off
    grep -q "so results equal plain llama.cpp's default" "$W/big.$huge.log" && ref=default
    want="== 0"
    [ $huge = on ] && [ "${thp#*\[never\]}" = "$thp" ] && want="> 0"
    [ $rc -eq 0 ] && cmp -s "$W/big.$ref.bin" "$W/big.$huge.bin" && awk -v x="${loaded:-none}" -v w="$want" \
        'BEGIN { exit !(x != "none" && (w == "> 0" ? x > 0 : x == 0)) }'
    check "big slices, huge folios $huge: logits equal the $ref reference, ${loaded:-?} MiB loaded via the huge mapping ($want)" \
        $? "rc=$rc $(grep -E 'guanaco: (error|residency: [0-9])' "$W/big.$huge.log" | head -2)"
done
# --guanaco-load auto (the default) chooses direct loading for those 4.5 MB slices too (the old rule gave them
# page-cache loading), overlapped, with the same logits; and direct for the small model's (the warm start above).
[ -n "${EVICT_TOOL:-}" ] && "$EVICT_TOOL" "$m" >/dev/null
GUANACO_STREAMING=1 GUANACO_RAM=40M GUANACO_STATUS_EVERY=1 "$LOGITS_DUMP" "$m" "$W/big.auto.bin" --gen-tokens 8 \
    >"$W/big.auto.log" 2>&1
rc=$?
ref=off
grep -q "so results equal plain llama.cpp's default" "$W/big.auto.log" && ref=default
[ $rc -eq 0 ] && cmp -s "$W/big.$ref.bin" "$W/big.auto.bin" && grep -q 'guanaco-load auto: direct' "$W/big.auto.log" &&
    grep -q 'load direct (a layer computes while its reads land)' "$W/big.auto.log" &&
    grep -q 'guanaco-load auto: direct' "$W/warm.log" && grep -q 'load direct (a layer computes while its reads land)' \
    "$W/warm.log"
check "load auto: direct (overlapped) for 4.5 MB slices and for small ones, logits equal the $ref reference" $? \
    "rc=$rc $(grep -hE 'load auto|residency: budget|guanaco: error' "$W/big.auto.log" "$W/warm.log" | head -4)"
m="$W/qwen3moe-Q8_0.gguf"

GUANACO_STREAMING=1 GUANACO_RAM=12Q "$LOGITS_DUMP" "$W/qwen3moe-Q8_0.gguf" "$W/bad.bin" >"$W/bad.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "GUANACO_RAM" "$W/bad.log"
check "an absurd GUANACO_RAM is refused by name" $? "rc=$rc $(tail -2 "$W/bad.log")"
finish
