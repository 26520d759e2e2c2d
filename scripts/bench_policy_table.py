#!/usr/bin/env python3
"""Markdown table of the chain_policies/* benchmarks of specula_bench (bench/bench_chain.cpp).

Usage: scripts/bench_policy_table.py results.json

Each case times seq, par, on_pool and spawn in turn within one loop; the table gives, per
policy, the median over repetitions of the per-run medians (µs per call) and the ratios to seq.
"""
import json, statistics, sys
with open(sys.argv[1], encoding="utf-8") as f:
    data = json.load(f)
rows = {}
for b in data["benchmarks"]:
    if not b["name"].startswith("chain_policies/") or b.get("run_type") == "aggregate":
        continue
    name = b["name"].split("/iterations")[0].replace("chain_policies/", "")
    r = rows.setdefault(name, {k: [] for k in ("seq_us", "par_us", "on_pool_us", "spawn_us")})
    for k in r:
        r[k].append(b[k])
print("| case | seq µs | par µs | on_pool µs | spawn µs (per-call threads) | par / seq | spawn / seq |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, r in rows.items():
    m = {k: statistics.median(v) for k, v in r.items()}
    print(f"| `{name}` | {m['seq_us']:.1f} | {m['par_us']:.1f} | {m['on_pool_us']:.1f} | "
          f"{m['spawn_us']:.1f} | {m['par_us']/m['seq_us']:.2f} | {m['spawn_us']/m['seq_us']:.2f} |")
