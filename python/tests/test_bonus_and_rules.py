"""vLLM's bonus_token_ids (target rows without bonus rows) and per-request rules (`rule=` a
sequence of one rule per request)."""

import numpy as np
import pytest

import specula_sd as specula
from helpers import draft_from, random_batch, random_rows

try:
    import torch
except ImportError:  # torch is optional: the tests that need it are skipped
    torch = None


def flat_batch(seed, batch=40, vocab=12, max_draft=4):
    """A flattened batch, its target rows with and without each request's bonus row, and
    bonus tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_draft + 1, size=batch)
    q_rows, p_rows, p_bonus_rows, tokens = [], [], [], []
    for b in range(batch):
        q = random_rows(rng, lengths[b], vocab)
        p = random_rows(rng, lengths[b] + 1, vocab)
        p[:-1] = (0.8 * q + 0.2 * p[:-1]).astype(np.float32)  # partly accepted chains
        p /= p.sum(axis=1, keepdims=True)
        q_rows.append(q)
        p_rows.append(p[:-1])
        p_bonus_rows.append(p)
        if lengths[b]:
            tokens.append(draft_from(rng, q, 1)[0])
    return dict(
        lengths=lengths,
        cu=np.cumsum(lengths).astype(np.int32),
        tokens=np.concatenate(tokens).astype(np.int32),
        draft=np.concatenate(q_rows),
        target=np.concatenate(p_rows),
        target_with_bonus_rows=np.concatenate(p_bonus_rows),
        bonus=rng.integers(0, vocab, size=batch),
        seeds=rng.integers(0, 2**62, size=batch),
        vocab=vocab,
    )


def test_bonus_token_ids_replace_the_bonus_sample_and_nothing_else():
    f = flat_batch(1)
    counts0 = np.empty(len(f["lengths"]), np.int32)
    flags0 = np.empty(len(f["lengths"]), np.int32)
    sampled = specula.rejection_sample(f["tokens"], f["cu"], f["draft"],
                                       f["target_with_bonus_rows"], seeds=f["seeds"], steps=3,
                                       num_accepted=counts0, flags=flags0)
    full = counts0 == f["lengths"]
    assert 0 < full.sum() < len(full)
    for bonus in (f["bonus"].astype(np.int64), f["bonus"].astype(np.int32),
                  f["bonus"].astype(np.int64).reshape(-1, 1)):
        counts = np.empty_like(counts0)
        flags = np.empty_like(flags0)
        given = specula.rejection_sample(f["tokens"], f["cu"], f["draft"], f["target"], bonus,
                                         seeds=f["seeds"], steps=3, num_accepted=counts,
                                         flags=flags)
        assert np.array_equal(counts, counts0)
        for b, n in enumerate(f["lengths"]):
            if full[b]:
                assert given[b, n] == f["bonus"][b]
                assert given[b, :n].tolist() == sampled[b, :n].tolist()
                assert flags[b] == specula.CHAIN_VALID | specula.CHAIN_BONUS
            else:
                assert given[b].tolist() == sampled[b].tolist()
                assert flags[b] == flags0[b]
    # Greedy: the bonus replaces the argmax of the bonus row.
    g0 = specula.greedy_chain(f["tokens"], f["cu"], f["target_with_bonus_rows"])
    g = specula.greedy_chain(f["tokens"], f["cu"], f["target"], f["bonus"])
    n0 = (g0 >= 0).sum(axis=1) - 1
    for b, n in enumerate(f["lengths"]):
        expected = g0[b].copy()
        if n0[b] == n:
            expected[n] = f["bonus"][b]
        assert g[b].tolist() == expected.tolist()


def test_bonus_token_ids_with_zero_drafts_and_flat_output():
    # Requests without drafts emit their bonus token and read no target row.
    target = np.zeros((0, 6), np.float32)
    out = specula.rejection_sample(np.zeros(0, np.int32), np.array([0, 0], np.int32), None,
                                   target, np.array([4, 1]), seeds=[1, 2], steps=0)
    assert out.tolist() == [[4], [1]]
    # specula's flattened output layout: num_draft + B slots.
    p = np.zeros((3, 6), np.float32)
    p[[0, 1, 2], [2, 3, 5]] = 1.0  # every draft accepted with certainty
    flat = np.full(5, 99, np.int32)
    specula.rejection_sample(np.array([2, 3, 5], np.int32), np.array([2, 3]), None, p,
                             np.array([0, 1]), seeds=[1, 2], steps=0, output_token_ids=flat)
    assert flat.tolist() == [2, 3, 0, 5, 1]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_bonus_token_ids_torch():
    f = flat_batch(2)
    ref = specula.rejection_sample(f["tokens"], f["cu"], f["draft"], f["target"], f["bonus"],
                                   seeds=f["seeds"], steps=1)
    out = specula.rejection_sample(torch.from_numpy(f["tokens"]).long(),
                                   torch.from_numpy(f["cu"]), torch.from_numpy(f["draft"]),
                                   torch.from_numpy(f["target"]),
                                   torch.from_numpy(f["bonus"]).view(-1, 1),
                                   seeds=torch.from_numpy(f["seeds"]), steps=1)
    assert isinstance(out, torch.Tensor) and out.tolist() == ref.tolist()


def test_bonus_token_ids_bad_input():
    f = flat_batch(3, batch=4)
    args = (f["tokens"], f["cu"], f["draft"], f["target"])
    kw = dict(seeds=f["seeds"], steps=0)
    bad = f["bonus"].copy()
    bad[2] = -1
    with pytest.raises(specula.InvalidInput, match=r"bonus_tokens\[row 2\].*token id out of range"):
        specula.rejection_sample(*args, bad, **kw)
    bad[2] = f["vocab"]
    with pytest.raises(specula.InvalidInput, match=r"bonus_tokens\[row 2\].*vocab_size is 12"):
        specula.rejection_sample(*args, bad, **kw)
    with pytest.raises(specula.InvalidInput, match=r"bonus_tokens\[row 2\]"):
        specula.greedy_chain(f["tokens"], f["cu"], f["target"], bad)
    with pytest.raises(ValueError, match=r"^specula: bonus_token_ids\[0\] = 1099511627776 is "
                                         r"not a token id"):
        specula.rejection_sample(*args, np.array([2**40, 0, 0, 0]), **kw)  # int64, beyond int32
    # Wrong length: B is the number of bonus tokens, so cu_num_draft_tokens disagrees.
    with pytest.raises(ValueError, match=r"cu_num_draft_tokens must have B or B \+ 1 entries "
                                         r"\(B = entries of bonus_token_ids = 5"):
        specula.rejection_sample(*args, np.zeros(5, np.int32), **kw)
    with pytest.raises(ValueError, match=r"B = entries of bonus_token_ids = 3\) but does not "
                                         r"start with 0"):
        specula.rejection_sample(*args, np.zeros(3, np.int32), seeds=f["seeds"][:3], steps=0)
    # Target rows with bonus rows while bonus tokens are given.
    with pytest.raises(ValueError, match="with bonus_token_ids, target_probs needs one row per "
                                         "draft token"):
        specula.rejection_sample(f["tokens"], f["cu"], f["draft"], f["target_with_bonus_rows"],
                                 f["bonus"], **kw)
    with pytest.raises(ValueError, match=r"bonus_token_ids must have shape \(B,\) or \(B, 1\)"):
        specula.rejection_sample(*args, np.zeros((4, 2), np.int32), **kw)
    with pytest.raises(TypeError, match="bonus_token_ids must have dtype int32 or int64"):
        specula.rejection_sample(*args, f["bonus"].astype(np.float32), **kw)


# ---------------------------------------------------------------------------------------------
# Per-request rules
# ---------------------------------------------------------------------------------------------


def relaxed_rules(batch):
    return [specula.relaxed_rule(1.0 + 0.5 * b) for b in range(batch)]


def test_per_request_rules_chain_equal_one_rule_per_request():
    p, q, drafts, _, seeds, _ = random_batch(4, batch=8, vocab=16)
    batch = len(seeds)
    emb = np.random.default_rng(1).standard_normal((16, 3)).astype(np.float32)
    table = specula.neighbour_table(emb, 3)
    families = [
        relaxed_rules(batch),
        [specula.scheduled_rule(specula.linear_schedule(1.0 + b, 4, 4)) for b in range(batch)],
        [specula.typical_rule(0.05 * (b + 1), 0.3) for b in range(batch)],
        [specula.lantern_rule(table, 0.5 * b) for b in range(batch)],
        [None] * batch,
    ]
    for rules in families:
        out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=5,
                                                         rule=tuple(rules))
        for b in range(batch):
            o1, a1, _ = specula.chain_speculative_sampling(
                q[b:b + 1], drafts[b:b + 1], p[b:b + 1], seeds=int(seeds[b]), steps=5,
                rule=rules[b])
            assert o1[0].tolist() == out[b].tolist() and a1[0] == acc[b], (rules[b], b)
    # The rules differ per request: a list of relaxed rules accepts more than the exact rule
    # in total, and as much as the exact rule where omega is 1 (request 0).
    exact, exact_acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=5)
    out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=5,
                                                     rule=relaxed_rules(batch))
    assert out[0].tolist() == exact[0].tolist()
    assert np.all(acc >= exact_acc)


def test_per_request_rules_flattened_tree_and_candidates():
    f = flat_batch(5, batch=10)
    rules = relaxed_rules(10)
    out = specula.rejection_sample(f["tokens"], f["cu"], f["draft"], f["target"], f["bonus"],
                                   seeds=f["seeds"], steps=2, rule=rules)
    offsets = np.concatenate([[0], f["cu"]])
    for b in range(10):
        lo, hi = offsets[b], offsets[b + 1]
        o1 = specula.rejection_sample(f["tokens"][lo:hi], np.array([hi - lo]),
                                      f["draft"][lo:hi], f["target"][lo:hi], f["bonus"][b:b + 1],
                                      seeds=int(f["seeds"][b]), steps=2, rule=rules[b],
                                      max_spec_len=out.shape[1] - 1)
        assert o1[0].tolist() == out[b].tolist()

    rng = np.random.default_rng(6)
    batch, n, vocab = 6, 4, 10
    parents = np.tile(np.array([-1, 0, 0, 1], np.int64), (batch, 1))
    tokens = rng.integers(0, vocab, size=(batch, n)).astype(np.int32)
    tokens[:, 2] = (tokens[:, 1] + 1) % vocab  # distinct siblings
    target = random_rows(rng, batch * n, vocab).reshape(batch, n, vocab)
    draft = random_rows(rng, batch * n, vocab).reshape(batch, n, vocab)
    seeds = np.arange(batch) + 40
    res = specula.verify_tree(parents, tokens, target, draft, seeds=seeds, steps=1,
                              rule=relaxed_rules(batch))
    cands = np.stack([tokens[:, 1], tokens[:, 2]], axis=1)
    cres = specula.verify_candidates(target[:, 0], cands, draft[:, 0], seeds=seeds, steps=1,
                                     rule=relaxed_rules(batch))
    for b in range(batch):
        one = specula.verify_tree(parents[b:b + 1], tokens[b:b + 1], target[b:b + 1],
                                  draft[b:b + 1], seeds=int(seeds[b]), steps=1,
                                  rule=relaxed_rules(batch)[b])
        assert all(one[i][0].tolist() == res[i][b].tolist() for i in range(3))
        c1 = specula.verify_candidates(target[b:b + 1, 0], cands[b:b + 1], draft[b:b + 1, 0],
                                       seeds=int(seeds[b]), steps=1, rule=relaxed_rules(batch)[b])
        assert c1[0][0] == cres[0][b] and c1[1][0] == cres[1][b]


def test_per_request_rules_bad_input():
    p, q, drafts, _, seeds, _ = random_batch(7, batch=3, vocab=16)
    call = specula.chain_speculative_sampling
    with pytest.raises(ValueError, match=r"rule must be one rule, or a sequence of one rule per "
                                         r"request \(B = 3; got 2\)"):
        call(q, drafts, p, seeds=seeds, steps=0, rule=relaxed_rules(2))
    with pytest.raises(ValueError, match=r"rule: the rules of a sequence must be of one kind "
                                         r"\(rule\[0\] is relaxed_rule.*rule\[2\] is exact_rule"):
        call(q, drafts, p, seeds=seeds, steps=0, rule=relaxed_rules(2) + [None])
    with pytest.raises(TypeError, match="rule must be a specula rule"):
        call(q, drafts, p, seeds=seeds, steps=0, rule=relaxed_rules(2) + [1.5])
    # Each rule is checked as a single rule is (omega of a relaxed rule, at construction).
    with pytest.raises(ValueError, match="omega"):
        specula.relaxed_rule(0.0)
    # Row-aware rules are refused by the tree verifier, one or one per request.
    parents = np.array([[-1, 0]], np.int64)
    with pytest.raises(ValueError, match="tree verification takes exact, relaxed or scheduled"):
        specula.verify_tree(parents, np.array([[0, 1]], np.int32), p[:1, :2], q[:1, :2],
                            seeds=1, steps=0, rule=[specula.typical_rule()])
