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
  2. pack (tools/jf_packing.py, plain Python, tested against the C++ jacobi_packing): per
     prompt, the prompt without its last byte, then N pairs [noisy view of block b | clean
     block b]; a block starts with its root (the token before its n - 1 new tokens), so the
     last prompt byte is block 0's root; noisy and clean block b share position ids; block b's
     noisy view is the trajectory point whose noisy fraction is nearest to t_b (the released
     data preparation: t_b = linspace(0, 1, w)[b mod w], noise = n - first mismatch);
  3. train: one forward per packed sequence under the noise-conditioned mask (Fig. 2b: a noisy
     block sees the prompt, the earlier noisy blocks and itself causally; a clean block the
     prompt, the earlier clean blocks and itself causally), loss = L_pc + w * L_AR (Eq. 9),
     with the settings of a recipe (RECIPES below; jf_losses):
     L_pc (Eq. 8): KL(teacher || student) at the compared noisy positions, the teacher the clean
     block's logits (detached, the same forward), the student the noisy view's;
     L_AR: the next-token cross-entropy over prompt + clean blocks ("released") or over
     training-corpus windows ("corpus").
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

import jf_packing as jp

# Loss recipes (the `jf` spec's `recipe`; its keys may also be set one by one):
#   released  the authors' trainer (hao-ai-lab/JacobiForcing, JacobiForcing/train/
#             soft_flexattn_cllm_trainer_multiblock_batched.py): the AR term is the next-token loss
#             over the packed clean stream (prompt + clean blocks) times 10; the consistency term
#             compares only the noisy offsets at or after the block's first divergence from its
#             clean copy, averaged over those positions and then divided by the number of blocks
#             in the batch (its `total_pairs`)
#   corpus    what text-target-jf shipped with before: the AR term on training-corpus windows with
#             weight 1, the consistency term a mean over every noisy position
#   anchored  the corpus recipe's AR term (corpus windows, weight 1: it holds the held-out NLL)
#             with the released trainer's consistency positions (only the offsets at or after a
#             block's first divergence); the consistency term stays a mean over those positions
#             with weight 1 (the released division by the 56-112 blocks of a batch is set against
#             its x10 AR term on the packed sequences; next to a corpus AR term of weight 1 it
#             would all but remove the consistency term)
RECIPES = {
    "released": dict(ar_data="clean_blocks", ar_weight=10.0, pc_norm="per_block",
                     pc_positions="from_divergence"),
    "corpus": dict(ar_data="corpus", ar_weight=1.0, pc_norm="mean", pc_positions="all"),
    "anchored": dict(ar_data="corpus", ar_weight=1.0, pc_norm="mean",
                     pc_positions="from_divergence"),
}


def recipe(js):
    """The loss settings of a `jf` spec: its recipe's, overridden by keys set explicitly."""
    r = dict(RECIPES[js.get("recipe", "corpus")])
    r.update({k: js[k] for k in ("ar_data", "ar_weight", "pc_norm", "pc_positions") if k in js})
    return r


def read_trajectories(path, read_safetensors):
    t, meta = read_safetensors(path)
    return {k: np.asarray(v).astype(np.int64) for k, v in t.items()}, meta


def pack_round(traj, num_blocks, n, window, pc_positions="all"):
    """Packed token sequences [K, L] of every prompt with num_blocks full blocks, the shared
    position ids [L], P, L, the realised noise fractions [K, N] (for the log) and the
    consistency term's keep mask [K, N * n] (tools/jf_packing.py builds all of it)."""
    prompts, poffs = traj["prompt_tokens"], traj["prompt_offsets"]
    bprompt, fixed = traj["block_prompt"], traj["fixed_points"]
    pt_offs, points = traj["point_offsets"], traj["points"]
    ratios = jp.released_noise_ratios(num_blocks, window)
    seqs, fracs, keeps = [], [], []
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
        prompt = [int(t) for t in prompts[poffs[k]:poffs[k + 1]]]
        P = len(prompt) - 1 if P is None else P
        assert len(prompt) - 1 == P, "prompts of one round have one length"
        clean, noisy, fr = [], [], []
        for j in range(num_blocks):
            b = b0 + j
            pts = points[pt_offs[b]:pt_offs[b + 1]].tolist()
            fx = fixed[b].tolist()
            i = jp.select_noisy_view(pts, fx, ratios[j])
            noisy += pts[i]
            clean += fx
            fr.append(jp.suffix_noise(pts[i], fx))
        seq = jp.pack_tokens(prompt[:-1], clean, noisy, n)
        seqs.append(seq)
        fracs.append(fr)
        keeps.append(jp.consistency_keep(seq, P, num_blocks, n, pc_positions))
    L = jp.packed_length(P, num_blocks, n)
    return (torch.tensor(seqs, dtype=torch.long),
            torch.tensor(jp.position_ids(P, num_blocks, n)), P, L, np.array(fracs),
            torch.tensor(keeps, dtype=torch.bool))


def packed_mask(P, N, n, kind="nc", window=1):
    """[L, L] bool tensor of jf_packing.packed_mask (True: slot i attends to slot j)."""
    return torch.tensor(jp.packed_mask(P, N, n, kind, window), dtype=torch.bool)


def jf_losses(model, batch, positions, mask, P, N, n, keep=None, pc_norm="mean"):
    """(L_pc, L_AR) of a batch of packed sequences.

    L_pc: KL(teacher || student) per compared noisy position (Eq. 8), the teacher the clean
    copy's logits at the same offset (detached: the same forward, no gradient), averaged over
    the positions `keep` selects ([B, N * n] bool; None: all); pc_norm "per_block" then divides
    by the number of blocks in the batch, B * N (the released trainer). The released trainer
    computes a soft cross-entropy, which is this KL plus the teacher's entropy: a constant
    for the gradient, so both train alike (the logged values differ by that entropy).
    L_AR: next-token cross-entropy over the clean stream, the prompt without its last byte
    followed by the clean blocks: block 0 starts with its root (the last prompt byte) and
    block b + 1 with the token after block b, so the stream is prompt + greedy output."""
    logits = model(batch, positions, mask).float()  # [B, L, V]
    noisy = torch.tensor(jp.noisy_slots(P, N, n))
    clean = noisy + n
    t_logp = torch.log_softmax(logits[:, clean].detach(), -1)
    s_logp = torch.log_softmax(logits[:, noisy], -1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)  # [B, N*n]
    if keep is None:
        keep = torch.ones_like(kl, dtype=torch.bool)
    w = keep.to(kl.dtype)
    l_pc = (kl * w).sum() / w.sum().clamp(min=1.0)
    if pc_norm == "per_block":
        l_pc = l_pc / float(batch.shape[0] * N)
    elif pc_norm != "mean":
        raise ValueError(f"pc_norm {pc_norm!r}: expected 'mean' or 'per_block'")
    inputs, targets = jp.ar_slots(P, N, n)
    ar_logits = logits[:, torch.tensor(inputs)]
    ar_targets = batch[:, torch.tensor(targets)]
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


def jacobi_speed(collector, model_path, out, read_safetensors, prompts=24, prompt_bytes=32,
                 n=16, new_tokens=112, prompts_file=None):
    """Greedy block-mode Jacobi decoding by the collector (guesses drawn from the context, as
    the released generator) of `prompts` prompts: held-out windows of text-target's held-out
    set, or windows of `prompts_file` (the trainer's training-split prompts). Returns
    dict(points_per_block, tokens_per_forward = n / points per block (a block's n tokens in
    that many forwards), distinct_4grams = mean over outputs of distinct / all 4-grams (low:
    repetitive output), in_runs = mean over outputs of the fraction of tokens inside runs of 8
    or more equal tokens, first_output = the first prompt + output as text)."""
    cmd = [str(collector), "--out", str(out), "--model", "text-target", "--model-file",
           str(model_path), "--prompts", str(prompts), "--prompt-bytes", str(prompt_bytes),
           "--block-size", str(n), "--max-new-tokens", str(new_tokens)]
    if prompts_file is not None:
        cmd += ["--prompts-file", str(prompts_file)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stdout}{res.stderr}")
    traj, _ = read_safetensors(out)
    blocks = len(traj["block_prompt"])
    ppb = len(traj["points"]) / blocks
    outs, offs = np.asarray(traj["output_tokens"]), np.asarray(traj["output_offsets"])
    pr, proffs = np.asarray(traj["prompt_tokens"]), np.asarray(traj["prompt_offsets"])
    distinct, in_runs = [], []
    for k in range(len(offs) - 1):
        o = outs[offs[k]:offs[k + 1]].tolist()
        grams = [tuple(o[i:i + 4]) for i in range(len(o) - 3)]
        if grams:
            distinct.append(len(set(grams)) / len(grams))
        # tokens inside runs of >= 8 equal tokens (spaces, underscores, quotes ...)
        run, covered = 1, 0
        for i in range(1, len(o) + 1):
            if i < len(o) and o[i] == o[i - 1]:
                run += 1
                continue
            covered += run if run >= 8 else 0
            run = 1
        if o:
            in_runs.append(covered / len(o))
    first = bytes(int(t) for t in list(pr[proffs[0]:proffs[1]]) + list(outs[offs[0]:offs[1]]))
    os.unlink(out)
    return dict(points_per_block=ppb, tokens_per_forward=n / ppb,
                distinct_4grams=float(np.mean(distinct)), in_runs=float(np.mean(in_runs)),
                first_output=first.decode("utf-8", "replace"))
