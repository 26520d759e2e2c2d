#!/usr/bin/env bash
# Shared helpers for specula's scripts. Source it; do not execute it.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

SPECULA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SPECULA_ROOT

# Debian packages needed to configure, build and test specula (python3-dev and python3-venv:
# the Python package's build and its test environment, see ensure_python_package;
# python3-numpy: examples.distortion_tool, scripts/distortion.py under the system Python).
SPECULA_DEPS=(cmake g++ make ninja-build catch2 libboost-math-dev libbenchmark-dev nlohmann-json3-dev libpng-dev
              python3-dev python3-venv python3-numpy)

JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
export JOBS

log() { printf '[specula] %s\n' "$*" >&2; }
die() { printf '[specula] error: %s\n' "$*" >&2; exit 1; }

# Use the default CUDA toolkit location when nvcc is not otherwise configured.
if [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

# ensure_deps: make sure the required Debian packages are installed.
# Installs missing ones when running as root with apt-get; otherwise explains
# what is missing and exits 1.
ensure_deps() {
  if ! command -v dpkg >/dev/null 2>&1; then
    log "dpkg not found; not checking packages (need: ${SPECULA_DEPS[*]})"
    return 0
  fi

  local missing=() pkg
  for pkg in "${SPECULA_DEPS[@]}"; do
    if ! dpkg -s "$pkg" >/dev/null 2>&1; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi

  if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing packages: ${missing[*]}
  install them with:  sudo apt-get install --no-install-recommends ${missing[*]}"
  fi

  log "installing missing packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    log "apt-get install failed; running apt-get update and retrying"
    apt-get update -qq
    apt-get install -y --no-install-recommends "${missing[@]}"
  fi
}

# ensure_conan <venv-dir>: put a Conan 2 `conan` on PATH for the package.conan_create
# test (tests/package/conan_create.cmake), which is skipped when there is none.
#   - a Conan 2 already on PATH is used as is;
#   - else <venv-dir>/bin/conan, if an earlier run installed it there;
#   - else conan is pip-installed (PyPI) into a new virtual environment <venv-dir>.
# Best effort: never fails the caller. Quick when conan is already there.
# SPECULA_NO_CONAN=1 skips all of this (and so the test, unless conan is on PATH).
_is_conan2() { [[ "$("$1" --version 2>/dev/null)" == "Conan version 2."* ]]; }

ensure_conan() {
  local venv="$1"
  if [[ "${SPECULA_NO_CONAN:-0}" == 1 ]]; then
    return 0
  fi
  if command -v conan >/dev/null 2>&1 && _is_conan2 conan; then
    return 0
  fi
  if [[ -x "$venv/bin/conan" ]] && _is_conan2 "$venv/bin/conan"; then
    export PATH="$venv/bin:$PATH"
    return 0
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    log "python3 not found: cannot install conan, package.conan_create will be skipped"
    return 0
  fi
  log "installing conan into $venv (for package.conan_create; SPECULA_NO_CONAN=1 to skip)"
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    log "python3 -m venv failed (Debian: apt-get install python3-venv):" \
        "package.conan_create will be skipped"
    rm -rf "$venv"
    return 0
  fi
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
         --timeout 30 --retries 1 'conan>=2,<3' >/dev/null 2>&1 ||
     ! _is_conan2 "$venv/bin/conan"; then
    log "pip install conan failed (no access to PyPI?): package.conan_create will be skipped"
    rm -rf "$venv"
    return 0
  fi
  export PATH="$venv/bin:$PATH"
  log "$("$venv/bin/conan" --version)"
}

# ensure_python_package <dir>: build the Python package (python/) for the python.pytest test
# (tests/python/run_pytest.cmake) into a virtual environment <dir>/venv:
#   - the interpreter is $SPECULA_PYTHON, else Debian's /usr/bin/python3 (whose python3-dev and
#     python3-venv ensure_deps installs; --system-site-packages lets the tests see Debian's
#     python3-numpy and python3-torch where installed), else python3 on PATH;
#   - the build dependencies (scikit-build-core, nanobind) and the test dependencies (pytest,
#     numpy) are pip-installed from PyPI into <dir>/venv once;
#   - the package is then built (CMake build folder <dir>/build, kept between runs) and
#     installed into the environment, its log in <dir>/build.log.
# Never fails the caller. Without PyPI access (or python3 -m venv, or with SPECULA_NO_PYTHON=1)
# the reason goes to <dir>/skipped and python.pytest is reported as skipped; a failed build of
# the package leaves it uninstalled, so python.pytest fails.
_python_skip() {
  log "$1: python.pytest will be skipped"
  printf '%s\n' "$1" >"$2/skipped"
}

# The progress lines of the package's CMake build ("[3/17] Building CXX object ..." from Ninja,
# "[ 40%] Building ..." from Make) on stderr.
_python_progress() {
  { grep --line-buffered -E '^ *\[ *[0-9]+(%|/[0-9]+)\]' |
      sed -u 's/^ */[specula]   python package: /' >&2; } || true
}

ensure_python_package() {
  local dir="$1" venv="$1/venv" py="${SPECULA_PYTHON:-}"
  mkdir -p "$dir"
  rm -f "$dir/skipped"
  if [[ "${SPECULA_NO_PYTHON:-0}" == 1 ]]; then
    rm -rf "$venv"
    _python_skip "SPECULA_NO_PYTHON=1" "$dir"
    return 0
  fi
  if [[ -z "$py" ]]; then
    if [[ -x /usr/bin/python3 ]]; then py=/usr/bin/python3; else py="$(command -v python3 || true)"; fi
  fi
  if [[ -z "$py" ]]; then
    _python_skip "python3 not found" "$dir"
    return 0
  fi
  if ! "$venv/bin/python" -c 'import nanobind, scikit_build_core, pytest, numpy' >/dev/null 2>&1; then
    log "making $venv ($py; build and test dependencies from PyPI; SPECULA_NO_PYTHON=1 to skip)"
    rm -rf "$venv"
    if ! "$py" -m venv --system-site-packages "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      _python_skip "$py -m venv failed (Debian: apt-get install python3-venv)" "$dir"
      return 0
    fi
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 30 \
           --retries 1 'scikit-build-core>=0.10' 'nanobind>=2.2' pytest numpy >"$dir/pip.log" 2>&1; then
      rm -rf "$venv"
      _python_skip "pip could not install scikit-build-core, nanobind, pytest and numpy from PyPI (no access?); see $dir/pip.log" "$dir"
      return 0
    fi
  fi
  log "building the Python package (python/, distribution specula-sd) into $venv; log: $dir/build.log"
  # pip -v passes CMake's output on: its progress lines are printed as they come.
  if ! CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$venv/bin/python" -m pip install -v --no-build-isolation \
         --no-deps --disable-pip-version-check --config-settings=build-dir="$dir/build" \
         "$SPECULA_ROOT/python" 2>&1 | tee "$dir/build.log" | _python_progress; then
    log "building the Python package failed (see $dir/build.log): python.pytest will fail"
    "$venv/bin/python" -m pip uninstall --yes --quiet specula-sd >/dev/null 2>&1 || true
  fi
}

# now_s: wall-clock seconds with sub-second precision.
now_s() { date +%s.%N; }

# elapsed <start>: seconds since <start>, formatted.
elapsed() { awk -v s="$1" -v e="$(now_s)" 'BEGIN { printf "%.1fs", e - s }'; }
