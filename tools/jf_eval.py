#!/usr/bin/env python3
"""Compare Jacobi Forcing models (docs/jacobi_forcing.md, "Rounds and recipes, measured").

For each model file: the held-out NLL on text-target's held-out set (as tools/train_models.py
computes it), greedy block-mode Jacobi decoding by the C++ collector (guesses drawn from the
context) on the held-out prompts and, with --train-prompts K, on K training-split prompts
(the trajectories the trainer collects), with points per block, tokens per forward, the
mean fraction of distinct 4-grams of the greedy outputs (low: repetitive output) and the
fraction of output tokens inside runs of 8 or more equal tokens; and the first greedy output.

    python3 tools/jf_eval.py [--collector BIN] [--train-prompts 800] [--block 16] MODEL...
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import jacobi_forcing as jf  # noqa: E402
import train_models as tm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--collector", default=str(tm.REPO_ROOT / "build" / "examples" /
                                               "specula_example_jacobi_trajectories"))
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--heldout-prompts", type=int, default=24)
    ap.add_argument("--train-prompts", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    train_b, held_b, _ = tm.load_text_corpus()
    inputs, targets = tm.text_heldout(held_b, 48, 256)
    tmp = Path(tempfile.mkdtemp(prefix="specula-jf-eval-"))
    prompts_file = tmp / "train.bin"
    prompts_file.write_bytes(train_b)
    print(f"| model | held-out NLL | held-out prompts: points per block (n = {a.block}) | "
          "tokens / forward | distinct 4-grams | in runs of >= 8 | training prompts: points "
          "per block | tokens / forward | distinct 4-grams | in runs of >= 8 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    samples = []
    for path in a.models:
        model, _ = tm.load_model_from_file(path)
        nll, _ = tm.evaluate_heldout(model, inputs, targets)
        h = jf.jacobi_speed(a.collector, path, tmp / "h.safetensors", tm.read_safetensors,
                            prompts=a.heldout_prompts, n=a.block)
        cells = [f"{h['points_per_block']:.2f}", f"{h['tokens_per_forward']:.3f}",
                 f"{h['distinct_4grams']:.3f}", f"{h['in_runs']:.3f}"]
        if a.train_prompts:
            t = jf.jacobi_speed(a.collector, path, tmp / "t.safetensors", tm.read_safetensors,
                                prompts=a.train_prompts, n=a.block, prompts_file=prompts_file)
            cells += [f"{t['points_per_block']:.2f}", f"{t['tokens_per_forward']:.3f}",
                      f"{t['distinct_4grams']:.3f}", f"{t['in_runs']:.3f}"]
        else:
            cells += ["", "", "", ""]
        print(f"| {Path(path).name} | {nll:.4f} | " + " | ".join(cells) + " |", flush=True)
        samples.append((Path(path).name, h["first_output"]))
    print()
    for name, text in samples:
        print(f"{name}: {text!r}")
    prompts_file.unlink()
    tmp.rmdir()


if __name__ == "__main__":
    main()
