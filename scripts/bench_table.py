#!/usr/bin/env python3
"""Format specula_bench JSON output (--benchmark_out_format=json) as a Markdown table.

Usage: scripts/bench_table.py results.json [name-regex]
"""
import json
import re
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    pattern = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
    print("| benchmark | time/call (µs) | bytes/call | GB/s (wall) | stream GB/s | fraction of stream | accepted/req |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for b in data["benchmarks"]:
        name = b["name"]
        if pattern and not pattern.search(name):
            continue
        # Aggregates (--benchmark_repetitions) carry a suffix such as _median.
        for suffix in ("_median", "_mean", "_stddev", "_cv"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
        t = b["real_time"] * unit
        if "bytes" not in b:
            arg = int(name.rsplit("/", 1)[-1])
            print(f"| `{name}` | {t:.1f} | {arg / 1e6:.3f} MB | {arg / (t * 1e3):.2f} | | | |")
            continue
        # GB/s from wall time (Google Benchmark's bytes_per_second uses the main thread's CPU
        # time, which undercounts multi-threaded cases).
        gbps = b["bytes"] / (t * 1e3)
        print(
            f"| `{name}` | {t:.1f} | {b['bytes'] / 1e6:.3f} MB | {gbps:.2f} "
            f"| {b['stream_GBps']:.1f} | {b['frac_of_stream']:.3f} | {b['accepted_mean']:.1f} |" if 'accepted_mean' in b else
            f"| `{name}` | {t:.1f} | {b['bytes'] / 1e6:.3f} MB | {gbps:.2f} | {b['stream_GBps']:.1f} | {b['frac_of_stream']:.3f} | |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
