#!/usr/bin/env python3
"""ctest tools.jf_packing_matches_cpp: the Jacobi Forcing trainer's plain-Python data layout
(tools/jf_packing.py) against the C++ library (specula/decode/jacobi_forcing.hpp, through
tests/tools/jf_packing_dump.cpp) on several shapes, every mask kind, word boundaries of the
bit-packed mask and the training shapes of text-target-jf; plus the worked example of
docs/jacobi_forcing.md and hand-worked loss slots for the Python side alone.

    check_jf_packing.py DUMP_EXECUTABLE
"""

import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import jf_packing as jp  # noqa: E402

# (P, N, n, mask kind, window): tiny, the documented example, odd sizes, a row longer than one
# 64-bit word and not a multiple of it, and the two rounds of text-target-jf (255 slots).
SHAPES = [(0, 1, 1, "nc", 1), (1, 2, 2, "nc", 1), (1, 2, 2, "cllm", 1), (3, 5, 4, "nc_ic", 2),
          (5, 6, 3, "cllm", 1), (2, 7, 5, "nc_ic", 3), (70, 2, 40, "nc", 1),
          (31, 14, 8, "nc", 8), (31, 7, 16, "nc", 4), (31, 7, 16, "nc_ic", 4)]


def main():
    dump = sys.argv[1]
    rng = random.Random(7)
    requests, expected = [], []
    for P, N, n, kind, w in SHAPES:
        prompt = [rng.randrange(256) for _ in range(P)]
        clean = [rng.randrange(256) for _ in range(N * n)]
        noisy = [t if rng.random() < 0.5 else rng.randrange(256) for t in clean]
        requests.append(f"pack {P} {N} {n} {kind} {w}\n" + " ".join(map(str, prompt + clean +
                                                                            noisy)))
        lines = ["positions " + " ".join(map(str, jp.position_ids(P, N, n))),
                 "tokens " + " ".join(map(str, jp.pack_tokens(prompt, clean, noisy, n)))]
        lines += ["".join("1" if x else "0" for x in row)
                  for row in jp.packed_mask(P, N, n, kind, w)]
        expected.append((f"pack {P} {N} {n} {kind} {w}", lines))
    for case in range(40):  # noisy-view selection on random trajectories (ties included)
        n, K = rng.choice([4, 8, 16]), rng.randint(1, 9)
        fixed = [rng.randrange(4) for _ in range(n)]
        points = []
        for _ in range(K):
            first = rng.randint(0, n)
            points.append(fixed[:first] + [(t + 1 + rng.randrange(3)) % 4 if r == 0 else
                                           rng.randrange(4) for r, t in enumerate(fixed[first:])])
        ratio = jp.released_noise_ratios(rng.randint(1, 20), rng.randint(1, 9))[-1] \
            if case % 2 else rng.choice([0.0, 0.25, 0.3, 0.5, 1.0])
        requests.append(f"select {n} {K} {ratio!r}\n"
                        + " ".join(map(str, sum(points, []) + fixed)))
        expected.append((f"select n {n} K {K} ratio {ratio}",
                         [f"select {jp.select_noisy_view(points, fixed, ratio)}"]))
    for w in range(1, 10):
        ratios = jp.released_noise_ratios(2 * w + 1, w)
        for b in range(2 * w + 1):
            requests.append(f"ratio {b} 16 {w}")
            expected.append((f"ratio b {b} w {w}", [ratios[b]]))
    res = subprocess.run([dump], input="\n".join(requests) + "\n", capture_output=True,
                         text=True, check=True)
    got = res.stdout.splitlines()
    failures, at = 0, 0
    for what, lines in expected:
        for k, line in enumerate(lines):
            mine = got[at] if at < len(got) else "<missing>"
            at += 1
            if isinstance(line, float):
                ok = mine.startswith("ratio ") and float(mine.split()[1]) == line
            else:
                ok = mine == line
            if not ok:
                failures += 1
                if failures <= 5:
                    print(f"MISMATCH {what}, line {k}:\n  python {line}\n  c++    {mine}")
    if at != len(got):
        failures += 1
        print(f"MISMATCH: {len(got)} lines from the C++ side, {at} expected")

    # Negative control: the comparison sees a one-block difference (the nc and cllm masks of
    # the same shape differ only in what the noisy blocks see).
    nc, cllm = jp.packed_mask(1, 2, 2, "nc"), jp.packed_mask(1, 2, 2, "cllm")
    if nc == cllm:
        failures += 1
        print("negative control: the nc and cllm masks compare equal")

    # docs/jacobi_forcing.md's worked example (P = 1, N = 2, n = 2), written out by hand.
    doc_nc = ["100000000", "110000000", "111000000", "100100000", "100110000", "111001000",
              "111001100", "100110010", "100110011"]
    doc_cllm = doc_nc[:5] + ["100111000", "100111100"] + doc_nc[7:]
    for kind, rows in (("nc", doc_nc), ("cllm", doc_cllm)):
        mine = ["".join("1" if x else "0" for x in r) for r in jp.packed_mask(1, 2, 2, kind)]
        if mine != rows:
            failures += 1
            print(f"docs example, {kind}: {mine} != {rows}")
    # Loss slots, by hand (P = 1, N = 2, n = 2: slots 0 prompt, 1-2 noisy 0, 3-4 clean 0,
    # 5-6 noisy 1, 7-8 clean 1): the clean stream is 0, 3, 4, 7, 8.
    if jp.ar_slots(1, 2, 2) != ([0, 3, 4, 7], [3, 4, 7, 8]):
        failures += 1
        print(f"ar_slots(1, 2, 2) = {jp.ar_slots(1, 2, 2)}")
    # Block 0's noisy view [5, 9] diverges from [5, 6] at offset 1; block 1's [7, 8] equals its
    # clean copy, so the released rule keeps only offset 1 of block 0.
    packed = [1, 5, 9, 5, 6, 7, 8, 7, 8]
    for positions, want in (("all", [True] * 4), ("from_divergence", [False, True, False, False])):
        if jp.consistency_keep(packed, 1, 2, 2, positions) != want:
            failures += 1
            print(f"consistency_keep({positions}) = "
                  f"{jp.consistency_keep(packed, 1, 2, 2, positions)}, expected {want}")
    print(f"{len(expected)} requests compared, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
