"""Jacobi Forcing training of text-target-jf (used by tools/train_models.py --only text-target-jf).

Paper: Hu, Kou et al., "Fast and Accurate Causal Parallel Decoding using Jacobi Forcing"
(arXiv 2512.14681), §3.1 (Eq. 7 noise schedule, Eq. 8 progressive consistency loss, Eq. 9 AR
loss, Fig. 2b noise-aware mask), §4.1 (progressive distillation: a round at n16/w16, then
trajectories recollected with that model and a round at n32/w8), Appendix C (packing).
docs/jacobi_forcing.md describes the recipe and what is scaled down here.

One round:
  1. collect: the C++ collector (examples/jacobi_trajectories.cpp, block-mode greedy Jacobi
     decoding) runs the current model on K prompts of P bytes taken at evenly spaced offsets of
     the training split of the corpus (never the held-out files) and writes every converged
     block's fixed point and trajectory;
  2. pack: per prompt, the prompt without its last byte, then N pairs [noisy view of block b |
     clean block b]; a block starts with its root (the token before its n - 1 new tokens), so the
     last prompt byte is block 0's root; noisy and clean block b share position ids; block b's
     noisy view is the trajectory point whose noisy fraction is nearest to t_b (the released
     data preparation: t_b = linspace(0, 1, w)[b mod w], noise = n - first mismatch);
  3. train: one forward per packed sequence under the noise-conditioned mask (Fig. 2b: a noisy
     block sees the prompt, the earlier noisy blocks and itself causally; a clean block the
     prompt, the earlier clean blocks and itself causally), loss = L_pc + w * L_AR (Eq. 9):
     L_pc (Eq. 8) = mean over blocks of KL(teacher || student) at the block's positions, the
     teacher the clean block's logits (detached, the same forward), the student the noisy
     view's; L_AR the next-token cross-entropy over prompt + clean blocks. Both are means over
     tokens (Eq. 8 sums a block's per-token KL; the factor 1/n is absorbed into w).
"""

import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

MASKS = ("nc", "nc_ic", "cllm")  # Table 5: noise-conditioned, NC + intra-window clean, CLLM (Fig. 2a)


def read_trajectories(path, read_safetensors):
    t, meta = read_safetensors(path)
    return {k: np.asarray(v).astype(np.int64) for k, v in t.items()}, meta


def released_noise_ratios(num_blocks, window):
    """t_b = linspace(0, 1, w)[b mod w] (the released data preparation; the last block of a
    window is fully noisy)."""
    w = np.linspace(0.0, 1.0, window) if window > 1 else np.zeros(1)
    return np.array([w[b % window] for b in range(num_blocks)])


def select_noisy_view(points, fixed):
    """points: [T, n] trajectory of one block, fixed: [n]. Returns the suffix noise fraction of
    every point: (n - first position that differs from the fixed point) / n."""
    n = fixed.shape[0]
    differs = points != fixed[None, :]
    first = np.where(differs.any(1), differs.argmax(1), n)
    return (n - first) / n


def pack_round(traj, num_blocks, n, window):
    """Packed token sequences [K, L] of every prompt with num_blocks full blocks, the shared
    position ids [L], and the realised noise fractions [K, N] (for the log)."""
    prompts, poffs = traj["prompt_tokens"], traj["prompt_offsets"]
    bprompt, fixed = traj["block_prompt"], traj["fixed_points"]
    pt_offs, points = traj["point_offsets"], traj["points"]
    ratios = released_noise_ratios(num_blocks, window)
    seqs, fracs = [], []
    first_block = {}
    for b, p in enumerate(bprompt):
        first_block.setdefault(int(p), b)
    P = None
    for k in range(len(poffs) - 1):
        if k not in first_block:
            continue
        b0 = first_block[k]
        if b0 + num_blocks > len(bprompt) or bprompt[b0 + num_blocks - 1] != k:
            continue  # fewer than num_blocks converged blocks (never with the shipped settings)
        prompt = prompts[poffs[k]:poffs[k + 1]]
        P = len(prompt) - 1 if P is None else P
        assert len(prompt) - 1 == P, "prompts of one round have one length"
        seq, fr = list(prompt[:-1]), []
        for j in range(num_blocks):
            b = b0 + j
            pts = points[pt_offs[b]:pt_offs[b + 1]]
            noise = select_noisy_view(pts, fixed[b])
            i = int(np.argmin(np.abs(noise - ratios[j])))  # ties: the earliest point
            seq += list(pts[i]) + list(fixed[b])
            fr.append(noise[i])
        seqs.append(seq)
        fracs.append(fr)
    L = P + 2 * num_blocks * n
    pos = list(range(P))
    for j in range(num_blocks):
        block = [P + j * n + r for r in range(n)]
        pos += block + block
    return (torch.tensor(np.array(seqs), dtype=torch.long), torch.tensor(pos), P, L,
            np.array(fracs))


def packed_mask(P, N, n, kind="nc", window=1):
    """[L, L] bool, True where slot i attends to slot j (docs/jacobi_forcing.md, the same rules
    as jacobi_packing::attention_mask in specula/decode/jacobi_forcing.hpp)."""
    L = P + 2 * N * n
    m = torch.zeros(L, L, dtype=torch.bool)
    m[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
    tri = torch.ones(n, n, dtype=torch.bool).tril()

    def noisy(b):
        return P + 2 * b * n

    def clean(b):
        return P + (2 * b + 1) * n

    for b in range(N):
        for start in (noisy(b), clean(b)):
            m[start:start + n, :P] = True
            m[start:start + n, start:start + n] = tri
        for e in range(b):
            m[clean(b):clean(b) + n, clean(e):clean(e) + n] = True
            if kind == "nc" or (kind == "nc_ic" and e // window == b // window):
                src = noisy(e)
            else:  # cllm, or nc_ic for blocks of earlier windows: the clean blocks
                src = clean(e)
            m[noisy(b):noisy(b) + n, src:src + n] = True
    return m


def jf_losses(model, batch, positions, mask, P, N, n):
    """(L_pc, L_AR) of a batch of packed sequences."""
    logits = model(batch, positions, mask).float()  # [B, L, V]
    noisy = torch.tensor([P + 2 * b * n + r for b in range(N) for r in range(n)])
    clean = noisy + n
    # Eq. 8: KL(teacher || student) per position, teacher = clean logits (detached).
    t_logp = torch.log_softmax(logits[:, clean].detach(), -1)
    s_logp = torch.log_softmax(logits[:, noisy], -1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)  # [B, N*n]
    l_pc = kl.mean()
    # Eq. 9's AR term: next-token loss over the clean stream, the prompt without its last byte
    # followed by the clean blocks: block 0 starts with its root (the last prompt byte) and
    # block b + 1 with the token after block b, so the stream is prompt + greedy output.
    stream = torch.cat([torch.arange(P), clean])
    ar_logits = logits[:, stream[:-1]]
    ar_targets = batch[:, stream[1:]]
    l_ar = F.cross_entropy(ar_logits.reshape(-1, ar_logits.shape[-1]), ar_targets.reshape(-1))
    return l_pc, l_ar


def collect(collector, model_path, prompts_file, k, prompt_bytes, n, new_tokens, out, log):
    cmd = [str(collector), "--out", str(out), "--model-file", str(model_path),
           "--prompts-file", str(prompts_file), "--prompts", str(k), "--prompt-bytes",
           str(prompt_bytes), "--block-size", str(n), "--max-new-tokens", str(new_tokens)]
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout}{res.stderr}")
    log(f"collected: {res.stdout.strip().splitlines()[-2]} ({time.time() - t0:.0f}s)")
    return time.time() - t0
