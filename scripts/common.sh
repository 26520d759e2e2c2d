#!/usr/bin/env bash
# Shared helpers for specula's scripts. Source it; do not execute it.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

SPECULA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SPECULA_ROOT

# Debian packages needed to configure, build and test specula.
SPECULA_DEPS=(cmake g++ make catch2 libboost-math-dev libbenchmark-dev)

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

# now_s: wall-clock seconds with sub-second precision.
now_s() { date +%s.%N; }

# elapsed <start>: seconds since <start>, formatted.
elapsed() { awk -v s="$1" -v e="$(now_s)" 'BEGIN { printf "%.1fs", e - s }'; }
