#!/usr/bin/env python3
"""SJD-PAC's Tables 2 and 3 (step compression) on the demo's image task, over seeds x labels.

Every cell runs `specula_demo --task image --json --quiet --seed S --label C --num-samples N`
for each seed S and label C (seeds x labels x N images), with the common sampling flags
(default: the paper's sampler on our 128-code model, `--cfg 3 --top-k 32 --temperature 1`) and
the cell's own flags. A cell reports the step compression over all its images (tokens / target
forward passes), the spread across seeds (min-max of the per-seed step compressions, each over
that seed's labels x N images), and the mean wall time per image. A configuration the demo
refuses (e.g. a Proactive Drafting tree larger than the window) is reported as "-".

  scripts/sjd_image_grid.py --demo build/examples/demo/specula_demo
      [--seeds 1,2,3,4] [--labels 0,1,2,3,4,5,6,7] [--num-samples 1]
      [--common "--cfg 3 --top-k 32 --temperature 1"] [--tables 2,3]
      [--config "NAME::ARGS" ...] [--widths 1,...,6] [--depths 1,...,4] [--window 64]
      [--jobs 1] [--raw results.json]

Table 2 rows (all sjd-pac, so every row has the same conventions: the root counted in L and D):
SJD = `--no-pd --no-ac`, + PD = `--no-ac`, + PD + AC, each at L = 32, and + PD + AC at L = 64;
then reference rows (`--method sjd --window 32`, the SJD baseline at L = 64, and AR). `--config`
adds rows to Table 2. Table 3 is a K x D grid of the full method at a fixed L (`--window`).
"""

import argparse
import json
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

TABLE2 = [
    ("SJD, L = 32", "--method sjd-pac --window 32 --no-pd --no-ac"),
    ("SJD + PD, L = 32", "--method sjd-pac --window 32 --no-ac"),
    ("SJD + PD + AC, L = 32", "--method sjd-pac --window 32"),
    ("SJD + PD + AC, L = 64 (SJD-PAC)", "--method sjd-pac --window 64"),
]
REFERENCE = [
    ("SJD, L = 64", "--method sjd-pac --window 64 --no-pd --no-ac"),
    ("SJD + AC, L = 32", "--method sjd-pac --window 32 --no-pd"),
    ("`sjd`, L = 32 (root not counted)", "--method sjd --window 32"),
    ("AR", "--method ar"),
]


def run_one(demo, common, args, seed, label, num_samples, out_dir):
    cmd = [demo, "--task", "image", "--json", "--quiet", "--seed", str(seed), "--label",
           str(label), "--num-samples", str(num_samples), "--out-dir", out_dir]
    cmd += shlex.split(common) + shlex.split(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    d = json.loads(r.stdout)
    return {"seed": seed, "label": label, "tokens": d["tokens"], "steps": d["steps"],
            "target_forwards": d["target_forwards"], "wall_seconds": d["wall_seconds"],
            "images": num_samples}


def run_cell(a, args, pool, out_dir, cache):
    if args in cache:
        return cache[args]
    futs = [pool.submit(run_one, a.demo, a.common, args, s, l, a.num_samples, out_dir)
            for s in a.seeds for l in a.labels]
    runs = [f.result() for f in futs]
    if any(r is None for r in runs):
        cache[args] = None
        return None
    tok = sum(r["tokens"] for r in runs)
    fwd = sum(r["target_forwards"] for r in runs)
    per_seed = []
    for s in a.seeds:
        rs = [r for r in runs if r["seed"] == s]
        per_seed.append(sum(r["tokens"] for r in rs) / sum(r["target_forwards"] for r in rs))
    cell = {"args": args, "images": sum(r["images"] for r in runs), "tokens": tok,
            "target_forwards": fwd, "step_compression": tok / fwd, "per_seed": per_seed,
            "wall_per_image": sum(r["wall_seconds"] for r in runs) / sum(r["images"] for r in runs),
            "runs": runs}
    cache[args] = cell
    return cell


def fmt(cell, wall=True):
    if cell is None:
        return "-"
    s = f"{cell['step_compression']:.2f} ({min(cell['per_seed']):.2f}–{max(cell['per_seed']):.2f})"
    return s + (f", {cell['wall_per_image']:.2f} s" if wall else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", required=True)
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--labels", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--num-samples", type=int, default=1)
    ap.add_argument("--common", default="--cfg 3 --top-k 32 --temperature 1")
    ap.add_argument("--tables", default="2,3")
    ap.add_argument("--config", action="append", default=[], help="NAME::ARGS (Table 2 rows)")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference rows")
    ap.add_argument("--widths", default="1,2,3,4,5,6")
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=1, help="demo runs in parallel")
    ap.add_argument("--raw", help="write every run's numbers to this JSON file")
    a = ap.parse_args()
    a.seeds = [int(x) for x in a.seeds.split(",")]
    a.labels = [int(x) for x in a.labels.split(",")]
    tables = a.tables.split(",")
    n_img = len(a.seeds) * len(a.labels) * a.num_samples
    print(f"common flags `{a.common}`; seeds {a.seeds} x labels {a.labels} x {a.num_samples} "
          f"= {n_img} images per cell; cells: step compression over all images (min–max over "
          f"seeds), wall seconds per image\n", flush=True)
    cache = {}
    with tempfile.TemporaryDirectory() as out_dir, ThreadPoolExecutor(a.jobs) as pool:
        if "2" in tables:
            rows = TABLE2 + [tuple(c.split("::", 1)) for c in a.config]
            if not a.no_reference:
                rows += REFERENCE
            print("| configuration | flags | step compression (seeds) | s / image |")
            print("| --- | --- | ---: | ---: |", flush=True)
            for name, args in rows:
                c = run_cell(a, args, pool, out_dir, cache)
                sc = fmt(c, wall=False)
                w = f"{c['wall_per_image']:.2f}" if c else "-"
                print(f"| {name} | `{args}` | {sc} | {w} |", flush=True)
            print(flush=True)
        if "3" in tables:
            widths = [int(x) for x in a.widths.split(",")]
            depths = [int(x) for x in a.depths.split(",")]
            print(f"Full method, L = {a.window} (`--method sjd-pac --window {a.window} "
                  f"--pd-width K --pd-depth D`)\n")
            print("| K \\ D | " + " | ".join(f"D = {d}" for d in depths) + " |")
            print("| --- | " + " | ".join("---:" for _ in depths) + " |", flush=True)
            for k in widths:
                cells = []
                for d in depths:
                    args = (f"--method sjd-pac --window {a.window} --pd-width {k} "
                            f"--pd-depth {d}")
                    cells.append(fmt(run_cell(a, args, pool, out_dir, cache)))
                print(f"| K = {k} | " + " | ".join(cells) + " |", flush=True)
    if a.raw:
        with open(a.raw, "w") as f:
            json.dump({"common": a.common, "seeds": a.seeds, "labels": a.labels,
                       "num_samples": a.num_samples, "cells": cache}, f, indent=1)


if __name__ == "__main__":
    main()
