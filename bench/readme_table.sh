#!/usr/bin/env bash
# readme_table.sh - owns the README's benchmark summary: one markdown table
# of decode tok/s, Guanaco (the engine's defaults) against plain llama.cpp at
# each budget, from the report.md files bench/benchmarks.sh's side-by-side
# runs wrote. benchmarks.sh splices it into README.md between the
# "benchmarks:begin" and "benchmarks:end" markers, so the README's numbers are
# always those of BENCHMARKS.md.
#
#   bench/readme_table.sh DIR                 print the table (DIR: benchmarks.sh's BENCH_DIR)
#   bench/readme_table.sh DIR --into FILE     replace what FILE holds between the markers with it
#
# A cell reads "G vs P: **Nx**, L%": Guanaco's and plain's median decode tok/s,
# their ratio as the report gives it, and Guanaco's share of the overlapped
# physical limit where the report has one. A missing report or cell is left
# empty; without a plain run at that budget a cell gives Guanaco's rate alone.
set -euo pipefail
DIR=${1:?usage: readme_table.sh BENCH_DIR [--into FILE]}
INTO=""
[ "${2:-}" = --into ] && INTO=${3:?--into needs a file}
BUDGETS=(10 25 50 100)

# run | label | the default variant's name in that run
ROWS=(
    "qwen3-random|Qwen3-30B-A3B Q4_0 17.2 GB, llama-bench's routing|guanaco"
    "qwen3-variants|Qwen3-30B-A3B Q4_0, replayed Qwen3 preset|guanaco:guanaco"
    "mixtral-replay|Mixtral-8x7B Q4_0 26.3 GB, replayed Mixtral (humaneval)|guanaco"
    "qwen3-24-pipeline|Qwen3-30B-A3B 24 layers Q8_0 16.6 GB, replayed preset|guanaco+prefetch=pilot"
    "qwen3-24-own|the same model, its own routing|guanaco+prefetch=pilot"
)

# cell REPORT BUDGET VARIANT: the first table's "G vs P: **Nx**, L%" for that budget, or nothing
cell() {
    awk -F' [|] ' -v b="$2%" -v v="$3" '
        /^\| budget \| variant \| decode tok\/s/ {
            t = 1; for (i = 1; i <= NF; i++) { h = $i; gsub(/^\| | \|$/, "", h); c[h] = i }; next }
        /^$/ { t = 0 }
        t && $1 == "| " b {
            tg = $c["decode tok/s"]; sub(/ .*/, "", tg)
            if ($2 == "plain") plain = tg
            if ($2 == v) { g = tg; x = $c["x plain"]; l = $c["% of limit"] } }
        END {
            if (g == "") exit
            out = sprintf("%.3g", g)
            if (plain != "" && x != "-") out = out sprintf(" vs %.3g: **%.3gx**", plain, x)
            if (l != "" && l != "-") out = out ", " l "%"
            print out }' "$1"
}

table() { # the markdown table, header first
    echo "| model (synthetic, real shape), routing | 10% | 25% | 50% | 100% | reps, fio GB/s |"
    echo "|---|---|---|---|---|---|"
    for row in "${ROWS[@]}"; do
        IFS='|' read -r run label variant <<<"$row"
        report="$DIR/$run/report.md"
        [ -f "$report" ] || continue
        line="| $label"
        for b in "${BUDGETS[@]}"; do
            line="$line | $(cell "$report" "$b" "$variant")"
        done
        reps=$(sed -n 's/^- reps per cell: \([0-9]*\),.*/\1/p' "$report")
        fio=$(grep -m1 -o 'O_DIRECT on the model file: \*\*[0-9.]* GB/s' "$report" | grep -o '[0-9.]* GB/s' | cut -d' ' -f1)
        [ -n "$fio" ] && fio=$(printf '%.2f' "$fio")
        echo "$line | ${reps:-?}, ${fio:-?} |"
    done
}

if [ -z "$INTO" ]; then
    table
    exit 0
fi
grep -qx '<!-- benchmarks:begin -->' "$INTO" && grep -qx '<!-- benchmarks:end -->' "$INTO" ||
    { echo "readme_table: $INTO has no benchmarks:begin / benchmarks:end markers" >&2; exit 1; }
# the table travels in the environment: awk -v would read its backslashes as escapes
TABLE=$(table) awk '
    $0 == "<!-- benchmarks:begin -->" { print; print ENVIRON["TABLE"]; skip = 1; next }
    $0 == "<!-- benchmarks:end -->" { skip = 0 }
    !skip { print }' "$INTO" >"$INTO.new"
mv "$INTO.new" "$INTO"
echo "readme_table: wrote the table into $INTO"
