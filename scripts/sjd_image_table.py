#!/usr/bin/env python3
"""Step compression of SJD / SJD-PAC configurations on the demo's image task, per label.

Runs `specula_demo --task image --json --num-samples N --label L` for every configuration and
label (same seeds: the demo's default --seed) and prints a markdown table: one row per
configuration and demo binary, the step compression (tokens / steps over the N samples) per
label and over all labels.

  scripts/sjd_image_table.py --demo build/examples/demo/specula_demo [--demo OTHER ...]
      [--num-samples 8] [--labels 0,1,2,3] [--config "NAME::ARGS" ...]

With several --demo binaries (e.g. before and after a change) each configuration is run with
each binary in turn; a configuration a binary refuses is reported as "-".
"""

import argparse
import json
import shlex
import subprocess
import tempfile

DEFAULT_CONFIGS = [
    ("SJD, L = 32", "--method sjd --window 32"),
    ("SJD + PD, L = 32", "--method sjd-pac --window 32 --no-ac"),
    ("SJD + AC, L = 32", "--method sjd-pac --window 32 --no-pd"),
    ("SJD + PD + AC, L = 32", "--method sjd-pac --window 32"),
    ("SJD + PD + AC, L = 64", "--method sjd-pac --window 64"),
    ("SJD, L = 32 counting the root", "--method sjd --window 32 --count-root"),
]


def run(demo, args, label, num_samples, out_dir):
    cmd = [demo, "--task", "image", "--json", "--quiet", "--num-samples", str(num_samples),
           "--label", str(label), "--out-dir", out_dir] + shlex.split(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    d = json.loads(r.stdout)
    return d["tokens"], d["steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", action="append", required=True)
    ap.add_argument("--num-samples", type=int, default=8)
    ap.add_argument("--labels", default="0,1,2,3")
    ap.add_argument("--config", action="append", help="NAME::ARGS (replaces the defaults)")
    a = ap.parse_args()
    labels = [int(x) for x in a.labels.split(",")]
    configs = [tuple(c.split("::", 1)) for c in a.config] if a.config else DEFAULT_CONFIGS
    print("| configuration | binary | " + " | ".join(f"label {l}" for l in labels) + " | all |")
    print("| --- | --- | " + " | ".join("---:" for _ in labels) + " | ---: |")
    with tempfile.TemporaryDirectory() as out_dir:
        for name, args in configs:
            for demo in a.demo:
                cells, tok, steps = [], 0, 0
                for l in labels:
                    r = run(demo, args, l, a.num_samples, out_dir)
                    if r is None:
                        cells.append("-")
                        continue
                    cells.append(f"{r[0] / r[1]:.2f}")
                    tok, steps = tok + r[0], steps + r[1]
                total = f"{tok / steps:.3f}" if steps else "-"
                print(f"| {name} (`{args}`) | {demo} | " + " | ".join(cells) + f" | {total} |",
                      flush=True)


if __name__ == "__main__":
    main()
