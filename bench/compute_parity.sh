#!/usr/bin/env bash
# compute_parity.sh - owns the "compute parity" benchmark of issue 9: with the
# whole model in a warm page cache and every expert resident, does Guanaco
# compute as fast as plain llama.cpp's default (which repacks Q4_0, Q4_K,
# IQ4_NL and MXFP4 on x86)? For each model it runs llama-bench in rounds, the
# configurations alternating (the order reverses every other round):
#   default    plain llama.cpp, its default (repacked)
#   nr         plain llama.cpp -nr (nothing repacked)
#   reference  plain llama.cpp --guanaco-reference (experts alone in the file's
#              layout: the kernels streaming runs, the logits streaming equals)
#   guanaco    --guanaco-streaming --guanaco-ram RAM (everything resident): with
#              room for llama.cpp's own load, the engine hands the experts to it
#   engine     the same with --guanaco-when-fits engine: Guanaco holds them
# and prints, per model and configuration, the median prompt and decode tok/s
# over the rounds with their range (each round's figure is llama-bench's mean
# over its -r repetitions). The model is read into the page cache (cat) before
# every round. Run it under `flock /tmp/guanaco-bench.lock`.
#
#   bench/compute_parity.sh [--rounds N] [--reps N] [--threads N] [--prompt N] [--gen N]
#       [--ram SIZE] [--configs "default nr reference guanaco engine"] [--out DIR] MODEL.gguf...
#
# Output: DIR/runs.csv (model,config,round,test,tok_s) and a Markdown table on stdout.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=${LLAMA_BENCH:-$ROOT/build/cmake/bin/llama-bench}
rounds=5 reps=3 threads=2 prompt=128 gen=32 ram=8G configs="default nr reference guanaco"
out=$(mktemp -d /tmp/compute-parity.XXXXXX)
models=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --prompt) prompt=$2; shift 2 ;;
        --gen) gen=$2; shift 2 ;;
        --ram) ram=$2; shift 2 ;;
        --configs) configs=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "compute_parity: unknown flag $1" >&2; exit 2 ;;
        *) models+=("$1"); shift ;;
    esac
done
[ ${#models[@]} -gt 0 ] || { echo "compute_parity: no model given" >&2; exit 2; }
[ -x "$BENCH" ] || { echo "compute_parity: llama-bench not found at $BENCH (set LLAMA_BENCH)" >&2; exit 2; }
mkdir -p "$out"
csv="$out/runs.csv"
echo "model,config,round,test,tok_s" > "$csv"

config_args() {
    case "$1" in
        default) ;;
        nr) echo "-nr" ;;
        reference) echo "--guanaco-reference" ;;
        guanaco) echo "--guanaco-streaming --guanaco-ram $ram" ;;
        engine) echo "--guanaco-streaming --guanaco-ram $ram --guanaco-when-fits engine" ;;
        *) echo "compute_parity: unknown configuration $1" >&2; exit 2 ;;
    esac
}

for model in "${models[@]}"; do
    name=$(basename "$model" .gguf)
    read -r -a order <<< "$configs"
    for ((round = 1; round <= rounds; round++)); do
        cat "$model" > /dev/null
        list=("${order[@]}")
        if [ $((round % 2)) -eq 0 ]; then
            list=()
            for ((i = ${#order[@]} - 1; i >= 0; i--)); do list+=("${order[i]}"); done
        fi
        for config in "${list[@]}"; do
            log="$out/$name.$config.$round"
            # shellcheck disable=SC2046 # the configuration's flags are words
            "$BENCH" -m "$model" -t "$threads" -p "$prompt" -n "$gen" -r "$reps" -o jsonl $(config_args "$config") \
                > "$log.jsonl" 2> "$log.log" || { echo "compute_parity: $name $config round $round failed" >&2; tail -3 "$log.log" >&2; exit 1; }
            python3 - "$log.jsonl" "$name" "$config" "$round" >> "$csv" <<'PY'
import json, sys
path, name, config, rnd = sys.argv[1:]
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
    print("%s,%s,%s,%s,%.2f" % (name, config, rnd, test, r["avg_ts"]))
PY
            echo "$name $config round $round: $(grep "^$name,$config,$round," "$csv" | cut -d, -f4,5 | tr '\n' ' ')" >&2
        done
    done
done

python3 - "$csv" "$configs" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
configs = sys.argv[2].split()
models = list(dict.fromkeys(r["model"] for r in rows))
tests = list(dict.fromkeys(r["test"] for r in rows))
def cell(model, config, test):
    v = sorted(float(r["tok_s"]) for r in rows if r["model"] == model and r["config"] == config and r["test"] == test)
    return (statistics.median(v), v[0], v[-1], len(v)) if v else None
print("| model | test | " + " | ".join(configs) + " | " + " | ".join("%s / default" % c for c in configs if c != "default") + " |")
print("|---|---|" + "---|" * (2 * len(configs) - 1))
for m in models:
    for t in tests:
        cells = [cell(m, c, t) for c in configs]
        base = cell(m, "default", t)
        text = ["%.1f [%.1f-%.1f]" % c[:3] if c else "-" for c in cells]
        ratios = ["%.3f" % (c[0] / base[0]) if c and base else "-" for cfg, c in zip(configs, cells) if cfg != "default"]
        print("| %s | %s | %s | %s |" % (m, t, " | ".join(text), " | ".join(ratios)))
n = min(cell(m, c, t)[3] for m in models for t in tests for c in configs if cell(m, c, t))
print("\nmedian [min-max] tok/s over %d rounds; raw runs: %s" % (n, sys.argv[1]))

# The verdict on 3%: each round's ratio against the default run of the same round (they ran minutes apart at most),
# and a distribution-free 95% interval for the median ratio, [v(k), v(n+1-k)] of the sorted ratios with the largest k
# whose coverage 1 - 2 P(Binomial(n, 1/2) < k) stays >= 95% (bench/overhead.sh's rule).
def interval(v):
    v = sorted(v)
    n = len(v)
    if n < 6:
        return None
    from math import comb
    k, tail = 1, 0.5 ** n
    while k + 1 <= (n + 1) // 2 and 1 - 2 * (tail + comb(n, k) * 0.5 ** n) >= 0.95:
        tail += comb(n, k) * 0.5 ** n
        k += 1
    return v[k - 1], v[n - k], 1 - 2 * tail
def verdict(lo, hi):
    if lo >= 0.97:
        return "within 3%"
    if hi < 0.97:
        return "more than 3% slower"
    return "cannot tell"
others = [c for c in configs if c != "default"]
if "default" in configs and others:
    print("\n| model | test | config | paired ratio over default, median [min-max] | 95% interval | rounds | 3% verdict |")
    print("|---|---|---|---|---|---|---|")
    for m in models:
        for t in tests:
            for c in others:
                by_round = {}
                for r in rows:
                    if r["model"] == m and r["test"] == t and r["config"] in ("default", c):
                        by_round.setdefault(r["round"], {})[r["config"]] = float(r["tok_s"])
                ratios = sorted(v[c] / v["default"] for v in by_round.values() if c in v and "default" in v and v["default"] > 0)
                if not ratios:
                    continue
                ci = interval(ratios)
                print("| %s | %s | %s | %.3f [%.3f-%.3f] | %s | %d | %s |" % (
                    m, t, c, statistics.median(ratios), ratios[0], ratios[-1],
                    "%.3f-%.3f (%.1f%%)" % (ci[0], ci[1], 100 * ci[2]) if ci else "- (under 6 rounds)", len(ratios),
                    verdict(ci[0], ci[1]) if ci else "cannot tell"))
PY
