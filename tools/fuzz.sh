#!/usr/bin/env bash
# make fuzz: each target of fuzz/fuzz_targets.h under libFuzzer, from moe.cu's own seed files (build/write_seeds)
# and the saved inputs in fuzz/corpus/TARGET. What it finds lands in build/fuzz_clang/TARGET-crash-* (or -leak-,
# -timeout-, -oom-); keep it in fuzz/corpus/TARGET so that make test runs it from then on.
#   FUZZ_SECONDS=60 (each target) or FUZZ_RUNS=N (executions each); FUZZ_TARGETS="config shard" picks targets.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/fuzz_clang
rm -rf "$out/seeds"
build/write_seeds "$out/seeds"
limit=(-max_total_time="${FUZZ_SECONDS:-60}")
[ -n "${FUZZ_RUNS:-}" ] && limit=(-runs="$FUZZ_RUNS")
failed=0
for target in ${FUZZ_TARGETS:-config safetensors checkpoint shard tokenizer}; do
    mkdir -p "$out/corpus/$target"
    saved=()
    [ -d "fuzz/corpus/$target" ] && saved=("fuzz/corpus/$target")
    status=0
    FUZZ_TARGET=$target "$out/moe_fuzz" "$out/corpus/$target" "$out/seeds/$target" "${saved[@]}" "${limit[@]}" \
        -max_len=65536 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/$target-" \
        > "$out/$target.log" 2>&1 || status=$?
    echo "$target: $(grep -E "^stat::number_of_executed_units" "$out/$target.log" | awk '{print $2}') executions," \
         "corpus $(ls "$out/corpus/$target" | wc -l) inputs, peak $(grep -E "^stat::peak_rss_mb" "$out/$target.log" |
         awk '{print $2}') MB, exit $status (log: $out/$target.log)"
    if [ $status -ne 0 ]; then
        grep -E "ERROR|SUMMARY|Test unit written" "$out/$target.log" | head -5
        failed=1
    fi
done
exit $failed
