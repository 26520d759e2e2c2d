"""The CUDA path (a package built with -Ccmake.define.SPECULA_PYTHON_CUDA=ON): CUDA tensors of
chain_speculative_sampling, rejection_sample and greedy_chain run on specula::cuda, on the
tensors' current stream, and give the CPU results bit for bit (the device kernels run the host's
verifier). Skipped without such a build or without a visible GPU."""

import numpy as np
import pytest

import specula_sd as specula
from helpers import random_batch

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not (specula._HAS_CUDA and torch.cuda.is_available()),
    reason="needs a package built with SPECULA_PYTHON_CUDA and a visible GPU")


def cuda(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_padded_chain_on_cuda_equals_cpu(one_hot, dtype):
    p, q, drafts, _, seeds, steps = random_batch(11, batch=24, vocab=300)
    p, q = p.astype(dtype), None if one_hot else q.astype(dtype)
    for rule in (None, specula.relaxed_rule(2.0)):
        ref, ref_n, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                           rule=rule)
        flags = torch.empty(24, dtype=torch.int32, device="cuda")
        out, n, emitted = specula.chain_speculative_sampling(
            None if q is None else cuda(q), cuda(drafts), cuda(p), seeds=seeds, steps=steps,
            rule=rule, flags=flags)
        assert out.is_cuda and n.is_cuda and emitted.is_cuda
        torch.cuda.synchronize()
        assert out.cpu().tolist() == ref.tolist()
        assert n.cpu().tolist() == ref_n.tolist() == emitted.cpu().tolist()
        assert torch.all(flags.cpu() & specula.CHAIN_VALID != 0)


def test_flattened_chain_on_cuda_equals_cpu():
    p, q, drafts, lengths, seeds, steps = random_batch(12, batch=20, vocab=500)
    tokens = np.concatenate([drafts[b, :lengths[b]] for b in range(20)]).astype(np.int32)
    target = np.concatenate([p[b, :lengths[b] + 1] for b in range(20)])
    draft = np.concatenate([q[b, :lengths[b]] for b in range(20)])
    cu = np.cumsum(lengths).astype(np.int32)
    ref = specula.rejection_sample(tokens, cu, draft, target, seeds=seeds, steps=steps,
                                   max_spec_len=4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # the call runs on the current stream
        out = specula.rejection_sample(cuda(tokens), cuda(cu), cuda(draft), cuda(target),
                                       seeds=seeds, steps=steps, max_spec_len=4)
    stream.synchronize()
    assert out.is_cuda and out.cpu().tolist() == ref.tolist()
    # B + 1 int64 offsets, the default max_spec_len, and specula's flattened output.
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    out = specula.rejection_sample(cuda(tokens), cuda(offsets), None, cuda(target), seeds=seeds,
                                   steps=steps)
    ref = specula.rejection_sample(tokens, offsets, None, target, seeds=seeds, steps=steps)
    assert out.cpu().tolist() == ref.tolist()
    flat = torch.empty(len(tokens) + 20, dtype=torch.int32, device="cuda")
    specula.rejection_sample(cuda(tokens), cuda(cu), None, cuda(target), seeds=seeds,
                             steps=steps, output_token_ids=flat)
    ref_flat = np.empty(len(tokens) + 20, np.int32)
    specula.rejection_sample(tokens, cu, None, target, seeds=seeds, steps=steps,
                             output_token_ids=ref_flat)
    assert flat.cpu().tolist() == ref_flat.tolist()
    # Greedy.
    g = specula.greedy_chain(cuda(tokens), cuda(cu), cuda(target), max_spec_len=4)
    assert g.cpu().tolist() == specula.greedy_chain(tokens, cu, target, max_spec_len=4).tolist()


def test_cuda_errors():
    p, q, drafts, _, seeds, _ = random_batch(13, batch=3, vocab=20)
    with pytest.raises(ValueError, match="every array of a call must be on the same device"):
        specula.chain_speculative_sampling(cuda(q), drafts, cuda(p), seeds=seeds, steps=0)
    with pytest.raises(TypeError, match=r"draft_token_ids must have dtype int32 \(CUDA"):
        specula.chain_speculative_sampling(cuda(q), cuda(drafts.astype(np.int64)), cuda(p),
                                           seeds=seeds, steps=0)
    with pytest.raises(ValueError, match="CUDA tensors take the exact rule or relaxed_rule"):
        specula.chain_speculative_sampling(cuda(q), cuda(drafts), cuda(p), seeds=seeds, steps=0,
                                           rule=specula.typical_rule())
    with pytest.raises(ValueError, match="per-request rules are not taken with CUDA tensors"):
        specula.chain_speculative_sampling(cuda(q), cuda(drafts), cuda(p), seeds=seeds, steps=0,
                                           rule=[None] * 3)
    with pytest.raises(ValueError, match="bonus_token_ids is not taken with CUDA tensors"):
        specula.rejection_sample(cuda(np.zeros(3, np.int32)), cuda(np.array([1, 2, 3])), None,
                                 cuda(p[:, 0]), cuda(np.zeros(3, np.int32)), seeds=seeds,
                                 steps=0)
    with pytest.raises(ValueError, match="runs on the CPU only"):
        specula.verify_candidates(cuda(p[:, 0]), cuda(drafts[:, :1]), seeds=seeds, steps=0)


def test_cuda_call_does_not_wait_for_its_stream():
    # The random streams are staged in pinned memory: with the stream busy (a long sleep kernel
    # queued before the call), the call returns while the stream is still running. A copy from
    # pageable memory would wait for the stream, and the stream would then be idle here.
    p, q, drafts, _, seeds, steps = random_batch(14, batch=8, vocab=100)
    p, q, drafts = cuda(p), cuda(q), cuda(drafts)
    torch.cuda.synchronize()
    for _ in range(3):  # several calls: every slot of the staging ring, reused
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU clock cycles
        specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
        assert not torch.cuda.current_stream().query()
        torch.cuda.synchronize()


def test_corrupt_cu_num_draft_tokens_give_rows_of_minus_one():
    # Request 1's cumulative count points past the drafts: the verifier flags it, and its padded
    # row is -1 throughout (no read outside the flattened tokens, no uninitialised scratch).
    p, q, drafts, lengths, seeds, steps = random_batch(15, batch=3, vocab=50)
    tokens = np.concatenate([drafts[b, :lengths[b]] for b in range(3)]).astype(np.int32)
    target = np.concatenate([p[b, :lengths[b] + 1] for b in range(3)])
    draft = np.concatenate([q[b, :lengths[b]] for b in range(3)])
    cu = np.cumsum(lengths).astype(np.int32)
    cu[1] = 1000
    flags = torch.zeros(3, dtype=torch.int32, device="cuda")
    out = specula.rejection_sample(cuda(tokens), cuda(cu), cuda(draft), cuda(target),
                                   seeds=seeds, steps=steps, max_spec_len=4, flags=flags)
    torch.cuda.synchronize()
    assert flags.cpu()[1].item() & 8  # chain_invalid_input (specula/verify/chain_core.hpp)
    assert out.cpu()[1].tolist() == [-1] * 5
