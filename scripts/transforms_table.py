#!/usr/bin/env python3
"""Format the transforms/ benchmarks (bench/bench_transforms.cpp) as a Markdown table: per case,
V and B, the selection and sort implementations side by side, in microseconds and in units of
softmax alone (the over_softmax counter: calls interleaved with softmax-only calls; the
sort/select speed-up is the ratio of the two over_softmax values).

Usage: scripts/transforms_table.py results.json [aggregate]   (aggregate: median by default)
"""
import json
import re
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    aggregate = sys.argv[2] if len(sys.argv) > 2 else "median"
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    name_re = re.compile(r"^transforms/(\w+)/(\w+)/V:(\d+)/B:(\d+)(?:_(\w+))?$")
    rows = {}
    for b in data["benchmarks"]:
        m = name_re.match(b["name"])
        if not m:
            continue
        case, impl, v, batch, agg = m.groups()
        if agg is not None and agg != aggregate:
            continue
        rows.setdefault((case, int(v), int(batch)), {})[impl] = b
    order = ["softmax", "top_k", "top_p", "min_p", "full"]
    print("| case | V | B | softmax alone (µs) | select (µs) | select / softmax "
          "| sort (µs) | sort / softmax | sort / select | select, bf16 logits (µs) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in sorted(rows, key=lambda k: (k[1], k[2], order.index(k[0]))):
        case, v, batch = key
        r = rows[key]
        sel, srt, bf = r.get("select"), r.get("sort"), r.get("select_bf16")
        if sel is None:
            continue
        cells = [f"{sel['softmax_us']:.0f}", f"{sel['call_us']:.0f}", f"{sel['over_softmax']:.2f}"]
        if srt is not None:
            # Each implementation against its own interleaved softmax calls: robust to load
            # that changes between the two cases.
            cells += [f"{srt['call_us']:.0f}", f"{srt['over_softmax']:.2f}",
                      f"{srt['over_softmax'] / sel['over_softmax']:.1f}"]
        else:
            cells += ["", "", ""]
        cells.append(f"{bf['call_us']:.0f}" if bf is not None else "")
        print(f"| {case} | {v} | {batch} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
