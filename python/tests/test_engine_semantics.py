"""Engine semantics: vLLM's placeholder draft id (-1) rejected at its position, per-request
greedy masks (is_greedy), random streams shared between requests refused."""

import numpy as np
import pytest

import specula_sd as specula
from helpers import ALPHA, draft_from, homogeneity_test, random_rows

V = 6
L = 3
N = 20000


def vllm_placeholder_reference(rng, p, q, drafts, bonus):
    """NumPy transcription of vLLM's random rejection sampler (v1) for one request, with its
    rule for the placeholder draft id (vllm-project/vllm, rejection_sampler.py, after the fix
    that added `if draft_token_id < 0: accepted = False`): a draft id < 0 is rejected without
    reading the probabilities at it; any other draft x is accepted when p(x) / q(x) >= u. At the
    first rejection the recovered token is the argmax of r / Exp(1) noise, with r = max(p - q, 0)
    given draft rows, or p with the drafted id masked out (`vocab_offset != draft_token_id`, which
    masks nothing for -1) without. All accepted: the engine's bonus token."""
    out = []
    for i, x in enumerate(drafts):
        u = rng.random()
        if x >= 0:
            q_x = q[i, x] if q is not None else 1.0
            if q_x > 0 and p[i, x] / q_x >= u:
                out.append(int(x))
                continue
        if q is not None:
            r = np.maximum(p[i].astype(np.float64) - q[i], 0)
        else:
            r = p[i].astype(np.float64).copy()
            if x >= 0:
                r[x] = 0
        out.append(int(np.argmax(r / rng.exponential(size=len(r)))))
        return tuple(out)
    out.append(int(bonus))
    return tuple(out)


@pytest.fixture(scope="module")
def placeholder_problem():
    """N requests of L drafts drawn from q, each with a placeholder (-1) at a random position or
    none, and one bonus token per request drawn from a fixed row."""
    rng = np.random.default_rng(4321)
    p = random_rows(rng, L + 1, V)
    q = random_rows(rng, L, V)
    drafts = draft_from(rng, q, N).astype(np.int32)
    where = rng.integers(0, L + 1, size=N)  # L: no placeholder
    for b in range(N):
        if where[b] < L:
            drafts[b, where[b]] = -1
    bonus = rng.choice(V, size=N, p=p[L] / p[L].astype(np.float64).sum()).astype(np.int64)
    return p, q, drafts, bonus


def flat_placeholder_call(p, q, drafts, bonus, **kw):
    tokens = drafts.reshape(-1)
    cu = np.arange(1, N + 1, dtype=np.int64) * L
    target = np.ascontiguousarray(np.broadcast_to(p[:L], (N, L, V))).reshape(-1, V)
    draft = None if q is None else np.ascontiguousarray(np.broadcast_to(q, (N, L, V))).reshape(-1, V)
    counts = np.empty(N, np.int32)
    out = specula.rejection_sample(tokens, cu, draft, target, bonus[:, None], seeds=kw.pop("seeds"),
                                   steps=3, num_accepted=counts, placeholders="reject", **kw)
    return [tuple(out[b, :counts[b] + 1]) for b in range(N)], counts


@pytest.mark.parametrize("one_hot", [False, True])
def test_placeholder_same_law_as_vllm_reference(placeholder_problem, one_hot):
    p, q, drafts, bonus = placeholder_problem
    qq = None if one_hot else q
    got, counts = flat_placeholder_call(p, qq, drafts, bonus, seeds=np.arange(N) + 900)
    # A placeholder is never accepted: a request stops at its first -1 at the latest.
    first = np.where((drafts == -1).any(axis=1), (drafts == -1).argmax(axis=1), L)
    assert np.all(counts <= first)
    rng = np.random.default_rng(17)
    ref = [vllm_placeholder_reference(rng, p, qq, drafts[b], bonus[b]) for b in range(N)]
    assert homogeneity_test(got, ref) > ALPHA
    # Negative control: a sampler that reads a placeholder as a draft of token 0 (accepting it
    # with probability min(1, p(0) / q(0))) has another law, and the test sees it.
    wrong = [vllm_placeholder_reference(rng, p, qq, np.where(drafts[b] < 0, 0, drafts[b]),
                                        bonus[b]) for b in range(N)]
    assert homogeneity_test(got, wrong) < ALPHA


def test_placeholder_draft_token_rejected_random():
    """vLLM's test of the same name: drafts [1, V - 1, -1] against target rows that put all
    their mass on 1, V - 1 and 7 (vLLM builds them from logits of +-100); the first two drafts
    are accepted and the placeholder is rejected, its position getting a token of the
    vocabulary (here exactly 7, the only token with mass), then nothing."""
    vocab = 100
    p = np.zeros((3, vocab), np.float32)
    p[0, 1] = p[1, vocab - 1] = p[2, 7] = 1.0
    drafts = np.array([1, vocab - 1, -1], np.int32)
    for seed in range(20):
        out = specula.rejection_sample(drafts, np.array([3]), None, p, np.array([[9]]),
                                       seeds=seed, steps=0, placeholders="reject")
        assert out.tolist() == [[1, vocab - 1, 7, -1]]
    with pytest.raises(specula.InvalidInput, match=r"draft_tokens\[row 2\].*placeholder"):
        specula.rejection_sample(drafts, np.array([3]), None, p, np.array([[9]]), seeds=0,
                                 steps=0)


def test_placeholder_padded_layout_and_greedy():
    """chain_speculative_sampling takes placeholders inside draft_lengths; greedy_chain rejects
    a placeholder and emits the argmax there (vLLM's greedy rule: -1 never equals it)."""
    p = np.zeros((1, 3, V), np.float32)
    p[0, 0, 2] = p[0, 1, 4] = p[0, 2, 1] = 1.0
    drafts = np.array([[2, -1]], np.int32)
    tokens, _, n = specula.chain_speculative_sampling(
        None, drafts, p, seeds=1, steps=0, draft_lengths=np.array([2]), placeholders="reject")
    assert tokens.tolist() == [[2, 4, -1]] and n.tolist() == [1]
    flat_target = p.reshape(3, V)
    out = specula.greedy_chain(drafts[0], np.array([2]), flat_target, placeholders="reject")
    assert out.tolist() == [[2, 4, -1]]


def test_placeholder_refused_with_one_wording():
    """Refused (the default), -1 inside the counted drafts gives the same message from every
    entry point, after the location of the draft."""
    p = np.full((1, 3, V), 1.0 / V, np.float32)
    drafts = np.array([[0, -1]], np.int32)
    messages = []
    with pytest.raises(specula.InvalidInput) as e:
        specula.chain_speculative_sampling(None, drafts, p, seeds=1, steps=0,
                                           draft_lengths=np.array([2]))
    messages.append(str(e.value))
    with pytest.raises(specula.InvalidInput) as e:
        specula.rejection_sample(drafts[0], np.array([2]), None, p.reshape(3, V), seeds=1, steps=0)
    messages.append(str(e.value))
    with pytest.raises(specula.InvalidInput) as e:
        specula.greedy_chain(drafts[0], np.array([2]), p.reshape(3, V))
    messages.append(str(e.value))
    tails = {m.split("]: ", 1)[1] for m in messages}
    assert len(tails) == 1, messages
    assert "-1 inside a request's counted drafts" in tails.pop()
    with pytest.raises(ValueError, match="placeholders must be 'refuse' or 'reject'"):
        specula.rejection_sample(drafts[0], np.array([2]), None, p.reshape(3, V), seeds=1,
                                 steps=0, placeholders="accept")


def mixed_batch(seed, batch=12, vocab=20, max_draft=4):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_draft + 1, size=batch)
    cu = np.cumsum(lengths).astype(np.int32)
    num = int(cu[-1])
    draft = random_rows(rng, num, vocab)
    target = random_rows(rng, num + batch, vocab)
    tokens = np.array([rng.choice(vocab, p=r / r.astype(np.float64).sum()) for r in draft],
                      np.int32)
    seeds = rng.integers(0, 2**40, size=batch)
    mask = rng.random(batch) < 0.5
    mask[0], mask[1] = True, False
    return lengths, cu, tokens, draft, target, seeds, mask


def one_request(lengths, b):
    start = int(np.sum(lengths[:b]))
    return start, start + int(lengths[b])


@pytest.mark.parametrize("with_bonus", [False, True])
def test_is_greedy_equals_separate_calls(with_bonus):
    """Each request of a mixed batch gets exactly what a call of its own kind gives it: the
    greedy rule (greedy_chain) where is_greedy is set, sampling (rejection_sample) elsewhere."""
    lengths, cu, tokens, draft, target, seeds, mask = mixed_batch(3)
    batch = len(lengths)
    bonus = np.arange(batch, dtype=np.int64) % target.shape[1] if with_bonus else None
    if with_bonus:  # vLLM's layout: one target row per draft token
        keep = np.ones(target.shape[0], bool)
        keep[cu + np.arange(batch)] = False
        target = target[keep]
    flags = np.empty(batch, np.int32)
    out = specula.rejection_sample(tokens, cu, draft, target, bonus, seeds=seeds, steps=5,
                                   is_greedy=mask, max_spec_len=4, flags=flags)
    for b in range(batch):
        lo, hi = one_request(lengths, b)
        rows = target[lo:hi] if with_bonus else target[lo + b:hi + b + 1]
        one_bonus = None if bonus is None else bonus[b:b + 1]
        if mask[b]:
            ref = specula.greedy_chain(tokens[lo:hi], np.array([hi - lo]), rows, one_bonus,
                                       max_spec_len=4)
        else:
            ref = specula.rejection_sample(tokens[lo:hi], np.array([hi - lo]), draft[lo:hi], rows,
                                           one_bonus, seeds=seeds[b], steps=5, max_spec_len=4)
        assert np.array_equal(out[b], ref[0]), b
    assert np.all(flags & specula.CHAIN_VALID)
    # Greedy requests draw nothing: their seeds may repeat.
    seeds2 = seeds.copy()
    seeds2[mask] = 0
    out2 = specula.rejection_sample(tokens, cu, draft, target, bonus, seeds=seeds2, steps=5,
                                    is_greedy=mask, max_spec_len=4)
    assert np.array_equal(out, out2)
    # All greedy / none greedy: one call of one kind.
    all_greedy = specula.rejection_sample(tokens, cu, draft, target, bonus, seeds=seeds, steps=5,
                                          is_greedy=np.ones(batch, bool), max_spec_len=4)
    assert np.array_equal(all_greedy,
                          specula.greedy_chain(tokens, cu, target, bonus, max_spec_len=4))


def test_is_greedy_bad_input():
    lengths, cu, tokens, draft, target, seeds, mask = mixed_batch(4)
    with pytest.raises(ValueError, match=r"is_greedy must have shape \(B,\) = \(12,\)"):
        specula.rejection_sample(tokens, cu, draft, target, seeds=seeds, steps=0,
                                 is_greedy=mask[:5])
    with pytest.raises(TypeError, match="is_greedy must have dtype bool"):
        specula.rejection_sample(tokens, cu, draft, target, seeds=seeds, steps=0,
                                 is_greedy=mask.astype(np.float32))
    bad = draft.copy()
    last = len(lengths) - 1
    lo, hi = one_request(lengths, last)
    assert not mask[last] and hi > lo
    bad[lo] = -bad[lo]  # a sampled request's proposal row: its q(x) < 0
    with pytest.raises(specula.InvalidInput, match=r"is_greedy splits the call"):
        specula.rejection_sample(tokens, cu, bad, target, seeds=seeds, steps=0, is_greedy=mask)


# ---------------------------------------------------------------------------------------------
# Shared random streams
# ---------------------------------------------------------------------------------------------

def chain_args(batch=3, length=2, vocab=4):
    q = np.full((batch, length, vocab), 1.0 / vocab, np.float32)
    p = np.full((batch, length + 1, vocab), 1.0 / vocab, np.float32)
    d = np.zeros((batch, length), np.int32)
    return q, d, p


def test_shared_streams_refused_naming_both_requests():
    q, d, p = chain_args()
    with pytest.raises(ValueError, match=r"^specula: requests 0 and 2 would draw the same random "
                                         r"numbers: both have seed 5 and request id 0 "
                                         r"\(seeds\[0\] = seeds\[2\], request_ids\)"):
        specula.chain_speculative_sampling(q, d, p, seeds=np.array([5, 6, 5]), steps=0)
    with pytest.raises(ValueError, match=r"requests 1 and 2 .* seed 9 and request id 4 "
                                         r"\(seeds, request_ids\[1\] = request_ids\[2\]\)"):
        specula.chain_speculative_sampling(q, d, p, seeds=9, request_ids=[3, 4, 4], steps=0)
    with pytest.raises(ValueError, match=r"requests 0 and 1 .*\(seeds\[0\] = seeds\[1\], "
                                         r"request_ids\[0\] = request_ids\[1\]\)"):
        specula.chain_speculative_sampling(q, d, p, seeds=[7, 7, 8], request_ids=[1, 1, 1],
                                           steps=0)
    # The same seed with distinct request ids, or distinct seeds: distinct streams.
    specula.chain_speculative_sampling(q, d, p, seeds=5, request_ids=[0, 1, 2], steps=0)
    specula.chain_speculative_sampling(q, d, p, seeds=[5, 6, 7], steps=[1, 1, 1])
    # Every verifier that samples.
    with pytest.raises(ValueError, match="requests 0 and 1 would draw the same random numbers"):
        specula.rejection_sample(d.reshape(-1), np.array([2, 4, 6]), q.reshape(-1, 4),
                                 np.full((9, 4), 0.25, np.float32), seeds=[3, 3, 4], steps=0)
    with pytest.raises(ValueError, match="requests 0 and 1 would draw the same random numbers"):
        specula.verify_candidates(np.full((2, 4), 0.25, np.float32), np.zeros((2, 2), np.int32),
                                  np.full((2, 4), 0.25, np.float32), seeds=[1, 1], steps=0)
    with pytest.raises(ValueError, match="requests 0 and 1 would draw the same random numbers"):
        specula.verify_tree(np.array([[-1, 0], [-1, 0]]), np.array([[-1, 1], [-1, 1]]),
                            np.full((2, 2, 4), 0.25, np.float32), seeds=[2, 2], steps=0)


def test_shared_streams_found_in_large_batches():
    """Above 32 requests the check hashes the pairs: the first shared pair is still named."""
    batch = 300
    q, d, p = chain_args(batch)
    seeds = np.arange(batch, dtype=np.int64) * 7919
    seeds[250] = seeds[40]
    seeds[299] = seeds[3]
    with pytest.raises(ValueError, match=r"requests 40 and 250 would draw"):
        specula.chain_speculative_sampling(q, d, p, seeds=seeds, steps=0)
    seeds[250] += 1
    with pytest.raises(ValueError, match=r"requests 3 and 299 would draw"):
        specula.chain_speculative_sampling(q, d, p, seeds=seeds, steps=0)


# ---------------------------------------------------------------------------------------------
# 16-bit probability rows
# ---------------------------------------------------------------------------------------------

def test_float16_rows_are_widened_exactly():
    """float16 rows give the result of float32 rows holding the same values, in every layout."""
    rng = np.random.default_rng(8)
    batch, vocab = 6, 32
    p = random_rows(rng, batch * (L + 1), vocab).reshape(batch, L + 1, vocab).astype(np.float16)
    q = random_rows(rng, batch * L, vocab).reshape(batch, L, vocab).astype(np.float16)
    drafts = rng.integers(0, vocab, size=(batch, L)).astype(np.int32)
    seeds = np.arange(batch) + 3
    kw = dict(seeds=seeds, steps=1, sum_tolerance=4e-3)
    a = specula.chain_speculative_sampling(q, drafts, p, **kw)
    b = specula.chain_speculative_sampling(q.astype(np.float32), drafts, p.astype(np.float32), **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    cu = np.arange(1, batch + 1) * L
    flat_p = p.reshape(-1, vocab)
    out16 = specula.rejection_sample(drafts.reshape(-1), cu, q.reshape(-1, vocab), flat_p, **kw)
    out32 = specula.rejection_sample(drafts.reshape(-1), cu, q.reshape(-1, vocab).astype(np.float32),
                                     flat_p.astype(np.float32), **kw)
    assert np.array_equal(out16, out32)
    with pytest.raises(TypeError, match="draft_probs must have the dtype of target_probs"):
        specula.chain_speculative_sampling(q.astype(np.float32), drafts, p, **kw)


def test_bfloat16_rows_are_widened_exactly():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    batch, vocab = 4, 40
    p = torch.from_numpy(random_rows(rng, batch * (L + 1), vocab)).to(torch.bfloat16)
    drafts = torch.from_numpy(rng.integers(0, vocab, size=batch * L).astype(np.int32))
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * L
    target = p.reshape(batch * (L + 1), vocab)
    kw = dict(seeds=torch.arange(batch), steps=2, sum_tolerance=1e-2)
    out16 = specula.rejection_sample(drafts, cu, None, target, **kw)
    out32 = specula.rejection_sample(drafts, cu, None, target.float(), **kw)
    assert torch.equal(out16, out32)


def test_is_greedy_forms():
    """A torch bool tensor, a list and a NumPy bool array are the same mask."""
    torch = pytest.importorskip("torch")
    target = torch.full((4, 4), 0.25)
    drafts = torch.tensor([1, 2], dtype=torch.int32)
    cu = torch.tensor([1, 2], dtype=torch.int32)
    outs = [specula.rejection_sample(drafts, cu, None, target, seeds=torch.tensor([1, 2]), steps=0,
                                     is_greedy=mask)
            for mask in (torch.tensor([True, False]), [1, 0], np.array([True, False]))]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert outs[0][0].tolist() == [0, -1]  # greedy: the argmax of a uniform row is token 0
