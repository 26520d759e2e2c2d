#!/usr/bin/env bash
# Build the Doxygen reference (public headers, the docs/ pages, compiled examples) into
# $BUILD_DIR/docs/html (default build/docs/html). Fails on any doxygen warning.
#
#   scripts/docs.sh            # then open build/docs/html/index.html
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v doxygen >/dev/null 2>&1; then
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -qq --no-install-recommends doxygen >/dev/null
  else
    echo "[specula] doxygen is not installed (Debian: apt-get install doxygen)" >&2
    exit 1
  fi
fi
out="${BUILD_DIR:-build}/docs"
mkdir -p "$out"
SPECULA_DOCS_OUT="$out" doxygen docs/Doxyfile
echo "[specula] reference written to $out/html/index.html"
