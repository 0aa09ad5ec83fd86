#!/usr/bin/env bash
# policy_choice.sh - owns the choice of the default replacement policy (issue 8's
# policy target): the default never loses to lru at any budget, and gains at
# least 3 points of hit rate at 8-16 experts per layer on Qwen3-like routing.
# It replays, through guanaco-sim (the live engine's pure policies, plus
# Belady's optimum), the two recorded Mixtral-8x7B traces and six synthetic
# presets of guanaco-tracegen that differ in skew, reuse and drift, each at
# several budgets given as experts per layer, and writes the hit rates and the
# verdict per policy to a Markdown file. A rule tuned to one preset can lose on
# another, so the verdict takes every cell.
#
#   bench/policy_choice.sh [--out FILE.md] [--work DIR] [--threads N]
#
# CPU only, deterministic (fixed seeds): about 15 s on 2 cores. The synthetic
# traces are 4 sequences of 512 tokens (Qwen3 shape) or 256 tokens (Mixtral
# shape), short enough for that and long enough that a policy's warm-up is a
# small part of each replay. Decode only: every token is its own access.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${GUANACO_BIN:-$ROOT/build/cmake/bin}
TRACES=${GUANACO_MIXTRAL_TRACES:-/work/shared/traces/mixtral-8x7b}
out=$ROOT/bench/POLICY.md work="" threads=2
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "policy_choice: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for tool in guanaco-sim guanaco-tracegen guanaco-trace-convert; do
    [ -x "$BIN/$tool" ] || { echo "policy_choice: $BIN/$tool not built (cmake --build build/cmake --target $tool)" >&2; exit 1; }
done
[ -n "$work" ] || work=$(mktemp -d /tmp/policy-choice.XXXXXX)
mkdir -p "$work"

# name|shape|budgets|tracegen arguments (or "recorded FILE.jsonl"): what each input stands for is in the notes below
QWEN="--shape qwen3-30b-a3b --sequences 4 --tokens 512"
MIXTRAL="--shape mixtral-8x7b --sequences 4 --tokens 256"
QB=8e,12e,16e,32e,64e
MB=1e,2e,3e,4e
inputs=(
    "qwen3-preset|qwen3-30b-a3b|$QB|--preset qwen3-30b-a3b"
    "qwen3-flat-reuse|qwen3-30b-a3b|$QB|$QWEN --zipf 1.0 --reuse 0.4"
    "qwen3-drift|qwen3-30b-a3b|$QB|$QWEN --zipf 3 --zipf-offset 10 --reuse 0.2 --topic-every 16 --topic-strength 4"
    "qwen3-static|qwen3-30b-a3b|$QB|$QWEN --zipf 8 --zipf-offset 20 --zipf-spread 0.8"
    "qwen3-recency|qwen3-30b-a3b|$QB|$QWEN --reuse 0.7"
    "qwen3-uniform|qwen3-30b-a3b|$QB|$QWEN"
    "mixtral-preset|mixtral-8x7b|$MB|--preset mixtral-8x7b"
    "mixtral-recency|mixtral-8x7b|$MB|$MIXTRAL --reuse 0.5 --topic-every 16 --topic-strength 4"
    "mixtral-static|mixtral-8x7b|$MB|$MIXTRAL --zipf 2 --zipf-spread 0.5"
    "mixtral-uniform|mixtral-8x7b|$MB|$MIXTRAL"
    "recorded-humaneval|mixtral-8x7b|$MB|recorded humaneval_2_routing.jsonl"
    "recorded-gsm8k|mixtral-8x7b|$MB|recorded gsm8k_2_routing.jsonl"
)
# Held out: inputs that were not looked at when guanaco's duel constants (DUEL_MARGIN, DUEL_SLOWDOWN) were chosen
# on the ones above; other seeds, and mixes of skew, reuse, topics and cross-layer links the list above lacks.
held_out=(
    "qwen3-preset-seed2|qwen3-30b-a3b|$QB|--preset qwen3-30b-a3b --seed 2"
    "qwen3-preset-seed3|qwen3-30b-a3b|$QB|--preset qwen3-30b-a3b --seed 3"
    "qwen3-mid-topics|qwen3-30b-a3b|$QB|$QWEN --seed 5 --zipf 1.5 --reuse 0.3 --topic-every 64 --topic-strength 2"
    "qwen3-cross-layer|qwen3-30b-a3b|$QB|$QWEN --seed 6 --zipf 2 --reuse 0.5 --cross-layer 0.3"
    "mixtral-preset-seed2|mixtral-8x7b|$MB|--preset mixtral-8x7b --seed 2"
    "mixtral-mild|mixtral-8x7b|$MB|$MIXTRAL --seed 7 --zipf 1 --reuse 0.3"
)

commands=()
run() { # run CMD...: runs it, and records it for the report
    commands+=("$(echo "$*" | sed "s|$BIN/||g; s|$work/||g; s|$TRACES/||g")")
    "$@" >/dev/null
}

# input_table ENTRY...: the Markdown table of what each input is; csv_files ENTRY...: their CSVs
input_table() {
    echo "| input | shape | routing |"
    echo "|---|---|---|"
    local entry name shape budgets args
    for entry in "$@"; do
        IFS='|' read -r name shape budgets args <<<"$entry"
        echo "| $name | $shape | \`${args}\` |"
    done
}
csv_files() {
    local entry name
    for entry in "$@"; do
        IFS='|' read -r name _ <<<"$entry"
        echo "$work/$name.csv"
    done
}

for entry in "${inputs[@]}" "${held_out[@]}"; do
    IFS='|' read -r name shape budgets args <<<"$entry"
    if [[ $args == recorded* ]]; then
        run "$BIN/guanaco-trace-convert" "$TRACES/${args#recorded }" "$work/$name.trace" --arch llama --n-layer 32 --n-expert 8
    else
        # shellcheck disable=SC2086 # the arguments are words
        run "$BIN/guanaco-tracegen" -o "$work/$name.trace" $args
    fi
    run "$BIN/guanaco-sim" --trace "$work/$name.trace" --shape "$shape" --budgets "$budgets" --policies all \
        --threads "$threads" --csv "$work/$name.csv"
done

{
    echo "# Choosing the default replacement policy"
    echo
    echo "Written by \`bench/policy_choice.sh\` (guanaco-sim, CPU only, deterministic; $(date -u +%Y-%m-%d), commit"
    echo "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)). Hit % of every expert access served"
    echo "from RAM, decode (each token its own access), no preload. Budgets are experts per layer: 8e of"
    echo "128 is 6.25% (one token's working set at top-8), 1e of 8 is 12.5%. The rule (issue 8): the default never"
    echo "loses to \`lru\` in any cell, and gains at least 3 points at 8, 12 and 16 experts per layer on qwen3-preset."
    echo
    echo "Inputs:"
    echo
    input_table "${inputs[@]}"
    echo
    echo "The presets: qwen3-preset and mixtral-preset are tracegen's calibrated ones (published Qwen3-30B-A3B"
    echo "statistics; the recorded Mixtral files); flat-reuse: low skew, tokens repeat their experts; drift: the"
    echo "popular experts move every 16 tokens; static: steep, fixed popularity, no reuse (frequency wins);"
    echo "recency: no skew, strong reuse (recency wins); uniform: independent uniform routing (nothing to learn)."
    echo "The recorded ones are Mixtral-8x7B's own routing on two HumanEval and two GSM8K problems."
    echo
    echo "\`guanaco\` chooses how it keeps experts by set dueling (src/policy_guanaco.c): whether a layer keeps its"
    echo "working-set floor, and whether its experts leave by recency or by frequency, or lru's own order. Five shadow"
    echo "copies, one per fixed variant, replay the same accesses. It starts in lru's order and follows the one that"
    echo "missed least over a 128-token half-life once that one misses 5% less than the followed one, so where no"
    echo "variant is clearly better it is lru. Those two constants were chosen on the inputs above; the held-out"
    echo "table after the verdict checks them on inputs that were not looked at."
    echo
    awk -F, '
        FNR == 1 { input = FILENAME; sub(/.*\//, "", input); sub(/\.csv$/, "", input); order[++n_inputs] = input; next }
        {
            budget = input SUBSEP $2
            if (!(budget in seen)) { seen[budget] = 1; budgets[input, ++n_budgets[input]] = $2 }
            hit[input, $2, $1] = $5; hits[input, $2, $1] = $6
            if (!($1 in is_policy) && $1 != "belady") { is_policy[$1] = 1; policies[++n_policies] = $1 }
        }
        END {
            printf "| input | budget | experts/layer | belady |"
            for (p = 1; p <= n_policies; p++) printf " %s |", policies[p]
            for (p = 1; p <= n_policies; p++) if (policies[p] != "lru") printf " %s - lru |", policies[p]
            printf "\n|---|---|---|---|"
            for (p = 1; p <= n_policies; p++) printf "---|"
            for (p = 1; p <= n_policies; p++) if (policies[p] != "lru") printf "---|"
            printf "\n"
            for (i = 1; i <= n_inputs; i++) {
                in_ = order[i]; experts = in_ ~ /qwen3/ ? 128 : 8
                for (b = 1; b <= n_budgets[in_]; b++) {
                    bu = budgets[in_, b]; per_layer = bu * experts / 100
                    printf "| %s | %.2f%% | %g | %.2f |", in_, bu, per_layer, hit[in_, bu, "belady"]
                    for (p = 1; p <= n_policies; p++) printf " %.2f |", hit[in_, bu, policies[p]]
                    for (p = 1; p <= n_policies; p++) {
                        po = policies[p]
                        if (po == "lru") continue
                        d = hit[in_, bu, po] - hit[in_, bu, "lru"]
                        mark = hits[in_, bu, po] < hits[in_, bu, "lru"] ? " **loses**" : ""
                        printf " %+.2f%s |", d, mark
                        cells[po]++
                        if (hits[in_, bu, po] < hits[in_, bu, "lru"]) { losses[po]++ }
                        if (!(po in worst) || d < worst[po]) { worst[po] = d; worst_at[po] = in_ " " per_layer "e" }
                        if (in_ == "qwen3-preset" && per_layer >= 8 && per_layer <= 16) {
                            if (!(po in least) || d < least[po]) { least[po] = d; least_at[po] = per_layer "e" }
                        }
                    }
                    printf "\n"
                }
            }
            printf "\nVerdict per policy (a loss: fewer hits than lru in a cell):\n\n"
            printf "| policy | cells lost to lru | worst cell against lru | least gain at 8-16e on qwen3-preset | meets the rule |\n"
            printf "|---|---|---|---|---|\n"
            for (p = 1; p <= n_policies; p++) {
                po = policies[p]
                if (po == "lru") continue
                meets = (losses[po] + 0 == 0 && least[po] >= 3) ? "yes" : "no"
                printf "| %s | %d of %d | %+.2f (%s) | %+.2f (%s) | %s |\n", po, losses[po], cells[po], worst[po],
                       worst_at[po], least[po], least_at[po], meets
            }
        }' $(csv_files "${inputs[@]}")
    echo
    echo "Held out: inputs not looked at when guanaco's duel constants were chosen on the ones above."
    echo
    input_table "${held_out[@]}"
    echo
    awk -F, '
        FNR == 1 { input = FILENAME; sub(/.*\//, "", input); sub(/\.csv$/, "", input); order[++n] = input; next }
        {
            if (!((input, $2) in seen)) { seen[input, $2] = 1; budgets[input, ++nb[input]] = $2 }
            hit[input, $2, $1] = $5; miss[input, $2, $1] = $8
        }
        END {
            print "| input | budget | lru | layer-lru | guanaco | guanaco - lru | misses guanaco / lru | guanaco - layer-lru |"
            print "|---|---|---|---|---|---|---|---|"
            for (i = 1; i <= n; i++) {
                in_ = order[i]
                for (b = 1; b <= nb[in_]; b++) {
                    bu = budgets[in_, b]; g = miss[in_, bu, "guanaco"]; l = miss[in_, bu, "lru"]
                    cells++; if (g > l) lost++
                    printf "| %s | %.2f%% | %.2f | %.2f | %.2f | %+.2f%s | %d / %d | %+.2f |\n", in_, bu, hit[in_, bu, "lru"],
                        hit[in_, bu, "layer-lru"], hit[in_, bu, "guanaco"], hit[in_, bu, "guanaco"] - hit[in_, bu, "lru"],
                        (g > l ? " **loses**" : ""), g, l, hit[in_, bu, "guanaco"] - hit[in_, bu, "layer-lru"]
                }
            }
            printf "\nguanaco loses to lru in %d of %d held-out cells.\n", lost, cells
        }' $(csv_files "${held_out[@]}")
    echo
    echo "Commands (tools from build/cmake/bin, files in the work folder, JSON Lines from $TRACES):"
    echo
    echo '```'
    printf '%s\n' "${commands[@]}"
    echo '```'
} >"$out"
echo "policy_choice: wrote $out (traces and CSVs in $work)"
