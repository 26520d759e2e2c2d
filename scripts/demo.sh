#!/usr/bin/env bash
# Build specula_demo and print a comparison of the decoding methods on the shipped tiny models:
# one markdown table per task (method | tokens | forwards | step compression | wall ms), parsed
# from `specula_demo --json`. Methods that are not available yet are listed as such.
#
#   scripts/demo.sh [task ...]        tasks: text, image, diffusion (default: all three)
#
# Environment: BUILD_DIR (default: build), BUILD_TYPE (default: Release), JOBS,
#              DEMO_SKIP_BUILD=1 (run the specula_demo already in BUILD_DIR),
#              DEMO_TEXT_TOKENS (new tokens per text sample, default 128),
#              DEMO_SAMPLES (samples per method, default 2), DEMO_SEED (default 1),
#              DEMO_OUT_DIR (images and heat maps, default $BUILD_DIR/demo).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cd "$SPECULA_ROOT"

BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
TEXT_TOKENS="${DEMO_TEXT_TOKENS:-128}"
SAMPLES="${DEMO_SAMPLES:-2}"
SEED="${DEMO_SEED:-1}"
OUT_DIR="${DEMO_OUT_DIR:-$BUILD_DIR/demo}"
TARGET=specula_demo

tasks=("$@")
((${#tasks[@]} > 0)) || tasks=(text image diffusion)
for t in "${tasks[@]}"; do
  case "$t" in
    text | image | diffusion) ;;
    *) die "unknown task '$t' (text, image, diffusion)" ;;
  esac
done

if [[ "${DEMO_SKIP_BUILD:-0}" != 1 ]]; then
  ensure_deps
  log "configure ($BUILD_DIR, $BUILD_TYPE)"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" >/dev/null
  log "build $TARGET"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "$TARGET" >/dev/null ||
    die "building $TARGET failed (it needs nlohmann-json3-dev and libpng-dev; see the configure log)"
fi
exe="$BUILD_DIR/examples/demo/$TARGET"
[[ -x "$exe" ]] || die "$exe was not built"

if command -v python3 >/dev/null 2>&1; then
  json_tool=python3
elif command -v jq >/dev/null 2>&1; then
  json_tool=jq
else
  die "python3 or jq is needed to read specula_demo --json"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# table_row <json file> <method>: one markdown row from specula_demo --json.
table_row() {
  if [[ "$json_tool" == python3 ]]; then
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
forwards = str(d["target_forwards"])
if d["draft_forwards"]:
    forwards += " (+%d draft)" % d["draft_forwards"]
print("| %s | %d | %s | %.3f | %.1f |" % (sys.argv[2], d["tokens"], forwards,
                                          d["step_compression"], 1e3 * d["wall_seconds"]))
' "$1" "$2"
  else
    jq -r --arg m "$2" '"| \($m) | \(.tokens) | \(.target_forwards)" +
      (if .draft_forwards > 0 then " (+\(.draft_forwards) draft)" else "" end) +
      " | \(.step_compression * 1000 | round / 1000) | \(.wall_seconds * 10000 | round / 10) |"' "$1"
  fi
}

# run_method <task> <method> [args...]: runs one method and prints its row.
run_method() {
  local task="$1" method="$2"
  shift 2
  local out="$tmp/$task-$method.json" err="$tmp/$task-$method.err" rc=0
  "$exe" --task "$task" --method "$method" --json --quiet --seed "$SEED" \
    --num-samples "$SAMPLES" "$@" >"$out" 2>"$err" || rc=$?
  if ((rc == 0)); then
    table_row "$out" "$method"
  elif ((rc == 3)); then
    printf '| %s | not available yet | | | |\n' "$method"
  else
    printf '| %s | error (exit %d) | | | |\n' "$method" "$rc"
    log "$task $method failed: $(head -n 1 "$err")"
  fi
}

header() {
  printf '\n### %s\n\n' "$1"
  printf '| method | tokens | forwards | step compression | wall ms |\n'
  printf '| --- | ---: | ---: | ---: | ---: |\n'
}

for task in "${tasks[@]}"; do
  case "$task" in
    text)
      header "text: text-target (draft text-draft), $SAMPLES x $TEXT_TOKENS tokens"
      for m in ar sd sjd sjd-pac cool-sd jacobi multiblock; do
        run_method text "$m" --max-new-tokens "$TEXT_TOKENS"
      done
      ;;
    image)
      header "image: image-ar, $SAMPLES x 64 tokens (label 0), images in $OUT_DIR"
      for m in ar sjd sjd-pac jacobi multiblock; do
        run_method image "$m" --out-dir "$OUT_DIR"
      done
      ;;
    diffusion)
      header "diffusion: text-diffusion, $SAMPLES x 64 tokens"
      run_method diffusion ar --max-new-tokens 64
      run_method diffusion ssd --max-new-tokens 64
      run_method diffusion ssd --max-new-tokens 64 --mix-order
      ;;
  esac
done
printf '\nforwards: target-model forward passes (draft-model passes in parentheses); step\n'
printf 'compression: tokens per decoding step; wall: decoding time of all samples.\n'
