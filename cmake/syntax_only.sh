#!/bin/sh
# Compiler launcher of the host header checks (cmake/SpeculaHeaderChecks.cmake): runs the
# compile command with -fsyntax-only, so that GCC or Clang parses the header, instantiates
# what it names and gives every front-end diagnostic, without generating code, then creates
# the empty object file the build expects. (A header-only TU that odr-uses nothing has no code
# to generate at any level; the generation alone cost about 40 % of these TUs' time.)
out=
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out=$arg; fi
  prev=$arg
done
"$@" -fsyntax-only || exit $?
if [ -n "$out" ]; then : >"$out"; fi
