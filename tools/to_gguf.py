#!/usr/bin/env python3
"""Convert specula's llama-style model files (docs/model_format.md) to GGUF for llama.cpp.

    python3 tools/to_gguf.py MODEL.safetensors OUT.gguf          one model
    python3 tools/to_gguf.py --all OUT_DIR                         every shipped causal model
    python3 tools/to_gguf.py --check MODEL.safetensors OUT.gguf    round trip: read OUT.gguf back
                                                                   and compare with the model
    python3 tools/to_gguf.py --toy OUT_DIR                         two random tiny models
                                                                   (toy-target, toy-draft; V = 4)
                                                                   as safetensors and GGUF, for
                                                                   exact-law tests over llama.cpp

Needs numpy and the `gguf` package (PyPI, the llama.cpp project's own GGUF reader/writer).

What it writes (llama.cpp architecture `llama`):
- every weight as F32 (the shipped files hold BF16, so this is exact); llama.cpp then computes in
  F32 like specula's example backend (examples/llama_cpp/llama_model.hpp lists the other
  settings exactness needs);
- tensor names token_embd, output_norm, output, blk.i.attn_{norm,q,k,v,output},
  blk.i.ffn_{norm,gate,up,down} (w1 = gate, w3 = up, w2 = down);
- q and k rows permuted: specula's RoPE rotates the two halves of each head (HF layout), llama.cpp's
  `llama` rotates adjacent pairs, so row (h, i, j) of a head (i: half, j < head_dim / 2) moves to
  (h, j, i), the permutation of llama.cpp's convert_hf_to_gguf.py (exact: a reordering of rows);
- tokenizer.ggml.model = "none" with llama.vocab_size = the model's vocabulary: token ids are fed
  directly (bytes for the text models, codebook indices for the image models); llama.cpp's
  tokenizer must never be called on such a file.

`--tokenizer bytes` writes a byte-level BPE vocabulary instead (the 256 bytes in GPT-2's
byte-to-unicode spelling, token id = byte value, no merges that apply to text, no BOS): llama.cpp's own tools (its
speculative example, which tokenizes a text prompt) then see the same byte ids. The logits do not
depend on the tokenizer.

Bidirectional models (text-diffusion, causal = false) are not converted: llama.cpp's `llama`
architecture is causal.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import struct
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"


def read_safetensors(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Metadata and tensors (as float32, or int32 for I32) of a safetensors file."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = memoryview(data)[8 + n :]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        raw = body[b:e]
        if t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif t["dtype"] == "I32":
            a = np.frombuffer(raw, dtype="<i4").astype(np.int32)
        else:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {t['dtype']}")
        out[name] = a.reshape(t["shape"])
    return meta, out


def permute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rotate-half (HF) q/k rows to llama.cpp's adjacent-pair order (convert_hf_to_gguf.py)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of permute_rope."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_map(cfg: dict) -> list[tuple[str, str, int | None]]:
    """(specula name, GGUF name, heads to permute by or None) for every tensor."""
    m = [("tok_embeddings.weight", "token_embd.weight", None)]
    for i in range(cfg["n_layers"]):
        p, q = f"layers.{i}.", f"blk.{i}."
        m += [
            (p + "attention_norm.weight", q + "attn_norm.weight", None),
            (p + "attention.wq.weight", q + "attn_q.weight", cfg["n_heads"]),
            (p + "attention.wk.weight", q + "attn_k.weight", cfg["n_kv_heads"]),
            (p + "attention.wv.weight", q + "attn_v.weight", None),
            (p + "attention.wo.weight", q + "attn_output.weight", None),
            (p + "ffn_norm.weight", q + "ffn_norm.weight", None),
            (p + "feed_forward.w1.weight", q + "ffn_gate.weight", None),
            (p + "feed_forward.w3.weight", q + "ffn_up.weight", None),
            (p + "feed_forward.w2.weight", q + "ffn_down.weight", None),
        ]
    m += [("norm.weight", "output_norm.weight", None), ("output.weight", "output.weight", None)]
    return m


def model_config(meta: dict, path: pathlib.Path) -> dict:
    if "specula.config" not in meta:
        raise ValueError(f"{path}: no 'specula.config' metadata (not a specula model file)")
    cfg = json.loads(meta["specula.config"])
    if cfg.get("architecture") != "llama":
        raise ValueError(f"{path}: architecture '{cfg.get('architecture')}' is not 'llama'")
    if not cfg["causal"]:
        raise ValueError(f"{path}: a bidirectional model (causal = false) has no llama.cpp equivalent")
    return cfg


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode spelling of bytes 0..255 (token id = byte value)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
    bs += list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    spelling = dict(zip(bs, cs))
    return [chr(spelling[b]) for b in range(256)]


def convert(src: pathlib.Path, dst: pathlib.Path, tokenizer: str = "none") -> dict:
    import gguf

    meta, tensors = read_safetensors(src)
    cfg = model_config(meta, src)
    name = meta.get("specula.name", src.stem)
    head_dim = cfg["d_model"] // cfg["n_heads"]
    w = gguf.GGUFWriter(str(dst), "llama")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg["max_seq_len"])
    w.add_embedding_length(cfg["d_model"])
    w.add_block_count(cfg["n_layers"])
    w.add_feed_forward_length(cfg["d_ff"])
    w.add_head_count(cfg["n_heads"])
    w.add_head_count_kv(cfg["n_kv_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if tokenizer == "bytes":
        if cfg["vocab_size"] != 256:
            raise ValueError(f"{src}: --tokenizer bytes needs a byte vocabulary (256 tokens)")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(byte_tokens())
        w.add_token_types([gguf.TokenType.NORMAL] * 256)
        # llama.cpp requires a merge list; one between bytes 0x00 and 0x01 never applies to text.
        w.add_token_merges([byte_tokens()[0] + " " + byte_tokens()[1]])
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
    else:
        w.add_tokenizer_model("none")
    w.add_string("specula.config", meta["specula.config"])
    for s, g, heads in tensor_map(cfg):
        a = np.ascontiguousarray(tensors[s], dtype=np.float32)
        if heads is not None:
            a = permute_rope(a, heads)
        w.add_tensor(g, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg


def check(src: pathlib.Path, dst: pathlib.Path, tokenizer: str = "none") -> None:
    """Reads dst back with gguf's reader: same metadata, and every tensor (permutation undone)
    bit-identical to src's."""
    import gguf

    meta, tensors = read_safetensors(src)
    cfg = model_config(meta, src)
    r = gguf.GGUFReader(str(dst))

    def field(key):
        f = r.get_field(key)
        if f is None:
            raise AssertionError(f"{dst}: no metadata '{key}'")
        return f.contents()

    expect = {
        "general.architecture": "llama",
        "llama.vocab_size": cfg["vocab_size"],
        "llama.embedding_length": cfg["d_model"],
        "llama.block_count": cfg["n_layers"],
        "llama.feed_forward_length": cfg["d_ff"],
        "llama.attention.head_count": cfg["n_heads"],
        "llama.attention.head_count_kv": cfg["n_kv_heads"],
        "llama.rope.dimension_count": cfg["d_model"] // cfg["n_heads"],
        "llama.context_length": cfg["max_seq_len"],
        "tokenizer.ggml.model": "gpt2" if tokenizer == "bytes" else "none",
    }
    for k, v in expect.items():
        if field(k) != v:
            raise AssertionError(f"{dst}: {k} = {field(k)!r}, expected {v!r}")
    for k, v in (("llama.rope.freq_base", cfg["rope_theta"]),
                 ("llama.attention.layer_norm_rms_epsilon", cfg["norm_eps"])):
        if abs(field(k) - v) > 1e-6 * abs(v):
            raise AssertionError(f"{dst}: {k} = {field(k)!r}, expected {v!r}")
    by_name = {t.name: t for t in r.tensors}
    mapping = tensor_map(cfg)
    if set(by_name) != {g for _, g, _ in mapping}:
        raise AssertionError(f"{dst}: tensor names {sorted(by_name)} differ from the expected set")
    for s, g, heads in mapping:
        t = by_name[g]
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise AssertionError(f"{dst}: {g} is {t.tensor_type.name}, expected F32")
        a = np.asarray(t.data, dtype=np.float32).reshape(tensors[s].shape)
        if heads is not None:
            a = unpermute_rope(a, heads)
        if not np.array_equal(a, tensors[s]):
            raise AssertionError(f"{dst}: {g} differs from {src}:{s}")


def write_safetensors(path: pathlib.Path, meta: dict, tensors: dict[str, np.ndarray]) -> None:
    """A specula model file (docs/model_format.md) with F32 tensors."""
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def toy_model(seed: int, base: dict[str, np.ndarray] | None = None, mix: float = 0.0):
    """A random tiny llama (V = 4, one layer, two heads of 8, GQA 2:1) with peaked rows; with
    `base`, the base's weights mixed with fresh ones ((1 - mix) * base + mix * fresh)."""
    cfg = {"architecture": "llama", "vocab_size": 4, "d_model": 16, "n_layers": 1, "n_heads": 2,
           "n_kv_heads": 1, "d_ff": 32, "max_seq_len": 64, "rope_theta": 10000.0,
           "norm_eps": 1e-5, "causal": True, "mask_token": -1}
    rng = np.random.default_rng(seed)
    d, f, v, hd = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"], 8
    shapes = {"tok_embeddings.weight": (v, d), "layers.0.attention_norm.weight": (d,),
              "layers.0.attention.wq.weight": (2 * hd, d), "layers.0.attention.wk.weight": (hd, d),
              "layers.0.attention.wv.weight": (hd, d), "layers.0.attention.wo.weight": (d, 2 * hd),
              "layers.0.ffn_norm.weight": (d,), "layers.0.feed_forward.w1.weight": (f, d),
              "layers.0.feed_forward.w3.weight": (f, d), "layers.0.feed_forward.w2.weight": (d, f),
              "norm.weight": (d,), "output.weight": (v, d)}
    t = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
            if name == "output.weight":
                a *= 2.0  # rows far from uniform, so that a biased sampler is detectable
        if base is not None:
            a = (1.0 - mix) * base[name] + mix * a
        t[name] = a.astype(np.float32)
    return cfg, t


def write_toys(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cfg, target = toy_model(35)
    _, draft = toy_model(36, target, 0.6)
    for name, t in (("toy-target", target), ("toy-draft", draft)):
        src = out / f"{name}.safetensors"
        write_safetensors(src, {"specula.config": json.dumps(cfg), "specula.name": name}, t)
        convert(src, out / f"{name}.gguf")
        check(src, out / f"{name}.gguf")
        print(f"{name}: {src} and {name}.gguf")


def shipped() -> list[pathlib.Path]:
    """Every shipped model file that converts (llama-style and causal)."""
    out = []
    for card in sorted(MODELS.glob("*.card.json")):
        c = json.loads(card.read_text())
        if c.get("config", {}).get("architecture") == "llama" and c["config"].get("causal"):
            out.append(MODELS / c["weights_file"])
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", metavar="OUT_DIR", help="convert every shipped causal model into OUT_DIR")
    ap.add_argument("--toy", metavar="OUT_DIR", help="write the toy models into OUT_DIR")
    ap.add_argument("--check", action="store_true", help="verify OUT.gguf against MODEL instead")
    ap.add_argument("--tokenizer", choices=("none", "bytes"), default="none",
                    help="none (default: ids fed directly) or bytes (byte-level BPE, see above)")
    ap.add_argument("paths", nargs="*", help="MODEL.safetensors OUT.gguf")
    a = ap.parse_args(argv)
    if a.toy:
        write_toys(pathlib.Path(a.toy))
    if a.all:
        out = pathlib.Path(a.all)
        out.mkdir(parents=True, exist_ok=True)
        for src in shipped():
            dst = out / (src.name.removesuffix(".safetensors") + ".gguf")
            convert(src, dst)
            check(src, dst)
            print(f"{src.name} -> {dst} (round trip checked)")
    if a.all or a.toy:
        return 0
    if len(a.paths) != 2:
        ap.error("expected MODEL.safetensors OUT.gguf (or --all OUT_DIR)")
    src, dst = map(pathlib.Path, a.paths)
    if a.check:
        check(src, dst, a.tokenizer)
        print(f"{dst}: matches {src}")
    else:
        convert(src, dst, a.tokenizer)
        check(src, dst, a.tokenizer)
        print(f"{src} -> {dst} (round trip checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
