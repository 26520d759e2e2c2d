#!/usr/bin/env bash
# Side by side on one GGUF target/draft pair, same llama.cpp build (scripts/llama_cpp.sh), same
# threads and context settings (F32 KV cache, flash attention off), greedy:
#   1. llama.cpp's own speculative decoding (its examples/speculative, built from the same pinned
#      sdist by scripts/llama_cpp.sh --with-speculative), chain drafts of K tokens;
#   2. specula's speculative_decode over llama.cpp (examples/llama_cpp/llama_model.hpp), chain
#      drafts of K tokens, and plain llama.cpp greedy decoding (specula_llama_sd_bench).
#
#   scripts/llama_cpp_bench.sh [BUILD_DIR]      (default: build; configured with
#                                               -DSPECULA_WITH_LLAMA_CPP=ON and built)
# Environment: TARGET, DRAFT (model names, default text-target, text-draft), N (default 128),
#              KS (draft lengths, default "2 4 6"), THREADS (default 1), PROMPT, REPEAT (3).
#
# llama.cpp's example tokenizes a text prompt, so the models are converted a second time with
# tools/to_gguf.py --tokenizer bytes (a byte-level vocabulary: the same ids; the logits do not
# depend on the tokenizer). Prints one line per run; docs/RESULTS.md records a run.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$SPECULA_ROOT"

BUILD_DIR="${1:-build}"
TARGET="${TARGET:-text-target}"
DRAFT="${DRAFT:-text-draft}"
N="${N:-128}"
KS="${KS:-2 4 6}"
THREADS="${THREADS:-1}"
REPEAT="${REPEAT:-3}"
PROMPT="${PROMPT:-import os
import sys


def main(argv):
    parser = }"

bench="$BUILD_DIR/examples/llama_cpp/specula_llama_sd_bench"
[[ -x "$bench" ]] || die "$bench not built (configure with -DSPECULA_WITH_LLAMA_CPP=ON and build)"
python="$(scripts/llama_cpp.sh --python)"
spec="$(scripts/llama_cpp.sh --with-speculative)"
out="$BUILD_DIR/gguf-bytes"
mkdir -p "$out"
for m in "$TARGET" "$DRAFT"; do
  if [[ ! -f "$out/$m.gguf" ]]; then
    "$python" tools/to_gguf.py --tokenizer bytes "examples/models/$m.safetensors" "$out/$m.gguf" >&2
  fi
done

log "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for k in $KS; do
  log "llama.cpp's llama-speculative, K = $k"
  best=""
  for ((r = 0; r < REPEAT; ++r)); do
    txt="$("$spec" -m "$out/$TARGET.gguf" -md "$out/$DRAFT.gguf" -p "$PROMPT" -n "$N" --temp 0 \
             --draft-max "$k" --draft-min 0 -np 1 -t "$THREADS" -tb "$THREADS" -td "$THREADS" \
             -tbd "$THREADS" -c 1024 -cd 1024 -b 512 -ub 512 -fa off -ctk f32 -ctv f32 \
             -ctkd f32 -ctvd f32 --seed 1 2>&1)"
    speed="$(sed -n 's/.*decoded *\([0-9]*\) tokens in *\([0-9.]*\) seconds, speed: *\([0-9.]*\) t\/s.*/\3/p' <<<"$txt" | tail -1)"
    if [[ -z "$best" ]] || awk -v a="$speed" -v b="$best" 'BEGIN { exit !(a > b) }'; then
      best="$speed"
      last="$txt"
    fi
  done
  grep -E 'decoded|n_draft|n_predict|n_drafted|n_accept|accept ' <<<"$last" | sed 's/^/  /'
  printf '  llama-speculative best of %s: %s tokens/s\n' "$REPEAT" "$best"
  log "specula over llama.cpp, K = $k"
  "$bench" --target "$BUILD_DIR/gguf/$TARGET.gguf" --draft "$BUILD_DIR/gguf/$DRAFT.gguf" \
           --prompt "$PROMPT" --n "$N" --draft-length "$k" --threads "$THREADS" \
           --repeat "$REPEAT" | sed 's/^/  /'
done
