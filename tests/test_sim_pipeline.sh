#!/usr/bin/env bash
# test_sim_pipeline.sh - owns the checks of guanaco-sim that need no recorded
# routing, so that they run in a fresh clone (test_sim.sh skips without the
# shared Mixtral traces): expert sizes read from a GGUF (--model), a trace of
# another shape refused, and the pipeline's timing on traces whose times are
# worked out by hand: a layer read ahead in full takes max(compute, reads),
# one with nothing read ahead their sum, and a prompt ubatch reads the whole
# next layer ahead; a streamed prompt leaves nothing resident (with
# --stream-prompts off a second prompt only computes); a prompt is timed at
# --prompt-disk-gbps; a victim's drop (--drop-cpu-s-per-gb) hides under the
# next call's reads where shorter, and read-ahead's kernel CPU
# (--read-cpu-s-per-gb over --cpu-cores) slows the compute it overlaps; with
# --load direct no folio CPU is charged, and placing and evicting copies is,
# and so are the O_DIRECT reads' own CPU where compute runs beside them.
# And the pilot predictor's recall on guanaco-tracegen traces: higher where
# each layer's routing follows the previous layer's than where it does not.
# Env: SIM, TRACE_CONVERT, WORKDIR, MKMODEL, TRACEGEN.
set -u
: "${SIM:?}" "${TRACE_CONVERT:?}" "${WORKDIR:?}"
W="$WORKDIR/sim_pipeline"
rm -rf "$W" && mkdir -p "$W"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --model: expert bytes from a GGUF. A synthetic qwen3moe of 4 layers x 8 experts, top-2, 64 x 64 experts
# in Q8_0 holds 3 * 64 * 64 * 34/32 = 13056 bytes per expert, 417792 in all.
if [ -n "${MKMODEL:-}" ]; then
    tiny_qwen3moe "$W/tiny.gguf"
    check "synthetic qwen3moe written" $? "$(cat "$W/tiny.gguf.log")"
    awk 'BEGIN { for (t = 0; t < 50; t++) for (l = 0; l < 4; l++) {
        a = (t * 3 + l) % 8; b = (a + 1 + t % 7) % 8
        printf "{\"dataset\": \"d\", \"problem_id\": 0, \"layer\": %d, \"experts\": [%d, %d], \"token_idx\": %d}\n", l, a, b, t
    } }' >"$W/tiny.jsonl"
    "$TRACE_CONVERT" "$W/tiny.jsonl" "$W/tiny.trace" --arch qwen3moe >/dev/null 2>&1
    check "synthetic trace converts" $? ""
    model=$("$SIM" --trace "$W/tiny.trace" --model "$W/tiny.gguf" --budgets 100% --policies all --csv "$W/tiny.csv" 2>&1)
    check "guanaco-sim --model runs" $? "$model"
    bad_rows=$(awk -F, 'NR > 1 && ($3 != 417792 || $8 != 32)' "$W/tiny.csv" 2>&1)
    [ -z "$bad_rows" ] && [ "$(awk 'NR > 1' "$W/tiny.csv" | wc -l)" -eq 5 ]
    check "--model: 100% is 417792 bytes of experts, and leaves the 32 compulsory misses" $? "$bad_rows"
else
    echo "MKMODEL not set: the --model checks are skipped"
fi

# The pipeline's timing (offline/simulate.h), on the tiny model: 4 MoE layers of 8 experts, top-2, E = 13056 bytes
# per expert. Traces written by lib.sh's write_trace. Expected times are computed here by hand, not by the tool.
# overlap_of OUT PHASE: "serial overlapped" tok/s of the layer-lru line of PHASE in the pipeline table
overlap_of() { echo "$1" | awk -v ph="$2" '$1 == "layer-lru" && $3 == ph { print $6, $7 }'; }
if [ -n "${MKMODEL:-}" ] && [ -s "$W/tiny.gguf" ]; then
    # Decode: 9 tokens, each routing layer l to experts 2l and 2l+1. Budget 1e (4 experts in all): every layer
    # misses both experts each token. From token 1 pilot has learnt each transition (probability 1), so layers
    # 1-3 are read ahead during the previous layer's compute and layer 0 is read on demand. --warmup 1 leaves
    # tokens 1-8 timed. Reads of one layer: 2E at 261120 B/s = 100 ms.
    awk 'BEGIN { for (t = 0; t < 9; t++) for (l = 0; l < 4; l++) print 0, t, l, 2 * l, 2 * l + 1 }' | write_trace "$W/decode.trace"
    check "decode trace written" $? ""
    # (--overlap-layer off here and below: a layer waits for its own reads before it computes; the overlap is
    # checked on its own after these)
    timing="--model $W/tiny.gguf --budgets 1e --policies layer-lru --disk-gbps 0.00026112 --warmup 1 --overlap-layer off"
    for compute in 200 800; do
        pout=$("$SIM" --trace "$W/decode.trace" $timing --compute-ms $compute --predictor pilot 2>&1)
        check "guanaco-sim times decode at $compute ms per token" $? "$pout"
        got=$(overlap_of "$pout" decode)
        # C = compute / 4 layers; layer 0: 100 + C; layers 1-3: max(C, 100); serial: 4 * (100 + C)
        want=$(awk -v c=$compute 'BEGIN { c /= 4; o = 100 + c + 3 * (c > 100 ? c : 100); s = 4 * (100 + c)
            printf "%.2f %.2f", 1000 / s, 1000 / o }')
        [ -n "$got" ] && [ "$got" = "$want" ]
        check "every read guessed right: layers 1-3 take max(compute, reads), serial the sum ($compute ms)" $? \
            "got '$got', want '$want' (serial overlapped)"
        echo "$pout" | awk '$1 == "layer-lru" && $3 == "decode" && $4 == 8 && $5 == 8 { ok = 1 } END { exit !ok }'
        check "--warmup 1: 8 of 9 decode passes timed" $? "$pout"
    done
    # A budget of 2 experts: the computing layer only, so every layer misses both experts every token.
    pout=$("$SIM" --trace "$W/decode.trace" $timing --compute-ms 200 --budgets 26112 2>&1)
    got=$(overlap_of "$pout" decode)
    [ "$got" = "1.67 1.67" ]
    check "nothing read ahead (no --predictor): time = compute + reads, 4 * (50 + 100) ms per token" $? \
        "got '$got'; $pout"
    csv_overlap=$("$SIM" --trace "$W/decode.trace" $timing --compute-ms 200 --predictor pilot --csv "$W/pipe.csv" \
        >/dev/null 2>&1; awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
        $1 == "layer-lru" { printf "%.3f", $c["decode_overlap_tokens_per_second"] }' "$W/pipe.csv")
    [ "$csv_overlap" = "2.222" ]
    check "CSV: decode_overlap_tokens_per_second 1000 / 450 ms" $? "got '$csv_overlap'"

    # A prompt: one ubatch of 8 rows, row r routing every layer to r and r+1 (mod 8): all 8 experts of each
    # layer, at least 3/4, so the engine reads the whole next layer ahead. Budget 4e (16 experts) holds the
    # computing layer and the next one. Reads of a layer: 8E at 1044480 B/s = 100 ms; compute 25 ms per
    # prompt token, 8 tokens: 50 ms per layer. Layer 0: 100 + 50; layers 1-3: 50 + (100 - 50).
    awk 'BEGIN { for (l = 0; l < 4; l++) for (r = 0; r < 8; r++) print 0, r, l, r, (r + 1) % 8 }' | write_trace "$W/prompt.trace"
    check "prompt trace written" $? ""
    prompt="--model $W/tiny.gguf --budgets 4e --policies layer-lru --disk-gbps 0.00104448 --compute-ms 1000 --prompt-compute-ms 25 --overlap-layer off"
    pout=$("$SIM" --trace "$W/prompt.trace" $prompt --ubatches --predictor pilot 2>&1)
    got=$(overlap_of "$pout" prompt)
    # serial 4 * 150 = 600 ms, overlapped 150 + 3 * 100 = 450 ms, for 8 tokens
    [ "$got" = "13.33 17.78" ]
    check "prompt ubatch: the whole next layer read ahead, layers 1-3 take max(compute, reads)" $? "got '$got'; $pout"
    pout=$("$SIM" --trace "$W/prompt.trace" $prompt --ubatches 2>&1)
    [ "$(overlap_of "$pout" prompt)" = "13.33 13.33" ]
    check "prompt ubatch without a predictor: nothing read ahead, the sum" $? "$pout"
    pout=$("$SIM" --trace "$W/prompt.trace" $prompt --predictor pilot 2>&1)
    echo "$pout" | awk '$1 == "layer-lru" && $3 == "decode" && $5 == 8 { ok = 1 } $3 == "prompt" { bad = 1 }
        END { exit !(ok && !bad) }'
    check "without --ubatches every token is its own pass: 8 decode tokens, no prompt" $? "$pout"

    # Streamed prompts (--stream-prompts, on by default as in the engine): a call that needs half of its layer
    # or more uses its reads once, so the policy never admits them. Two prompt ubatches of the same 8 rows in
    # one sequence, the first a warmup; budget 8e holds the whole model (32 experts). No predictor, so every
    # read is demand: 8E at 1044480 B/s = 100 ms per layer, compute 50 ms per layer (25 ms x 8 tokens / 4).
    awk 'BEGIN { for (u = 0; u < 2; u++) for (l = 0; l < 4; l++) for (r = 0; r < 8; r++) print 0, 8 * u + r, l, r, (r + 1) % 8 }' |
        write_trace "$W/prompt2.trace"
    check "two-prompt trace written" $? ""
    twice="--model $W/tiny.gguf --budgets 8e --policies layer-lru --compute-ms 1000 --prompt-compute-ms 25 --ubatches --warmup 1 --overlap-layer off"
    pout=$("$SIM" --trace "$W/prompt2.trace" $twice --disk-gbps 0.00104448 2>&1)
    [ "$(overlap_of "$pout" prompt)" = "13.33 13.33" ]
    check "streamed prompt: nothing admitted, the second prompt reads every layer again, 4 * (100 + 50) ms" $? "$pout"
    echo "$pout" | awk '$1 == "layer-lru" && $3 == "prompt" && $NF == 1 { ok = 1 } END { exit !ok }'
    check "streamed prompt: the timed pass is counted as streamed" $? "$pout"
    pout=$("$SIM" --trace "$W/prompt2.trace" $twice --disk-gbps 0.00104448 --stream-prompts off 2>&1)
    [ "$(overlap_of "$pout" prompt)" = "40.00 40.00" ]
    check "--stream-prompts off: the first prompt's reads stay, the second only computes, 4 * 50 ms" $? "$pout"
    # A disk rate for prompts: decode's is half of it, and the prompt is timed with its own.
    pout=$("$SIM" --trace "$W/prompt2.trace" $twice --disk-gbps 0.00052224 --prompt-disk-gbps 0.00104448 2>&1)
    [ "$(overlap_of "$pout" prompt)" = "13.33 13.33" ]
    check "--prompt-disk-gbps times the prompt's reads, 4 * (100 + 50) ms" $? "$pout"
    pout=$("$SIM" --trace "$W/prompt2.trace" $twice --disk-gbps 0.00052224 2>&1)
    [ "$(overlap_of "$pout" prompt)" = "8.00 8.00" ]
    check "without it the prompt reads at --disk-gbps, 4 * (200 + 50) ms" $? "$pout"

    # The kernel's CPU. Budget of 2 experts, no predictor: every call misses its 2 experts (100 ms) and evicts
    # the previous layer's 2 (victims 2E = 26112 B). The engine drops them during the next call's reads, so a
    # layer waits max(100, D); the last MoE layer drops its own at once, + D. Layer 0 finds nothing pending.
    # Per token: 4 * 50 + 100 + 3 * max(100, D) + D.
    drops="--model $W/tiny.gguf --budgets 26112 --policies layer-lru --disk-gbps 0.00026112 --warmup 1 --compute-ms 200 --overlap-layer off"
    for case in "1914.83 50" "5744.49 150"; do
        read -r per_gb d <<<"$case"
        pout=$("$SIM" --trace "$W/decode.trace" $drops --drop-cpu-s-per-gb "$per_gb" 2>&1)
        got=$(overlap_of "$pout" decode | cut -d' ' -f2)
        want=$(awk -v d="$d" 'BEGIN { printf "%.2f", 1000 / (200 + 100 + 3 * (d > 100 ? d : 100) + d) }')
        [ -n "$got" ] && [ "$got" = "$want" ]
        check "--drop-cpu-s-per-gb: drop of $d ms per call hidden under reads where shorter, last layer's at once" $? \
            "got '$got', want '$want'; $pout"
    done
    # --overlap-layer on (off by default, as in the engine): a layer computes while its own reads land, so with
    # nothing read ahead it takes max(drop + compute, reads) and the last MoE layer's drop comes on top:
    # per token max(50, 100) + 3 * max(D + 50, 100) + D; serial stays 4 * (100 + 50) ms.
    for case in "0 0" "1914.83 50" "5744.49 150"; do
        read -r per_gb d <<<"$case"
        pout=$("$SIM" --trace "$W/decode.trace" ${drops% --overlap-layer off} --overlap-layer on --drop-cpu-s-per-gb "$per_gb" 2>&1)
        got=$(overlap_of "$pout" decode)
        want=$(awk -v d="$d" 'BEGIN { b = d + 50; printf "1.67 %.2f", 1000 / (100 + 3 * (b > 100 ? b : 100) + d) }')
        [ -n "$got" ] && [ "$got" = "$want" ] && echo "$pout" | grep -q "layers compute while their reads land: on"
        check "--overlap-layer on: a layer takes max(drop $d + compute 50, reads 100) ms" $? \
            "got '$got', want '$want'; $pout"
    done
    # Read-ahead's kernel CPU: every read guessed right (budget 1e, pilot) at 200 ms per token, 450 ms as above,
    # plus, for each of layers 1-3, 2E read ahead at X CPU-s per GB over 2 cores: X = 3829.66 is 50 ms each.
    pout=$("$SIM" --trace "$W/decode.trace" $timing --compute-ms 200 --predictor pilot --read-cpu-s-per-gb 3829.66 \
        --cpu-cores 2 2>&1)
    [ "$(overlap_of "$pout" decode | cut -d' ' -f2)" = "1.67" ]
    check "--read-cpu-s-per-gb: read-ahead's kernel CPU slows the compute it overlaps, 450 + 3 * 50 ms" $? "$pout"
    # --load direct: copies read with O_DIRECT, so no folio CPU is charged (the 4 KiB drop and read rates given
    # below must change nothing); each call's 2E loaded cost M ms to place and its victims (the previous
    # call's 2E, budget 2 experts) V ms to evict, both at once: per token 4 * (50 + 100 + M + V) ms, serial
    # 4 * (50 + 100 + M). 1914.83 CPU-s per GB of 2E is 50 ms, 3829.66 is 100.
    pout=$("$SIM" --trace "$W/decode.trace" $drops --drop-cpu-s-per-gb 5744.49 --read-cpu-s-per-gb 3829.66 \
        --load direct --map-cpu-s-per-gb 1914.83 --evict-cpu-s-per-gb 3829.66 2>&1)
    [ "$(overlap_of "$pout" decode)" = "1.25 0.83" ] && echo "$pout" | grep -q "direct loading: copies"
    check "--load direct: placing (50 ms) and evicting (100 ms) each call's copies at once, no folio drops" $? "$pout"
    # Read-ahead into direct copies: no kernel CPU (unlike the 4 KiB folios above), but each layer places its
    # 2E (M = 50 ms) after the reads: layer 0 100 + 50 + 50, layers 1-3 50 + (100 - 50) + 50, 650 ms a token.
    pout=$("$SIM" --trace "$W/decode.trace" $timing --compute-ms 200 --predictor pilot --read-cpu-s-per-gb 3829.66 \
        --cpu-cores 2 --load direct --map-cpu-s-per-gb 1914.83 2>&1)
    [ "$(overlap_of "$pout" decode | cut -d' ' -f2)" = "1.54" ]
    check "--load direct: read-ahead costs no kernel CPU, each layer places its copies, 650 ms a token" $? "$pout"
    # The O_DIRECT reads' own CPU (--direct-read-cpu-s-per-gb X over 2 cores). The read-ahead's runs under the
    # previous layer's compute and is charged whole: 3829.66 is 100 CPU-ms per 2E, 50 ms on each of layers 1-3,
    # whose compute becomes 100 ms: 100 + 50 + 50, then 100 + (100 - 50) + 50 three times, 800 ms a token. Layer 0's
    # demand reads find nothing of the layer in memory to compute beside them and cost nothing more.
    pout=$("$SIM" --trace "$W/decode.trace" $timing --compute-ms 200 --predictor pilot --cpu-cores 2 --load direct \
        --map-cpu-s-per-gb 1914.83 --direct-read-cpu-s-per-gb 3829.66 2>&1)
    [ "$(overlap_of "$pout" decode | cut -d' ' -f2)" = "1.25" ] && echo "$pout" | grep -q "the reads cost 3.83e+03 CPU-s"
    check "--direct-read-cpu-s-per-gb: read-ahead's reads slow the compute they overlap, 800 ms a token" $? "$pout"
    # A call's own reads take CPU from compute only while the layer's experts already in memory compute. Each layer
    # keeps expert 2l (a hit every token) and misses one other (E, 50 ms); budget 3e leaves 2l resident. 7659.3
    # CPU-s per GB is 100 CPU-ms per E, over 2 cores. At 200 ms a token the hit computes 25 ms of the 50 ms read:
    # half is charged, 25 ms, per layer 50 + 25 + 50; at 800 ms it computes 100 ms, all of it, 50 ms: 200 + 50 + 50.
    awk 'BEGIN { for (t = 0; t < 9; t++) for (l = 0; l < 4; l++) print 0, t, l, 2 * l, (2 * l + 1 + t % 7) % 8 }' |
        write_trace "$W/half.trace"
    # half_decode ARGS...: the replay of half.trace at budget 3e, lru; sets pout (its report) and got (lru's decode
    # tok/s, serial and overlapped)
    half_decode() {
        pout=$("$SIM" --trace "$W/half.trace" --model "$W/tiny.gguf" --budgets 3e --policies lru --disk-gbps 0.00026112 \
            --warmup 1 --overlap-layer off "$@" 2>&1)
        got=$(echo "$pout" | awk '$1 == "lru" && $3 == "decode" { print $6, $7 }')
    }
    for case in "200 0 2.50" "200 7659.3 2.00" "800 0 1.00" "800 7659.3 0.83"; do
        read -r compute per_gb want <<<"$case"
        half_decode --compute-ms "$compute" --cpu-cores 2 --load direct --direct-read-cpu-s-per-gb "$per_gb"
        [ "$got" = "$want $want" ]
        check "--direct-read-cpu-s-per-gb $per_gb at $compute ms a token: a call's reads charged while its hit computes" \
            $? "got '$got', want '$want $want'; $pout"
    done
    # Page-cache loading's first touches (--first-touch-cpu-s-per-gb), whole and not over the cores: two threads
    # took as long as one. The same trace at 200 ms a token, page-cache loading: per layer 50 ms of compute and the
    # miss's 50 ms read, 400 ms a token; 3829.66 s per GB is 50 ms per E (the tiny model's slices hold no 2 MiB-aligned
    # middle, so all of E counts), per layer 100 + 50, 600 ms a token, with 1 core or 2 (over 2: 500 ms).
    for case in "0 1 2.50" "3829.66 1 1.67" "3829.66 2 1.67"; do
        read -r per_gb cores want <<<"$case"
        half_decode --compute-ms 200 --cpu-cores "$cores" --load page-cache --first-touch-cpu-s-per-gb "$per_gb"
        [ "$got" = "$want $want" ]
        check "--first-touch-cpu-s-per-gb $per_gb on $cores core(s): page-cache loading's first touches, whole" \
            $? "got '$got', want '$want $want'; $pout"
    done
    echo "$pout" | grep -q "middles: 100.0% of the expert bytes"
    check "slices without a 2 MiB-aligned middle: all of their bytes are charged" $? "$pout"
    # Slices of 4.25 MiB (Q8_0, 1024 x 4096) always hold one or two aligned 2 MiB folios, so 0.25-2.25 MiB of each
    # goes in 4 KiB pages: 5.9-52.9% of the bytes, whatever the header's length puts them at.
    if "$MKMODEL" --arch qwen3moe --quant Q8_0 --n-layer 1 --n-embd 1024 --n-ff-exp 4096 --n-expert 4 --seed 5 \
        -o "$W/big-slices.gguf" >/dev/null 2>&1; then
        awk 'BEGIN { for (t = 0; t < 3; t++) print 0, t, 0, t % 4, (t + 1) % 4 }' | write_trace "$W/big.trace" 1 4
        pout=$("$SIM" --trace "$W/big.trace" --model "$W/big-slices.gguf" --budgets 1e --policies lru --disk-gbps 1 \
            --compute-ms 1 --first-touch-cpu-s-per-gb 0.3 2>&1)
        share=$(echo "$pout" | sed -n 's/.*middles: \([0-9.]*\)% of the expert bytes.*/\1/p')
        awk -v s="$share" 'BEGIN { exit !(s != "" && s >= 5.8 && s <= 53) }'
        check "4.25 MiB slices: only their ends are charged ($share% of the bytes)" $? "$pout"
    fi
    for bad in "--warmup 1" "--prompt-compute-ms 5" "--disk-gbps 1 --compute-ms 1 --warmup -1" \
        "--disk-gbps 1 --compute-ms 1 --prompt-compute-ms x" "--prompt-disk-gbps 1" \
        "--disk-gbps 1 --compute-ms 1 --prompt-disk-gbps 0" "--disk-gbps 1 --compute-ms 1 --stream-prompts maybe" \
        "--disk-gbps 1 --compute-ms 1 --overlap-layer 2" \
        "--disk-gbps 1 --compute-ms 1 --cpu-cores 0" "--disk-gbps 1 --compute-ms 1 --drop-cpu-s-per-gb -1" \
        "--disk-gbps 1 --compute-ms 1 --load mmap" "--load direct" \
        "--disk-gbps 1 --compute-ms 1 --map-cpu-s-per-gb 1" \
        "--disk-gbps 1 --compute-ms 1 --load page-cache --evict-cpu-s-per-gb 1" \
        "--disk-gbps 1 --compute-ms 1 --load direct --evict-cpu-s-per-gb -1" \
        "--disk-gbps 1 --compute-ms 1 --direct-read-cpu-s-per-gb 1" \
        "--disk-gbps 1 --compute-ms 1 --load direct --direct-read-cpu-s-per-gb -1" \
        "--first-touch-cpu-s-per-gb 1" "--disk-gbps 1 --compute-ms 1 --first-touch-cpu-s-per-gb -1" \
        "--disk-gbps 1 --compute-ms 1 --load direct --first-touch-cpu-s-per-gb 1"; do
        refused=$("$SIM" --trace "$W/prompt.trace" --model "$W/tiny.gguf" --budgets 4e $bad 2>&1)
        [ $? -eq 2 ]
        check "refused: $bad" $? "$refused"
    done
else
    echo "MKMODEL not set: the pipeline timing checks are skipped"
fi

# Prints "recall set_size precision" for the pilot line of mass $1 in the report on stdin.
pilot_line() { awk -v m="$1" '$1 == "pilot" && $2 + 0 == m + 0 { print $4, $5, $6 }'; }
if [ -n "${TRACEGEN:-}" ]; then
    for cross in 0.9 0; do
        "$TRACEGEN" --shape mixtral-8x7b --tokens 300 --cross-layer "$cross" -o "$W/cross$cross.trace" >/dev/null 2>&1
        check "tracegen --cross-layer $cross" $? ""
    done
    if [ -s "$W/tiny.gguf" ]; then
        mismatch=$("$SIM" --trace "$W/cross0.trace" --model "$W/tiny.gguf" 2>&1)
        status=$?
        [ "$status" -ne 0 ] && echo "$mismatch" | grep -q "refusing to replay"
        check "a Mixtral-shaped trace on the 4-layer model is refused" $? "status $status: $mismatch"
    fi
    follows=$("$SIM" --trace "$W/cross0.9.trace" --shape mixtral-8x7b --budgets 100% --policies lru \
        --predictor pilot --pilot-mass 0.6 2>&1 | pilot_line 0.6)
    independent=$("$SIM" --trace "$W/cross0.trace" --shape mixtral-8x7b --budgets 100% --policies lru \
        --predictor pilot --pilot-mass 0.6 2>&1 | pilot_line 0.6)
    echo "$follows $independent" | awk 'NF == 6 && $1 >= 0 && $1 <= 1 && $4 >= 0 && $4 <= 1 && $1 > $4 && $3 > $6 {
        ok = 1 } END { exit !ok }'
    check "pilot: higher recall and precision at cross-layer 0.9 than at 0" $? \
        "cross 0.9: $follows; cross 0: $independent (recall set precision)"
else
    echo "TRACEGEN not set: the synthetic predictor checks are skipped"
fi
finish
