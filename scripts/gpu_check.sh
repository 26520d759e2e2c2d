#!/usr/bin/env bash
# One prepared device run: everything the CUDA half needs checked on a GPU, in one command that
# fits a lent GPU session (docs/cuda.md, "Running the device checks").
#
#   scripts/gpu_check.sh build      here (nvcc, no GPU needed): build the bundle for sm_90 into
#                                   $BUNDLE (default build-gpu/bundle, git-ignored) as one
#                                   stripped, xz-compressed archive, and check that it fits the
#                                   device tool beside the repository's tracked files (64 MiB
#                                   travel in all: the shipped models take most of it)
#   scripts/gpu_check.sh travel-light   here, before the device call when `build` says the bundle
#                                   and the repository do not fit: take the large model files the
#                                   device run does not read (text-target-xl) out of what travels
#                                   (out of git's index, ignored in .git/info/exclude; the files
#                                   stay on disk); commit nothing until travel-restore
#   scripts/gpu_check.sh travel-restore  here, after the device call: undo travel-light
#   scripts/gpu_check.sh run        on the GPU machine: run every step of the bundle within the
#                                   wall budget, then write $OUT/summary.md (pass/fail per step,
#                                   the targets, the benchmark tables), $OUT/*.json (benchmark
#                                   results) and $OUT/logs.tar.gz (every step's log)
#   scripts/gpu_check.sh --dry-run  here: the bundle (built, or copied from --from-build), its
#                                   size, every step's command line, and the summary from
#                                   stand-in results (benchmark names listed by the real
#                                   binaries, numbers made up and marked STAND-IN); the ctest
#                                   entry gpu.check_dry_run runs it in CI
#
# Options:
#   --bundle DIR      the bundle folder (default: build-gpu/bundle)
#   --out DIR         results (default: $OUT, else build-gpu/out)
#   --from-build DIR  bundle the binaries of an existing build tree instead of building (the
#                     dry run in CI reuses the tree scripts/test.sh built)
#   --budget SEC      run: wall-clock budget of the whole run (default 450: 7.5 minutes, so
#                     that the run, a machine start and a rerun fit a 15-minute device session);
#                     no step starts after the budget minus its minimum time, and each step's
#                     timeout is cut to what is left
# Environment (run): GPU_CHECK_PEERS_FILTER / GPU_CHECK_CUDA_FILTER, a --benchmark_filter regex
#   for the peer / CUDA benchmark steps (default: every case; the CUDA benchmarks' 230 cases take
#   several minutes, mostly host-side set-up);
#   GPU_CHECK_STEPS="device_tests bench_peers ..." runs only those steps (a
#   rerun of what failed); GPU_CHECK_SANITIZE_SPEC, the Catch2 test spec of the sanitizer steps
#   (default "[device]~[stats]~[exact]").
#
# Adding a step (another area's device tests or demo): in register_steps below, one line
#   step NAME MIN_SECONDS MAX_SECONDS COMMAND [ARGS...]
# runs COMMAND from the repository root with the bundle's binaries in $BIN (bin/ of the bundle)
# and its shared libraries on LD_LIBRARY_PATH, its output in logs/NAME.log; exit 0 passes,
# 77 reads as skipped, anything else fails. Steps run in the order registered; one whose
# MIN_SECONDS no longer fit the budget is reported as "not started". A binary it needs goes
# into the bundle with one line in register_targets:
#   target CMAKE_TARGET RELATIVE_PATH_IN_BUILD_TREE
# (missing optional targets are left out with a message; the step should then skip, exit 77).
# A step that writes Google Benchmark JSON to "$RESULTS/NAME.json" gets its table in the summary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

mode=""
BUNDLE="build-gpu/bundle"
OUT_DIR="${OUT:-build-gpu/out}"
FROM_BUILD=""
BUDGET=450
while (($#)); do
  case "$1" in
    build | run | travel-light | travel-restore) mode="$1" ;;
    --dry-run) mode="dry-run" ;;
    --python-step) mode="python-step" ;;
    --profile-step) mode="profile-step" ;;
    --bundle) BUNDLE="$2"; shift ;;
    --out) OUT_DIR="$2"; shift ;;
    --from-build) FROM_BUILD="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$mode" ]] || { echo "gpu_check: say build, run or --dry-run (see --help)" >&2; exit 2; }
BUNDLE="$(realpath -m "$BUNDLE")"
OUT_DIR="$(realpath -m "$OUT_DIR")"
[[ -z "$FROM_BUILD" ]] || FROM_BUILD="$(realpath -m "$FROM_BUILD")"

log() { printf '[gpu_check] %s\n' "$*"; }
T0=$(date +%s)
now() { echo $(($(date +%s) - T0)); }

# ---------------------------------------------------------------------------------------------
# What goes into the bundle: target NAME PATH (relative to the build tree).
# ---------------------------------------------------------------------------------------------
TARGETS=()
TARGET_PATHS=()
target() { TARGETS+=("$1"); TARGET_PATHS+=("$2"); }
register_targets() {
  # GPU_CHECK_TARGETS="a b" bundles only those (when the repository leaves too little room).
  if [[ -n "${GPU_CHECK_TARGETS:-}" ]]; then
    local t
    register_targets_all
    local names=("${TARGETS[@]}") paths=("${TARGET_PATHS[@]}")
    TARGETS=()
    TARGET_PATHS=()
    for t in "${!names[@]}"; do
      if [[ " $GPU_CHECK_TARGETS " == *" ${names[$t]} "* ]]; then
        target "${names[$t]}" "${paths[$t]}"
      fi
    done
    return 0
  fi
  register_targets_all
}
register_targets_all() {
  target specula_test_cuda tests/specula_test_cuda
  target specula_bench_cuda bench/specula_bench_cuda
  target specula_bench_peers bench/peers/specula_bench_peers  # needs PyPI at configure time
  target specula_test_cuda_model tests/specula_test_cuda_model  # the example transformer
  target specula_bench_device_model bench/specula_bench_device_model
  target specula_demo examples/demo/specula_demo
}

# ---------------------------------------------------------------------------------------------
# The steps of a run: step NAME MIN_SECONDS MAX_SECONDS COMMAND...  (see the file comment).
# Order: what answers the most first (the tests, the targets' benchmarks), the sanitizers, then
# the Python package, which is built on the device in the background from the start.
# ---------------------------------------------------------------------------------------------
STEPS=()
declare -A STEP_MIN STEP_MAX STEP_CMD
step() {
  local name="$1" min="$2" max="$3"
  shift 3
  STEPS+=("$name")
  STEP_MIN[$name]="$min"
  STEP_MAX[$name]="$max"
  local arg cmd=""
  for arg in "$@"; do
    # Arguments naming $BIN or $RESULTS expand when the step runs; the others stay literal.
    if [[ "$arg" == *'$BIN'* || "$arg" == *'$RESULTS'* ]]; then
      cmd+="\"$arg\" "
    else
      cmd+="$(printf '%q' "$arg") "
    fi
  done
  STEP_CMD[$name]="$cmd"
}
# Device tests without the large statistical and enumeration ones, under each sanitizer tool.
SANITIZED="${GPU_CHECK_SANITIZE_SPEC:-[device]~[stats]~[exact]}"
register_steps() {
  step nvidia_smi 5 20 nvidia-smi
  step device_tests 30 150 '$BIN/specula_test_cuda' --durations yes
  # The example transformer on the GPU (docs/cuda.md): its device tests, the pass cost against
  # tree nodes, and the demo's tables with every model on the GPU (one round, one sample).
  step model_tests 30 180 env SPECULA_MODELS_DIR=examples/models \
    '$BIN/specula_test_cuda_model' --durations yes
  step bench_peers 20 100 '$BIN/specula_bench_peers' --benchmark_min_time=0.01 \
    "--benchmark_filter=${GPU_CHECK_PEERS_FILTER:-.}" \
    '--benchmark_out=$RESULTS/bench_peers.json' --benchmark_out_format=json
  step bench_cuda 20 100 '$BIN/specula_bench_cuda' --benchmark_min_time=0.01 \
    "--benchmark_filter=${GPU_CHECK_CUDA_FILTER:-.}" \
    '--benchmark_out=$RESULTS/bench_cuda.json' --benchmark_out_format=json
  step model_bench 15 60 env SPECULA_MODELS_DIR=examples/models \
    '$BIN/specula_bench_device_model' --benchmark_min_time=0.05 \
    '--benchmark_out=$RESULTS/model_bench.json' --benchmark_out_format=json
  step model_demo 30 150 bash -c '[[ -x $BIN/specula_demo ]] || exit 77; DEMO_SKIP_BUILD=1 DEMO_EXE=$BIN/specula_demo DEMO_MODELS_DIR=examples/models DEMO_DEVICE=cuda DEMO_REPEATS=1 DEMO_WARMUP=1 DEMO_SAMPLES=1 DEMO_TEXT_TOKENS=64 bash scripts/demo.sh text diffusion image'
  step memcheck 20 75 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 \
    '$BIN/specula_test_cuda' "$SANITIZED"
  step synccheck 15 60 compute-sanitizer --tool synccheck --error-exitcode 1 \
    '$BIN/specula_test_cuda' "$SANITIZED"
  step initcheck 15 60 compute-sanitizer --tool initcheck --error-exitcode 1 \
    '$BIN/specula_test_cuda' "$SANITIZED"
  step python_cuda 20 150 bash scripts/gpu_check.sh --python-step
  # Nsight Compute on two launches of each hot kernel (text in the log; no source view, the
  # bundle is built without -lineinfo): where the next performance work starts.
  step profile 20 90 bash scripts/gpu_check.sh --profile-step
  # Last: racecheck's cost is open-ended (18 device test cases took 75 s on an H200), so it
  # takes what the budget leaves.
  step racecheck 20 200 compute-sanitizer --tool racecheck \
    --error-exitcode 1 '$BIN/specula_test_cuda' "$SANITIZED"
}
# ('$BIN' and '$RESULTS' in single quotes: they expand when the step runs.)

# ---------------------------------------------------------------------------------------------
# Bundle: binaries, the shared libraries they need beyond the C/C++ runtime, a manifest.
# ---------------------------------------------------------------------------------------------
system_lib() {  # libraries every Linux machine has (and the driver, which must be the machine's)
  case "$(basename "$1")" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | \
      libgcc_s* | libstdc++* | libcuda.so* | libnvidia*) return 0 ;;
  esac
  return 1
}

assemble_bundle() {  # assemble_bundle BUILD_TREE
  local tree="$1" i name path lib
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  for i in "${!TARGETS[@]}"; do
    name="${TARGETS[$i]}"
    path="$tree/${TARGET_PATHS[$i]}"
    if [[ -x "$path" ]]; then
      cp "$path" "$BUNDLE/bin/"
      strip --strip-all "$BUNDLE/bin/$name" 2>/dev/null || true
      while read -r lib; do
        [[ -n "$lib" && -f "$lib" ]] || continue
        system_lib "$lib" || cp -L -n "$lib" "$BUNDLE/lib/" 2>/dev/null || true
      done < <(ldd "$path" 2>/dev/null | awk '/=> \//{print $3}')
    else
      log "not in the bundle: $name ($path not built; its step will skip)"
    fi
  done
  {
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m)"
    echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1 || echo unknown)"
    echo "binaries: $(ls "$BUNDLE/bin" | tr '\n' ' ')"
    echo "libraries: $(ls "$BUNDLE/lib" | tr '\n' ' ')"
  } >"$BUNDLE/MANIFEST"
  # One archive travels (xz -9e: about a fifth of the stripped binaries, 11 % smaller than -6;
  # GPU_CHECK_XZ_LEVEL overrides, the ctest dry run uses 0); `run` unpacks it.
  local raw bytes tree_bytes mib level="${GPU_CHECK_XZ_LEVEL:-9e}"
  raw=$(du -sb "$BUNDLE" | cut -f1)
  tar -C "$BUNDLE" -cf - bin lib MANIFEST | xz "-$level" -T0 >"$BUNDLE.tar.xz"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"
  mv "$BUNDLE.tar.xz" "$BUNDLE/bundle.tar.xz"
  bytes=$(du -sb "$BUNDLE" | cut -f1)
  # What travels with it: tracked files and untracked files git does not ignore.
  tree_bytes=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
    xargs -0 -r du -cb 2>/dev/null | awk '$2 == "total" {s += $1} END {print s + 0}')
  mib() { awk -v b="$1" 'BEGIN{printf "%.1f MiB", b/1048576}'; }
  log "bundle $BUNDLE/bundle.tar.xz: $(mib "$bytes") ($(mib "$raw") unpacked); the repository's" \
    "files: $(mib "$tree_bytes"); together $(mib $((bytes + tree_bytes))) of the device tool's 64 MiB"
  if ((bytes + tree_bytes > 64 * 1024 * 1024)); then
    log "too large for the device tool by $(mib $((bytes + tree_bytes - 64 * 1024 * 1024))):" \
      "'scripts/gpu_check.sh travel-light' before the call (and travel-restore after it)," \
      "or bundle fewer targets (GPU_CHECK_TARGETS)"
    # Only the real bundle (sm_90, `build`) must fit; the dry run bundles whatever the CI build
    # made (every architecture, a fast compression level).
    [[ "$mode" == dry-run ]] || return 1
  fi
}

# Tracked files the device run does not read, left behind by travel-light.
LIGHT_FILES=(examples/models/text-target-xl.safetensors)
LIGHT_MARK="# specula gpu_check travel-light"
travel_light() {
  local f exclude
  exclude="$(git rev-parse --git-path info/exclude)"
  for f in "${LIGHT_FILES[@]}"; do
    git ls-files --error-unmatch "$f" >/dev/null 2>&1 || continue
    git rm --cached -q -- "$f"
    printf '%s\n/%s\n' "$LIGHT_MARK" "$f" >>"$exclude"
    log "left behind: $f (out of the index, ignored; on disk)"
  done
  log "do not commit until 'scripts/gpu_check.sh travel-restore' (git status shows the deletion)"
}
travel_restore() {
  local f exclude
  exclude="$(git rev-parse --git-path info/exclude)"
  for f in "${LIGHT_FILES[@]}"; do
    git reset -q -- "$f" 2>/dev/null || true
  done
  if [[ -f "$exclude" ]]; then
    local drop=("$LIGHT_MARK")
    for f in "${LIGHT_FILES[@]}"; do drop+=("/$f"); done
    grep -vxF -f <(printf '%s\n' "${drop[@]}") "$exclude" >"$exclude.tmp" || true
    mv "$exclude.tmp" "$exclude"
  fi
  git status --short -- "${LIGHT_FILES[@]}"
  log "restored: ${LIGHT_FILES[*]}"
}

# The bundle's files: `run` and the dry run unpack bundle.tar.xz into a scratch folder.
unpack_bundle() {
  [[ -f "$BUNDLE/bundle.tar.xz" ]] || return 0
  local dir
  dir="$(mktemp -d /tmp/specula-gpu-bundle.XXXXXX)"
  xz -dc "$BUNDLE/bundle.tar.xz" | tar -C "$dir" -xf -
  BUNDLE="$dir"
}

build_bundle() {
  if [[ -n "$FROM_BUILD" ]]; then
    log "bundling the binaries of $FROM_BUILD (no build)"
    assemble_bundle "$FROM_BUILD"
    return
  fi
  local tree="$ROOT/build-gpu/tree" launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # 90-real: sm_90 machine code only, no PTX. The lent GPUs (H100, H200) are sm_90, and the
  # PTX, which only serves a JIT for other GPUs, is about a third of the compressed device code.
  log "configure $tree (Release, sm_90 machine code)"
  cmake -S . -B "$tree" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real \
    -DSPECULA_BUILD_EXAMPLES=ON "${launcher[@]}" >"$ROOT/build-gpu/configure.log" 2>&1 ||
    { tail -20 "$ROOT/build-gpu/configure.log"; return 1; }
  grep -q 'CUDA enabled' "$ROOT/build-gpu/configure.log" ||
    { log "no CUDA compiler found: nothing to bundle"; return 1; }
  # The target list read once (not `cmake ... | grep -q`: under pipefail grep's early exit
  # fails the pipeline with SIGPIPE, and no target would be selected).
  local t available=() help
  help="$(cmake --build "$tree" --target help 2>/dev/null || true)"
  for t in "${TARGETS[@]}"; do
    if grep -qw -- "$t" <<<"$help"; then available+=("$t"); fi
  done
  ((${#available[@]})) || { log "none of ${TARGETS[*]} is a target of $tree"; return 1; }
  log "build ${available[*]} (-j ${JOBS:-$(nproc)})"
  cmake --build "$tree" -j "${JOBS:-$(nproc)}" --target "${available[@]}"
  assemble_bundle "$tree"
}

# ---------------------------------------------------------------------------------------------
# Run: every step in order within the budget; statuses in $RESULTS/status.tsv.
# ---------------------------------------------------------------------------------------------
run_steps() {  # run_steps DRY(0/1)
  local dry="$1" name min max left limit cmd rc start status first
  export PATH="$PATH:/usr/local/cuda/bin"
  export BIN="$BUNDLE/bin" RESULTS="$RESULTS"
  export LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  : >"$RESULTS/status.tsv"
  for name in "${STEPS[@]}"; do
    min="${STEP_MIN[$name]}"
    max="${STEP_MAX[$name]}"
    cmd="${STEP_CMD[$name]}"
    left=$((BUDGET - $(now)))
    limit=$((max < left ? max : left))
    if ((dry)); then
      printf 'dry run: would run (timeout %ss, from %s):\n  %s\n' "$max" "$ROOT" \
        "$(eval "echo $cmd")" >"$LOGS/$name.log"
      printf '%s\t%s\t%s\t%s\n' "$name" "dry-run" 0 "$max" >>"$RESULTS/status.tsv"
      log "$name: $(eval "echo $cmd")"
      continue
    fi
    if [[ -n "${GPU_CHECK_STEPS:-}" && " $GPU_CHECK_STEPS " != *" $name "* ]]; then
      printf '%s\t%s\t%s\t%s\n' "$name" "not selected" 0 "$max" >>"$RESULTS/status.tsv"
      continue
    fi
    first="$(eval "echo ${cmd%% *}")"
    if [[ "$first" == "$BIN"/* && ! -x "$first" ]]; then
      printf '%s\t%s\t%s\t%s\n' "$name" "skipped (not bundled)" 0 "$max" >>"$RESULTS/status.tsv"
      log "$name: skipped ($(basename "$first") is not in the bundle)"
      continue
    fi
    if ((left < min)); then
      printf '%s\t%s\t%s\t%s\n' "$name" "not started (budget)" 0 "$max" >>"$RESULTS/status.tsv"
      log "$name: not started ($left s left, needs $min s)"
      continue
    fi
    log "$name (timeout ${limit}s): $(eval "echo $cmd")"
    start=$(now)
    rc=0
    (eval "timeout -k 5 $limit $cmd") >"$LOGS/$name.log" 2>&1 || rc=$?
    case "$rc" in
      0) status=pass ;;
      77) status=skipped ;;
      124 | 137) status="timeout (${limit}s)" ;;
      *) status="FAIL (exit $rc)" ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(($(now) - start))" "$max" >>"$RESULTS/status.tsv"
    log "$name: $status in $(($(now) - start)) s"
  done
}

# Whether this machine has a GPU (nvidia-smi lists one, or the driver's device node exists).
have_gpu() {
  { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; } ||
    [[ -e /dev/nvidia0 ]]
}

# Runs python3 -X faulthandler ARGS under cuda-gdb (110 s at most; the device has no gdb) and
# prints the native backtrace of the thread that stops it with a fatal signal.
native_backtrace() {
  if ! command -v cuda-gdb >/dev/null 2>&1; then
    echo "cuda-gdb not found: no native backtrace"
    return 0
  fi
  PYTHONUNBUFFERED=1 timeout -k 5 110 cuda-gdb -batch -iex 'set auto-load python-scripts off' \
    -ex 'set pagination off' -ex 'handle SIGPIPE SIGUSR1 SIGUSR2 nostop noprint pass' \
    -ex run -ex 'bt 25' -ex 'info registers rip' -ex 'x/6i $pc' -ex 'info threads' \
    --args python3 -X faulthandler "$@" 2>&1 || true
}

# module_link_report SO BUILD_DIR: how the module was linked. The link command comes from the
# build tool (scikit-build-core builds with Ninja where ninja is installed: then there is no
# link.txt); it is run once more into a scratch file with the compiler driver's own command
# (-v: collect2's line, every -L, -l and -static* flag) and the linker naming each library it
# opens (--trace) and the file that defines std::locale::classic() and
# std::codecvt<char16_t, char, mbstate_t>::do_length (-y): a libstdc++.a or another archive
# there is the static copy's source. Then the flags that reach the link from outside the project.
module_link_report() {
  local so="$1" build="$2" make link out="${TMPDIR:-/tmp}/specula-relink.so"
  make="$(sed -n 's/^CMAKE_MAKE_PROGRAM:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
  if [[ -f "$build/CMakeFiles/_specula.dir/link.txt" ]]; then
    link="$(tail -1 "$build/CMakeFiles/_specula.dir/link.txt")"
  elif [[ "$make" == *ninja* ]]; then
    link="$(cd "$build" && "$make" -t commands "$(basename "$so")" 2>/dev/null | tail -1 || true)"
  fi
  echo "link command: ${link:-(not found)}"
  grep -h 'IMPLICIT_LINK_LIBRARIES\|IMPLICIT_LINK_DIRECTORIES' \
    "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake "$build"/CMakeFiles/*/CMakeCXXCompiler.cmake \
    2>/dev/null || true
  grep -E '^CMAKE_(MODULE|SHARED)_LINKER_FLAGS:|^CMAKE_CXX_FLAGS:|^CMAKE_CXX_COMPILER:' \
    "$build/CMakeCache.txt" 2>/dev/null || true
  echo "environment: LDFLAGS='${LDFLAGS:-}' CXXFLAGS='${CXXFLAGS:-}' CXX='${CXX:-}'" \
    "CUDAHOSTCXX='${CUDAHOSTCXX:-}' AUDITWHEEL_PLAT='${AUDITWHEEL_PLAT:-}'"
  # A libstdc++.so that is missing or dangles next to the compiler makes ld take libstdc++.a.
  local cxx lib
  cxx="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
  for lib in libstdc++.so libstdc++.a; do
    lib="$("${cxx:-c++}" -print-file-name="$lib" 2>/dev/null || true)"
    echo "$lib -> $(readlink -e "$lib" 2>/dev/null || echo 'missing or dangling')"
  done
  [[ -n "${link:-}" ]] || return 0
  # ': && g++ ... -o TARGET ... && :' (Ninja) or 'g++ ... -o TARGET ...' (Makefiles)
  link="$(sed -e 's/^: && //' -e 's/ && :$//' -e "s# -o [^ ]*# -o $out#" <<<"$link")"
  (cd "$build" && eval "$link -v -Wl,--trace -Wl,-y,_ZNSt6locale7classicEv \
      -Wl,-y,_ZNKSt7codecvtIDsc11__mbstate_tE9do_lengthERS0_PKcS4_m" 2>&1) |
    grep -E 'collect2|static|stdc\+\+|_ZNSt6locale|codecvt' | cut -c1-4000 || true
  rm -f "$out"
}

# The python_cuda step (runs on the device): wait for the background build of the package with
# the CUDA path (started by `run` at t = 0), then its CUDA tests.
python_step() {
  local dir=/tmp/specula-gpu-python
  if [[ ! -f "$dir/started" ]]; then echo "python package build not started"; exit 77; fi
  while [[ ! -f "$dir/done" ]]; do sleep 2; done
  cat "$dir/build.log" | tail -5
  if [[ "$(cat "$dir/done")" != 0 ]]; then
    echo "building the Python package with SPECULA_PYTHON_CUDA=ON failed (see above)"
    exit 1
  fi
  # What built and runs the package: the first thing to compare when only the device fails.
  PYTHONPATH="$dir/site" python3 -c 'import platform, sys, torch, numpy, nanobind, specula_sd
print("python", sys.version.split()[0], "| glibc", "-".join(platform.libc_ver()), "| torch",
      torch.__version__, "cuda", torch.version.cuda, "| numpy", numpy.__version__,
      "| nanobind", nanobind.__version__, "| specula_sd._HAS_CUDA", specula_sd._HAS_CUDA)' ||
    true
  c++ --version 2>/dev/null | head -1 || true
  # How the module was linked. On the H200 run of 2026-11-27 the package built there (GCC 13.3,
  # nanobind 3.1.0) died in its first call, relaxed_rule(2.0), inside std::ostream << double,
  # with libstdc++'s own functions (std::codecvt<char16_t, ...>::do_length) named as symbols of
  # _specula.so. The report below found why on 2026-11-28: that compiler has no usable
  # libstdc++.so, so ld took libstdc++.a; the module now links with --exclude-libs,ALL, which
  # keeps the static copy private (exported libstdc++ functions: 0), and the tests pass.
  local so
  so="$(ls "$dir"/site/specula_sd/_specula*.so 2>/dev/null | head -1 || true)"
  if [[ -n "$so" ]]; then
    echo "module: $so ($(stat -c %s "$so") bytes)"
    ldd "$so" | grep -E 'stdc|gcc_s|cuda' || true
    echo "libstdc++ functions exported by the module: $(nm -DC --defined-only "$so" 2>/dev/null |
      grep -cE ' (std::(locale|codecvt|basic_ostream|ios_base)|__cxa)' || true)"
    nm -DC --defined-only "$so" 2>/dev/null | grep -m5 -E 'std::(locale|codecvt)' || true
    module_link_report "$so" "$dir/build"
  fi
  # The calls of the first test stage by stage, each named before it runs (the last name
  # printed is where a fatal signal struck), then the tests. -v, unbuffered: the log names each
  # test as it starts and keeps the results of those before it.
  local rc=0 smoke=0 test
  PYTHONUNBUFFERED=1 PYTHONPATH="$dir/site" python3 -X faulthandler \
    scripts/python_cuda_smoke.py || smoke=$?
  if ((smoke > 128)); then
    echo "=== the staged calls died with signal $((smoke - 128)); once more under cuda-gdb"
    PYTHONPATH="$dir/site" native_backtrace scripts/python_cuda_smoke.py
  fi
  PYTHONUNBUFFERED=1 PYTHONPATH="$dir/site" python3 -X faulthandler -m pytest -v \
    -p no:cacheprovider python/tests/test_cuda.py 2>&1 | tee "$dir/pytest.log" || rc=$?
  if ((rc > 128 && smoke <= 128)); then
    # The whole file again, not the test named last alone: the fault may depend on what the
    # tests before it left in the process.
    test="$(grep -o 'python/tests/test_cuda\.py::[^ ]*' "$dir/pytest.log" | tail -1 || true)"
    echo "=== pytest died with signal $((rc - 128)) in ${test:-an unnamed test}; once more under cuda-gdb"
    PYTHONPATH="$dir/site" native_backtrace -m pytest -v -p no:cacheprovider \
      python/tests/test_cuda.py
    # The other tests, which the fault kept from running, without the test function that died.
    local fn="${test##*::}"
    fn="${fn%%[*}"
    if [[ -n "$fn" ]]; then
      echo "=== the other tests, without $fn"
      PYTHONUNBUFFERED=1 PYTHONPATH="$dir/site" python3 -X faulthandler -m pytest -v \
        -p no:cacheprovider -k "not $fn" python/tests/test_cuda.py 2>&1 || true
    fi
  fi
  if ((rc == 0 && smoke != 0 && smoke != 77)); then rc=1; fi
  return "$rc"
}

# The profile step (runs on the device): launches of the kernels named below, out of the CUDA
# benchmarks, under ncu with the clocks left alone; sections printed as text.
profile_step() {
  local ncu
  ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)"
  [[ -n "$ncu" && -x "$BIN/specula_bench_cuda" ]] || { echo "no ncu or no specula_bench_cuda"; exit 77; }
  # "filter|kernel regex"; case names end in /manual_time, so a filter ends in "/", not "$".
  local cases=(
    'cuda_chain/reject_mid/V:128256/n:8/B:32/|chain_flattened_kernel'
    'cuda_chain/accept_all/V:32000/n:1/B:1/|chain_flattened_kernel'
    'cuda_chain_split/reject_mid/V:128256/n:8/B:32/S:auto/|chain_split'
    'cuda_sample/logits/f32/V:128256/B:1/|logits_to_probs|row_transform|sample'
    'cuda_tree/sjd_pac/V:16384/B:1/|tree'
  )
  local c filter kernel rc=0
  for c in "${cases[@]}"; do
    filter="${c%%|*}"
    kernel="${c#*|}"
    echo "=== $filter (kernels matching $kernel)"
    "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats \
      "$BIN/specula_bench_cuda" "--benchmark_filter=$filter" --benchmark_min_time=0.001 || rc=1
  done
  exit "$rc"
}

start_python_build() {
  local dir=/tmp/specula-gpu-python
  rm -rf "$dir"
  mkdir -p "$dir"
  touch "$dir/started"
  if ! python3 -c 'import scikit_build_core, nanobind, torch, pytest' >/dev/null 2>&1; then
    echo "scikit-build-core, nanobind, torch or pytest missing" >"$dir/build.log"
    echo 1 >"$dir/done"
    return
  fi
  (
    rc=0
    CMAKE_BUILD_PARALLEL_LEVEL=8 nice -n 5 python3 -m pip install --no-build-isolation --no-deps \
      --no-index --disable-pip-version-check --target "$dir/site" \
      --config-settings=cmake.define.SPECULA_PYTHON_CUDA=ON \
      --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
      --config-settings=build-dir="$dir/build" ./python >"$dir/build.log" 2>&1 || rc=$?
    echo "$rc" >"$dir/done"
  ) &
}

# ---------------------------------------------------------------------------------------------
# Summary: summary.md from the statuses and the benchmark JSON (scripts/gpu_check_report.py).
# ---------------------------------------------------------------------------------------------
finish() {  # finish DRY
  local dry="$1" stand_in=()
  ((dry)) && stand_in=(--stand-in "$BUNDLE/bin")
  python3 scripts/gpu_check_report.py --results "$RESULTS" --bundle "$BUNDLE" \
    "${stand_in[@]}" >"$OUT_DIR/summary.md"
  cp "$RESULTS"/*.json "$OUT_DIR/" 2>/dev/null || true
  tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs results
  log "wrote $OUT_DIR/summary.md, $OUT_DIR/logs.tar.gz$(ls "$RESULTS"/*.json >/dev/null 2>&1 && echo ', benchmark JSON')"
  echo
  # The steps and targets (the benchmark tables are in summary.md), last: the device tool's
  # reply shows the end of the output.
  sed '/^## Benchmark tables/,$d' "$OUT_DIR/summary.md"
}

if [[ "$mode" == python-step ]]; then python_step; exit; fi
if [[ "$mode" == profile-step ]]; then profile_step; exit; fi
if [[ "$mode" == travel-light ]]; then travel_light; exit; fi
if [[ "$mode" == travel-restore ]]; then travel_restore; exit; fi
register_targets
register_steps

case "$mode" in
  build)
    mkdir -p build-gpu
    build_bundle
    ;;
  run | dry-run)
    dry=0
    [[ "$mode" == dry-run ]] && dry=1
    if ((dry)); then
      mkdir -p build-gpu
      build_bundle
    elif [[ ! -f "$BUNDLE/bundle.tar.xz" && ! -d "$BUNDLE/bin" ]]; then
      log "no bundle at $BUNDLE: run 'scripts/gpu_check.sh build' where nvcc is, and carry it"
      exit 1
    fi
    unpack_bundle
    mkdir -p "$OUT_DIR"
    WORK="$(mktemp -d)"
    LOGS="$WORK/logs"
    RESULTS="$WORK/results"
    mkdir -p "$LOGS" "$RESULTS"
    log "mode $mode, budget ${BUDGET}s, bundle $BUNDLE ($(head -1 "$BUNDLE/MANIFEST"))"
    # The bundle is self-contained: its test binaries start from the bundle's libraries and
    # list their cases (no GPU needed), here and on the device before any step.
    for exe in specula_test_cuda specula_test_cuda_model; do
      [[ -x "$BUNDLE/bin/$exe" ]] || continue
      n=$(LD_LIBRARY_PATH="$BUNDLE/lib" "$BUNDLE/bin/$exe" --list-test-names-only |
        grep -c . || true)
      log "bundle check: $exe lists $n test cases"
      ((n > 0)) || { log "the bundled $exe does not start"; exit 1; }
    done
    no_gpu=0
    if ((!dry)) && ! have_gpu; then
      # Nothing here can use the bundle: say so, write the summary, and stop before the Python
      # build and the steps (exit 77: skipped), so that a run on a machine without a GPU costs
      # seconds and reads as what it is.
      log "no GPU on this machine (nvidia-smi lists none, no /dev/nvidia0): every step skipped"
      no_gpu=1
      : >"$RESULTS/status.tsv"
      for name in "${STEPS[@]}"; do
        printf '%s\t%s\t%s\t%s\n' "$name" "skipped (no GPU)" 0 "${STEP_MAX[$name]}" \
          >>"$RESULTS/status.tsv"
      done
    elif ((!dry)) && [[ -z "${GPU_CHECK_STEPS:-}" || " $GPU_CHECK_STEPS " == *" python_cuda "* ]]; then
      start_python_build  # only when its step runs (a split run builds it in the call that does)
    fi
    ((no_gpu)) || run_steps "$dry"
    finish "$dry"
    rm -rf "$WORK"
    [[ "$BUNDLE" != /tmp/specula-gpu-bundle.* ]] || rm -rf "$BUNDLE"
    ((no_gpu == 0)) || exit 77
    ;;
esac
