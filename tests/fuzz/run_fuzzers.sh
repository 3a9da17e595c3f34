#!/usr/bin/env bash
# Runs the libFuzzer harnesses built in BUILD_DIR/fuzz, one after the other.
#
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [HARNESS...]   fuzz each for SECONDS
#   tests/fuzz/run_fuzzers.sh --merge BUILD_DIR [HARNESS...]   minimize what the
#       runs found into the seed corpora (tests/fuzz/<harness>/corpus)
#
# A run reads the seed corpus tests/fuzz/<harness>/corpus read-only and writes
# new inputs, crash reproducers and the log under BUILD_DIR/fuzz-work/<harness>/.
# It prints one summary line per harness (executions, exec/s, cov, ft, corpus,
# new units, result) and exits non-zero when any harness crashed, leaked,
# timed out or ran out of memory. FUZZ_KEEP_GOING=1 runs libFuzzer's fork
# mode, which records every crash in artifacts/ and goes on fuzzing.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ALL_HARNESSES=(chat_template cluster_spec json_nesting kv_descriptor kv_transfer_config
  model_config openai_request safetensors_header structured_constraint tokenizer_json)
# Harnesses whose input is JSON get json.dict in front of their field names.
JSON_HARNESSES=" kv_transfer_config model_config openai_request safetensors_header structured_constraint tokenizer_json "

usage() {
  echo "usage: $0 BUILD_DIR SECONDS [HARNESS...] | $0 --merge BUILD_DIR [HARNESS...]" >&2
  echo "harnesses: ${ALL_HARNESSES[*]}" >&2
  exit 2
}

merge=0
if [[ "${1:-}" == "--merge" ]]; then
  merge=1
  shift
fi
[[ $# -ge 1 ]] || usage
build_dir="$(cd "$1" && pwd)" || usage
shift
if [[ $merge == 0 ]]; then
  [[ $# -ge 1 && "$1" =~ ^[0-9]+$ && "$1" -gt 0 ]] || usage
  seconds="$1"
  shift
fi
harnesses=("$@")
[[ ${#harnesses[@]} -gt 0 ]] || harnesses=("${ALL_HARNESSES[@]}")

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

summary=()
failed=0
for harness in "${harnesses[@]}"; do
  binary="$build_dir/fuzz/${harness}_fuzzer"
  seeds="$HERE/$harness/corpus"
  work="$build_dir/fuzz-work/$harness"
  if [[ ! -x "$binary" || ! -d "$seeds" ]]; then
    echo "unknown or unbuilt harness '$harness' (no $binary or $seeds)" >&2
    failed=1
    continue
  fi
  mkdir -p "$work/corpus"
  # artifacts/ holds this run's findings only; the last run's stay next to it.
  if [[ $merge == 0 && -d "$work/artifacts" ]]; then
    rm -rf "$work/artifacts.previous"
    mv "$work/artifacts" "$work/artifacts.previous"
  fi
  mkdir -p "$work/artifacts"

  if [[ $merge == 1 ]]; then
    # Keeps the seeds and adds, minimized, what the runs found that covers more.
    before=$(ls "$seeds" | wc -l)
    "$binary" -merge=1 "$seeds" "$work/corpus" >"$work/merge.log" 2>&1 || {
      echo "$harness: merge failed, see $work/merge.log" >&2
      failed=1
      continue
    }
    echo "$harness: seed corpus $before -> $(ls "$seeds" | wc -l) files"
    continue
  fi

  dict="$work/dict"
  : >"$dict"
  [[ "$JSON_HARNESSES" == *" $harness "* ]] && cat "$HERE/json.dict" >>"$dict"
  [[ -f "$HERE/$harness/fields.dict" ]] && cat "$HERE/$harness/fields.dict" >>"$dict"
  # libFuzzer refuses an empty dictionary (a harness whose input is a program).
  dict_flag=()
  [[ -s "$dict" ]] && dict_flag=(-dict="$dict")

  log="$work/fuzz.log"
  # New inputs go to the first directory (the scratch copy); the seeds are
  # only read.
  keep_going=()
  [[ "${FUZZ_KEEP_GOING:-0}" == 1 ]] &&
    keep_going=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "${keep_going[@]}" "${dict_flag[@]}" -artifact_prefix="$work/artifacts/" "$work/corpus" \
    "$seeds" >"$log" 2>&1
  status=$?
  crashes=$(ls "$work/artifacts" | wc -l)

  cov_line=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1)
  stat() { grep -E "^stat::$1:" "$log" | tail -n 1 | awk '{print $2}'; }
  execs=$(stat number_of_executed_units)
  [[ -n "$execs" ]] || execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$cov_line")
  rate=$(stat average_exec_per_sec)
  # Fork mode prints no final stats: derive them from the last status line.
  [[ -n "$rate" || -z "$execs" ]] || rate=$((execs / seconds))
  new_units=$(stat new_units_added)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$cov_line")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$cov_line")
  corp=$(sed -nE 's/.* corp: ([^ ]+).*/\1/p' <<<"$cov_line")
  if [[ $status == 0 && $crashes == 0 ]]; then
    result="ok"
  else
    failed=1
    artifact=$(ls -t "$work/artifacts" 2>/dev/null | head -n 1)
    result="FAILED (exit $status, $crashes inputs in $work/artifacts, latest $artifact; log $log)"
    echo "---- $harness: $(grep -m1 -E 'ERROR: |runtime error|deadly signal|ALARM|out-of-memory' "$log")" >&2
    grep -A25 -m1 -E 'ERROR: |runtime error' "$log" | grep -E '^ +#[0-9]+ ' | head -n 12 >&2
  fi
  summary+=("$(printf '%-19s %4ss execs %-9s exec/s %-6s cov %-5s ft %-6s corp %-10s new %-5s %s' \
    "$harness" "$seconds" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
    "${new_units:-?}" "$result")")
  echo "${summary[-1]}"
done

if [[ $merge == 0 && ${#summary[@]} -gt 0 ]]; then
  echo "==== fuzzing summary ($build_dir/fuzz-work)"
  printf '%s\n' "${summary[@]}"
fi
exit $failed
