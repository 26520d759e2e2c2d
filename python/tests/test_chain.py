"""Chain verification through the Python API: exact laws, agreement in law with reference
implementations of transformers' and vLLM's rejection samplers, layouts, batch independence."""

import numpy as np
import pytest

import specula_sd as specula
from helpers import ALPHA, draft_from, g_test, homogeneity_test, random_batch, random_rows

try:
    import torch
except ImportError:  # torch is optional: the tests that need it are skipped
    torch = None

V = 5
L = 3
N = 20000


@pytest.fixture(scope="module")
def problem():
    """Fixed target rows p_1..p_{L+1} and proposal rows q_1..q_L (the same for every request),
    and N requests whose drafts are drawn from q."""
    rng = np.random.default_rng(1234)
    p = random_rows(rng, L + 1, V)
    q = random_rows(rng, L, V)
    drafts = draft_from(rng, q, N)
    return p, q, drafts


def padded_call(p, q, drafts, **kw):
    n = drafts.shape[0]
    target = np.ascontiguousarray(np.broadcast_to(p, (n, L + 1, V)))
    draft = None if q is None else np.ascontiguousarray(np.broadcast_to(q, (n, L, V)))
    return specula.chain_speculative_sampling(draft, drafts, target,
                                              seeds=kw.pop("seeds", 7),
                                              request_ids=kw.pop("request_ids", np.arange(n)),
                                              steps=kw.pop("steps", 0), **kw)


def check_emitted_laws(p, tokens, counts):
    """Token i of the output is distributed as p_{i+1} among requests that accepted i drafts or
    more (each position's verification is exact given the ones before)."""
    for i in range(L + 1):
        reached = counts >= i
        obs = np.bincount(tokens[reached, i], minlength=V)
        assert g_test(obs, p[i]) > ALPHA, (i, obs)


def test_padded_exact_law(problem):
    p, q, drafts = problem
    out, acc, emitted = padded_call(p, q, drafts)
    assert out.shape == (N, L + 1) and out.dtype == np.int32
    assert np.array_equal(acc, emitted)
    check_emitted_laws(p, out, acc)
    # Accepted drafts are the drafted tokens; after the emitted token, -1.
    for b in range(100):
        n = acc[b]
        assert np.array_equal(out[b, :n], drafts[b, :n])
        assert np.all(out[b, n + 1:] == -1)


def test_one_hot_drafts_exact_law(problem):
    p, _, drafts = problem
    out, acc, _ = padded_call(p, None, drafts)
    check_emitted_laws(p, out, acc)


def test_flat_layout_ragged_exact_law(problem):
    """vLLM's layout with ragged draft counts, cu_num_draft_tokens without the leading 0."""
    p, q, drafts = problem
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, L + 1, size=N)
    cu = np.cumsum(lengths).astype(np.int32)
    tokens = np.concatenate([drafts[b, :lengths[b]] for b in range(N)]).astype(np.int32)
    target = np.concatenate([p[:lengths[b] + 1] for b in range(N)])
    draft = np.concatenate([q[:lengths[b]] for b in range(N)])
    counts = np.empty(N, np.int32)
    out = specula.rejection_sample(tokens, cu, draft, target, seeds=3, steps=1,
                                   request_ids=np.arange(N), num_accepted=counts)
    assert out.shape == (N, L + 1)
    for i in range(L + 1):
        reached = (counts >= i) & (lengths >= i)
        obs = np.bincount(out[reached, i], minlength=V)
        assert g_test(obs, p[i]) > ALPHA
    assert np.all(counts <= lengths)
    assert all(np.all(out[b, lengths[b] + 1:] == -1) for b in range(200))


def hf_speculative_sampling(rng, p, q, drafts):
    """NumPy transcription of transformers' `_speculative_sampling` for one request (p: L+1
    target rows, q: L draft rows, drafts: L tokens): returns the valid tokens."""
    idx = np.arange(len(drafts))
    p_i = p[idx, drafts].astype(np.float64)
    q_i = q[idx, drafts].astype(np.float64)
    ratio = p_i / q_i
    r = rng.random(len(drafts))
    is_accepted = r <= ratio
    n_matches = int(((~is_accepted).cumsum() < 1).sum())
    gamma = len(drafts)
    p_next = p[n_matches].astype(np.float64)
    if n_matches < gamma:
        p_prime = np.clip(p_next - q[n_matches], 0, None)
        p_prime /= p_prime.sum()
    else:
        p_prime = p_next / p_next.sum()
    t = rng.choice(len(p_prime), p=p_prime)
    return tuple(drafts[:n_matches]) + (int(t),)


def vllm_rejection_sample(rng, p, q, drafts, bonus=None):
    """NumPy transcription of vLLM's rejection sampler (v1, random requests) for one request:
    accept x when p(x) / q(x) >= u; at the first rejection the recovered token is the argmax
    of max(p - q, 0) / Exp(1) noise; when all are accepted, the bonus token: `bonus`
    (bonus_token_ids[b], sampled by the engine's sampler before the call), or sampled here from
    the bonus row p[-1]."""
    out = []
    for i, x in enumerate(drafts):
        u = rng.random()
        q_x = q[i, x] if q is not None else 1.0
        if q_x > 0 and p[i, x] / q_x >= u:
            out.append(int(x))
            continue
        if q is not None:
            residual = np.maximum(p[i].astype(np.float64) - q[i], 0)
        else:
            residual = p[i].astype(np.float64).copy()
            residual[x] = 0
        noise = rng.exponential(size=len(residual))
        out.append(int(np.argmax(residual / noise)))
        return tuple(out)
    if bonus is not None:
        out.append(int(bonus))
    else:
        out.append(int(rng.choice(p.shape[1], p=p[-1] / p[-1].astype(np.float64).sum())))
    return tuple(out)


def specula_outcomes(out, acc):
    return [tuple(out[b, :acc[b] + 1]) for b in range(out.shape[0])]


def test_same_law_as_transformers_reference(problem):
    p, q, drafts = problem
    out, acc, _ = padded_call(p, q, drafts, seeds=11)
    rng = np.random.default_rng(99)
    ref = [hf_speculative_sampling(rng, p, q, drafts[b]) for b in range(N)]
    assert homogeneity_test(specula_outcomes(out, acc), ref) > ALPHA


@pytest.mark.parametrize("one_hot", [False, True])
def test_same_law_as_vllm_reference(problem, one_hot):
    p, q, drafts = problem
    qq = None if one_hot else q
    tokens = drafts.reshape(-1)
    cu = np.arange(1, N + 1, dtype=np.int64) * L
    target = np.ascontiguousarray(np.broadcast_to(p, (N, L + 1, V))).reshape(-1, V)
    draft = None if one_hot else np.ascontiguousarray(np.broadcast_to(q, (N, L, V))).reshape(-1, V)
    counts = np.empty(N, np.int32)
    out = specula.rejection_sample(tokens, cu, draft, target, seeds=np.arange(N) + 100,
                                   steps=4, num_accepted=counts)
    rng = np.random.default_rng(77)
    ref = [vllm_rejection_sample(rng, p, qq, drafts[b]) for b in range(N)]
    assert homogeneity_test(specula_outcomes(out, counts), ref) > ALPHA


@pytest.mark.parametrize("one_hot", [False, True])
def test_bonus_token_ids_same_law_as_vllm_reference(problem, one_hot):
    """vLLM's layout: target_probs has one row per draft token and the engine's bonus tokens,
    drawn beforehand from the bonus row p_{L+1}, are appended after fully accepted chains."""
    p, q, drafts = problem
    qq = None if one_hot else q
    rng = np.random.default_rng(31)
    bonus = rng.choice(V, size=N, p=p[L] / p[L].astype(np.float64).sum()).astype(np.int64)
    tokens = drafts.reshape(-1)
    cu = np.arange(1, N + 1, dtype=np.int32) * L
    target = np.ascontiguousarray(np.broadcast_to(p[:L], (N, L, V))).reshape(-1, V)
    draft = None if one_hot else np.ascontiguousarray(np.broadcast_to(q, (N, L, V))).reshape(-1, V)
    counts = np.empty(N, np.int32)
    out = specula.rejection_sample(tokens, cu, draft, target, bonus[:, None],
                                   seeds=np.arange(N) + 500, steps=2, num_accepted=counts)
    assert out.shape == (N, L + 1)
    full = counts == L
    assert 0 < full.sum() < N
    assert np.array_equal(out[full, L], bonus[full])  # the engine's tokens, unchanged
    ref_rng = np.random.default_rng(78)
    ref_bonus = ref_rng.choice(V, size=N, p=p[L] / p[L].astype(np.float64).sum())
    ref = [vllm_rejection_sample(ref_rng, p, qq, drafts[b], ref_bonus[b]) for b in range(N)]
    assert homogeneity_test(specula_outcomes(out, counts), ref) > ALPHA
    # The law of vLLM's sampler with bonus rows: the bonus position is distributed as p_{L+1}.
    check_emitted_laws(p, out, counts)


def test_results_independent_of_batch_position():
    p, q, drafts, _, seeds, steps = random_batch(1)
    out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
    perm = np.random.default_rng(2).permutation(len(seeds))
    out_p, acc_p, _ = specula.chain_speculative_sampling(
        q[perm], drafts[perm], p[perm], seeds=seeds[perm], steps=steps[perm])
    assert np.array_equal(out_p, out[perm]) and np.array_equal(acc_p, acc[perm])
    for b in range(len(seeds)):
        o1, a1, _ = specula.chain_speculative_sampling(
            q[b:b + 1], drafts[b:b + 1], p[b:b + 1], seeds=int(seeds[b]), steps=int(steps[b]))
        assert np.array_equal(o1[0], out[b]) and a1[0] == acc[b]
    # Threads do not change the outputs.
    out_t, acc_t, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                         threads=0)
    assert np.array_equal(out_t, out) and np.array_equal(acc_t, acc)


def test_padded_and_flattened_layouts_agree_bit_for_bit():
    p, q, drafts, lengths, seeds, steps = random_batch(3)
    out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
    tokens = np.concatenate([drafts[b, :lengths[b]] for b in range(len(lengths))])
    target = np.concatenate([p[b, :lengths[b] + 1] for b in range(len(lengths))])
    draft = np.concatenate([q[b, :lengths[b]] for b in range(len(lengths))])
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # leading 0: B + 1 entries
    counts = np.empty(len(lengths), np.int32)
    flat = specula.rejection_sample(tokens, cu, draft, target, seeds=seeds, steps=steps,
                                    num_accepted=counts, max_spec_len=drafts.shape[1])
    assert np.array_equal(flat, out) and np.array_equal(counts, acc)
    # specula's own flattened output layout, written in place.
    flat1 = np.empty(len(tokens) + len(lengths), np.int32)
    specula.rejection_sample(tokens, cu, draft, target, seeds=seeds, steps=steps,
                             output_token_ids=flat1)
    starts = cu[:-1] + np.arange(len(lengths))
    for b in range(len(lengths)):
        assert np.array_equal(flat1[starts[b]:starts[b] + lengths[b] + 1],
                              out[b, :lengths[b] + 1])


def test_steps_select_the_draws():
    p, q, drafts, _, seeds, _ = random_batch(4, batch=64)
    a = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=5)[0]
    b = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=5)[0]
    c = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=6)[0]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_flashinfer_counters_accumulate():
    p, q, drafts, _, seeds, steps = random_batch(5)
    acc_total = np.full(len(seeds), 10, np.int32)
    emit_total = np.zeros(len(seeds), np.int32)
    out, acc, emitted = specula.chain_speculative_sampling(q, drafts, p, acc_total, emit_total,
                                                           seeds=seeds, steps=steps)
    assert acc is acc_total and emitted is emit_total
    _, n, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
    assert np.array_equal(acc_total, n + 10) and np.array_equal(emit_total, n)


def test_flags_and_accepted_outputs():
    p, q, drafts, lengths, seeds, steps = random_batch(6)
    flags = np.empty(len(seeds), np.int32)
    accepted = np.empty(drafts.shape, np.uint8)
    _, n, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                 flags=flags, accepted=accepted)
    assert np.all(flags & specula.CHAIN_VALID)
    assert np.array_equal((flags & specula.CHAIN_BONUS) != 0, n == lengths)
    assert np.array_equal(accepted.sum(axis=1), n)


def test_relaxed_rules():
    p, q, drafts, _, seeds, steps = random_batch(7, batch=400, vocab=20)
    exact = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
    # omega = 1 is the exact rule, bit for bit; so is a uniform schedule of 1.
    for rule in (specula.relaxed_rule(1.0), specula.relaxed_rule(1.0, "vanilla"),
                 specula.scheduled_rule(specula.uniform_schedule(1.0))):
        r = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps, rule=rule)
        assert np.array_equal(r[0], exact[0]), rule
    # Relaxing accepts at least as often (the same uniforms, a larger acceptance probability).
    relaxed = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                 rule=specula.relaxed_rule(3.0))
    assert np.all(relaxed[1] >= exact[1]) and relaxed[1].sum() > exact[1].sum()
    for schedule in (specula.exponential_schedule(2.0, 0.5, 4), specula.linear_schedule(2.0, 8, 4),
                     specula.custom_schedule([3.0, 2.0, 1.5, 1.0])):
        r = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                               rule=specula.scheduled_rule(schedule))
        assert r[1].sum() > exact[1].sum(), schedule  # a mean omega of 2 accepts more
    # Row-aware rules: typical acceptance and LANTERN++ over a neighbour table.
    typical = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                 rule=specula.typical_rule(0.09, 0.3))
    assert typical[0].shape == exact[0].shape
    emb = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    table = specula.neighbour_table(emb, 3)
    assert table.vocab_size == 20 and table.k == 3 and len(table.neighbours(0)) == 3
    lantern = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps,
                                                 rule=specula.lantern_rule(table, 1.0))
    assert np.all(lantern[1] >= exact[1])
    assert "relaxed_rule(3" in repr(specula.relaxed_rule(3.0))


def test_greedy_chain():
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((3 + 2 + 2, 10)).astype(np.float32)  # B = 2, drafts 3 and 2
    am = logits.argmax(axis=1)
    drafts = np.array([am[0], am[1], (am[2] + 1) % 10, am[4], am[5]], np.int32)
    out = specula.greedy_chain(drafts, np.array([3, 5], np.int32), logits)
    assert out.tolist() == [[am[0], am[1], am[2], -1], [am[4], am[5], am[6], -1]]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_tensors_give_the_numpy_results():
    p, q, drafts, _, seeds, steps = random_batch(9)
    out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
    t_out, t_acc, t_emit = specula.chain_speculative_sampling(
        torch.from_numpy(q), torch.from_numpy(drafts), torch.from_numpy(p),
        seeds=torch.from_numpy(seeds), steps=torch.from_numpy(steps))
    assert isinstance(t_out, torch.Tensor) and t_out.dtype == torch.int32
    assert t_out.tolist() == out.tolist() and t_acc.tolist() == acc.tolist()
    assert t_emit.data_ptr() != t_acc.data_ptr()
    # int64 draft ids (torch's default) are accepted (copied).
    t64 = specula.chain_speculative_sampling(torch.from_numpy(q), torch.from_numpy(drafts).long(),
                                             torch.from_numpy(p), seeds=seeds, steps=steps)[0]
    assert t64.tolist() == out.tolist()


def test_draft_lengths():
    p, q, drafts, lengths, seeds, steps = random_batch(10)
    out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=steps)
    for dtype in (np.int32, np.int64):
        out_l, acc_l, _ = specula.chain_speculative_sampling(
            q, drafts, p, seeds=seeds, steps=steps, draft_lengths=lengths.astype(dtype))
        assert np.array_equal(out_l, out) and np.array_equal(acc_l, acc)
    # Slots past a request's length must hold -1 (the C++ check).
    b = int(np.argmin(lengths))
    full = drafts.copy()
    full[b, lengths[b]:] = 0
    if lengths[b] < drafts.shape[1]:
        with pytest.raises(ValueError, match=r"draft_tokens\[row %d\].*must be -1" % b):
            specula.chain_speculative_sampling(q, full, p, seeds=seeds, steps=steps,
                                               draft_lengths=lengths)
