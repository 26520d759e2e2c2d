#!/usr/bin/env python3
"""Python binding overhead and the torch formulations, side by side in one process.

For each case (padded chain layout, L drafts per request, fp32 rows, one thread) the rounds
alternate, in this order:

  cpp            the C++ call alone: specula_sd._specula._chain_padded_timed loops
                 specula::verify_chain on the same arrays inside C++ (mean over `inner` calls)
  ext/numpy      the extension function on NumPy arrays, outputs preallocated
  api/numpy      specula.chain_speculative_sampling on NumPy arrays (allocates its outputs)
  ext/torch      the extension function on torch tensors, outputs preallocated
  api/torch      specula.chain_speculative_sampling on torch tensors
  hf/torch       transformers' `_speculative_sampling` formulation in torch, one request at a
                 time (its batch size is 1)
  vllm_v0/torch  vLLM v0's batched rejection sampler formulation in torch
                 (_batch_modified_rejection_sampling + bonus multinomial + _create_output)

and each reports the minimum over rounds of its mean CPU time per call (the calling thread's,
which runs all of the work: torch.set_num_threads(1), specula's threads=1), so that time
slices given to other jobs on a shared machine are not counted. Overheads are the Python rows
minus `cpp`. Run niced on a shared machine:

  nice -n 19 python bench/python/bench_python.py [--quick] [--overhead]

Needs the package (pip install ./python), NumPy and torch (Debian: python3-torch).
"""

import argparse
import json
import sys
import time

import numpy as np
import torch

import specula_sd as specula
from specula_sd import _specula as ext

torch.set_num_threads(1)


def make_case(batch, length, vocab, seed=0):
    """Target and draft rows close enough to accept about half the drafts."""
    rng = np.random.default_rng(seed)
    logits_q = rng.standard_normal((batch, length + 1, vocab), dtype=np.float32) * 3
    logits_p = logits_q + rng.standard_normal((batch, length + 1, vocab), dtype=np.float32) * 0.3

    def softmax(x):
        x = x - x.max(axis=-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
        return x

    p = softmax(logits_p)
    q = np.ascontiguousarray(softmax(logits_q)[:, :length])
    # Drafts drawn from q by the inverse CDF.
    cdf = np.cumsum(q, axis=-1, dtype=np.float64)
    u = rng.random((batch, length, 1)) * cdf[..., -1:]
    drafts = np.minimum((cdf < u).sum(axis=-1), vocab - 1).astype(np.int32)
    return p, q, drafts


def hf_speculative_sampling(q, p, drafts):
    """transformers' _speculative_sampling for one request (probabilities given): q [L, V],
    p [L + 1, V], drafts [L] int64."""
    length = drafts.shape[0]
    idx = torch.arange(length)
    ratio = p[idx, drafts] / q[idx, drafts]
    r = torch.rand_like(ratio)
    is_accepted = r <= ratio
    n = int(((~is_accepted).cumsum(dim=-1) < 1).sum())
    if n < length:
        p_prime = torch.clamp(p[n] - q[n], min=0)
        p_prime.div_(p_prime.sum())
    else:
        p_prime = p[n]
    t = torch.multinomial(p_prime, num_samples=1)
    return torch.cat((drafts[:n], t)), n


def vllm_v0_rejection_sample(target_with_bonus, draft_probs, draft_ids):
    """vLLM v0's RejectionSampler (batched modified rejection sampling, bonus token sampled
    from the bonus row, -1 padded output): target_with_bonus [B, L + 1, V], draft_probs
    [B, L, V], draft_ids [B, L] int64."""
    batch, length = draft_ids.shape
    target = target_with_bonus[:, :-1]
    bi = torch.arange(batch)[:, None]
    pi = torch.arange(length)
    sel_draft = draft_probs[bi, pi, draft_ids]
    sel_target = target[bi, pi, draft_ids]
    uniform = torch.rand(batch, length)
    capped = torch.minimum(sel_target / sel_draft, torch.full((1,), 1.0))
    accepted = uniform < capped
    diff = target - draft_probs
    f = torch.clamp(diff, min=torch.finfo(diff.dtype).tiny)
    recovered_probs = f / torch.sum(f, dim=-1).reshape(-1, length, 1)
    exp = torch.empty_like(recovered_probs).exponential_(1.0)
    recovered = recovered_probs.div_(exp).argmax(dim=-1)
    bonus = torch.multinomial(target_with_bonus[:, -1], 1)
    limits = (accepted == 0).max(1).indices
    limits[~(accepted == 0).any(1)] = length
    indices = torch.arange(length).unsqueeze(0)
    accepted_mask = indices < limits.unsqueeze(1)
    after_false = indices == limits.unsqueeze(1)
    output = torch.full((batch, length + 1), -1, dtype=torch.long)
    output[:, :length] = torch.where(accepted_mask, draft_ids, -1)
    output[:, :length].mul_(~after_false).add_(recovered.mul(after_false))
    output[:, -1] = torch.where(output[:, length - 1] != -1, bonus[:, 0], -1)
    return output


def mean_ns(fn, inner):
    # CPU time of this thread (every row runs on the calling thread: one thread for torch,
    # threads=1 for specula), so that time slices taken by other jobs on a shared machine are
    # not counted.
    start = time.thread_time_ns()
    for _ in range(inner):
        fn()
    return (time.thread_time_ns() - start) / inner


def run_case(batch, length, vocab, rounds, inner, torch_rows=True):
    p, q, drafts = make_case(batch, length, vocab)
    out = np.empty((batch, length + 1), np.int32)
    n = np.empty(batch, np.int32)
    seeds = np.arange(batch, dtype=np.uint64) + 1
    tp, tq, td = torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(drafts)
    tout, tn = torch.from_numpy(out), torch.from_numpy(n)
    td64 = td.long()
    tseeds = torch.from_numpy(seeds.astype(np.int64))
    args = (None, 0, 0)  # draft_lengths, request_ids, steps

    def cpp_args(qq, dd, pp, oo, nn, s):
        return (qq, dd, pp, args[0], s, args[1], args[2], oo, nn, None, None, None, 1e-3, 1e-6,
                "reads", "refuse", 1)

    rows = {
        "cpp": None,
        "ext/numpy": lambda: ext._chain_padded(*cpp_args(q, drafts, p, out, n, seeds)),
        "api/numpy": lambda: specula.chain_speculative_sampling(q, drafts, p, seeds=seeds,
                                                                steps=0),
        "ext/torch": lambda: ext._chain_padded(*cpp_args(tq, td, tp, tout, tn, tseeds)),
        "api/torch": lambda: specula.chain_speculative_sampling(tq, td, tp, seeds=tseeds,
                                                                steps=0),
    }
    if torch_rows:
        rows["hf/torch"] = lambda: [hf_speculative_sampling(tq[b], tp[b], td64[b])
                                    for b in range(batch)]
        rows["vllm_v0/torch"] = lambda: vllm_v0_rejection_sample(tp, tq, td64)
    best = {k: float("inf") for k in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            if name == "cpp":
                start = time.thread_time_ns()
                ext._chain_padded_timed(*cpp_args(q, drafts, p, out, n, seeds), inner)
                t = (time.thread_time_ns() - start) / inner
            else:
                fn()  # warm
                k = inner if not name.startswith(("hf", "vllm")) else max(1, inner // 20)
                t = mean_ns(fn, k)
            best[name] = min(best[name], t)
    accepted = float(n.mean())
    return best, accepted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--overhead", action="store_true",
                    help="only the B = 1 cases, without the torch formulations (binding overhead)")
    a = ap.parse_args()
    rounds = 3 if a.quick else 7
    cases = [
        # (B, L, V, inner calls per round, torch formulations)
        (1, 8, 16, 20000, False),       # the call itself: overhead
        (1, 8, 32000, 2000, True),
        (1, 8, 128256, 500, True),
        (32, 8, 32000, 50, True),
        (32, 8, 128256, 20, True),
    ]
    if a.overhead:
        cases = [(b, l, v, inner, False) for b, l, v, inner, _ in cases if b == 1]
    results = []
    for batch, length, vocab, inner, torch_rows in cases:
        best, acc = run_case(batch, length, vocab, rounds, inner, torch_rows)
        results.append({"B": batch, "L": length, "V": vocab, "mean_accepted": acc,
                        "ns": {k: round(v) for k, v in best.items()}})
        if not a.json:
            cpp = best["cpp"]
            line = [f"B={batch:2d} L={length} V={vocab:6d} accepted={acc:.2f}:"]
            for k, v in best.items():
                extra = "" if k == "cpp" else (
                    f" (+{(v - cpp) / 1e3:.1f} us)" if k.startswith(("ext", "api"))
                    else f" ({v / cpp:.0f}x)")
                line.append(f"  {k} {v / 1e3:.1f} us{extra}")
            print("\n".join(line), flush=True)
    if a.json:
        json.dump({"torch": torch.__version__, "numpy": np.__version__,
                   "python": sys.version.split()[0], "results": results}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
