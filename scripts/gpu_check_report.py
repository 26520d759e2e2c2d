#!/usr/bin/env python3
"""Write the summary of a device run (scripts/gpu_check.sh) as Markdown on stdout.

Usage: gpu_check_report.py --results DIR --bundle DIR [--stand-in BIN_DIR]

DIR/status.tsv holds one line per step (name, status, seconds, timeout); DIR/<step>.json the
Google Benchmark results of the benchmark steps. The summary gives the steps, the targets of
docs/PERFORMANCE.md ("Targets of the GPU run") evaluated on the results, then one table per
benchmark file.

--stand-in (the dry run): the benchmark binaries in BIN_DIR list their cases
(--benchmark_list_tests, which needs no GPU), and made-up numbers for exactly those names are
written to DIR/<step>.json first, so that every part of the summary is produced; the summary
then says STAND-IN throughout, and the script fails when a target's benchmark case is not
among the listed names (a renamed case would otherwise leave a target unmeasured on the GPU).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

# Benchmark steps: step name -> binary in the bundle.
BENCH_STEPS = {"bench_peers": "specula_bench_peers", "bench_cuda": "specula_bench_cuda"}

# The targets (docs/PERFORMANCE.md, "Targets of the GPU run"): (description, step, case name,
# counter, comparison, goal). The counter "real_time" is the case's time per call in µs.
TARGETS = [
    ("chain B=32 n=8 V=128256 fp32, accept-heavy: FlashInfer time / specula time",
     "bench_peers", "peer_chain/accept/V:128256/n:8/B:32", "speedup", ">=", 2.0),
    ("chain B=32 n=8 V=128256 fp32, reject-heavy: FlashInfer time / specula time",
     "bench_peers", "peer_chain/reject/V:128256/n:8/B:32", "speedup", ">=", 2.0),
    ("chain B=32 n=8 V=128256 fp32, accept-heavy: byte-floor time / specula time (1/1.6)",
     "bench_peers", "peer_chain/accept/V:128256/n:8/B:32", "specula_frac_of_floor", ">=", 0.625),
    ("chain B=32 n=8 V=128256 fp32, reject-heavy: byte-floor time / specula time (1/1.6)",
     "bench_peers", "peer_chain/reject/V:128256/n:8/B:32", "specula_frac_of_floor", ">=", 0.625),
    ("SJD-PAC-shaped tree verification, B=1: µs per step",
     "bench_cuda", "cuda_tree/sjd_pac/V:16384/B:1", "real_time", "<=", 15.0),
    ("law check of specula's chain kernel: G-test p-value",
     "bench_peers", "peer_law/specula", "law_p", ">=", 1e-6),
    ("law check of FlashInfer's chain kernel: G-test p-value",
     "bench_peers", "peer_law/flashinfer", "law_p", ">=", 1e-6),
]

UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def base_name(name):
    """A case's name without the suffix Google Benchmark appends (/manual_time, /real_time)."""
    for suffix in ("/manual_time", "/real_time"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def stand_in_value(name, key, lo, hi):
    h = int(hashlib.sha256(f"{name}/{key}".encode()).hexdigest()[:8], 16)
    return lo + (hi - lo) * (h / 0xFFFFFFFF)


def stand_in_results(results, bin_dir, bundle):
    """Made-up results for the cases the real binaries list; returns {step: [names]}."""
    env = dict(os.environ)
    lib = os.path.join(bundle, "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    listed = {}
    for step, binary in BENCH_STEPS.items():
        path = os.path.join(bin_dir, binary)
        if not os.access(path, os.X_OK):
            listed[step] = None  # not bundled (e.g. no PyPI for FlashInfer): its step skips
            continue
        r = subprocess.run([path, "--benchmark_list_tests=true"], capture_output=True, text=True,
                           env=env, timeout=60)
        if r.returncode != 0:
            raise SystemExit(f"{binary} --benchmark_list_tests failed: {r.stderr[-400:]}")
        names = [base_name(n) for n in r.stdout.split() if n]
        listed[step] = names
        benchmarks = []
        for n in names:
            b = {"name": n, "run_name": n, "run_type": "iteration", "iterations": 100,
                 "real_time": stand_in_value(n, "t", 3.0, 300.0), "time_unit": "us"}
            if n.startswith("peer_law/"):
                b["law_p"] = stand_in_value(n, "p", 0.01, 0.99)
                b["law_G"] = stand_in_value(n, "g", 5.0, 25.0)
            elif n.startswith("peer_"):
                s_us = stand_in_value(n, "s", 5.0, 200.0)
                f_us = stand_in_value(n, "f", 5.0, 400.0)
                b.update({"specula_us": s_us, "flashinfer_us": f_us, "speedup": f_us / s_us,
                          "bytes": stand_in_value(n, "b", 1e5, 1e8), "copy_GBps": 3000.0,
                          "specula_frac_of_floor": stand_in_value(n, "sf", 0.2, 0.9),
                          "flashinfer_frac_of_floor": stand_in_value(n, "ff", 0.1, 0.9)})
            else:
                b.update({"bytes": stand_in_value(n, "b", 1e5, 1e8), "copy_GBps": 3000.0,
                          "frac_of_copy": stand_in_value(n, "c", 0.1, 0.95)})
            benchmarks.append(b)
        with open(os.path.join(results, f"{step}.json"), "w", encoding="utf-8") as f:
            json.dump({"context": {"stand_in": True}, "benchmarks": benchmarks}, f)
    return listed


def load(results, step):
    path = os.path.join(results, f"{step}.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    try:
        benchmarks = json.loads(text).get("benchmarks", [])
    except ValueError:
        benchmarks = complete_cases(text)  # a step stopped at its timeout: the cases it finished
        if not benchmarks:
            return None
    return {base_name(b["name"]): b for b in benchmarks}


def complete_cases(text):
    """The complete case objects of a Google Benchmark JSON file cut off mid-write."""
    start = text.find('"benchmarks"')
    start = text.find("[", start) if start >= 0 else -1
    if start < 0:
        return []
    decoder, pos, cases = json.JSONDecoder(), start + 1, []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            case, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return cases
        if isinstance(case, dict) and "name" in case:
            cases.append(case)


def value(b, counter):
    if counter == "real_time":
        return b["real_time"] * UNIT_US[b.get("time_unit", "ns")]
    return b.get(counter)


def fmt(x):
    if x is None:
        return ""
    if isinstance(x, str):
        return x
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        return f"{x:.4g}"
    return f"{x:.3e}"


def table(cases):
    counters = []
    for b in cases.values():
        for k, v in b.items():
            if isinstance(v, (int, float)) and k not in counters and k not in (
                    "real_time", "cpu_time", "iterations", "repetitions", "repetition_index",
                    "threads", "per_family_instance_index", "family_index"):
                counters.append(k)
    lines = ["| case | µs/call | " + " | ".join(counters) + " | error |",
             "| --- | ---: | " + " | ".join("---:" for _ in counters) + " | --- |"]
    for name, b in cases.items():
        t = "" if b.get("error_occurred") else fmt(value(b, "real_time"))
        lines.append(f"| `{name}` | {t} | " + " | ".join(fmt(b.get(c)) for c in counters) +
                     f" | {b.get('error_message', '')} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--stand-in", dest="stand_in")
    a = ap.parse_args()
    stand_in = a.stand_in is not None
    listed = stand_in_results(a.results, a.stand_in, a.bundle) if stand_in else None
    tag = " — STAND-IN results (dry run: nothing ran on a GPU)" if stand_in else ""
    out = [f"# Device check{tag}", ""]
    manifest = os.path.join(a.bundle, "MANIFEST")
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as f:
            out += [f"- {line.strip()}" for line in f if line.strip()]
        out.append("")

    out += ["## Steps", "", "| step | status | seconds | timeout (s) |", "| --- | --- | ---: | ---: |"]
    status_path = os.path.join(a.results, "status.tsv")
    failed = False
    if os.path.exists(status_path):
        with open(status_path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4:
                    out.append(f"| {parts[0]} | {parts[1]} | {parts[2]} | {parts[3]} |")
                    failed = failed or parts[1].startswith(("FAIL", "timeout"))
    out.append("")

    out += ["## Targets" + (" (STAND-IN numbers)" if stand_in else ""), "",
            "| target | case | measured | goal | met |", "| --- | --- | ---: | ---: | --- |"]
    missing = []
    data = {step: load(a.results, step) for step in BENCH_STEPS}
    for desc, step, case, counter, op, goal in TARGETS:
        cases = data.get(step) or {}
        b = cases.get(case)
        if stand_in and listed.get(step) is not None and case not in listed[step]:
            missing.append(f"{step}: {case}")
        if b is None or b.get("error_occurred"):
            why = "not run" if b is None else f"error: {b.get('error_message', '')}"
            out.append(f"| {desc} | `{case}` | {why} | {op} {fmt(goal)} | — |")
            continue
        v = value(b, counter)
        met = v is not None and (v >= goal if op == ">=" else v <= goal)
        out.append(f"| {desc} | `{case}` | {fmt(v)} | {op} {fmt(goal)} | {'yes' if met else 'NO'} |")
    out.append("")
    if failed:
        out += ["**At least one step failed or timed out: see logs.tar.gz (logs/<step>.log).**", ""]

    out += ["## Benchmark tables", ""]
    for step, cases in data.items():
        out += [f"### {step}" + (" (STAND-IN)" if stand_in else ""), ""]
        out += [table(cases) if cases else "(no results)", ""]
    print("\n".join(out))
    if missing:
        print("gpu_check_report: target cases not among the benchmarks the binaries list: " +
              ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
