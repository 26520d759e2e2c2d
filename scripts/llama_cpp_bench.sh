#!/usr/bin/env bash
# Side by side on one GGUF target/draft pair, same llama.cpp build (scripts/llama_cpp.sh), same
# threads and context settings (F32 KV cache, flash attention off), greedy:
#   1. llama.cpp's own speculative decoding (its examples/speculative, built from the same pinned
#      sdist by scripts/llama_cpp.sh --with-speculative), chain drafts of K tokens;
#   2. specula's speculative_decode over llama.cpp (examples/llama_cpp/llama_model.hpp), chain
#      drafts of K tokens, and plain llama.cpp greedy decoding (specula_llama_sd_bench).
# Speeds are tokens per CPU second (one thread; best of REPEAT): on a shared machine wall time
# measures the other jobs more than the decoding.
#
#   scripts/llama_cpp_bench.sh [BUILD_DIR]      (default: build; configured with
#                                               -DSPECULA_WITH_LLAMA_CPP=ON and built)
# Environment: TARGET, DRAFT (model names, default text-target, text-draft), N (default 128),
#              KS (draft lengths, default "2 4 6"), THREADS (default 1), PROMPT, REPEAT (3),
#              LLAMA_SPECULATIVE (a llama-speculative binary to use instead of building one; with
#              LD_LIBRARY_PATH naming another build's install/lib, both sides run that build's
#              libllama + ggml, which is how docs/RESULTS.md compares build options).
#
# llama.cpp's example tokenizes a text prompt, so the models are converted a second time with
# tools/to_gguf.py --tokenizer bytes (a byte-level vocabulary: the same ids; the logits do not
# depend on the tokenizer). specula's side reads the same files (it feeds ids and never calls the
# tokenizer): the same file on both sides, because the pass cost of one model depended on the
# file it was read from by 2-3 % (docs/RESULTS.md). Prints one line per run; docs/RESULTS.md
# records a run.
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
spec="${LLAMA_SPECULATIVE:-$(scripts/llama_cpp.sh --with-speculative)}"
out="$BUILD_DIR/gguf-bytes"
mkdir -p "$out"
for m in "$TARGET" "$DRAFT"; do
  if [[ ! -f "$out/$m.gguf" ]]; then
    "$python" tools/to_gguf.py --tokenizer bytes "examples/models/$m.safetensors" "$out/$m.gguf" >&2
  fi
done

log "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
log "llama.cpp libraries: $(ldd "$bench" | sed -n 's/^.*libggml-cpu[^ ]* => \([^ ]*\).*$/\1/p')"
# run_spec <k> <n>: one llama-speculative run; prints "<cpu seconds> <n_predict> <n_drafted>
# <n_accept>" (process CPU time: user + sys; robust to other jobs on a shared machine). A run
# without statistics leaves its output in BUILD_DIR/llama-speculative-failed.log.
run_spec() {
  local txt
  txt="$(python3 - "$spec" -m "$out/$TARGET.gguf" -md "$out/$DRAFT.gguf" \
           -p "$PROMPT" -n "$2" --temp 0 --spec-draft-n-max "$1" --spec-draft-n-min 0 -np 1 \
           -t "$THREADS" -tb "$THREADS" -td "$THREADS" -tbd "$THREADS" -c 1024 -b 512 -ub 512 \
           -fa off -ctk f32 -ctv f32 -ctkd f32 -ctvd f32 --seed 1 2>&1 <<'EOF'
import resource, subprocess, sys
# The child's CPU time (user + system) at microsecond resolution (GNU time prints 10 ms).
rc = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"CPU {r.ru_utime:.6f} {r.ru_stime:.6f} rc {rc}", file=sys.stderr)
EOF
)"
  if ! grep -q 'n_predict *=' <<<"$txt"; then
    printf '%s\n' "$txt" >"$BUILD_DIR/llama-speculative-failed.log"
  fi
  awk '/^CPU / { cpu = $2 + $3 } /n_predict *=/ { np = $NF } /n_drafted *=/ { nd = $NF }
       /n_accept *=/ { na = $NF } END { print cpu, np, nd, na }' <<<"$txt"
}

# best <k> <n>: the run with the least CPU time of REPEAT (a run that printed no statistics, which
# llama-speculative rarely does on a loaded machine, is reported and not counted).
best() {
  local r line bestline=""
  for ((r = 0; r < REPEAT; ++r)); do
    line="$(run_spec "$1" "$2")"
    if [[ "$(wc -w <<<"$line")" != 4 ]]; then
      log "llama-speculative K=$1 n=$2: a run printed no statistics; not counted"
      continue
    fi
    if [[ -z "$bestline" ]] || awk -v a="${line%% *}" -v b="${bestline%% *}" 'BEGIN { exit !(a < b) }'; then
      bestline="$line"
    fi
  done
  printf '%s\n' "$bestline"
}

cost=(--cost-curve)  # the target's c(n) over llama.cpp, printed once (with the first K)
for k in $KS; do
  # Generation only: the CPU time of a run of N tokens minus that of a run of 1 token (model
  # loading, the prompt and the first step cancel).
  read -r c_n p_n d_n a_n <<<"$(best "$k" "$N")"
  read -r c_1 p_1 _ _ <<<"$(best "$k" 1)"
  awk -v k="$k" -v cn="$c_n" -v c1="$c_1" -v pn="$p_n" -v p1="$p_1" -v d="$d_n" -v a="$a_n" 'BEGIN {
    printf "llama.cpp llama-speculative K=%s: %.1f tokens per CPU second (%d tokens, %d drafted, %d accepted: %.1f %%)\n",
           k, (pn - p1) / (cn - c1), pn, d, a, 100 * a / d }'
  "$bench" --target "$out/$TARGET.gguf" --draft "$out/$DRAFT.gguf" \
           --prompt "$PROMPT" --n "$N" --draft-length "$k" --threads "$THREADS" \
           --repeat "$REPEAT" "${cost[@]}" | sed 's/^/  /'
  cost=()
done
log "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
