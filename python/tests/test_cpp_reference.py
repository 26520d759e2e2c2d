"""The Python call equals the C++ call bit for bit: the same batch verified by
specula_py_reference (tests/python/reference_chain.cpp: specula::verify_chain from C++) and by
specula.chain_speculative_sampling. ctest (python.pytest) passes the program's path in
SPECULA_PY_REFERENCE; without it these tests are skipped."""

import os
import subprocess

import numpy as np
import pytest

import specula_sd as specula
from helpers import draft_from, random_rows

REFERENCE = os.environ.get("SPECULA_PY_REFERENCE", "")
pytestmark = pytest.mark.skipif(not os.path.isfile(REFERENCE),
                                reason="SPECULA_PY_REFERENCE (the C++ reference) not set")


def run_reference(tmp_path, q, drafts, p, seeds, ids, steps):
    b, length = drafts.shape
    v = p.shape[-1]
    src = tmp_path / "in.bin"
    with open(src, "wb") as f:
        np.array([b, length, v, q is not None], np.int64).tofile(f)
        if q is not None:
            q.astype(np.float32).tofile(f)
        drafts.astype(np.int32).tofile(f)
        p.astype(np.float32).tofile(f)
        seeds.astype(np.uint64).tofile(f)
        ids.astype(np.uint32).tofile(f)
        steps.astype(np.uint32).tofile(f)
    dst = tmp_path / "out.bin"
    subprocess.run([REFERENCE, str(src), str(dst)], check=True)
    raw = dst.read_bytes()
    if np.frombuffer(raw[:4], np.int32)[0] == 1:
        return raw[4:].decode()
    body = np.frombuffer(raw[4:], np.int32)
    tokens = body[:b * (length + 1)].reshape(b, length + 1)
    counts = body[b * (length + 1):b * (length + 2)]
    flags = body[b * (length + 2):].view(np.uint32)
    return tokens, counts, flags


@pytest.mark.parametrize("vocab,one_hot", [(7, False), (1000, False), (1000, True),
                                           (32000, False)])
def test_python_equals_cpp_bit_for_bit(tmp_path, vocab, one_hot):
    rng = np.random.default_rng(vocab + one_hot)
    b, length = 16, 5
    p = random_rows(rng, b * (length + 1), vocab, zeros=vocab // 3).reshape(b, length + 1, vocab)
    q = random_rows(rng, b * length, vocab).reshape(b, length, vocab)
    drafts = np.stack([draft_from(rng, q[i], 1)[0] for i in range(b)]).astype(np.int32)
    lengths = rng.integers(0, length + 1, size=b)
    for i in range(b):
        drafts[i, lengths[i]:] = -1
    seeds = rng.integers(0, 2**63, size=b, dtype=np.int64).astype(np.uint64)
    ids = rng.integers(0, 2**32, size=b, dtype=np.int64).astype(np.uint32)
    steps = rng.integers(0, 2**32, size=b, dtype=np.int64).astype(np.uint32)
    qq = None if one_hot else q
    tokens, counts, flags = run_reference(tmp_path, qq, drafts, p, seeds, ids, steps)
    py_flags = np.empty(b, np.uint32)
    out, acc, _ = specula.chain_speculative_sampling(qq, drafts, p, seeds=seeds, request_ids=ids,
                                                     steps=steps, flags=py_flags)
    assert np.array_equal(out, tokens)
    assert np.array_equal(acc, counts)
    assert np.array_equal(py_flags, flags)


def test_error_message_equals_cpp(tmp_path):
    rng = np.random.default_rng(3)
    b, length, vocab = 3, 2, 6
    p = random_rows(rng, b * (length + 1), vocab).reshape(b, length + 1, vocab)
    q = random_rows(rng, b * length, vocab).reshape(b, length, vocab)
    drafts = np.array([[0, 1], [2, 9], [3, 4]], np.int32)  # 9 is outside the vocabulary
    seeds = np.array([1, 2, 3], np.uint64)
    zeros = np.zeros(b, np.uint32)
    message = run_reference(tmp_path, q, drafts, p, seeds, zeros, zeros)
    with pytest.raises(specula.InvalidInput) as e:
        specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=zeros)
    assert str(e.value) == message
