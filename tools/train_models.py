#!/usr/bin/env python3
"""Train the tiny example models shipped in examples/models/.

The models follow the contract in docs/model_format.md (llama-style decoder: RMSNorm,
rotate-half RoPE, grouped-query attention, SwiGLU MLP, no biases, untied output projection):

  text-target     byte-level causal LM over the Python standard-library sources (~2.8M params)
  text-draft      the same data and tokenizer, ~20x smaller (draft model for speculation)
  text-diffusion  byte-level bidirectional masked-diffusion LM (LLaDA-style training)
  image-ar        class-conditional autoregressive model over VQ tokens of procedural 32x32 images
  image-ar-256    the same classes at 64x64 (a 16x16 grid: 256 tokens), same VQ codebook, ~1.2M
                  params (trained after image-ar, whose codebook it reads back from --out)
  image-draft     image-ar-256's data, tokenizer and held-out set, ~13x smaller (its draft model)
  text-target-jf  text-target fine-tuned with Jacobi Forcing (tools/jacobi_forcing.py): two
                  rounds of trajectories collected by the C++ collector (build it first:
                  cmake --build build --target specula_example_jacobi_trajectories; --collector
                  names another binary), evaluated on text-target's held-out set
  text-target-xl  text-target grown to 18.4M params (d_model 512, 6 layers, d_ff 1536) by a
                  function-preserving expansion, then trained (only the new entries): 70 MiB of
                  fp32 weights, more than a CPU's last-level cache, so its passes stream from
                  DRAM (docs/PERFORMANCE.md); evaluated on text-target's held-out set; its
                  training is checkpointed to <out>/text-target-xl.ckpt.pt (git-ignored) every
                  --checkpoint-every steps and resumes from there when rerun

Every output is written to --out (default: examples/models/ next to this script's parent):

  <name>.safetensors           weights (BF16; RMSNorm weights F32) + config metadata
  <name>.heldout.safetensors   I32 `inputs` / `targets` [N, T] held-out set
  <name>.card.json / <name>.md model card (held-out NLL/perplexity of the weights *as shipped*)
  <name>.reference.safetensors text-target-xl: this script's logits for 32 held-out tokens (the
                               C++ backend's test compares against them)
  image-vq.safetensors         the VQ codebook of the image tokenizer
  README.md                    list of the files

The held-out metrics are computed after reading the written safetensors file back: every weight
is rounded to bf16 exactly as stored, the forward runs in float32 and the NLL is accumulated in
float64, so a conforming C++ engine should reproduce `heldout_nll` to well within 1 %.

Only PyTorch and numpy are needed (Debian: python3-torch, python3-numpy); there are no downloads.
Debian's torch calls the system BLAS (libblas.so.3); with the reference BLAS (libblas3) a
product runs about 15x slower than with OpenBLAS (6 against 95 GFLOP/s per core on Zen 4).
Install libopenblas0-pthread, or point the loader at it for this script alone:
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread OPENBLAS_NUM_THREADS=1.
text-target-xl (about 8 CPU-seconds per step with OpenBLAS) is impractical without it.
The safetensors files are written by hand (the `safetensors` package is not required).

Reproduce (60-80 minutes on one CPU thread, depending on the machine's other load, plus about
an hour for text-target-jf; one model alone with `--only NAME`, e.g. `--only image-ar-256` or
`--only text-target-jf`, which leaves the other files untouched):

    nice -n 10 /usr/bin/python3 tools/train_models.py

Smoke test of the whole pipeline (a few steps per model, into a scratch directory):

    /usr/bin/python3 tools/train_models.py --steps-scale 0.005 --out /tmp/models-smoke
"""

import argparse
import functools
import hashlib
import json
import math
import os
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "examples" / "models"
SEED = 1234

# --------------------------------------------------------------------------------------------
# Model specifications. `steps` were chosen by timing steps on one CPU thread while a C++ build
# shared the 2-core machine (s/step: target 1.6-2.9, draft 0.3-0.5, diffusion 1.2-2, image
# 0.4-0.7) so that the four models together train in at most about 45 minutes; the target
# model gets the largest share. image-ar-256 (added later, trained alone) took about 3 s/step
# on the same kind of loaded machine; its 600 steps take 30-35 minutes.
# --------------------------------------------------------------------------------------------

TEXT_CORPUS_ROOT = Path("/usr/lib/python3.11")

MODELS = {
    "text-target": dict(
        kind="text",
        config=dict(vocab_size=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=640,
                    max_seq_len=256, rope_theta=10000.0, norm_eps=1e-5, causal=True,
                    mask_token=-1),
        train=dict(steps=600, batch=16, seq_len=256, lr=2e-3, warmup=60, min_lr_frac=0.1,
                   weight_decay=0.1),
        heldout=dict(rows=48, seq_len=256),
    ),
    "text-draft": dict(
        kind="text",
        config=dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                    max_seq_len=256, rope_theta=10000.0, norm_eps=1e-5, causal=True,
                    mask_token=-1),
        train=dict(steps=800, batch=16, seq_len=256, lr=4e-3, warmup=60, min_lr_frac=0.1,
                   weight_decay=0.1),
        heldout=dict(rows=48, seq_len=256),
    ),
    "text-diffusion": dict(
        kind="diffusion",
        config=dict(vocab_size=257, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512,
                    max_seq_len=128, rope_theta=10000.0, norm_eps=1e-5, causal=False,
                    mask_token=256),
        train=dict(steps=300, batch=32, seq_len=128, lr=3e-3, warmup=40, min_lr_frac=0.1,
                   weight_decay=0.1),
        heldout=dict(rows=128, seq_len=128),
    ),
    "image-ar": dict(
        kind="image",
        config=dict(vocab_size=137, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=384,
                    max_seq_len=65, rope_theta=10000.0, norm_eps=1e-5, causal=True,
                    mask_token=-1),
        train=dict(steps=400, batch=32, seq_len=65, lr=3e-3, warmup=40, min_lr_frac=0.1,
                   weight_decay=0.1, label_dropout=0.1),
        heldout=dict(rows=200, seq_len=65),
    ),
    # 64x64 images of the same classes tokenized with image-ar's codebook (not retrained): a
    # 16x16 grid, 256 image tokens, for Jacobi windows of the SJD papers' length (L = 64).
    "image-ar-256": dict(
        kind="image",
        image_size=64,
        config=dict(vocab_size=137, d_model=128, n_layers=6, n_heads=4,
                    n_kv_heads=2, d_ff=384, max_seq_len=257, rope_theta=10000.0,
                    norm_eps=1e-5, causal=True, mask_token=-1),
        train=dict(steps=600, batch=16, seq_len=257, lr=3e-3, warmup=40, min_lr_frac=0.1,
                   weight_decay=0.1, label_dropout=0.1),
        heldout=dict(rows=100, seq_len=257),
    ),
    # The draft model of image-ar-256 for draft-model speculative decoding: the same training
    # images and held-out set (`data_of`: generated from image-ar-256's seed), the same label
    # dropout (so that it can be guided too), 2 layers of width 64. 0.7-1.2 s/step on one CPU
    # thread of the loaded 2-core machine: 1000 steps took 16 minutes. With 1000 steps against
    # image-ar-256's 600 it reaches a lower held-out NLL than image-ar-256 (0.338 vs 0.365).
    "image-draft": dict(
        kind="image",
        image_size=64,
        data_of="image-ar-256",
        config=dict(vocab_size=137, d_model=64, n_layers=2, n_heads=4,
                    n_kv_heads=2, d_ff=128, max_seq_len=257, rope_theta=10000.0,
                    norm_eps=1e-5, causal=True, mask_token=-1),
        train=dict(steps=1000, batch=16, seq_len=257, lr=4e-3, warmup=60, min_lr_frac=0.1,
                   weight_decay=0.1, label_dropout=0.1),
        heldout=dict(rows=100, seq_len=257),
    ),
    # A target larger than the last-level cache (docs/PERFORMANCE.md, "A target that streams from
    # DRAM"): 18.4 M parameters, 70 MiB of fp32 weights as the C++ backend holds them (bf16 file
    # widened at load) against the 32 MiB L3 of the machines it was built on; 36.7 MB shipped.
    # Grown from text-target by a function-preserving expansion (`grow_from`, see grow_model):
    # at step 0 it computes exactly text-target's logits, so it starts at text-target's held-out
    # NLL. A step costs about 8 CPU-seconds (OpenBLAS, one thread); on the 2-core machine
    # shared with ~20 runnable build jobs it took 33-180 s of wall time, so training from
    # scratch to text-target's NLL did not fit the time there was. Only the new entries train
    # (`freeze_base`). 32 steps (held-out NLL 1.4425 at step 0, 1.4688 at 8 as the new entries
    # start to write, 1.4485 at 32), then continued to 48 (`stages`). Resumable: every
    # --checkpoint-every steps <out>/<name>.ckpt.pt (ignored by git) is written, and a rerun
    # continues from it; a run with more steps continues a shorter one's.
    "text-target-xl": dict(
        kind="text",
        grow_from="text-target",
        config=dict(vocab_size=256, d_model=512, n_layers=6, n_heads=16, n_kv_heads=4,
                    d_ff=1536, max_seq_len=256, rope_theta=10000.0, norm_eps=1e-5, causal=True,
                    mask_token=-1),
        freeze_base=True,
        train=dict(steps=48, stages=[32], batch=16, seq_len=256, lr=1e-3, warmup=4,
                   min_lr_frac=0.1, weight_decay=0.0),
        heldout=dict(rows=48, seq_len=256),
        heldout_of="text-target",
        reference=True,
    ),
    # text-target fine-tuned with Jacobi Forcing (tools/jacobi_forcing.py, docs/jacobi_forcing.md):
    # two rounds of progressive distillation scaled to a 256-token context (the paper's n16/w16
    # then n32/w8 become n8/w8 then n16/w4), each on trajectories collected by the C++ collector
    # on training-split prompts, the second with the first round's model. Held-out set: the
    # base model's (text-target.heldout.safetensors).
    "text-target-jf": dict(
        kind="jacobi_forcing",
        base="text-target",
        config=dict(vocab_size=256, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=640,
                    max_seq_len=256, rope_theta=10000.0, norm_eps=1e-5, causal=True,
                    mask_token=-1),
        # recipe: tools/jacobi_forcing.py RECIPES ("released": the authors' trainer's loss;
        # "corpus": the AR term on corpus windows). eval: the learning curve's Jacobi speed
        # measure, every eval_every steps (0: only the round ends' records).
        jf=dict(prompt_bytes=32, new_tokens=112, mask="nc", recipe="corpus", ar_batch=4,
                eval=dict(prompts=24, prompt_bytes=32, n=16, new_tokens=112), eval_every=0,
                rounds=[dict(block=8, window=8, prompts=800, steps=350),
                        dict(block=16, window=4, prompts=800, steps=350)]),
        train=dict(steps=700, batch=8, seq_len=255, lr=3e-4, warmup=20, min_lr_frac=0.1,
                   weight_decay=0.1),
        heldout=dict(rows=48, seq_len=256),
    ),
}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# safetensors I/O (hand-written: 8-byte LE header length, JSON header, raw LE tensor bytes).
# --------------------------------------------------------------------------------------------

def fp32_to_bf16_bits(a):
    """Round float32 values to bf16 (round-to-nearest-even); returns the uint16 bit patterns."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_bits_to_fp32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


_DTYPES = {"F32": (np.float32, 4), "I32": (np.int32, 4), "BF16": (np.uint16, 2)}


def write_safetensors(path, tensors, metadata):
    """tensors: dict name -> (dtype string, numpy array). BF16 arrays are given as float32 and
    rounded here. metadata: dict of str -> str."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs = []
    offset = 0
    for name, (dtype, arr) in tensors.items():
        if dtype == "BF16":
            raw = fp32_to_bf16_bits(arr).astype("<u2").tobytes()
        elif dtype == "F32":
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        elif dtype == "I32":
            raw = np.ascontiguousarray(arr, dtype="<i4").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)  # pad with spaces to a multiple of 8
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def read_safetensors(path):
    """Returns (dict name -> float32/int32 numpy array, metadata dict)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        np_dtype, size = _DTYPES[info["dtype"]]
        lo, hi = info["data_offsets"]
        shape = info["shape"]
        assert hi - lo == size * int(np.prod(shape, dtype=np.int64)), name
        arr = np.frombuffer(data[base + lo:base + hi], dtype=np.dtype(np_dtype).newbyteorder("<"))
        if info["dtype"] == "BF16":
            arr = bf16_bits_to_fp32(arr)
        out[name] = arr.reshape(shape).copy()
    return out, meta


# --------------------------------------------------------------------------------------------
# The model, written to mirror docs/model_format.md line by line.
# --------------------------------------------------------------------------------------------

class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg["d_model"], cfg["d_model"] // cfg["n_heads"]
        assert cfg["d_model"] % cfg["n_heads"] == 0 and hd % 2 == 0
        assert cfg["n_heads"] % cfg["n_kv_heads"] == 0
        self.hd = hd
        P = torch.nn.Parameter
        # Parameters keyed by their file names ("layers.0.attention.wq.weight"); module
        # attribute names may not contain dots, so they are registered with "__" instead.
        self.params = {}
        self.params["tok_embeddings.weight"] = P(torch.empty(cfg["vocab_size"], d))
        for i in range(cfg["n_layers"]):
            p = f"layers.{i}."
            self.params[p + "attention_norm.weight"] = P(torch.ones(d))
            self.params[p + "attention.wq.weight"] = P(torch.empty(cfg["n_heads"] * hd, d))
            self.params[p + "attention.wk.weight"] = P(torch.empty(cfg["n_kv_heads"] * hd, d))
            self.params[p + "attention.wv.weight"] = P(torch.empty(cfg["n_kv_heads"] * hd, d))
            self.params[p + "attention.wo.weight"] = P(torch.empty(d, cfg["n_heads"] * hd))
            self.params[p + "ffn_norm.weight"] = P(torch.ones(d))
            self.params[p + "feed_forward.w1.weight"] = P(torch.empty(cfg["d_ff"], d))
            self.params[p + "feed_forward.w3.weight"] = P(torch.empty(cfg["d_ff"], d))
            self.params[p + "feed_forward.w2.weight"] = P(torch.empty(d, cfg["d_ff"]))
        self.params["norm.weight"] = P(torch.ones(d))
        self.params["output.weight"] = P(torch.empty(cfg["vocab_size"], d))
        for name, w in self.params.items():
            self.register_parameter(name.replace(".", "__"), w)
        # Initialisation: N(0, 0.02); residual-branch output projections scaled by
        # 1/sqrt(2 * n_layers) (GPT-2 style).
        for name, w in self.params.items():
            if name.endswith("norm.weight"):
                continue
            std = 0.02
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                std /= math.sqrt(2 * cfg["n_layers"])
            torch.nn.init.normal_(w, 0.0, std)
        # RoPE tables, "rotate-half": f_i = theta^(-2i/hd), angle = pos * f_i, pos from 0.
        i = torch.arange(hd // 2, dtype=torch.float64)
        freqs = cfg["rope_theta"] ** (-2.0 * i / hd)
        ang = torch.arange(cfg["max_seq_len"], dtype=torch.float64)[:, None] * freqs[None, :]
        self.register_buffer("rope_cos", torch.cos(ang).float(), persistent=False)
        self.register_buffer("rope_sin", torch.sin(ang).float(), persistent=False)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["norm_eps"]) * w

    def rope(self, x, positions=None):  # x: [B, H, T, hd]; positions: [T] (default 0..T-1)
        T, h2 = x.shape[2], self.hd // 2
        if positions is None:
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x1, x2 = x[..., :h2], x[..., h2:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, tokens, positions=None, mask=None):
        """tokens: [B, T] int64 -> logits [B, T, vocab]. positions: [T] int64 position ids
        (default 0..T-1); mask: [T, T] bool, True where query i attends to key j (default: the
        causal mask of a causal model, none otherwise). Jacobi Forcing training packs noisy and
        clean blocks with shared position ids and a block-sparse mask (tools/jacobi_forcing.py)."""
        cfg, W = self.cfg, self.params
        B, T = tokens.shape
        H, KV, hd = cfg["n_heads"], cfg["n_kv_heads"], self.hd
        group = H // KV
        x = W["tok_embeddings.weight"][tokens]
        causal = cfg["causal"]
        for i in range(cfg["n_layers"]):
            p = f"layers.{i}."
            a = self.rms(x, W[p + "attention_norm.weight"])
            q = (a @ W[p + "attention.wq.weight"].T).view(B, T, H, hd).transpose(1, 2)
            k = (a @ W[p + "attention.wk.weight"].T).view(B, T, KV, hd).transpose(1, 2)
            v = (a @ W[p + "attention.wv.weight"].T).view(B, T, KV, hd).transpose(1, 2)
            q, k = self.rope(q, positions), self.rope(k, positions)
            # query head h reads kv head h // group: repeat_interleave gives exactly that.
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)  # [B, H, T, T]
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            elif causal:  # a position sees itself and every earlier position
                m = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
                s = s.masked_fill(m, float("-inf"))
            o = torch.softmax(s, dim=-1) @ v
            o = o.transpose(1, 2).reshape(B, T, H * hd)
            h = x + o @ W[p + "attention.wo.weight"].T
            f = self.rms(h, W[p + "ffn_norm.weight"])
            g = F.silu(f @ W[p + "feed_forward.w1.weight"].T) * (f @ W[p + "feed_forward.w3.weight"].T)
            x = h + g @ W[p + "feed_forward.w2.weight"].T
        return self.rms(x, W["norm.weight"]) @ W["output.weight"].T

    def n_params(self):
        return sum(p.numel() for p in self.parameters())


def model_tensors(model):
    """Tensors to store: RMSNorm weights in F32, everything else in BF16."""
    out = {}
    for name, p in model.params.items():
        arr = p.detach().float().cpu().numpy()
        out[name] = ("F32" if name.endswith("norm.weight") else "BF16", arr)
    return out


def load_model_from_file(path):
    tensors, meta = read_safetensors(path)
    cfg = json.loads(meta["specula.config"])
    model = Llama(cfg)
    with torch.no_grad():
        for name, p in model.params.items():
            p.copy_(torch.from_numpy(tensors[name]))
    return model, meta


@torch.no_grad()
def evaluate_heldout(model, inputs, targets, batch_rows=16):
    """Mean NLL (nats) over entries with target >= 0, accumulated in float64."""
    model.eval()
    total, count = 0.0, 0
    for lo in range(0, inputs.shape[0], batch_rows):
        x = torch.from_numpy(inputs[lo:lo + batch_rows]).long()
        y = torch.from_numpy(targets[lo:lo + batch_rows]).long()
        logits = model(x).float()  # fp32 forward
        logp = torch.log_softmax(logits.double(), dim=-1)
        keep = y >= 0
        nll = -logp.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        total += float(nll[keep].sum())
        count += int(keep.sum())
    return total / count, count


# --------------------------------------------------------------------------------------------
# Text corpus: the Python standard library of this machine's Debian Python.
# --------------------------------------------------------------------------------------------

_EXCLUDED_DIRS = {"dist-packages", "site-packages", "test", "tests", "idlelib", "__pycache__"}


def load_text_corpus(root=TEXT_CORPUS_ROOT, heldout_percent=2):
    """Returns (train bytes, held-out bytes, description dict). A file goes to the held-out
    split when sha256(relative path) mod 100 < heldout_percent (stable across machines)."""
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in _EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        if not p.is_file():
            continue
        files.append(rel.as_posix())
    files.sort()
    train, held = [], []
    n_train = n_held = 0
    for rel in files:
        data = (root / rel).read_bytes()
        h = int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "little")
        if h % 100 < heldout_percent:
            held.append(data)
            n_held += 1
        else:
            train.append(data)
            n_train += 1
    train_b, held_b = b"".join(train), b"".join(held)
    desc = dict(
        source=f"{root}/**/*.py (Python standard-library sources)",
        excluded_directories=sorted(_EXCLUDED_DIRS),
        python_version=_python_version(root),
        files=len(files), train_files=n_train, heldout_files=n_held,
        train_bytes=len(train_b), heldout_bytes=len(held_b),
        split="held out iff int.from_bytes(sha256(relative_path)[:8], 'little') % 100 < "
              f"{heldout_percent}; files concatenated in sorted path order",
        train_sha256=hashlib.sha256(train_b).hexdigest(),
        heldout_sha256=hashlib.sha256(held_b).hexdigest(),
    )
    return train_b, held_b, desc


def _python_version(root):
    # The corpus belongs to the Python installed at `root`, not necessarily the interpreter
    # running this script; ask the matching interpreter when it exists.
    exe = Path("/usr/bin") / root.name
    try:
        import subprocess
        out = subprocess.run([str(exe), "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except Exception:
        return root.name


def text_heldout(held_bytes, rows, T):
    """Causal held-out set: `rows` windows of T bytes at evenly spaced offsets of the held-out
    stream; targets[r, t] = inputs[r, t+1], -1 in the last column."""
    buf = np.frombuffer(held_bytes, dtype=np.uint8)
    assert len(buf) >= rows * T, "held-out corpus too small"
    starts = [(r * (len(buf) - T)) // max(rows - 1, 1) for r in range(rows)]
    inputs = np.stack([buf[s:s + T] for s in starts]).astype(np.int32)
    targets = np.full_like(inputs, -1)
    targets[:, :-1] = inputs[:, 1:]
    return inputs, targets


def diffusion_heldout(held_bytes, rows, T, mask_token, seed):
    """Masked held-out set: row r has masking ratio t_r = (r + 0.5) / rows; each position is
    masked independently with probability t_r (at least one per row, seeded numpy RNG).
    inputs holds the mask token where targets holds the original byte; targets is -1 elsewhere."""
    buf = np.frombuffer(held_bytes, dtype=np.uint8)
    # Offset the windows by T/2 relative to the causal set so the two sets differ.
    starts = [(r * (len(buf) - 2 * T)) // max(rows - 1, 1) + T // 2 for r in range(rows)]
    clean = np.stack([buf[s:s + T] for s in starts]).astype(np.int32)
    rng = np.random.default_rng(seed)
    ratios = (np.arange(rows) + 0.5) / rows
    masked = rng.random((rows, T)) < ratios[:, None]
    for r in range(rows):
        if not masked[r].any():
            masked[r, rng.integers(T)] = True
    inputs = np.where(masked, mask_token, clean).astype(np.int32)
    targets = np.where(masked, clean, -1).astype(np.int32)
    return inputs, targets, ratios


# --------------------------------------------------------------------------------------------
# Procedural images and their VQ tokenizer.
# --------------------------------------------------------------------------------------------

IMAGE_SIZE, PATCH, GRID, CODES = 32, 4, 8, 128
IMAGE_CLASSES = ["circle", "square", "triangle", "horizontal_gradient", "vertical_gradient",
                 "stripes", "checkerboard", "blobs"]
LABEL_BASE = CODES                        # label token of class c is 128 + c
NULL_LABEL = CODES + len(IMAGE_CLASSES)   # 136: "no label" (classifier-free guidance)


# Colours are drawn from a small palette so that flat regions map to exact codebook entries and
# the 128 codes are left for edges and gradients (a VQ over arbitrary RGB colours is very lossy).
PALETTE = np.array([
    [0.00, 0.00, 0.00], [1.00, 1.00, 1.00], [0.50, 0.50, 0.50], [0.90, 0.10, 0.10],
    [0.10, 0.70, 0.20], [0.15, 0.30, 0.90], [0.95, 0.85, 0.10], [0.95, 0.50, 0.05],
    [0.60, 0.20, 0.75], [0.10, 0.80, 0.85], [0.95, 0.45, 0.70], [0.45, 0.28, 0.10],
], dtype=np.float32)


def _two_colours(rng):
    """Two different palette colours (foreground, background)."""
    i, j = rng.choice(len(PALETTE), size=2, replace=False)
    return PALETTE[i], PALETTE[j]


def make_image(cls, rng, size=IMAGE_SIZE):
    """One size x size RGB image of class `cls` as float32 [size, size, 3] in [0, 1]. Sizes are
    multiples of 32; every length drawn for 32x32 is scaled by k = size / 32 (the same random
    draws, so size 32 gives exactly image-ar's images)."""
    S = size
    assert size % IMAGE_SIZE == 0, size
    k = size // IMAGE_SIZE
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float32) + 0.5
    fg, bg = _two_colours(rng)
    name = IMAGE_CLASSES[cls]
    if name == "circle":
        r = rng.uniform(5, 12) * k
        cx, cy = rng.uniform(r, S - r, size=2)
        m = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    elif name == "square":
        side = rng.uniform(9, 22) * k
        x0, y0 = rng.uniform(0, S - side, size=2)
        m = (xx >= x0) & (xx < x0 + side) & (yy >= y0) & (yy < y0 + side)
    elif name == "triangle":  # upright isosceles triangle
        w = rng.uniform(12, 28) * k
        h = rng.uniform(10, 26) * k
        x0 = rng.uniform(0, S - w)
        y0 = rng.uniform(0, S - h)  # apex row
        frac = (yy - y0) / h        # 0 at the apex, 1 at the base
        m = (frac >= 0) & (frac <= 1) & (np.abs(xx - (x0 + w / 2)) <= frac * w / 2)
    elif name in ("horizontal_gradient", "vertical_gradient"):
        coord = xx if name == "horizontal_gradient" else yy
        t = (coord / S)[..., None]
        return (bg * (1 - t) + fg * t).astype(np.float32)
    elif name == "stripes":
        period = rng.integers(4, 13) * k
        phase = rng.uniform(0, period)
        coord = xx if rng.random() < 0.5 else yy
        m = ((coord + phase) % period) < period / 2
    elif name == "checkerboard":
        cell = int(rng.choice([4, 8])) * k
        m = ((xx // cell + yy // cell) % 2) == 0
    elif name == "blobs":  # a few soft Gaussian blobs of random colours on the background
        img = np.broadcast_to(bg, (S, S, 3)).astype(np.float32).copy()
        for _ in range(rng.integers(2, 5)):
            c = PALETTE[rng.integers(len(PALETTE))]
            cx, cy = rng.uniform(0, S, size=2)
            s = rng.uniform(3, 8) * k
            wgt = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * s * s))[..., None]
            img = img * (1 - wgt) + c * wgt
        return np.clip(img, 0, 1).astype(np.float32)
    else:
        raise ValueError(name)
    return np.where(m[..., None], fg, bg).astype(np.float32)


def make_images(n, seed, size=IMAGE_SIZE):
    """n images with uniformly random classes; returns (images [n,size,size,3], labels [n])."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(IMAGE_CLASSES), size=n)
    imgs = np.stack([make_image(int(c), rng, size) for c in labels])
    return imgs, labels


def make_image_codes(n, seed, size, codebook, chunk=1000):
    """The VQ codes [n, (size/4)^2] and labels [n] of make_images(n, seed, size), tokenized a
    chunk of images at a time (the same images; the patches of all of them would not fit)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(IMAGE_CLASSES), size=n)
    codes = []
    for lo in range(0, n, chunk):
        imgs = np.stack([make_image(int(c), rng, size) for c in labels[lo:lo + chunk]])
        p = torch.from_numpy(to_patches(imgs).reshape(-1, PATCH * PATCH * 3))
        codes.append(nearest_code(p, codebook).view(len(imgs), -1))
    return torch.cat(codes), labels


def to_patches(imgs):
    """[n, S, S, 3] -> [n, (S/4)^2, 48]; patches in row-major grid order, each flattened in
    (row, col, channel) order."""
    n, grid = imgs.shape[0], imgs.shape[1] // PATCH
    p = imgs.reshape(n, grid, PATCH, grid, PATCH, 3).transpose(0, 1, 3, 2, 4, 5)
    return p.reshape(n, grid * grid, PATCH * PATCH * 3)


def kmeans(x, k, iters, seed):
    """Plain Lloyd k-means in torch (float32). Empty clusters are re-seeded from random points."""
    g = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(x).float()
    c = x[torch.randperm(x.shape[0], generator=g)[:k]].clone()
    for it in range(iters):
        assign = nearest_code(x, c)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).float()
        empty = counts == 0
        c = torch.where(empty[:, None], c, sums / counts.clamp(min=1)[:, None])
        if empty.any():
            c[empty] = x[torch.randint(0, x.shape[0], (int(empty.sum()),), generator=g)]
    return c


def nearest_code(x, c, chunk=65536):
    out = []
    c2 = (c * c).sum(1)
    for lo in range(0, x.shape[0], chunk):
        xb = x[lo:lo + chunk]
        d = c2[None, :] - 2 * xb @ c.T  # |x|^2 is constant per row
        out.append(d.argmin(1))
    return torch.cat(out)


def image_description(size=IMAGE_SIZE):
    grid = size // PATCH
    return dict(
        image_size=size, channels=3, patch=PATCH, grid=grid, codebook_size=CODES,
        codebook_tensor="codebook F32 [128, 48] in image-vq.safetensors",
        patch_layout="each code is a 4x4x3 patch flattened in (row, col, channel) order",
        pixel_range=[0.0, 1.0],
        token_order=f"row-major over the {grid}x{grid} grid of patches",
        sequence=f"[label token] + {grid * grid} image tokens (max_seq_len {grid * grid + 1})",
        classes=IMAGE_CLASSES,
        palette=PALETTE.tolist(),
        label_tokens={name: LABEL_BASE + i for i, name in enumerate(IMAGE_CLASSES)},
        label_token_base=LABEL_BASE, null_label_token=NULL_LABEL,
        label_dropout=MODELS["image-ar"]["train"]["label_dropout"],
    )


# --------------------------------------------------------------------------------------------
# Training.
# --------------------------------------------------------------------------------------------

def lr_at(step, steps, tr):
    """Linear warmup, then cosine decay to min_lr_frac * lr."""
    if step < tr["warmup"]:
        return tr["lr"] * (step + 1) / tr["warmup"]
    t = (step - tr["warmup"]) / max(steps - tr["warmup"], 1)
    frac = tr["min_lr_frac"] + (1 - tr["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * t))
    return tr["lr"] * frac


def make_optimizer(model, tr):
    decay = [p for n, p in model.params.items() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.params.items() if n.endswith("norm.weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=tr["lr"], betas=(0.9, 0.95), eps=1e-8)


def train_loop(model, tr, steps, loss_fn, name, checkpoint=None, state=None, evaluate=None):
    """Runs `steps` AdamW steps; loss_fn(step) returns the scalar loss of one batch.

    checkpoint: optional dict(path=, every=): every `every` steps (and after the last) the
    model, optimizer, the RNG states in `state` (name -> torch.Generator) and the step count are
    written to `path`; a run that finds the file continues from it, so a training run may be
    stopped and resumed (the batches and updates are those of an uninterrupted run). A run with
    more steps than the checkpoint's continues it under the longer run's schedule (the learning
    rate jumps to that schedule's value at the checkpoint's step).
    evaluate: optional callable() -> float logged (held-out NLL) at each checkpoint."""
    opt = make_optimizer(model, tr)
    start, wall_before, history = 0, 0.0, []
    ckpt = Path(checkpoint["path"]) if checkpoint else None
    if ckpt is not None and ckpt.exists():
        saved = torch.load(ckpt)
        if saved["config"] != model.cfg or saved["step"] > steps:
            raise SystemExit(f"{ckpt}: checkpoint of another configuration or past {steps} "
                             f"steps (step {saved['step']}); delete it to start over")
        if saved["steps"] != steps:  # a longer run continues a shorter one's checkpoint
            log(f"{name}: continuing a {saved['steps']}-step run's checkpoint under a "
                f"{steps}-step schedule")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        for k, g in (state or {}).items():
            g.set_state(saved["rng"][k])
        start, wall_before, history = saved["step"], saved["wall"], saved["history"]
        log(f"{name}: resumed from {ckpt} at step {start}/{steps}")
    model.train()
    t0 = time.time()
    recent = []
    last_loss = history[-1]["loss"] if history else float("nan")
    every = max(1, min(50, steps // 20))
    for step in range(start, steps):
        lr = lr_at(step, steps, tr)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(float(loss))
        if (step + 1) % every == 0 or step + 1 == steps:
            el = time.time() - t0
            log(f"{name} step {step + 1}/{steps} loss {np.mean(recent):.4f} lr {lr:.2e} "
                f"{el:.0f}s ({el / (step + 1 - start):.3f}s/step)")
            last_loss, recent = float(np.mean(recent)), []
        if ckpt is not None and ((step + 1) % checkpoint["every"] == 0 or step + 1 == steps):
            entry = dict(step=step + 1, loss=last_loss, wall=wall_before + time.time() - t0)
            if evaluate is not None:
                entry["heldout_nll_fp32"] = evaluate()
                model.train()
                log(f"{name} step {step + 1}: held-out nll (fp32 weights) "
                    f"{entry['heldout_nll_fp32']:.5f}")
            history.append(entry)
            tmp = ckpt.with_suffix(".tmp")
            torch.save(dict(config=model.cfg, steps=steps, step=step + 1,
                            wall=wall_before + time.time() - t0, history=history,
                            model=model.state_dict(), optimizer=opt.state_dict(),
                            rng={k: g.get_state() for k, g in (state or {}).items()}), tmp)
            os.replace(tmp, ckpt)
    if checkpoint is not None:
        train_loop.history = history
    return wall_before + time.time() - t0, last_loss


def text_batches(train_bytes, tr, seed):
    """Random windows of seq_len+1 bytes from the training stream (seeded)."""
    data = torch.from_numpy(np.frombuffer(train_bytes, dtype=np.uint8).copy())
    g = torch.Generator().manual_seed(seed)
    T, B = tr["seq_len"], tr["batch"]
    ar = torch.arange(T + 1)

    def batch():
        offs = torch.randint(0, len(data) - T - 1, (B,), generator=g)
        return data[offs[:, None] + ar].long()
    return batch, g


def grow_model(base, cfg, seed):
    """A model of config `cfg` that computes exactly what `base` computes (function-preserving
    expansion): base's d_model, layers, heads and d_ff are the leading slices of cfg's, with the
    same head size and query heads per kv head. The residual stream's new dimensions start at 0
    and stay 0 because every tensor that writes them (embedding columns, rows of wo and w2) is 0
    there; RMSNorm weights are scaled by sqrt(d_base / d) to undo the larger mean over the zero
    dimensions; the new query heads' and hidden units' outputs (columns of wo and w2) and the
    appended layers' wo and w2 are 0. Every other new entry is drawn like a fresh model's
    (N(0, 0.02)), so the gradients reach all of them from the first step.

    Returns (model, masks): masks[name] is a float tensor, 0 on the entries copied from base
    and 1 on the new ones (train_text multiplies the gradients by it when `freeze_base`)."""
    bc = base.cfg
    db, d = bc["d_model"], cfg["d_model"]
    hd = d // cfg["n_heads"]
    assert hd == db // bc["n_heads"], "head size must not change"
    assert cfg["n_heads"] // cfg["n_kv_heads"] == bc["n_heads"] // bc["n_kv_heads"]
    assert d >= db and cfg["n_layers"] >= bc["n_layers"] and cfg["d_ff"] >= bc["d_ff"]
    assert cfg["n_heads"] >= bc["n_heads"] and cfg["vocab_size"] == bc["vocab_size"]
    torch.manual_seed(seed)
    model = Llama(cfg)
    scale = math.sqrt(db / d)
    B, W = base.params, model.params
    masks = {name: torch.ones_like(w) for name, w in W.items()}
    with torch.no_grad():
        for name, w in W.items():
            if name in B:
                masks[name][tuple(slice(0, n) for n in B[name].shape)] = 0
            if name.endswith("norm.weight"):
                w.fill_(scale)
                if name in B:
                    w[:db] = B[name] * scale
                continue
            if name.endswith("wo.weight") or name.endswith("w2.weight"):
                w.zero_()
            if name == "tok_embeddings.weight":
                w[:, db:] = 0
            if name in B:
                b = B[name]
                w[:b.shape[0], :b.shape[1]] = b
    return model, masks


def train_text(name, spec, out, steps, seed, corpus, checkpoint_every=0):
    train_b, held_b, desc = corpus
    torch.manual_seed(seed)
    extra = {}
    if "grow_from" in spec:
        base_path = Path(out) / f"{spec['grow_from']}.safetensors"
        if not base_path.exists():
            base_path = DEFAULT_OUT / base_path.name
        base, _ = load_model_from_file(base_path)
        model, masks = grow_model(base, spec["config"], seed)
        if spec.get("freeze_base"):  # the copied entries keep base's values
            for pname, p in model.params.items():
                p.register_hook(lambda g, m=masks[pname]: g * m)
        base_card = json.loads(base_path.with_name(f"{spec['grow_from']}.card.json").read_text())
        extra.update(base_model=spec["grow_from"], base_heldout_nll=base_card["heldout_nll"],
                     base_frozen=bool(spec.get("freeze_base")),
                     growth=grow_model.__doc__.split("\n\n")[0].replace("\n    ", " ").strip()
                     .replace("`base`", spec["grow_from"]))
    else:
        model = Llama(spec["config"])
    batch, gen = text_batches(train_b, spec["train"], seed + 1)
    ho = spec["heldout"]
    inputs, targets = text_heldout(held_b, ho["rows"], ho["seq_len"])

    def loss_fn(step):
        w = batch()
        logits = model(w[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))

    ckpt = None
    if checkpoint_every > 0:
        ckpt = dict(path=Path(out) / f"{name}.ckpt.pt", every=checkpoint_every)
    evaluate = (lambda: evaluate_heldout(model, inputs, targets)[0]) if ckpt else None
    if evaluate is not None and "grow_from" in spec:
        log(f"{name}: grown from {spec['grow_from']} ({model.n_params():,} parameters); "
            f"held-out nll at step 0 {evaluate():.5f} (base: {extra['base_heldout_nll']:.5f})")
    # `stages`: train as a run of the first stage's steps, then continue its checkpoint under
    # each longer run's schedule (scaled like `steps`); the last stage is `steps`.
    stages = [max(1, round(n * steps / spec["train"]["steps"]))
              for n in spec["train"].get("stages", [])] + [steps]
    if len(stages) > 1 and ckpt is None:
        ckpt = dict(path=Path(out) / f"{name}.ckpt.pt", every=steps)
    for total in stages:
        wall, last = train_loop(model, spec["train"], total, loss_fn, name, checkpoint=ckpt,
                                state={"batches": gen}, evaluate=evaluate)
    if ckpt is not None:
        extra["heldout_nll_during_training"] = train_loop.history
    extra.update(corpus=desc, tokenizer="bytes (token id = byte value 0..255, no special tokens)",
                 heldout_set=f"{ho['rows']} windows of {ho['seq_len']} bytes at evenly spaced "
                             "offsets of the held-out stream")
    if "heldout_of" in spec:
        extra["heldout_of"] = spec["heldout_of"]
    return model, inputs, targets, wall, last, extra, "bytes"


def train_diffusion(name, spec, out, steps, seed, corpus):
    train_b, held_b, desc = corpus
    cfg, tr = spec["config"], spec["train"]
    torch.manual_seed(seed)
    model = Llama(cfg)
    T, B, M = tr["seq_len"], tr["batch"], cfg["mask_token"]
    tr = dict(tr, seq_len=T - 1)  # text_batches returns seq_len+1 bytes: exactly T
    batch, g = text_batches(train_b, tr, seed + 1)

    def loss_fn(step):
        x0 = batch()  # [B, T]
        # LLaDA: t ~ U(0, 1] per sequence (clamped to >= 1/T), mask each position w.p. t,
        # loss = sum over masked positions of CE / t, averaged over B*T positions.
        t = (1.0 - torch.rand(B, generator=g)).clamp(min=1.0 / T)
        masked = torch.rand(B, T, generator=g) < t[:, None]
        xt = torch.where(masked, torch.full_like(x0, M), x0)
        logits = model(xt)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x0.reshape(-1),
                             reduction="none").view(B, T)
        return ((ce * masked) / t[:, None]).sum() / (B * T)

    wall, last = train_loop(model, spec["train"], steps, loss_fn, name)
    ho = spec["heldout"]
    inputs, targets, _ = diffusion_heldout(held_b, ho["rows"], ho["seq_len"], M, seed + 7)
    extra = dict(
        corpus=desc,
        tokenizer="bytes (token id = byte value 0..255) + mask token 256",
        objective="LLaDA masked diffusion: t ~ U(0,1] per sequence (clamped to >= 1/T), each "
                  "position masked w.p. t, loss = sum over masked positions of CE/t, / (B*T)",
        heldout_set=f"{ho['rows']} windows of {ho['seq_len']} bytes; row r masked with ratio "
                    f"(r+0.5)/{ho['rows']} (numpy default_rng seed {seed + 7}, at least one "
                    "mask per row); the held-out loss is the plain mean CE over masked "
                    "positions (no 1/t weighting)",
    )
    return model, inputs, targets, wall, last, extra, "bytes+mask"


def shipped_codebook(out):
    """image-ar's codebook as written to `out` (or, for a scratch --out without one, as shipped
    in examples/models/)."""
    for d in (Path(out), DEFAULT_OUT):
        if (d / "image-vq.safetensors").exists():
            t, _ = read_safetensors(d / "image-vq.safetensors")
            return torch.from_numpy(np.array(t["codebook"], dtype=np.float32)), d
    raise FileNotFoundError("image-vq.safetensors: train image-ar first")


def train_image(name, spec, out, steps, seed, corpus, n_train=24000, n_heldout=200):
    if spec.get("image_size", IMAGE_SIZE) != IMAGE_SIZE:
        return train_image_large(name, spec, out, steps, seed, corpus)
    cfg, tr = spec["config"], spec["train"]
    t0 = time.time()
    imgs, labels = make_images(n_train, seed)
    patches = to_patches(imgs).reshape(-1, PATCH * PATCH * 3)
    rng = np.random.default_rng(seed + 3)
    sub = patches[rng.choice(len(patches), size=200000, replace=False)]
    codebook = kmeans(sub, CODES, iters=15, seed=seed + 4)
    codes = nearest_code(torch.from_numpy(patches), codebook).view(n_train, GRID * GRID)
    recon = codebook[codes.reshape(-1)].numpy()
    vq_mse = float(((recon - patches) ** 2).mean())
    log(f"{name}: {n_train} images, k-means codebook ready, VQ mse {vq_mse:.5f} "
        f"({time.time() - t0:.0f}s)")
    desc = image_description()
    write_safetensors(Path(out) / "image-vq.safetensors",
                      {"codebook": ("F32", codebook.numpy())},
                      {"specula.name": "image-vq", "specula.image": json.dumps(desc),
                       "image_size": IMAGE_SIZE, "patch": PATCH, "grid": GRID,
                       "codebook_size": CODES, "patch_layout": "row,col,channel",
                       "classes": json.dumps(IMAGE_CLASSES), "label_token_base": LABEL_BASE,
                       "null_label_token": NULL_LABEL})

    model, wall, last = train_label_conditioned(name, cfg, tr, steps, seed, codes, labels)
    inputs, targets = image_heldout(codebook, n_heldout, seed + 1000, IMAGE_SIZE)
    extra = dict(
        data=f"{n_train} procedural 32x32 RGB images (numpy default_rng seed {seed}), "
             f"{len(IMAGE_CLASSES)} classes drawn uniformly: {', '.join(IMAGE_CLASSES)}",
        tokenizer=f"VQ: k-means (K={CODES}, 15 Lloyd iterations on 200000 random patches) over "
                  "non-overlapping 4x4 RGB patches; codebook in image-vq.safetensors",
        vq_mse_per_value=vq_mse,
        vq_codebook_sha256=hashlib.sha256(codebook.numpy().tobytes()).hexdigest(),
        image=desc,
        heldout_set=f"{n_heldout} images from seed {seed + 1000}, label token kept",
    )
    return model, inputs, targets, wall, last, extra, "image-vq"


def train_label_conditioned(name, cfg, tr, steps, seed, codes, labels):
    """Trains on [label token] + codes sequences, the label replaced by the null label with
    probability label_dropout; returns (model, wall seconds, last loss)."""
    seqs = torch.cat([torch.from_numpy(labels).long()[:, None] + LABEL_BASE, codes.long()], 1)
    torch.manual_seed(seed)
    model = Llama(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    B = tr["batch"]

    def loss_fn(step):
        idx = torch.randint(0, len(seqs), (B,), generator=g)
        x = seqs[idx].clone()
        drop = torch.rand(B, generator=g) < tr["label_dropout"]
        x[drop, 0] = NULL_LABEL
        logits = model(x[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    wall, last = train_loop(model, tr, steps, loss_fn, name)
    return model, wall, last


def image_heldout(codebook, n, seed, size):
    """Held-out images come from a different seed; the label is always kept."""
    codes, labels = make_image_codes(n, seed, size, codebook)
    inputs = np.concatenate([labels[:, None] + LABEL_BASE, codes.numpy()], 1).astype(np.int32)
    targets = np.full_like(inputs, -1)
    targets[:, :-1] = inputs[:, 1:]
    return inputs, targets


def train_image_large(name, spec, out, steps, seed, _corpus, n_train=24000):
    """A model over larger images of the same classes, tokenized with image-ar's codebook."""
    cfg, tr, size = spec["config"], spec["train"], spec["image_size"]
    grid = size // PATCH
    t0 = time.time()
    codebook, cb_dir = shipped_codebook(out)
    model_seed, seed = seed, spec.get("data_seed", seed)  # images (and held-out set) from
    codes, labels = make_image_codes(n_train, seed, size, codebook)  # data_seed if given
    # VQ error on a sample (the patches of all the images would take too much memory).
    sample, _ = make_images(200, seed + 5, size)
    sp = torch.from_numpy(to_patches(sample).reshape(-1, PATCH * PATCH * 3))
    vq_mse = float(((codebook[nearest_code(sp, codebook)] - sp) ** 2).mean())
    log(f"{name}: {n_train} {size}x{size} images tokenized with {cb_dir / 'image-vq.safetensors'}"
        f", VQ mse {vq_mse:.5f} on 200 samples ({time.time() - t0:.0f}s)")
    desc = image_description(size)
    desc["label_dropout"] = tr["label_dropout"]

    model, wall, last = train_label_conditioned(name, cfg, tr, steps, model_seed, codes, labels)
    n_heldout = spec["heldout"]["rows"]
    inputs, targets = image_heldout(codebook, n_heldout, seed + 1000, size)
    extra = dict(
        data=f"{n_train} procedural {size}x{size} RGB images (numpy default_rng seed {seed}; "
             f"image-ar's generator with every length scaled by {size // IMAGE_SIZE}), "
             f"{len(IMAGE_CLASSES)} classes drawn uniformly: {', '.join(IMAGE_CLASSES)}",
        tokenizer=f"VQ: image-ar's codebook (image-vq.safetensors, K={CODES}, not retrained) over "
                  f"non-overlapping 4x4 RGB patches, a {grid}x{grid} grid",
        vq_mse_per_value=vq_mse,
        vq_codebook_sha256=hashlib.sha256(codebook.numpy().tobytes()).hexdigest(),
        image=desc,
        heldout_set=f"{n_heldout} images from seed {seed + 1000}, label token kept",
    )
    if "data_of" in spec:
        extra["data"] += f" (the training images of {spec['data_of']})"
        extra["heldout_set"] += f" (the held-out set of {spec['data_of']})"
    return model, inputs, targets, wall, last, extra, "image-vq"


def loss_description(rc, js, cfg):
    """What the Jacobi Forcing loss computed, in words (model card)."""
    pc = ("KL(clean logits, detached || noisy logits) at the noisy positions "
          + ("at or after each block's first divergence from its clean copy"
             if rc["pc_positions"] == "from_divergence" else "of every block")
          + ", averaged over those positions"
          + (" and divided by the number of blocks in the batch (batch x blocks)"
             if rc["pc_norm"] == "per_block" else ""))
    ar = ("next-token cross-entropy over the packed clean stream (the prompt, then the clean "
          "blocks: the collected greedy output)" if rc["ar_data"] == "clean_blocks" else
          f"next-token cross-entropy on training-corpus windows (batch {js['ar_batch']} x "
          f"{cfg['max_seq_len']}), not on the packed sequences")
    return f"L_pc + {rc['ar_weight']:g} * L_AR; L_pc = {pc}; L_AR = {ar}"


def train_jacobi_forcing(name, spec, out, steps, seed, corpus, collector=None):
    """Jacobi Forcing fine-tuning of spec["base"] (tools/jacobi_forcing.py): per round, collect
    trajectories with the current model on training-split prompts, pack, train L_pc + w L_AR."""
    import jacobi_forcing as jf
    train_b, held_b, desc = corpus
    cfg, tr, js = spec["config"], spec["train"], spec["jf"]
    base_path = Path(out) / f"{spec['base']}.safetensors"
    if not base_path.exists():
        base_path = DEFAULT_OUT / f"{spec['base']}.safetensors"
    collector = Path(collector or REPO_ROOT / "build" / "examples" /
                     "specula_example_jacobi_trajectories")
    if not collector.exists():
        raise FileNotFoundError(f"{collector}: build it first (cmake --build build --target "
                                "specula_example_jacobi_trajectories) or pass --collector")
    torch.manual_seed(seed)
    model, _ = load_model_from_file(base_path)
    ho = spec["heldout"]
    inputs, targets = text_heldout(held_b, ho["rows"], ho["seq_len"])
    base_nll, _ = evaluate_heldout(model, inputs, targets)
    log(f"{name}: base {base_path.name}, held-out nll {base_nll:.5f}")
    total_steps = sum(r["steps"] for r in js["rounds"])
    g = torch.Generator().manual_seed(seed + 1)
    corpus_batch, _ = text_batches(train_b, dict(seq_len=cfg["max_seq_len"],
                                                 batch=js["ar_batch"]), seed + 2)
    tmp = Path(tempfile.mkdtemp(prefix="specula-jf-"))
    prompts_file = tmp / "train.bin"
    prompts_file.write_bytes(train_b)
    wall, rounds_log, last = 0.0, [], float("nan")
    current = base_path
    rc = jf.recipe(js)
    log(f"{name}: loss recipe {js.get('recipe', 'corpus')}: {rc}")
    curve = []  # the learning curve: step, losses, held-out NLL, Jacobi speed

    def checkpoint_eval(round_index, step_in_round, done_steps, pc, ar):
        path = tmp / "eval-model.safetensors"
        write_safetensors(path, model_tensors(model),
                          {"specula.config": json.dumps(dict(architecture="llama", **cfg)),
                           "specula.name": f"{name}-eval"})
        sp = jf.jacobi_speed(collector, path, tmp / "eval-traj.safetensors", read_safetensors,
                             **js.get("eval", {}))
        sample = sp.pop("first_output")
        nll, _ = evaluate_heldout(model, inputs, targets)
        model.train()
        e = dict(round=round_index + 1, round_step=step_in_round, step=done_steps,
                 l_pc=pc, l_ar=ar, heldout_nll_fp32=nll, **sp)
        curve.append(e)
        log(f"{name} curve: step {done_steps} (round {round_index + 1} step {step_in_round}) "
            f"nll {nll:.5f} Jacobi {sp['tokens_per_forward']:.3f} tokens/forward "
            f"({sp['points_per_block']:.2f} points per block) distinct 4-grams "
            f"{sp['distinct_4grams']:.3f}, in runs of >= 8 {sp['in_runs']:.3f}; first output "
            f"{sample!r}")

    eval_every = js.get("eval_every", 0)
    done = 0
    if eval_every:
        checkpoint_eval(-1, 0, 0, None, None)  # the base model (JSON null: no loss yet)
    for ri, rd in enumerate(js["rounds"]):
        n, w = rd["block"], rd["window"]
        N = js["new_tokens"] // n
        r_steps = max(1, round(steps * rd["steps"] / total_steps))
        traj_path = tmp / f"round{ri + 1}.safetensors"
        t0 = time.time()
        jf.collect(collector, current, prompts_file, rd["prompts"], js["prompt_bytes"], n,
                   js["new_tokens"], traj_path, log)
        traj, _ = jf.read_trajectories(traj_path, read_safetensors)
        seqs, positions, P, L, fracs, keep = jf.pack_round(traj, N, n, w, rc["pc_positions"])
        points_per_block = (len(traj["points"]) / len(traj["block_prompt"]))
        mask = jf.packed_mask(P, N, n, js["mask"], w)
        log(f"{name} round {ri + 1}: n {n}, w {w}, {len(seqs)} packed sequences of {L} slots "
            f"(prompt {P}, {N} blocks), {points_per_block:.2f} trajectory points per block; "
            f"mean noisy fraction per window position "
            f"{[round(float(fracs[:, j::w].mean()), 3) for j in range(min(w, N))]}; "
            f"consistency positions kept {float(keep.float().mean()):.3f}")
        stats = dict(pc=[], ar=[])

        def loss_fn(step):
            if eval_every and step and step % eval_every == 0:
                tail = stats["pc"][-eval_every:]
                checkpoint_eval(ri, step, done + step, float(np.mean(tail)),
                                float(np.mean(stats["ar"][-eval_every:])))
            idx = torch.randint(0, len(seqs), (tr["batch"],), generator=g)
            l_pc, l_ar = jf.jf_losses(model, seqs[idx], positions, mask, P, N, n, keep[idx],
                                      rc["pc_norm"])
            if rc["ar_data"] == "corpus":  # the pretraining objective on training-split text
                wnd = corpus_batch()
                lg = model(wnd[:, :-1])
                l_ar = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), wnd[:, 1:].reshape(-1))
            elif rc["ar_data"] != "clean_blocks":
                raise ValueError(f"ar_data {rc['ar_data']!r}: expected 'corpus' or 'clean_blocks'")
            stats["pc"].append(float(l_pc.detach()))
            stats["ar"].append(float(l_ar.detach()))
            return l_pc + rc["ar_weight"] * l_ar

        r_wall, last = train_loop(model, tr, r_steps, loss_fn, f"{name} round {ri + 1}")
        done += r_steps
        tail = max(1, r_steps // 10)
        if eval_every:
            since = r_steps % eval_every or eval_every
            checkpoint_eval(ri, r_steps, done, float(np.mean(stats["pc"][-since:])),
                            float(np.mean(stats["ar"][-since:])))
        nll, _ = evaluate_heldout(model, inputs, targets)
        rounds_log.append(dict(
            block_size=n, window=w, blocks=N, prompts=len(seqs), prompt_bytes=js["prompt_bytes"],
            new_tokens=js["new_tokens"], steps=r_steps,
            trajectory_points_per_block=round(points_per_block, 3),
            collected_with=current.name if ri else base_path.name,
            consistency_positions_kept=round(float(keep.float().mean()), 4),
            final_l_pc=float(np.mean(stats["pc"][-tail:])),
            final_l_ar=float(np.mean(stats["ar"][-tail:])),
            heldout_nll_fp32=nll, wall_seconds=round(time.time() - t0, 1)))
        log(f"{name} round {ri + 1}: L_pc {rounds_log[-1]['final_l_pc']:.4f} L_AR "
            f"{rounds_log[-1]['final_l_ar']:.4f}, held-out nll {nll:.5f} (base {base_nll:.5f})")
        wall += time.time() - t0
        # Every round's model is kept next to the output (git-ignored): the next round collects
        # with it, and it can be evaluated on its own (docs/jacobi_forcing.md).
        current = Path(out) / f"{name}.round{ri + 1}.safetensors"
        write_safetensors(current, model_tensors(model),
                          {"specula.config": json.dumps(dict(architecture="llama", **cfg)),
                           "specula.name": f"{name}-round{ri + 1}"})
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    extra = dict(
        corpus=desc, tokenizer="bytes (token id = byte value 0..255, no special tokens)",
        heldout_set=f"text-target's: {ho['rows']} windows of {ho['seq_len']} bytes at evenly "
                    "spaced offsets of the held-out stream",
        heldout_of=spec["base"], base_model=spec["base"], base_heldout_nll=base_nll,
        jacobi_forcing=dict(
            js, rounds=rounds_log,
            prompts_from="the training split (the corpus minus the held-out files): K windows of "
                         "prompt_bytes bytes at evenly spaced offsets",
            noisy_views="released data preparation: t_b = linspace(0, 1, w)[b mod w], noise = "
                        "(n - first mismatch) / n, the nearest point (ties: earliest)",
            recipe=js.get("recipe", "corpus"), loss_settings=rc, learning_curve=curve,
            loss=loss_description(rc, js, cfg),
            collector="examples/jacobi_trajectories.cpp (block-mode greedy Jacobi, guesses "
                      "initialised from the context)"),
    )
    return model, inputs, targets, wall, last, extra, "bytes"


TRAINERS = {"text": train_text, "diffusion": train_diffusion, "image": train_image,
            "jacobi_forcing": train_jacobi_forcing}


# --------------------------------------------------------------------------------------------
# Output: weights, held-out set, card.
# --------------------------------------------------------------------------------------------

def ship(name, spec, out, model, inputs, targets, steps, wall, last_loss, extra, tokenizer,
         seed, command):
    out = Path(out)
    cfg = dict(architecture="llama", **spec["config"])
    meta = {"specula.config": json.dumps(cfg), "specula.name": name,
            "specula.tokenizer": tokenizer}
    if "image" in extra:
        meta["specula.image"] = json.dumps(extra["image"])
    wpath = out / f"{name}.safetensors"
    write_safetensors(wpath, model_tensors(model), meta)
    if "heldout_of" in extra:  # the base model's held-out set, not written again
        hpath = out / f"{extra['heldout_of']}.heldout.safetensors"
        if not hpath.exists():
            hpath = DEFAULT_OUT / hpath.name
    else:
        hpath = out / f"{name}.heldout.safetensors"
        write_safetensors(hpath, {"inputs": ("I32", inputs), "targets": ("I32", targets)},
                          {"specula.name": f"{name}.heldout"})

    # Metrics of the weights as shipped: read both files back and evaluate in fp32.
    shipped, _ = load_model_from_file(wpath)
    ht, _ = read_safetensors(hpath)
    t0 = time.time()
    nll, count = evaluate_heldout(shipped, ht["inputs"], ht["targets"])
    fp32_nll, _ = evaluate_heldout(model, ht["inputs"], ht["targets"])
    log(f"{name}: held-out nll {nll:.5f} ppl {math.exp(nll):.4f} over {count} tokens "
        f"(unrounded fp32 weights: nll {fp32_nll:.5f}; eval {time.time() - t0:.1f}s)")

    card = dict(
        name=name, parameters=model.n_params(), heldout_nll=nll, heldout_ppl=math.exp(nll),
        heldout_tokens=count, heldout_rows=int(inputs.shape[0]),
        heldout_seq_len=int(inputs.shape[1]),
        heldout_nll_unrounded_fp32=fp32_nll, train_steps=steps, seed=seed,
        config=cfg,
        training=dict(spec["train"], optimizer="AdamW(betas=(0.9, 0.95), eps=1e-8), grad-norm "
                      "clip 1.0, weight decay on matrices only", schedule="linear warmup then "
                      "cosine decay to min_lr_frac * lr", steps=steps,
                      final_train_loss=last_loss),
        train_wall_seconds=round(wall, 1),
        weights_file=wpath.name, weights_bytes=wpath.stat().st_size,
        weights_dtype="BF16 (RMSNorm weights F32)",
        heldout_file=hpath.name,
        metric_definition="mean over entries with targets >= 0 of -log softmax(logits)[target], "
                          "nats; weights read back from the bf16 file, forward in float32, sum "
                          "in float64",
        environment=dict(torch=torch.__version__, numpy=np.__version__,
                         python=platform.python_version(), threads=torch.get_num_threads(),
                         machine=platform.machine()),
        reproduce=command,
        **extra,
    )
    (out / f"{name}.card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown_card(card))
    return card


REFERENCE_TOKENS = 32


@torch.no_grad()
def write_reference_logits(name, out):
    """<name>.reference.safetensors: I32 `tokens` [T] (the first T tokens of the first held-out
    row) and F32 `logits` [T, V], this script's forward pass on the weights as shipped (read back
    from the bf16 file, computed in float32): what a conforming engine must reproduce."""
    out = Path(out)
    model, _ = load_model_from_file(out / f"{name}.safetensors")
    card = json.loads((out / f"{name}.card.json").read_text())
    hpath = out / card["heldout_file"]
    if not hpath.exists():
        hpath = DEFAULT_OUT / hpath.name
    held, _ = read_safetensors(hpath)
    tokens = held["inputs"][0, :REFERENCE_TOKENS].astype(np.int32)
    model.eval()
    logits = model(torch.from_numpy(tokens).long()[None])[0].float().numpy()
    path = out / f"{name}.reference.safetensors"
    write_safetensors(path, {"tokens": ("I32", tokens), "logits": ("F32", logits)},
                      {"specula.name": f"{name}.reference", "specula.source": hpath.name + " row 0",
                       "specula.forward": "tools/train_models.py Llama.forward, float32, torch "
                                          + torch.__version__})
    log(f"{name}: reference logits of {len(tokens)} tokens -> {path.name}")
    return path


def curve_table(curve, ev, title):
    """Markdown lines of a Jacobi Forcing learning curve (train_jacobi_forcing's records)."""
    lines = ["", f"{title}: held-out NLL and greedy block-mode Jacobi decoding (blocks of "
             f"{ev.get('n', 16)}, guesses drawn from the context) of {ev.get('prompts', 24)} "
             f"held-out prompts of {ev.get('prompt_bytes', 32)} bytes, "
             f"{ev.get('new_tokens', 112)} new tokens each (step 0: the base model; L_pc, L_AR: "
             "means since the previous row):", "",
             "| step | round | L_pc | L_AR | held-out NLL (fp32) | points per block | "
             "Jacobi tokens / forward | distinct 4-grams of the output | output in runs of >= 8 "
             "equal bytes |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for e in curve:
        pc, ar = (f"{e[k]:.4f}" if e[k] is not None and e[k] == e[k] else ""
                  for k in ("l_pc", "l_ar"))
        runs = f"{e['in_runs']:.3f}" if "in_runs" in e else ""  # not recorded before 2026-11-27
        lines.append(f"| {e['step']} | {e['round']} | {pc} | {ar} | "
                     f"{e['heldout_nll_fp32']:.4f} | {e['points_per_block']:.2f} | "
                     f"{e['tokens_per_forward']:.3f} | {e['distinct_4grams']:.3f} | {runs} |")
    return lines


def markdown_card(c):
    cfg = c["config"]
    lines = [f"# {c['name']}", ""]
    what = {"text-target": "Byte-level causal language model over Python source code (the "
                           "target model of the speculative-decoding examples).",
            "text-draft": "Byte-level causal language model over Python source code, about 20x "
                          "smaller than text-target (its draft model).",
            "text-diffusion": "Byte-level bidirectional masked-diffusion language model "
                              "(LLaDA-style) over Python source code.",
            "image-ar": "Class-conditional autoregressive model over VQ tokens of procedural "
                        "32x32 images (classifier-free guidance via a null label).",
            "image-ar-256": "Class-conditional autoregressive model over VQ tokens of procedural "
                            "64x64 images, a 16x16 grid of image-ar's 4x4 patch codes "
                            "(classifier-free guidance via a null label).",
            "image-draft": "Class-conditional autoregressive model over the same VQ tokens as "
                           "image-ar-256, about 13x smaller (its draft model; trained with the "
                           "same null-label dropout, so it can be guided too).",
            "text-target-xl": "Byte-level causal language model over Python source code, "
                              "6.7x text-target's size (18.4 M parameters, 70 MiB as fp32): a "
                              "target whose weights stream from DRAM on a CPU, where "
                              "speculative decoding pays. Grown from text-target.",
            "text-target-jf": "text-target fine-tuned with Jacobi Forcing (progressive "
                              "consistency distillation on its own Jacobi trajectories, "
                              "arXiv 2512.14681; docs/jacobi_forcing.md): the same architecture "
                              "and tokenizer, for Jacobi and multi-block decoding."}
    lines += [what.get(c["name"], ""), "",
              "Format: see `docs/model_format.md`. Trained by `tools/train_models.py`.", "",
              "## Size", "",
              f"- parameters: {c['parameters']:,}",
              f"- weights: `{c['weights_file']}` ({c['weights_bytes']:,} bytes, "
              f"{c['weights_dtype']})",
              f"- architecture: llama, vocab {cfg['vocab_size']}, d_model {cfg['d_model']}, "
              f"{cfg['n_layers']} layers, {cfg['n_heads']} heads / {cfg['n_kv_heads']} kv heads, "
              f"d_ff {cfg['d_ff']}, max_seq_len {cfg['max_seq_len']}, rope_theta "
              f"{cfg['rope_theta']}, norm_eps {cfg['norm_eps']}, causal "
              f"{str(cfg['causal']).lower()}, mask_token {cfg['mask_token']}", "",
              "## Data", ""]
    if "corpus" in c:
        d = c["corpus"]
        lines += [f"- source: {d['source']} of Python {d['python_version']}, excluding "
                  f"directories {', '.join(d['excluded_directories'])}",
                  f"- {d['files']} files: {d['train_files']} train ({d['train_bytes']:,} bytes),"
                  f" {d['heldout_files']} held out ({d['heldout_bytes']:,} bytes)",
                  f"- split: {d['split']}",
                  f"- tokenizer: {c['tokenizer']}"]
        if "objective" in c:
            lines.append(f"- objective: {c['objective']}")
    else:
        lines += [f"- {c['data']}", f"- tokenizer: {c['tokenizer']}",
                  f"- VQ reconstruction MSE per value: {c['vq_mse_per_value']:.5f}",
                  f"- sequence: {c['image']['sequence']}; label tokens "
                  f"{c['image']['label_token_base']}..{c['image']['label_token_base'] + 7} in "
                  f"class order ({', '.join(c['image']['classes'])}), null label "
                  f"{c['image']['null_label_token']} (label dropout "
                  f"{c['image']['label_dropout']:.0%} in training)",
                  f"- image layout (also in the `specula.image` metadata): "
                  f"{c['image']['patch_layout']}, {c['image']['token_order']}"]
    tr = c["training"]
    if "growth" in c:
        lines += ["", "## Growth from the base model", "",
                  f"- base model: `{c['base_model']}` (held-out NLL {c['base_heldout_nll']:.4f}"
                  f"); this model: {c['heldout_nll']:.4f} "
                  f"({100 * (c['heldout_nll'] / c['base_heldout_nll'] - 1):+.2f} %)",
                  f"- {c['growth']}",
                  "- trained: " + ("only the new entries (the gradients of the entries copied "
                                   "from the base model are masked to 0, no weight decay), so "
                                   "the base model is a sub-network of this one"
                                   if c.get("base_frozen") else "every parameter"),
                  "", "| step | training loss | held-out NLL (fp32 weights) | wall s |",
                  "| ---: | ---: | ---: | ---: |"]
        for h in c.get("heldout_nll_during_training", []):
            lines.append(f"| {h['step']} | {h['loss']:.4f} | "
                         f"{h.get('heldout_nll_fp32', float('nan')):.4f} | {h['wall']:.0f} |")
    if "jacobi_forcing" in c:
        js = c["jacobi_forcing"]
        lines += ["", "## Jacobi Forcing", "",
                  f"- base model: `{c['base_model']}` (held-out NLL {c['base_heldout_nll']:.4f}"
                  f"); this model: {c['heldout_nll']:.4f} "
                  f"({100 * (c['heldout_nll'] / c['base_heldout_nll'] - 1):+.2f} %)",
                  f"- prompts: {js['prompts_from']}; {js['new_tokens']} new tokens each "
                  "(greedy), blocks tiling prompt's last byte + output",
                  f"- trajectories: {js['collector']}",
                  f"- noisy views: {js['noisy_views']}",
                  f"- mask: {js['mask']} (noise-conditioned, Fig. 2b)" if js["mask"] == "nc"
                  else f"- mask: {js['mask']}",
                  f"- loss (recipe `{js.get('recipe', 'corpus')}`, tools/jacobi_forcing.py): "
                  f"{js['loss']}", "",
                  "| round | block n | window w | blocks | prompts | steps | collected with | "
                  "points per block | L_pc | L_AR | held-out NLL (fp32) | wall s |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: "
                  "| ---: |"]
        for i, r in enumerate(js["rounds"]):
            lines.append(f"| {i + 1} | {r['block_size']} | {r['window']} | {r['blocks']} | "
                         f"{r['prompts']} | {r['steps']} | {r['collected_with']} | "
                         f"{r['trajectory_points_per_block']:.2f} | {r['final_l_pc']:.4f} | "
                         f"{r['final_l_ar']:.4f} | {r['heldout_nll_fp32']:.4f} | "
                         f"{r['wall_seconds']:.0f} |")
        if js.get("learning_curve"):
            lines += curve_table(js["learning_curve"], js.get("eval", {}), "Learning curve")
        for run in js.get("other_runs", []):  # runs measured against this model, not shipped
            lines += ["", f"### {run['title']}", "", run["summary"], "", f"`{run['command']}`"]
            lines += curve_table(run["learning_curve"], js.get("eval", {}), "Its learning curve")
    lines += ["", "## Training", "",
              f"- {c['train_steps']} steps, batch {tr['batch']} x {tr['seq_len']} tokens, "
              f"AdamW lr {tr['lr']} (warmup {tr['warmup']}, cosine to {tr['min_lr_frac']} x), "
              f"weight decay {tr['weight_decay']}, grad clip 1.0"
              + ("".join(f"; trained as a {n}-step run, whose checkpoint was then continued under"
                         " the longer schedule" for n in tr.get("stages", []))),
              f"- seed {c['seed']}; {c['train_wall_seconds']:.0f} s wall on "
              f"{c['environment']['threads']} CPU threads (torch {c['environment']['torch']})",
              f"- final training loss (mean of the last logging window): "
              f"{tr['final_train_loss']:.4f}", "",
              "## Held-out evaluation", "",
              f"- set: `{c['heldout_file']}` — {c['heldout_set']}",
              f"- {c['heldout_tokens']:,} target tokens ({c['heldout_rows']} rows of "
              f"{c['heldout_seq_len']} tokens; "
              + ("the last column has no target)" if cfg["causal"] else "masked positions only)"),
              f"- NLL **{c['heldout_nll']:.4f}** nats/token, perplexity "
              f"**{c['heldout_ppl']:.4f}** (weights as shipped; fp32 weights before bf16 "
              f"rounding: NLL {c['heldout_nll_unrounded_fp32']:.4f})",
              f"- metric: {c['metric_definition']}", "",
              "## Reproduce", "", "```sh", c["reproduce"], "```", ""]
    return "\n".join(lines)


def write_readme(out):
    out = Path(out)
    cards = [json.loads(p.read_text()) for p in sorted(out.glob("*.card.json"))]
    lines = ["# Example models", "",
             "Tiny models for the example transformer backend (`examples/transformer/`), in the "
             "format of `docs/model_format.md`, trained on CPU by `tools/train_models.py`:", "",
             "```sh", "nice -n 10 /usr/bin/python3 tools/train_models.py   # all the models",
             "```", "",
             "| model | parameters | steps | held-out NLL | held-out ppl | files |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for c in cards:
        n = c["name"]
        lines.append(f"| {n} | {c['parameters']:,} | {c['train_steps']} | "
                     f"{c['heldout_nll']:.4f} | {c['heldout_ppl']:.4f} | `{n}.safetensors`, "
                     f"`{c['heldout_file']}`, `{n}.card.json`, `{n}.md` |")
    lines += ["", "Files:", "",
              "- `<name>.safetensors`: weights (BF16, RMSNorm weights F32) and the "
              "`specula.config` metadata",
              "- `<name>.heldout.safetensors`: I32 `inputs`/`targets` [N, T]; the card's "
              "`heldout_nll` is the mean NLL over entries with `targets >= 0`",
              "- `<name>.card.json` / `<name>.md`: model cards (data, size, training, held-out "
              "metrics, how to reproduce)"]
    if (out / "image-vq.safetensors").exists():
        lines.append("- `image-vq.safetensors`: the VQ codebook of `image-ar` (`codebook` F32 "
                     "[128, 48]: 4x4 RGB patches flattened in (row, col, channel) order, "
                     "pixels in [0, 1]); metadata `specula.image` describes the layout, "
                     "classes and label tokens")
        lines.append("- `image-ar-256` uses the same codebook, classes and label tokens for "
                     "64x64 images (a 16x16 grid); the `specula.image` metadata of its "
                     "weights file gives its layout")
        lines.append("- `image-draft` is `image-ar-256`'s draft model: the same images, tokens "
                     "and held-out set, about 13x fewer parameters")
    lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=list(MODELS),
                    help="train only this model (repeatable)")
    ap.add_argument("--steps-scale", type=float, default=1.0,
                    help="multiply every step count (e.g. 0.005 for a smoke run)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output directory")
    # One thread by default: on a 2-core machine shared with other work (e.g. a C++ build), two
    # OpenMP threads under `nice` stall on each other and ran 4-10x slower than one.
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--collector", default=None,
                    help="the trajectory collector for text-target-jf (default: build/examples/"
                         "specula_example_jacobi_trajectories)")
    ap.add_argument("--checkpoint-every", type=int, default=None,
                    help="text models: write <out>/<name>.ckpt.pt (model, optimizer, RNG state) "
                         "every this many steps and resume from it when present (default: 8 for "
                         "text-target-xl, none otherwise; 0 disables)")
    ap.add_argument("--reference-only", action="store_true",
                    help="only write <name>.reference.safetensors of the shipped --only models")
    ap.add_argument("--rewrite-cards", action="store_true",
                    help="only rewrite the markdown cards of --only (default: all) from their "
                         ".card.json and the README; no training")
    ap.add_argument("--jf-recipe", choices=["released", "corpus", "anchored"], default=None,
                    help="text-target-jf: the loss recipe (tools/jacobi_forcing.py RECIPES; "
                         "default: the spec's)")
    ap.add_argument("--jf-rounds", type=int, default=None,
                    help="text-target-jf: train only the first K rounds of the spec")
    ap.add_argument("--jf-round-steps", default=None,
                    help="text-target-jf: comma-separated steps of each round (replaces the "
                         "spec's; --steps-scale still applies)")
    ap.add_argument("--jf-prompts", type=int, default=None,
                    help="text-target-jf: prompts (trajectories) per round (default: the spec's)")
    ap.add_argument("--jf-eval-every", type=int, default=None,
                    help="text-target-jf: learning-curve point (held-out NLL, Jacobi speed) every "
                         "this many steps of a round and at each round's end (0: none)")
    ap.add_argument("--jf-lr", type=float, default=None,
                    help="text-target-jf: peak learning rate of every round (default: the spec's)")
    ap.add_argument("--jf-ar-weight", type=float, default=None,
                    help="text-target-jf: the AR term's weight w in L_pc + w L_AR (default: the "
                         "recipe's)")
    ap.add_argument("--jf-mask", choices=["nc", "nc_ic", "cllm"], default=None,
                    help="text-target-jf: the packed attention mask (Table 5 of the paper: nc "
                         "noise-conditioned, nc_ic intra-window clean, cllm clean-conditioned; "
                         "default: the spec's)")
    args = ap.parse_args()
    jf_spec = MODELS["text-target-jf"]
    js = dict(jf_spec["jf"], rounds=[dict(r) for r in jf_spec["jf"]["rounds"]])
    if args.jf_recipe:
        js["recipe"] = args.jf_recipe
    if args.jf_rounds:
        js["rounds"] = js["rounds"][:args.jf_rounds]
    if args.jf_round_steps:
        for r, k in zip(js["rounds"], args.jf_round_steps.split(",")):
            r["steps"] = int(k)
    if args.jf_eval_every is not None:
        js["eval_every"] = args.jf_eval_every
    if args.jf_prompts:
        for r in js["rounds"]:
            r["prompts"] = args.jf_prompts
    if args.jf_mask:
        js["mask"] = args.jf_mask
    if args.jf_ar_weight is not None:
        js["ar_weight"] = args.jf_ar_weight
    MODELS["text-target-jf"] = dict(jf_spec, jf=js, train=dict(
        jf_spec["train"], steps=sum(r["steps"] for r in js["rounds"]),
        **({"lr": args.jf_lr} if args.jf_lr is not None else {})))
    if args.rewrite_cards:
        for name in args.only or list(MODELS):
            card = Path(args.out) / f"{name}.card.json"
            if card.exists():
                (Path(args.out) / f"{name}.md").write_text(markdown_card(json.loads(card.read_text())))
        write_readme(args.out)
        return 0

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    if args.reference_only:
        for name in args.only or [n for n in MODELS if MODELS[n].get("reference")]:
            write_reference_logits(name, args.out)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(MODELS)
    command = "nice -n 10 /usr/bin/python3 tools/train_models.py"
    if args.only:
        command += "".join(f" --only {n}" for n in args.only)
    if args.steps_scale != 1.0:
        command += f" --steps-scale {args.steps_scale}"
    if args.seed != SEED:
        command += f" --seed {args.seed}"
    if args.threads != 1:
        command += f" --threads {args.threads}"
    if args.collector:
        command += f" --collector {args.collector}"
    for flag in ("jf_recipe", "jf_rounds", "jf_round_steps", "jf_prompts", "jf_eval_every",
                 "jf_lr", "jf_mask", "jf_ar_weight"):
        if getattr(args, flag) is not None:
            command += f" --{flag.replace('_', '-')} {getattr(args, flag)}"
    log(f"torch {torch.__version__}, numpy {np.__version__}, {args.threads} threads; "
        f"training {', '.join(names)} into {out}")

    corpus = None
    if any(MODELS[n]["kind"] in ("text", "diffusion", "jacobi_forcing") for n in names):
        corpus = load_text_corpus()
        d = corpus[2]
        log(f"corpus: Python {d['python_version']}, {d['files']} files, train {d['train_bytes']:,}"
            f" bytes ({d['train_files']} files), held-out {d['heldout_bytes']:,} bytes "
            f"({d['heldout_files']} files)")
    t_all = time.time()
    for i, name in enumerate(names):
        spec = MODELS[name]
        steps = max(1, round(spec["train"]["steps"] * args.steps_scale))
        seed = args.seed + 100 * list(MODELS).index(name)
        if "data_of" in spec:  # trained on another model's data: that model's seed for it
            spec = dict(spec, data_seed=args.seed + 100 * list(MODELS).index(spec["data_of"]))
        log(f"=== {name}: {steps} steps, seed {seed}")
        trainer = TRAINERS[spec["kind"]]
        if spec["kind"] == "jacobi_forcing":
            trainer = functools.partial(trainer, collector=args.collector)
        if spec["kind"] == "text":
            every = args.checkpoint_every
            if every is None:
                every = 8 if "grow_from" in spec else 0
            trainer = functools.partial(trainer, checkpoint_every=every)
        model, inputs, targets, wall, last, extra, tok = trainer(
            name, spec, out, steps, seed, corpus)
        ship(name, spec, out, model, inputs, targets, steps, wall, last, extra, tok, seed,
             command)
        if spec.get("reference"):
            write_reference_logits(name, out)
    write_readme(out)
    log(f"all done in {time.time() - t_all:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
