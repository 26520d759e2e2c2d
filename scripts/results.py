#!/usr/bin/env python3
"""Regenerate the tables of docs/RESULTS.md by running specula_demo on the shipped models.

    python3 scripts/results.py [--build-dir build] [--tables sjd,k,sdtree,cool,jacobi,ssd,ssdcache] [--quick]
                               [--models-dir DIR]

`--tables jf` prints only the text-target vs text-target-jf table of `jacobi`; `--models-dir`
runs the demo on the models of DIR (e.g. a candidate text-target-jf next to the shipped ones).

Every table aggregates over the prompts (text, diffusion) or labels (image) listed below:
tokens and target forward passes are summed, step compression is their ratio, and wall time
is the decoding time summed over the runs (one thread; it varies with the machine's load).
Prints markdown to stdout.
"""

import argparse
import json
import os
import subprocess
import sys

TEXT_PROMPTS = [
    "import os\n",
    "def __init__(self",
    "class ",
    "for i in range(",
    "# Copyright ",
    "if __name__ == ",
]
DIFFUSION_PROMPTS = [
    "import os\n",
    "def __init__(self",
    "class Stack:\n",
    "for i in range(",
    "# Copyright ",
    "if __name__ == ",
]


DEMO_EXTRA = []  # --models-dir DIR, when given


def run(demo, args):
    cmd = [demo, "--json", "--quiet"] + args + DEMO_EXTRA
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


class Totals:
    def __init__(self):
        self.tokens = 0
        self.forwards = 0
        self.draft_forwards = 0
        self.wall = 0.0
        self.hist = []

    def add(self, d):
        self.tokens += d["tokens"]
        self.forwards += d["target_forwards"]
        self.draft_forwards += d["draft_forwards"]
        self.wall += d["wall_seconds"]
        h = d["accepted_histogram"]
        if len(self.hist) < len(h):
            self.hist += [0] * (len(h) - len(self.hist))
        for k, v in enumerate(h):
            self.hist[k] += v

    def row(self, name):
        comp = self.tokens / self.forwards if self.forwards else 0.0
        fwd = str(self.forwards)
        if self.draft_forwards:
            fwd += f" (+{self.draft_forwards} draft)"
        return f"| {name} | {self.tokens} | {fwd} | {comp:.3f} | {self.wall * 1e3:.0f} |"


HEADER = ("| configuration | tokens | target forwards | step compression | wall ms |\n"
          "| --- | ---: | ---: | ---: | ---: |")


def text_runs(demo, method, extra, tokens, samples=1):
    t = Totals()
    for p in TEXT_PROMPTS:
        t.add(run(demo, ["--task", "text", "--method", method, "--prompt", p,
                         "--max-new-tokens", str(tokens), "--num-samples", str(samples)]
                  + extra))
    return t


def image_runs(demo, method, extra, samples):
    t = Totals()
    for label in range(8):
        # The tables below were measured on the 8x8 model (the demo's default is image-ar-256).
        t.add(run(demo, ["--task", "image", "--image-model", "image-ar", "--method", method,
                         "--label", str(label), "--num-samples", str(samples),
                         "--out-dir", "/tmp/specula_results"]
                  + extra))
    return t


def diffusion_runs(demo, method, extra, tokens):
    t = Totals()
    for p in DIFFUSION_PROMPTS:
        t.add(run(demo, ["--task", "diffusion", "--method", method, "--prompt", p,
                         "--max-new-tokens", str(tokens)] + extra))
    return t


def ssd_configs():
    """SSD's rows: N = 3, 4, 5, the greedy chain and the mix-order tree: (N, name, options)."""
    for n in [3, 4, 5]:
        for mix in [False, True]:
            name = f"SSD N = {n}, {'mix-order tree' if mix else 'greedy chain'}"
            yield n, mix, name, ["--draft-length", str(n)] + (["--mix-order"] if mix else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--tables", default="sjd,k,sdtree,cool,jacobi,ssd,ssdcache")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and samples")
    ap.add_argument("--models-dir", default=None,
                    help="the demo's --models-dir (default: the shipped examples/models)")
    a = ap.parse_args()
    if a.models_dir:
        DEMO_EXTRA.extend(["--models-dir", a.models_dir])
    demo = os.path.join(a.build_dir, "examples", "demo", "specula_demo")
    if not os.path.exists(demo):
        sys.exit(f"{demo} not found: build it first (cmake --build {a.build_dir} "
                 "--target specula_demo)")
    tables = a.tables.split(",")
    text_tokens = 32 if a.quick else 128
    image_samples = 1 if a.quick else 4

    if "sjd" in tables:
        print("### SJD-PAC ablation (SJD-PAC Table 2 pattern)\n")
        # The authors' conventions throughout: L counts the root, D = 3 is two candidate
        # levels (sjd-pac's defaults K = 4, D = 3).
        rows = [
            ("SJD, L = 32", "sjd", ["--window", "32", "--count-root"]),
            ("+ PD (K = 4, D = 3), L = 32", "sjd-pac", ["--window", "32", "--no-ac"]),
            ("+ AC, L = 32", "sjd-pac", ["--window", "32", "--no-pd"]),
            ("+ PD + AC (SJD-PAC), L = 32", "sjd-pac", ["--window", "32"]),
            ("SJD-PAC, L = 64", "sjd-pac", ["--window", "64"]),
        ]
        print(f"image-ar, 8 labels x {image_samples} samples x 64 tokens, T = 1:\n")
        print(HEADER)
        for name, m, extra in rows:
            print(image_runs(demo, m, extra, image_samples).row(name))
        print(f"\ntext-target, {len(TEXT_PROMPTS)} prompts x {text_tokens} tokens, T = 1:\n")
        print(HEADER)
        for name, m, extra in rows:
            print(text_runs(demo, m, extra, text_tokens).row(name))
        print()

    if "k" in tables:
        print("### Proactive Drafting width K and depth D (SJD-PAC Table 3 pattern; L = 32)\n")
        print(f"image-ar, 8 labels x {image_samples} samples; text-target, "
              f"{len(TEXT_PROMPTS)} prompts x {text_tokens} tokens:\n")
        print("| K | D | image step compression | text step compression |")
        print("| ---: | ---: | ---: | ---: |")
        # D = candidate levels below the emitted token; the tree (K + ... + K^D nodes) comes
        # out of the 32-node budget, so only trees that fit are listed.
        for k, d in [(1, 1), (2, 1), (3, 1), (4, 1), (6, 1), (2, 2), (3, 2), (4, 2), (2, 3),
                     (2, 4)]:
            extra = ["--window", "32", "--no-count-root", "--pd-width", str(k), "--pd-depth",
                     str(d)]
            img = image_runs(demo, "sjd-pac", extra, image_samples)
            txt = text_runs(demo, "sjd-pac", extra, text_tokens)
            print(f"| {k} | {d} | {img.tokens / img.forwards:.3f} | "
                  f"{txt.tokens / txt.forwards:.3f} |")
        print()

    if "sdtree" in tables:
        print("### Draft-model SD: chain drafts vs tree drafts (exact rule, T = 1)\n")
        print(f"text-target with text-draft, {len(TEXT_PROMPTS)} prompts x {text_tokens} "
              "tokens; tree drafts: siblings without replacement:\n")
        print(HEADER)
        for name, extra in [("chain of 2", ["--draft-length", "2"]),
                            ("chain of 3", ["--draft-length", "3"]),
                            ("chain of 4", ["--draft-length", "4"]),
                            ("chain of 6", ["--draft-length", "6"]),
                            ("tree 2x2 (6 drafts)", ["--draft-tree", "2x2"]),
                            ("tree 3x2 (12 drafts)", ["--draft-tree", "3x2"]),
                            ("tree 2x3 (14 drafts)", ["--draft-tree", "2x3"]),
                            ("tree 2x4 (30 drafts)", ["--draft-tree", "2x4"])]:
            print(text_runs(demo, "sd", extra, text_tokens).row(name))
        print()

    if "cool" in tables:
        print("### Cool-SD on the text models (draft length 4, T = 1, G* resampling)\n")
        print(f"text-target with text-draft, {len(TEXT_PROMPTS)} prompts x {text_tokens} "
              "tokens; mean accepted drafts per step:\n")
        print("| schedule | delta | step compression | mean accepted |")
        print("| --- | ---: | ---: | ---: |")
        for sched, extra in [("uniform", []), ("exponential", ["--nu", "0.7"]),
                             ("linear", ["--ell", "8"])]:
            for delta in ["1", "1.5", "2", "4"]:
                t = text_runs(demo, "cool-sd", ["--cool-schedule", sched, "--delta", delta]
                              + extra, text_tokens)
                steps = sum(t.hist)
                mean_acc = sum(k * v for k, v in enumerate(t.hist)) / steps
                print(f"| {sched} | {delta} | {t.tokens / t.forwards:.3f} | {mean_acc:.3f} |")
        print()

    if "jacobi" in tables or "jf" in tables:
        if "jacobi" in tables:
            print("### Jacobi vs multi-block vs multi-block + rejection recycling (greedy)\n")
        rows = [
            ("Jacobi, running window 64", "jacobi", ["--window", "64"]),
            ("Jacobi, fixed blocks of 64 (multi-block K = 1)", "multiblock",
             ["--blocks", "1", "--no-recycling"]),
            ("multi-block K = 2, r = 0.85", "multiblock", ["--no-recycling"]),
            ("multi-block K = 2, r = 0.5", "multiblock", ["--no-recycling", "--spawn-ratio",
                                                          "0.5"]),
            ("recycling only (K = 1), per-key pool", "multiblock",
             ["--blocks", "1", "--pool", "per-key"]),
            ("recycling only (K = 1), released pool", "multiblock", ["--blocks", "1"]),
            ("multi-block K = 2, r = 0.85 + recycling, per-key pool, any block spawns",
             "multiblock", ["--pool", "per-key", "--spawn", "any"]),
            ("multi-block K = 2, r = 0.85 + recycling, released pool and spawn (defaults)",
             "multiblock", []),
        ]
        if "jacobi" in tables:
            print(f"text-target, {len(TEXT_PROMPTS)} prompts x {text_tokens} tokens (block 64; "
                  "per-key pool: 4 n-grams of 16 per key; released pool: 4 sequences):\n")
            print(HEADER)
            for name, m, extra in rows:
                print(text_runs(demo, m, extra, text_tokens).row(name))
        # The same configurations (and blocks of 16, the second training round's block size)
        # on text-target-jf, text-target after Jacobi Forcing, next to the base model; each
        # model's output is its own greedy output.
        jf_rows = rows + [
            ("Jacobi, running window 16", "jacobi", ["--window", "16"]),
            ("multi-block K = 2, r = 0.85, block 16", "multiblock",
             ["--no-recycling", "--block-size", "16"]),
            ("multi-block K = 2, r = 0.85 + recycling (defaults), block 16", "multiblock",
             ["--block-size", "16"]),
        ]
        print(f"\ntext-target (base) vs text-target-jf (Jacobi Forcing), the same "
              f"{len(TEXT_PROMPTS)} prompts x {text_tokens} tokens (block 64 unless stated):\n")
        print("| configuration | base forwards | base step compression | base wall ms | "
              "JF forwards | JF step compression | JF wall ms |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, m, extra in jf_rows:
            b = text_runs(demo, m, extra, text_tokens)
            j = text_runs(demo, m, extra + ["--model", "text-target-jf"], text_tokens)
            print(f"| {name} | {b.forwards} | {b.tokens / b.forwards:.3f} | {b.wall * 1e3:.0f} | "
                  f"{j.forwards} | {j.tokens / j.forwards:.3f} | {j.wall * 1e3:.0f} |")
        if "jacobi" not in tables:
            print()
        if "jacobi" in tables:
            # Window initialisation (the demo's default is the released code's `context`) and the
            # verification extent (--ra-only: within the real-active block, as the released code).
            print(f"\nInitialisation and verification extent, the same {len(TEXT_PROMPTS)} prompts x "
                  f"{text_tokens} tokens (step compression; base / JF):\n")
            print("| configuration | context | repeat | random | context, --ra-only |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for name, m, extra in [
                    ("Jacobi, running window 16", "jacobi", ["--window", "16"]),
                    ("multi-block K = 2, r = 0.85, block 16", "multiblock",
                     ["--no-recycling", "--block-size", "16"]),
                    ("multi-block K = 2, r = 0.85 + recycling, block 16", "multiblock",
                     ["--block-size", "16"]),
                    ("multi-block K = 2, r = 0.85 + recycling, block 64", "multiblock", [])]:
                cells = []
                for init, ra in [("context", []), ("repeat", []), ("random", []),
                                 ("context", ["--ra-only"])]:
                    if ra and m != "multiblock":
                        cells.append("—")
                        continue
                    b = text_runs(demo, m, extra + ["--init", init] + ra, text_tokens)
                    j = text_runs(demo, m, extra + ["--init", init] + ra
                                  + ["--model", "text-target-jf"], text_tokens)
                    cells.append(f"{b.tokens / b.forwards:.3f} / {j.tokens / j.forwards:.3f}")
                print(f"| {name} | " + " | ".join(cells) + " |")
            print(f"\nimage-ar, 8 labels x 1 sample x 64 tokens (greedy):\n")
            print(HEADER)
            for name, m, extra in rows:
                print(image_runs(demo, m, extra, 1).row(name))
            print()

    if "ssd" in tables:
        tokens = 32 if a.quick else 64
        print("### SSD on text-diffusion (semi-AR blocks of 32, greedy)\n")
        print(f"{len(DIFFUSION_PROMPTS)} prompts x {tokens} tokens; step reduction = 1 - "
              "forwards / stepwise forwards:\n")
        print("| configuration | verification nodes | target forwards | step compression | "
              "step reduction | wall ms |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        pin = ["--block-size", "32", "--cache", "none"]
        base = diffusion_runs(demo, "ar", pin, tokens)
        print(f"| stepwise (one token per forward) | 1 | {base.forwards} | 1.000 | 0.0% | "
              f"{base.wall * 1e3:.0f} |")
        for n, mix, name, extra in ssd_configs():
            t = diffusion_runs(demo, "ssd", pin + extra, tokens)
            nodes = 2 * n if mix else n + 1
            print(f"| {name} | {nodes} | {t.forwards} | {t.tokens / t.forwards:.3f} | "
                  f"{100 * (1 - t.forwards / base.forwards):.1f}% | {t.wall * 1e3:.0f} |")
        print()

    if "ssdcache" in tables:
        tokens = 32 if a.quick else 64
        print("### SSD under the dual cache (the paper's preset: blocks of 8, refresh every 8)\n")
        print(f"{len(DIFFUSION_PROMPTS)} prompts x {tokens} tokens; step compression = tokens / "
              "forwards; every output equals stepwise decoding with the same cache (tests):\n")
        print("| configuration | forwards, uncached | step compression, uncached | "
              "forwards, dual cache | step compression, dual cache |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for _, _, name, extra in ssd_configs():
            extra = ["--block-size", "8"] + extra
            u = diffusion_runs(demo, "ssd", extra + ["--cache", "none"], tokens)
            c = diffusion_runs(demo, "ssd", extra + ["--cache", "dual", "--refresh", "8"], tokens)
            print(f"| {name} | {u.forwards} | {u.tokens / u.forwards:.3f} | {c.forwards} | "
                  f"{c.tokens / c.forwards:.3f} |")
        print()


if __name__ == "__main__":
    main()
