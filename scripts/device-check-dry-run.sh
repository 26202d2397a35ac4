#!/usr/bin/env bash
# CI's check of the GPU check (the gpu-deps leg): both calls of scripts/device-check.sh run here on the CPU at tiny
# sizes with the programs of an existing build (--dry-run --build-dir), and what they leave in OUT is checked:
#   headline   every stage ends, report.md has the generate, train and profile rows, profile.md its tables
#   stopped    the headline killed with SIGKILL once its train stage has landed (--kill-after train, as the device tool
#              kills a command at its limit): report.md, results.json and log.txt still hold generate and train
#   rest       the second call's stages that run here (step, checkpoint, demo): their rows
#   scripts/device-check-dry-run.sh [BUILD_DIR]      (default build: the Debian 12 leg's)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
expect() {  # expect FILE PATTERN WHAT
  if grep -qF -- "$2" "$1"; then
    echo "device-check-dry-run: ok: $3"
  else
    echo "device-check-dry-run: FAILED: $3 ($1 has no '$2')" >&2
    failures=$((failures + 1))
  fi
}
refuse() {  # refuse FILE PATTERN WHAT
  if grep -qF -- "$2" "$1"; then
    echo "device-check-dry-run: FAILED: $3 ($1 has '$2')" >&2
    failures=$((failures + 1))
  else
    echo "device-check-dry-run: ok: $3"
  fi
}

echo "device-check-dry-run: the headline call"
bash scripts/device-check.sh headline --dry-run --build-dir "$build" "$work/headline" >"$work/headline.log" 2>&1 || {
  tail -40 "$work/headline.log"; echo "device-check-dry-run: the headline call failed" >&2; exit 1; }
report=$work/headline/report.md
for stage in generate train profile; do expect "$report" "| stages | $stage | ok" "the headline's $stage stage ends"; done
expect "$report" "engine, eager steps: decode ms per step" "the engine's decode ms per step"
expect "$report" "engine, eager steps: fraction of the bandwidth bound" "the engine's fraction of the bound"
expect "$report" "generate() (the engine in one call" "generate()'s row"
expect "$report" "memory bandwidth, GB/s: a copy measured here" "the bandwidth measured by a copy"
expect "$report" "step 2: seconds (rollout + update)" "the trainer's steps, through qwen_gsm8k train"
expect "$report" "decode steps, admissions, checks, graph captures, replays" "the engine's counts per step"
expect "$report" "memory plan's peak" "the memory plan beside the steps"
expect "$report" "decode step, eager: operators per instance" "the profile's decode step"
expect "$report" "update micro-batch: operators per instance" "the profile's update micro-batch"
expect "$work/headline/profile.md" "| top-level operator | calls per instance" "profile.md's tables"
expect "$work/headline/profile.md" "qwen::engine_decode_step" "profile.md names the engine's decode scope"
# The train stage's run (in build-device/results, where the report reads its metrics as they land) kept no checkpoint
# (--save-every -1: a 1.5B one would be 18 GB with AdamW's state).
run=build-device/results/train-run
if [[ ! -s $run/metrics.jsonl ]] || compgen -G "$run/checkpoints/step-*" >/dev/null; then
  echo "device-check-dry-run: FAILED: no metrics.jsonl in $run, or a checkpoint despite --save-every -1" >&2
  failures=$((failures + 1))
else
  echo "device-check-dry-run: ok: the train run's metrics, and no checkpoint (--save-every -1)"
fi
for file in log.txt results.json; do [[ -s $work/headline/$file ]] || { echo "no $file" >&2; failures=$((failures + 1)); }; done
(($(ls "$work/headline" | wc -l) <= 8)) || { echo "more than the device tool's 8 files in OUT" >&2; failures=$((failures + 1)); }

echo "device-check-dry-run: the headline call, killed once its train stage has landed"
status=0
bash scripts/device-check.sh headline --dry-run --build-dir "$build" --kill-after train "$work/stopped" \
  >"$work/stopped.log" 2>&1 || status=$?
((status == 137)) || { echo "device-check-dry-run: expected the kill's status 137, got $status" >&2; exit 1; }
report=$work/stopped/report.md
expect "$report" "| stages | generate | ok" "stopped: the generate stage's row stays"
expect "$report" "| stages | train | ok" "stopped: the train stage's row stays"
expect "$report" "engine, eager steps: tokens/s" "stopped: the generate numbers stay"
expect "$report" "step 2: seconds (rollout + update)" "stopped: the train numbers stay"
refuse "$report" "| stages | profile" "stopped: nothing of the profile stage"
expect "$work/stopped/log.txt" "=== train: ok" "stopped: log.txt holds the output so far"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$work/stopped/results.json" ||
  { echo "stopped: results.json is not whole" >&2; failures=$((failures + 1)); }

echo "device-check-dry-run: the rest call (the stages that run here)"
bash scripts/device-check.sh rest --dry-run --build-dir "$build" --stages step,checkpoint,demo "$work/rest" \
  >"$work/rest.log" 2>&1 || { tail -40 "$work/rest.log"; echo "device-check-dry-run: the rest call failed" >&2; exit 1; }
report=$work/rest/report.md
for stage in step demo; do expect "$report" "| stages | $stage | ok" "the rest's $stage stage ends"; done
# The checkpoint is written here; transformers, which loads it on the GPU machine, is not importable here: skipped.
expect "$report" "| stages | checkpoint | " "the rest's checkpoint stage ran"
refuse "$report" "| stages | checkpoint | failed" "the rest's checkpoint stage did not fail"
expect "$report" "DAPO step, larger (step_bench) | update tokens/s" "the larger step's row"
expect "$report" "G = 4: update tokens/s, each row whole -> shared" "the shared-prompt update's row"
expect "$report" "greedy accuracy before -> after" "the demo's row"

if ((failures)); then
  echo "device-check-dry-run: $failures check(s) failed; the reports:" >&2
  cat "$work/headline/report.md" "$work/stopped/report.md" "$work/rest/report.md" >&2
  exit 1
fi
echo "device-check-dry-run: both calls' commands, the progressive OUT and the report hold"
