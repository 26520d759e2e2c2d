"""logits_to_probs through the Python API, and zero-copy: inputs are read in place and outputs
written into the caller's arrays (data pointers checked)."""

import numpy as np
import pytest

import specula_sd as specula
from helpers import random_rows

try:
    import torch
except ImportError:
    torch = None


def softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_logits_to_probs_pipeline():
    rng = np.random.default_rng(31)
    logits = rng.standard_normal((4, 100)).astype(np.float32)
    np.testing.assert_allclose(specula.logits_to_probs(logits), softmax(logits), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(specula.logits_to_probs(logits, temperature=0.5),
                               softmax(logits / 0.5), rtol=1e-5, atol=1e-7)
    top = specula.logits_to_probs(logits, top_k=5)
    assert np.all((top > 0).sum(axis=1) == 5)
    kept = np.argsort(-logits, axis=1)[:, :5]
    assert all(set(np.nonzero(top[r])[0]) == set(kept[r]) for r in range(4))
    nucleus = specula.logits_to_probs(logits, top_p=0.5)
    assert np.all(nucleus.sum(axis=1) > 0.999)
    mp = specula.logits_to_probs(logits, min_p=0.2)
    assert np.all(mp[mp > 0] >= 0.2 * mp.max(axis=1, keepdims=True).repeat(100, 1)[mp > 0] - 1e-7)
    uncond = rng.standard_normal((4, 100)).astype(np.float32)
    cfg = specula.logits_to_probs(logits, uncond=uncond, cfg_scale=1.5)
    np.testing.assert_allclose(cfg, softmax(uncond + 1.5 * (logits - uncond)), rtol=1e-4,
                               atol=1e-6)


def test_per_row_parameters_equal_single_row_calls():
    rng = np.random.default_rng(32)
    logits = rng.standard_normal((3, 64)).astype(np.float32)
    temps = np.array([0.7, 1.0, 1.3], np.float32)
    top_k = np.array([0, 10, 3], np.int64)
    top_p = np.array([0.9, 1.0, 0.5], np.float64)
    batch = specula.logits_to_probs(logits, temperature=temps, top_k=top_k, top_p=top_p)
    for r in range(3):
        one = specula.logits_to_probs(logits[r:r + 1], temperature=float(temps[r]),
                                      top_k=int(top_k[r]), top_p=float(top_p[r]))
        assert np.array_equal(one[0], batch[r])
    assert np.array_equal(specula.logits_to_probs(logits, threads=0, temperature=temps,
                                                  top_k=top_k, top_p=top_p), batch)
    # The same parameters as lists and tuples.
    assert np.array_equal(specula.logits_to_probs(logits, temperature=temps.tolist(),
                                                  top_k=tuple(top_k.tolist()),
                                                  top_p=top_p.tolist()), batch)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_bf16_and_fp16_logits():
    rng = np.random.default_rng(33)
    logits = torch.from_numpy(rng.standard_normal((2, 50)).astype(np.float32))
    for dt in (torch.bfloat16, torch.float16):
        x = logits.to(dt)
        out = specula.logits_to_probs(x, top_k=7)
        ref = specula.logits_to_probs(x.float(), top_k=7)   # exact widening: the same bits
        assert out.dtype == torch.float32 and torch.equal(out, ref)


def test_numpy_inputs_are_read_in_place_and_outputs_written_in_place():
    rng = np.random.default_rng(34)
    b, length, v = 3, 2, 16
    p = random_rows(rng, b * (length + 1), v).reshape(b, length + 1, v)
    q = random_rows(rng, b * length, v).reshape(b, length, v)
    d = rng.integers(0, v, size=(b, length)).astype(np.int32)
    out = np.full((b, length + 1), 99, np.int32)
    res, _, _ = specula.chain_speculative_sampling(q, d, p, seeds=[1, 2, 3], steps=0,
                                                   output_token_ids=out)
    assert res is out and np.all(out != 99)
    ptr = specula._ext._last_pointers()
    assert ptr["target_probs"] == p.ctypes.data
    assert ptr["draft_probs"] == q.ctypes.data
    assert ptr["draft_token_ids"] == d.ctypes.data
    assert ptr["output_token_ids"] == out.ctypes.data
    # A view with a row stride larger than V is read in place too.
    wide = np.zeros((b, length + 1, 2 * v), np.float32)
    wide[..., :v] = p
    specula.chain_speculative_sampling(q, d, wide[..., :v], seeds=[1, 2, 3], steps=0,
                                       output_token_ids=out)
    assert specula._ext._last_pointers()["target_probs"] == wide.ctypes.data
    # int64 draft ids are converted: a copy (documented).
    specula.chain_speculative_sampling(q, d.astype(np.int64), p, seeds=[1, 2, 3], steps=0)
    assert specula._ext._last_pointers()["draft_token_ids"] != d.ctypes.data
    # Flattened layout with specula's flat output: written in place.
    flat = np.empty(b * length + b, np.int32)
    specula.rejection_sample(d.reshape(-1), np.array([2, 4, 6]), q.reshape(-1, v),
                             p.reshape(-1, v), seeds=[1, 2, 3], steps=0, output_token_ids=flat)
    ptr = specula._ext._last_pointers()
    assert ptr["output_token_ids"] == flat.ctypes.data and ptr["target_probs"] == p.ctypes.data
    logits = rng.standard_normal((4, v)).astype(np.float32)
    probs = np.empty((4, v), np.float32)
    assert specula.logits_to_probs(logits, out=probs) is probs
    ptr = specula._ext._last_pointers()
    assert ptr["logits"] == logits.ctypes.data and ptr["probs"] == probs.ctypes.data


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_inputs_are_read_in_place_and_outputs_written_in_place():
    rng = np.random.default_rng(35)
    b, length, v = 2, 3, 32
    p = torch.from_numpy(random_rows(rng, b * (length + 1), v).reshape(b, length + 1, v))
    q = torch.from_numpy(random_rows(rng, b * length, v).reshape(b, length, v))
    d = torch.from_numpy(rng.integers(0, v, size=(b, length)).astype(np.int32))
    out = torch.empty((b, length + 1), dtype=torch.int32)
    res, _, _ = specula.chain_speculative_sampling(q, d, p, seeds=[5, 6], steps=1,
                                                   output_token_ids=out)
    assert res is out
    ptr = specula._ext._last_pointers()
    assert ptr["target_probs"] == p.data_ptr() and ptr["draft_probs"] == q.data_ptr()
    assert ptr["draft_token_ids"] == d.data_ptr() and ptr["output_token_ids"] == out.data_ptr()
    logits = torch.randn(3, v)
    probs = torch.empty(3, v)
    specula.logits_to_probs(logits, out=probs)
    ptr = specula._ext._last_pointers()
    assert ptr["logits"] == logits.data_ptr() and ptr["probs"] == probs.data_ptr()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_fast_import_requires_grad_subclasses_and_bfloat16():
    """A CPU torch.Tensor is imported from its data_ptr(), shape and stride() (others through
    torch._C._to_dlpack, not Tensor.__dlpack__): tensors that require gradients are read (in
    place), subclasses still go through __dlpack__, views with a storage offset are read at
    their own data, and bfloat16 logits are read as before."""
    rng = np.random.default_rng(36)
    b, length, v = 2, 3, 16
    p_np = random_rows(rng, b * (length + 1), v).reshape(b, length + 1, v)
    q_np = random_rows(rng, b * length, v).reshape(b, length, v)
    d_np = rng.integers(0, v, size=(b, length)).astype(np.int32)
    ref = specula.chain_speculative_sampling(q_np, d_np, p_np, seeds=[1, 2], steps=3)[0]
    p = torch.from_numpy(p_np).requires_grad_()
    q = torch.from_numpy(q_np)
    out = specula.chain_speculative_sampling(q, torch.from_numpy(d_np), p, seeds=[1, 2],
                                             steps=3)[0]
    assert out.tolist() == ref.tolist()
    assert specula._ext._last_pointers()["target_probs"] == p.data_ptr()
    # A subclass (nn.Parameter without gradients) takes the generic path: same result.
    param = torch.nn.Parameter(torch.from_numpy(p_np), requires_grad=False)
    out = specula.chain_speculative_sampling(q, torch.from_numpy(d_np), param, seeds=[1, 2],
                                             steps=3)[0]
    assert out.tolist() == ref.tolist()
    logits = torch.randn(3, v).bfloat16()
    probs = specula.logits_to_probs(logits)
    expected = torch.softmax(logits.float(), dim=-1)
    assert torch.allclose(probs, expected, atol=1e-6)
    # A view with a non-unit last stride is refused as before, whichever path imports it.
    with pytest.raises(ValueError, match="contiguous"):
        specula.logits_to_probs(torch.randn(v, 3).t())
    # A view that starts inside its storage (rows 1..2 of 4): read in place, at the view.
    big = torch.randn(4, v)
    view = big[1:3]
    probs = specula.logits_to_probs(view)
    assert specula._ext._last_pointers()["logits"] == view.data_ptr() != big.data_ptr()
    assert torch.equal(probs, specula.logits_to_probs(big[1:3].clone()))
    assert torch.allclose(probs, torch.softmax(view, dim=-1), atol=1e-6)
    # float16 rows, and int64 draft tokens: the last rows of a taller tensor.
    logits16 = torch.randn(2, v).half()
    assert torch.allclose(specula.logits_to_probs(logits16),
                          torch.softmax(logits16.float(), dim=-1), atol=1e-6)
    tall = torch.from_numpy(np.concatenate([d_np[::-1], d_np], axis=0).astype(np.int64))
    out = specula.chain_speculative_sampling(q, tall[b:], p, seeds=[1, 2], steps=3)[0]
    assert out.tolist() == ref.tolist()
    # A non-contiguous token view is refused, not read with the wrong layout.
    with pytest.raises(ValueError, match="draft_token_ids must be C-contiguous"):
        specula.chain_speculative_sampling(q, torch.cat([tall, tall], 1)[b:, :length], p,
                                           seeds=[1, 2], steps=3)
