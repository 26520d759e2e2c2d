#!/usr/bin/env bash
# Build specula_demo and compare the decoding methods on the shipped tiny models: one markdown
# table per task (method | tokens | forwards | step compression | wall ms | speedup (wall)),
# parsed from `specula_demo --json`.
#
#   scripts/demo.sh [task ...]        tasks: text, text-xl, image, diffusion (default: all four)
#
# text-xl: the text task on text-target-xl (18 M parameters, 70 MiB of fp32 weights, more than
# the last-level cache, so every pass streams its weights from DRAM), drafted by text-draft and
# by text-target; its backend threads (1 or 2) are chosen by timing ar both ways first, unless
# DEMO_XL_THREADS is set.
#
# Every method runs DEMO_REPEATS times; the rounds are interleaved (round r runs every method of
# the task once), so a change in the machine's load reaches all methods alike. The table gives
# the median wall time with the range, and the speedup against the task's baseline: ar (text,
# image) and stepwise decoding with the same cache (diffusion). Every method of a run uses the
# same example backend kernel and DEMO_THREADS threads.
#
# Environment: BUILD_DIR (default: build), BUILD_TYPE (default: Release), JOBS,
#              DEMO_SKIP_BUILD=1 (run the specula_demo already in BUILD_DIR),
#              DEMO_REPEATS (runs per method, default 3), DEMO_THREADS (backend threads, default
#              1; 0: one per hardware thread), DEMO_TEXT_TOKENS (new tokens per text sample,
#              default 128), DEMO_SAMPLES (samples per method, default 2), DEMO_SEED (default 1),
#              DEMO_OUT_DIR (images and heat maps, default $BUILD_DIR/demo), DEMO_IMAGE_MODEL
#              (image-ar-256, the default: 256 tokens; image-ar: 64 tokens), DEMO_BACKEND (the
#              text task's backend: specula, the default, or llama.cpp — the same models as GGUF
#              in llama.cpp, built with -DSPECULA_WITH_LLAMA_CPP=ON; see docs/llama_cpp.md),
#              DEMO_XL_THREADS (text-xl's threads; default: measured), DEMO_DEVICE (cpu, cuda,
#              or auto, the default: cuda when the demo was built with CUDA, nvidia-smi lists a
#              GPU and DEMO_BACKEND is specula; every method and its baseline then run on the
#              GPU), DEMO_EXE (a specula_demo elsewhere, with DEMO_SKIP_BUILD=1), DEMO_MODELS_DIR
#              (its --models-dir), DEMO_WARMUP (untimed requests each run decodes first: its
#              --warmup, default 0; on a GPU a run's first request otherwise pays module loading
#              and graph capture).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$SPECULA_ROOT"

BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
TEXT_TOKENS="${DEMO_TEXT_TOKENS:-128}"
SAMPLES="${DEMO_SAMPLES:-2}"
SEED="${DEMO_SEED:-1}"
REPEATS="${DEMO_REPEATS:-3}"
WARMUP="${DEMO_WARMUP:-0}"
THREADS="${DEMO_THREADS:-1}"
OUT_DIR="${DEMO_OUT_DIR:-$BUILD_DIR/demo}"
IMAGE_MODEL="${DEMO_IMAGE_MODEL:-image-ar-256}"
BACKEND="${DEMO_BACKEND:-specula}"
DEVICE="${DEMO_DEVICE:-auto}"
TARGET=specula_demo

[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "DEMO_REPEATS must be a positive integer, got '$REPEATS'"
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "DEMO_WARMUP must be an integer >= 0, got '$WARMUP'"
[[ "$THREADS" =~ ^[0-9]+$ ]] || die "DEMO_THREADS must be an integer >= 0, got '$THREADS'"
case "$DEVICE" in
  cpu | cuda | auto) ;;
  *) die "DEMO_DEVICE must be cpu, cuda or auto, got '$DEVICE'" ;;
esac

XL_THREADS="${DEMO_XL_THREADS:-}"
[[ -z "$XL_THREADS" || "$XL_THREADS" =~ ^[0-9]+$ ]] ||
  die "DEMO_XL_THREADS must be an integer >= 0, got '$XL_THREADS'"

tasks=("$@")
((${#tasks[@]} > 0)) || tasks=(text text-xl image diffusion)
for t in "${tasks[@]}"; do
  case "$t" in
    text | text-xl | image | diffusion) ;;
    *) die "unknown task '$t' (text, text-xl, image, diffusion)" ;;
  esac
done
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read specula_demo --json"

if [[ "${DEMO_SKIP_BUILD:-0}" != 1 ]]; then
  ensure_deps
  log "configure ($BUILD_DIR, $BUILD_TYPE)"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" >/dev/null
  log "build $TARGET"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "$TARGET" >/dev/null ||
    die "building $TARGET failed (it needs nlohmann-json3-dev and libpng-dev; see the configure log)"
fi
exe="${DEMO_EXE:-$BUILD_DIR/examples/demo/$TARGET}"
[[ -x "$exe" ]] || die "$exe was not built"
if [[ "$DEVICE" == auto ]]; then
  DEVICE=cpu
  if [[ $BACKEND == specula ]] && "$exe" --help 2>&1 | grep -q -- '--device cpu|cuda' &&
    command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
    "$exe" --task text --method ar --max-new-tokens 1 --device cuda --quiet >/dev/null 2>&1; then
    DEVICE=cuda
  fi
fi
log "device: $DEVICE"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The rows of each task: "label|baseline label|method|args..." (the baseline row is its own
# baseline). Labels name the method as the table prints it.
rows_text=(
  "ar|ar|ar|--max-new-tokens $TEXT_TOKENS"
  "sd|ar|sd|--max-new-tokens $TEXT_TOKENS"
  "sd, 8 drafts|ar|sd|--max-new-tokens $TEXT_TOKENS --draft-length 8"
  "sd, 8 drafts, p-min 0.3|ar|sd|--max-new-tokens $TEXT_TOKENS --draft-length 8 --p-min 0.3"
  "lookup|ar|lookup|--max-new-tokens $TEXT_TOKENS"
  "cool-sd|ar|cool-sd|--max-new-tokens $TEXT_TOKENS"
  "sjd|ar|sjd|--max-new-tokens $TEXT_TOKENS"
  "sjd-pac|ar|sjd-pac|--max-new-tokens $TEXT_TOKENS"
  "jacobi|ar|jacobi|--max-new-tokens $TEXT_TOKENS"
  "multiblock|ar|multiblock|--max-new-tokens $TEXT_TOKENS"
)
# text-target-xl: draft lengths and the tree chosen by the sweep in docs/RESULTS.md
# ("A target that streams from DRAM").
XL="--model text-target-xl --max-new-tokens $TEXT_TOKENS"
rows_text_xl=(
  "ar|ar|ar|$XL"
  "sd, draft text-draft|ar|sd|$XL --draft-model text-draft --draft-length 4"
  "sd, draft text-target|ar|sd|$XL --draft-model text-target --draft-length 6"
  "sd tree 2x8/path, draft text-target|ar|sd|$XL --draft-model text-target --draft-tree 2x8/path"
  "cool-sd, draft text-draft|ar|cool-sd|$XL --draft-model text-draft --draft-length 4"
  "cool-sd, draft text-target|ar|cool-sd|$XL --draft-model text-target --draft-length 6"
  "sjd-pac|ar|sjd-pac|$XL"
  "jacobi|ar|jacobi|$XL"
  "multiblock|ar|multiblock|$XL"
)
rows_image=(
  "ar|ar|ar|--out-dir $OUT_DIR --image-model $IMAGE_MODEL"
  "sjd|ar|sjd|--out-dir $OUT_DIR --image-model $IMAGE_MODEL"
  "sjd-pac|ar|sjd-pac|--out-dir $OUT_DIR --image-model $IMAGE_MODEL"
  "jacobi|ar|jacobi|--out-dir $OUT_DIR --image-model $IMAGE_MODEL"
  "multiblock|ar|multiblock|--out-dir $OUT_DIR --image-model $IMAGE_MODEL"
)
rows_diffusion=(
  "stepwise|stepwise|ar|--max-new-tokens 64 --cache none"
  "ssd chain|stepwise|ssd|--max-new-tokens 64 --cache none"
  "ssd mix-order|stepwise|ssd|--max-new-tokens 64 --mix-order --cache none"
  "stepwise, dual cache|stepwise, dual cache|ar|--max-new-tokens 64 --cache dual"
  "ssd chain, dual cache|stepwise, dual cache|ssd|--max-new-tokens 64 --cache dual"
  "ssd mix-order, dual cache|stepwise, dual cache|ssd|--max-new-tokens 64 --mix-order --cache dual"
)

# run_row <task> <row index> <round> <row spec>: one run of one row; its JSON (or its failure)
# goes to $tmp/<task>.<row>.<round>.json / .err / .rc.
run_row() {
  local task="$1" index="$2" round="$3" spec="$4"
  local method args rc=0 base="$tmp/$task.$index.$round"
  IFS='|' read -r _ _ method args <<<"$spec"
  [[ $task == text ]] && args="--backend $BACKEND $args"
  [[ -z "${DEMO_MODELS_DIR:-}" ]] || args="--models-dir $DEMO_MODELS_DIR $args"
  # shellcheck disable=SC2086  # args are word lists without spaces inside words
  local threads="$THREADS" demo_task="$task"
  [[ $task == text-xl ]] && threads="$XL_THREADS" demo_task=text
  "$exe" --task "$demo_task" --method "$method" --json --quiet --seed "$SEED" \
    --num-samples "$SAMPLES" --warmup "$WARMUP" --threads "$threads" --device "$DEVICE" $args \
    >"$base.json" 2>"$base.err" || rc=$?
  echo "$rc" >"$base.rc"
  ((rc == 0 || rc == 3)) || log "$task ${spec%%|*} failed (exit $rc): $(head -n 1 "$base.err")"
}

# pick_xl_threads: text-xl's backend threads, 1 or 2, whichever decodes ar faster (the median
# of 3 interleaved runs each); a DRAM-bound pass can gain from a second core's bandwidth.
pick_xl_threads() {
  local t r w
  declare -A walls=([1]="" [2]="")
  for r in 1 2 3; do
    for t in 1 2; do
      w="$("$exe" --task text --method ar --json --quiet --seed "$SEED" --num-samples 1 \
        --threads "$t" --model text-target-xl --max-new-tokens 64 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["wall_seconds"])')" ||
        die "specula_demo --model text-target-xl failed"
      walls[$t]+="$w "
    done
  done
  XL_THREADS="$(python3 -c '
import statistics, sys
one, two = (statistics.median(map(float, a.split())) for a in sys.argv[1:3])
print(2 if two < one else 1)
print("text-xl threads: ar 1 x 64 tokens, median of 3: 1 thread %.1f ms, 2 threads %.1f ms"
      % (1e3 * one, 1e3 * two), file=sys.stderr)' "${walls[1]}" "${walls[2]}")"
}

titles=()
for task in "${tasks[@]}"; do
  declare -n rows="rows_${task//-/_}"
  case "$task" in
    text) titles+=("text: text-target (draft text-draft), $SAMPLES x $TEXT_TOKENS tokens, backend $BACKEND") ;;
    text-xl)
      if [[ -z "$XL_THREADS" ]]; then
        log "text-xl: timing ar on 1 and 2 threads"
        pick_xl_threads
      fi
      titles+=("text-xl: text-target-xl (drafts text-draft, text-target), $SAMPLES x $TEXT_TOKENS tokens, $XL_THREADS backend thread(s)")
      ;;
    image)
      [[ $IMAGE_MODEL == image-ar ]] && image_tokens=64 || image_tokens=256
      titles+=("image: $IMAGE_MODEL, $SAMPLES x $image_tokens tokens (label 0), images in $OUT_DIR")
      ;;
    diffusion) titles+=("diffusion: text-diffusion, $SAMPLES x 64 tokens, blocks of 8 (the SSD paper's preset)") ;;
  esac
  for ((round = 0; round < REPEATS; ++round)); do
    log "$task: round $((round + 1)) of $REPEATS"
    for i in "${!rows[@]}"; do run_row "$task" "$i" "$round" "${rows[$i]}"; done
  done
  printf '%s\n' "${rows[@]}" >"$tmp/$task.rows"
  unset -n rows
done

python3 - "$tmp" "$REPEATS" "$THREADS" "$DEVICE" "${tasks[@]}" -- "${titles[@]}" <<'PY'
import json, os, statistics, sys

tmp, repeats, threads, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rest = sys.argv[5:]
sep = rest.index("--")
tasks, titles = rest[:sep], rest[sep + 1:]

non_resident = set()
for task, title in zip(tasks, titles):
    rows = [line.split("|") for line in open(os.path.join(tmp, task + ".rows")).read().splitlines()]
    results = {}
    for i, (label, baseline, method, args) in enumerate(rows):
        runs, status = [], "ok"
        for r in range(repeats):
            base = os.path.join(tmp, "%s.%d.%d" % (task, i, r))
            rc = int(open(base + ".rc").read())
            if rc == 3:
                status = "not available yet"
                break
            if rc != 0:
                status = "error (exit %d)" % rc
                break
            runs.append(json.load(open(base + ".json")))
        results[label] = (status, runs)
    print("\n### %s (device: %s)\n" % (title, device))
    print("| method | tokens | forwards | step compression | wall ms, median (range) | speedup (wall) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, baseline, method, args in rows:
        status, runs = results[label]
        if status != "ok":
            print("| %s | %s | | | | |" % (label, status))
            continue
        d = runs[0]
        forwards = str(d["target_forwards"])
        if d["draft_forwards"]:
            forwards += " (+%d draft)" % d["draft_forwards"]
        walls = [1e3 * x["wall_seconds"] for x in runs]
        wall = statistics.median(walls)
        wall_text = "%.1f" % wall if len(walls) == 1 else "%.1f (%.1f–%.1f)" % (wall, min(walls), max(walls))
        b_status, b_runs = results.get(baseline, ("missing", []))
        if b_status == "ok" and wall > 0:
            speedup = "%.2fx" % (statistics.median(1e3 * x["wall_seconds"] for x in b_runs) / wall)
        else:
            speedup = "—"
        shown = label
        if device == "cuda" and d.get("parameters", {}).get("resident") is False:
            shown += " †"  # the host's loop over the GPU model: logits to the host each pass
            non_resident.add(d["parameters"].get("non_resident_reason", "?"))
        print("| %s | %d | %s | %.3f | %s | %s |" % (shown, d["tokens"], forwards,
                                                     d["step_compression"], wall_text, speedup))

print("\nforwards: target-model forward passes (draft-model passes in parentheses); step")
print("compression: tokens per target forward pass; wall: decoding time of all samples, median of")
print("%d interleaved runs (range in parentheses); speedup: the baseline's median wall time over" % repeats)
print("the method's (baseline: ar, or stepwise decoding with the same cache); device: %s%s."
      % (device, "" if device == "cuda" else ", backend threads: %s%s" % (
          threads, " (text-xl: as its title says)" if "text-xl" in tasks else "")))
if non_resident:
    print("\n†: not a resident loop on the GPU (the host's loop over the GPU model, logits copied to")
    print("the host each pass): " + "; ".join(sorted(non_resident)) + ".")
PY
