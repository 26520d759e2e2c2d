#!/usr/bin/env python3
"""specula.logits_to_probs against torch on the same logits, side by side in one process.

For each case (B rows of V logits, normal with standard deviation 3, fp32 or bf16, one thread)
the rounds alternate, in this order:

  specula   specula.logits_to_probs(logits, ..., out=preallocated, threads=1)
  torch     the torch formulation of the same transform:
              softmax      torch.softmax(logits, -1, dtype=torch.float32)
              temperature  torch.softmax(logits.div(0.8), -1, dtype=torch.float32)
              top_k        vLLM's apply_top_k_only (topk, the k-th value per row, masked_fill
                           with -inf), then the softmax
              top_p        vLLM's apply_top_k_top_p with k = None (sort ascending, softmax,
                           cumsum, mask, scatter back), then the softmax

and each reports the minimum over rounds of its mean CPU time per call (the calling thread's,
which runs all of the work: torch.set_num_threads(1), threads=1), so that time slices taken by
other jobs on a shared machine are not counted. bf16 logits go to torch as bf16 (its softmax
computes in float32 with dtype=torch.float32; top-k and top-p convert first, as vLLM does).

--path also times the logits path of speculative decoding for one request (L = 8 drafts):
transformers' `_speculative_sampling` on logits (softmax of the candidate and new logits, then
its rejection loop, transcribed from transformers) against specula.logits_to_probs twice and
specula.chain_speculative_sampling.

  nice -n 19 python bench/python/bench_logits.py [--quick] [--path] [--json]

Needs the package (pip install ./python), NumPy and torch.
"""

import argparse
import json
import sys
import time

import numpy as np
import torch

import specula_sd as specula
from bench_python import hf_speculative_sampling

torch.set_num_threads(1)

TEMPERATURE = 0.8
TOP_K = 50
TOP_P = 0.9


def mean_ns(fn, inner):
    start = time.thread_time_ns()
    for _ in range(inner):
        fn()
    return (time.thread_time_ns() - start) / inner


def vllm_top_k_only(logits, k):
    """vLLM's apply_top_k_only for a scalar k (the same k for every row)."""
    top_k_mask = logits.topk(k, dim=1).values[:, k - 1:k]
    return logits.masked_fill(logits < top_k_mask, -float("inf"))


def vllm_top_p(logits, p):
    """vLLM's apply_top_k_top_p with k = None and a scalar p."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    top_p_mask = probs_sum <= 1 - p
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def torch_case(kind, x):
    if kind == "softmax":
        return lambda: torch.softmax(x, -1, dtype=torch.float32)
    if kind == "temperature":
        return lambda: torch.softmax(x.div(TEMPERATURE), -1, dtype=torch.float32)
    if kind == "top_k":
        return lambda: torch.softmax(vllm_top_k_only(x.float(), TOP_K), -1)
    if kind == "top_p":
        return lambda: torch.softmax(vllm_top_p(x.float(), TOP_P), -1)
    raise ValueError(kind)


def specula_case(kind, x, out):
    kw = {"temperature": {"temperature": TEMPERATURE}, "top_k": {"top_k": TOP_K},
          "top_p": {"top_p": TOP_P}}.get(kind, {})
    return lambda: specula.logits_to_probs(x, out=out, threads=1, **kw)


def logits(batch, vocab, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, vocab, generator=g) * 3).to(dtype)


def run(fns, rounds, inner):
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()  # warm
            best[name] = min(best[name], mean_ns(fn, inner))
    return best


def hf_speculative_sampling_logits(candidate_logits, new_logits, drafts):
    """transformers' _speculative_sampling on logits for one request: the softmax of
    candidate_logits [L, V] and new_logits [L + 1, V], then its rejection loop (bench_python's
    transcription); drafts [L] int64."""
    return hf_speculative_sampling(candidate_logits.softmax(dim=-1), new_logits.softmax(dim=-1),
                                   drafts)


def path_case(vocab, rounds, inner, length=8):
    g = torch.Generator().manual_seed(1)
    q_logits = torch.randn(length, vocab, generator=g) * 3
    p_logits = q_logits + torch.randn(length + 1, vocab, generator=g)[:length] * 0.3
    p_logits = torch.cat([p_logits, torch.randn(1, vocab, generator=g) * 3])
    q = torch.softmax(q_logits, -1)
    drafts = torch.multinomial(q, 1).view(length)
    qo = torch.empty(1, length, vocab)
    po = torch.empty(1, length + 1, vocab)
    seeds = torch.tensor([7])

    def ours():
        specula.logits_to_probs(q_logits.view(1, length, vocab), out=qo, threads=1)
        specula.logits_to_probs(p_logits.view(1, length + 1, vocab), out=po, threads=1)
        return specula.chain_speculative_sampling(qo, drafts.view(1, length), po, seeds=seeds,
                                                  steps=0)

    return run({"specula": ours,
                "hf": lambda: hf_speculative_sampling_logits(q_logits, p_logits, drafts)}, rounds, inner)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds and cases")
    ap.add_argument("--path", action="store_true", help="also the logits path (L = 8)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    rounds = 3 if a.quick else 5
    vocabs = [32000, 128256, 151936]
    batches = [1, 8] if a.quick else [1, 8, 64]
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for vocab in vocabs:
            for batch in batches:
                x = logits(batch, vocab, dtype)
                out = torch.empty(batch, vocab)
                inner = max(2, int(4e6 / (batch * vocab)))
                for kind in ("softmax", "temperature", "top_k", "top_p"):
                    k_inner = inner if kind != "top_p" else max(1, inner // 8)
                    best = run({"specula": specula_case(kind, x, out),
                                "torch": torch_case(kind, x)}, rounds, k_inner)
                    r = {"dtype": str(dtype).replace("torch.", ""), "V": vocab, "B": batch,
                         "case": kind, "specula_us": best["specula"] / 1e3,
                         "torch_us": best["torch"] / 1e3,
                         "ratio": best["specula"] / best["torch"]}
                    results.append(r)
                    if not a.json:
                        print(f"{r['dtype']:8s} V={vocab:6d} B={batch:2d} {kind:11s} "
                              f"specula {r['specula_us']:9.1f} us  torch {r['torch_us']:9.1f} us"
                              f"  specula/torch {r['ratio']:.2f}", flush=True)
    paths = []
    if a.path:
        for vocab in vocabs:
            best = path_case(vocab, rounds, 20)
            p = {"V": vocab, "L": 8, "specula_us": best["specula"] / 1e3,
                 "hf_us": best["hf"] / 1e3, "ratio": best["specula"] / best["hf"]}
            paths.append(p)
            if not a.json:
                print(f"path V={vocab:6d} L=8: specula (logits_to_probs x2 + verify) "
                      f"{p['specula_us']:.1f} us  transformers {p['hf_us']:.1f} us  "
                      f"specula/transformers {p['ratio']:.2f}", flush=True)
    if a.json:
        json.dump({"torch": torch.__version__, "cpu_capability":
                   torch.backends.cpu.get_cpu_capability(), "python": sys.version.split()[0],
                   "results": results, "path": paths}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
