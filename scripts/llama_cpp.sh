#!/usr/bin/env bash
# Fetch and build the pinned llama.cpp (libllama + ggml, CPU) into a cache folder outside any
# build directory, for specula's optional llama.cpp integration (-DSPECULA_WITH_LLAMA_CPP=ON,
# examples/llama_cpp/, ctest label `llama`).
#
#   scripts/llama_cpp.sh                    fetch + build + install once; print the install prefix
#   scripts/llama_cpp.sh --prefix           print the install prefix (builds nothing)
#   scripts/llama_cpp.sh --ready            exit 0 when the cache already holds llama.cpp and the
#                                           gguf environment (builds nothing)
#   scripts/llama_cpp.sh --with-speculative also build llama.cpp's own speculative example
#                                           (llama-speculative, for scripts/llama_cpp_bench.sh)
#   scripts/llama_cpp.sh --python           make a virtual environment with the pinned `gguf`
#                                           package (PyPI) for tools/to_gguf.py; print its python
#
# What is fetched: the source distribution of the PyPI package llama-cpp-python (pinned below by
# version and sha256), which vendors a released llama.cpp tree; only its vendor/llama.cpp folder
# is unpacked and built. Its address comes from PyPI's simple index (PEP 691 JSON;
# $PIP_INDEX_URL, default https://pypi.org/simple), or a local copy is named by
# SPECULA_LLAMA_CPP_SDIST; either way the sha256 must match.
#
# Environment:
#   SPECULA_LLAMA_CPP_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/specula)
#   SPECULA_LLAMA_CPP_NATIVE  1: -march=native build (GGML_NATIVE=ON); default 0: a portable
#                             x86-64-v3 build (AVX2, FMA, F16C, BMI2) on x86-64, generic elsewhere,
#                             so that a cache shared between CI machines never holds an
#                             instruction the next machine lacks. The flavour is part of the key.
#   SPECULA_LLAMA_CPP_LLAMAFILE 1 (default, llama.cpp's own default): llamafile's F32/F16 GEMM
#                             (tinyBLAS) for passes of 2+ tokens; 0: -DGGML_LLAMAFILE=OFF, ggml's
#                             blocked dot products for every pass: chain rows bit for bit equal to
#                             one-token rows, cheaper passes of 2-7 tokens, dearer passes from ~9
#                             tokens and prefills (docs/RESULTS.md, llama.cpp section). 0 adds
#                             "-nollamafile" to the key; the build takes the same time.
#   SPECULA_LLAMA_CPP_SDIST   path of an already downloaded sdist (checked against the hash)
#   JOBS                      build parallelism (default: nproc); the build runs under nice.
#
# Exit status: 0 with the install prefix on stdout; 2 when the sdist cannot be fetched (no access
# to PyPI: callers skip the integration with a message); 1 on any other failure (see build.log).
set -euo pipefail

SPECULA_LLAMA_CPP_PY_VERSION=0.3.36
SPECULA_LLAMA_CPP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The GGUF writer of tools/to_gguf.py (the llama.cpp project's Python package).
SPECULA_GGUF_VERSION=0.19.0

log() { printf '[specula llama.cpp] %s\n' "$*" >&2; }

mode=build
case "${1:-}" in
  "") ;;
  --prefix) mode=prefix ;;
  --ready) mode=ready ;;
  --with-speculative) mode=speculative ;;
  --python) mode=python ;;
  *) log "unknown argument '$1' (expected --prefix, --with-speculative or --python)"; exit 1 ;;
esac

if [[ "${SPECULA_LLAMA_CPP_NATIVE:-0}" == 1 ]]; then
  flavour=native
  arch_args=(-DGGML_NATIVE=ON)
elif [[ "$(uname -m)" == x86_64 ]]; then
  flavour=x86-64-v3
  arch_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
             -DGGML_BMI2=ON -DGGML_AVX512=OFF)
else
  flavour=generic
  arch_args=(-DGGML_NATIVE=OFF)
fi

if [[ "${SPECULA_LLAMA_CPP_LLAMAFILE:-1}" == 0 ]]; then
  flavour="$flavour-nollamafile"
  arch_args+=(-DGGML_LLAMAFILE=OFF)
else
  arch_args+=(-DGGML_LLAMAFILE=ON)
fi

root="${SPECULA_LLAMA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specula}"
dir="$root/llama-cpp-python-$SPECULA_LLAMA_CPP_PY_VERSION-$flavour"
prefix="$dir/install"
config="$prefix/lib/cmake/llama/llama-config.cmake"

if [[ "$mode" == prefix ]]; then
  printf '%s\n' "$prefix"
  exit 0
fi
if [[ "$mode" == ready ]]; then
  [[ -f "$config" && -f "$dir/installed.stamp" ]] &&
    "$root/gguf-$SPECULA_GGUF_VERSION-venv/bin/python" -c 'import gguf, numpy' >/dev/null 2>&1
  exit
fi

if [[ "$mode" == python ]]; then
  venv="$root/gguf-$SPECULA_GGUF_VERSION-venv"
  mkdir -p "$root"
  exec 9>"$root/.gguf.lock"
  flock 9
  if ! "$venv/bin/python" -c 'import gguf, numpy' >/dev/null 2>&1; then
    log "making $venv (gguf==$SPECULA_GGUF_VERSION and numpy from PyPI)"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      rm -rf "$venv"
      log "python3 -m venv failed (Debian: apt-get install python3-venv)"
      exit 2
    fi
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 30 \
           --retries 1 "gguf==$SPECULA_GGUF_VERSION" numpy >"$root/gguf-pip.log" 2>&1; then
      rm -rf "$venv"
      log "pip could not install gguf==$SPECULA_GGUF_VERSION from PyPI (no access?); see $root/gguf-pip.log"
      exit 2
    fi
  fi
  printf '%s\n' "$venv/bin/python"
  exit 0
fi

mkdir -p "$dir"
# One builder at a time per cache folder (two configures of one build tree would collide).
exec 9>"$dir/.lock"
flock 9

if [[ "$mode" == build && -f "$config" && -f "$dir/installed.stamp" ]]; then
  printf '%s\n' "$prefix"
  exit 0
fi

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

sdist="$dir/llama_cpp_python-$SPECULA_LLAMA_CPP_PY_VERSION.tar.gz"
if [[ ! -f "$sdist" || "$(sha256_of "$sdist")" != "$SPECULA_LLAMA_CPP_SHA256" ]]; then
  rm -f "$sdist"
  if [[ -n "${SPECULA_LLAMA_CPP_SDIST:-}" ]]; then
    cp "$SPECULA_LLAMA_CPP_SDIST" "$sdist.part"
  else
    log "fetching llama-cpp-python $SPECULA_LLAMA_CPP_PY_VERSION (sdist, ~77 MB) from PyPI"
    if ! python3 - "$SPECULA_LLAMA_CPP_PY_VERSION" "$SPECULA_LLAMA_CPP_SHA256" "$sdist.part" <<'EOF'
import json, os, sys, urllib.request
version, sha256, out = sys.argv[1:]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
req = urllib.request.Request(f"{index}/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=30) as r:
    files = json.load(r)["files"]
name = f"llama_cpp_python-{version}.tar.gz"
url = next(f["url"] for f in files if f["filename"] == name and f["hashes"].get("sha256") == sha256)
with urllib.request.urlopen(url, timeout=60) as r, open(out, "wb") as f:
    while chunk := r.read(1 << 20):
        f.write(chunk)
EOF
    then
      rm -f "$sdist.part"
      log "could not fetch llama-cpp-python $SPECULA_LLAMA_CPP_PY_VERSION from PyPI (no access?)"
      exit 2
    fi
  fi
  got="$(sha256_of "$sdist.part")"
  if [[ "$got" != "$SPECULA_LLAMA_CPP_SHA256" ]]; then
    rm -f "$sdist.part"
    log "sha256 mismatch for the llama-cpp-python sdist: got $got, pinned $SPECULA_LLAMA_CPP_SHA256"
    exit 1
  fi
  mv "$sdist.part" "$sdist"
fi

src="$dir/src"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  log "unpacking vendor/llama.cpp"
  rm -rf "$src" "$src.part"
  mkdir -p "$src.part"
  tar -xzf "$sdist" -C "$src.part" --strip-components=3 \
      "llama_cpp_python-$SPECULA_LLAMA_CPP_PY_VERSION/vendor/llama.cpp"
  mv "$src.part" "$src"
fi

jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
build="$dir/build"
common_args=(-S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
             -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_RPATH='$ORIGIN'
             -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
             -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_ALL_WARNINGS=OFF
             -DGGML_BACKEND_DL=OFF "${arch_args[@]}")
t0=$(date +%s)
if [[ "$mode" == build ]]; then
  log "building libllama + ggml ($flavour, -j$jobs, nice) in $build; log: $dir/build.log"
  if ! { cmake "${common_args[@]}" -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_EXAMPLES=OFF &&
         nice -n 10 cmake --build "$build" -j "$jobs" --target llama &&
         cmake --install "$build"; } >"$dir/build.log" 2>&1; then
    log "build failed; see $dir/build.log"
    tail -n 30 "$dir/build.log" >&2
    exit 1
  fi
  touch "$dir/installed.stamp"
  log "libllama + ggml built and installed in $(($(date +%s) - t0)) s"
  printf '%s\n' "$prefix"
else
  log "building llama.cpp's llama-speculative ($flavour, -j$jobs, nice); log: $dir/speculative.log"
  if ! { cmake "${common_args[@]}" -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON &&
         nice -n 10 cmake --build "$build" -j "$jobs" --target llama-speculative; } \
         >"$dir/speculative.log" 2>&1; then
    log "build of llama-speculative failed; see $dir/speculative.log"
    tail -n 30 "$dir/speculative.log" >&2
    exit 1
  fi
  log "llama-speculative built in $(($(date +%s) - t0)) s"
  printf '%s\n' "$build/bin/llama-speculative"
fi
