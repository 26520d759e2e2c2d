"""Token trees, K candidates and greedy trees through the Python API."""

import numpy as np
import pytest

import specula_sd as specula
from helpers import ALPHA, draft_from, g_test, random_rows

V = 6
N = 20000


def without_replacement(rng, q, k):
    """k distinct tokens drawn one after the other from q (renormalised without the earlier)."""
    w = q.astype(np.float64).copy()
    out = []
    for _ in range(k):
        x = rng.choice(len(w), p=w / w.sum())
        out.append(x)
        w[x] = 0
    return out


@pytest.mark.parametrize("sampling", ["without_replacement", "with_replacement"])
def test_tree_first_token_law(sampling):
    """Tree: root with two children drawn from q_root, each with one child drawn from its own
    q. The first emitted token is distributed as p_root."""
    rng = np.random.default_rng(21)
    p = random_rows(rng, 5, V)      # rows of nodes 0..4 (the same for every request)
    q = random_rows(rng, 5, V)
    parents = np.tile(np.array([-1, 0, 0, 1, 2], np.int64), (N, 1))
    tokens = np.full((N, 5), -1, np.int32)
    for b in range(N):
        if sampling == "without_replacement":
            c = without_replacement(rng, q[0], 2)
        else:
            c = list(draft_from(rng, q[0:1], 2)[:, 0])
        tokens[b, 1:3] = c
        tokens[b, 3] = draft_from(rng, q[1:2], 1)[0, 0]
        tokens[b, 4] = draft_from(rng, q[2:3], 1)[0, 0]
    target = np.ascontiguousarray(np.broadcast_to(p, (N, 5, V)))
    draft = np.ascontiguousarray(np.broadcast_to(q, (N, 5, V)))
    out, n, nodes = specula.verify_tree(parents, tokens, target, draft, seeds=5, steps=0,
                                        request_ids=np.arange(N), sampling=sampling)
    assert out.shape == (N, 5) and nodes.shape == (N, 5) and n.shape == (N,)
    assert g_test(np.bincount(out[:, 0], minlength=V), p[0]) > ALPHA
    # The accepted path follows the tree.
    for b in range(50):
        path = nodes[b, :n[b] + 1]
        assert path[0] == 0 and all(parents[b, path[i]] == path[i - 1] for i in range(1, len(path)))
        assert np.array_equal(out[b, :n[b]], tokens[b, path[1:]])


def test_chain_shaped_tree_equals_chain_verification():
    rng = np.random.default_rng(22)
    batch, length = 40, 3
    p = random_rows(rng, batch * (length + 1), V).reshape(batch, length + 1, V)
    q = random_rows(rng, batch * length, V).reshape(batch, length, V)
    drafts = np.stack([draft_from(rng, q[b], 1)[0] for b in range(batch)]).astype(np.int32)
    seeds = np.arange(batch, dtype=np.uint64) * 977
    out, acc, _ = specula.chain_speculative_sampling(q, drafts, p, seeds=seeds, steps=3)
    parents = np.tile(np.arange(-1, length, dtype=np.int64), (batch, 1))
    tokens = np.concatenate([np.full((batch, 1), -1, np.int32), drafts], axis=1)
    # Tree row u holds what u's children were drawn from: q_{u+1} (the last row is unused).
    tq = np.concatenate([q, q[:, :1]], axis=1)
    t_out, t_n, _ = specula.verify_tree(parents, tokens, p, tq, seeds=seeds, steps=3)
    assert np.array_equal(t_out, out) and np.array_equal(t_n, acc)


def test_ragged_trees_with_node_offsets_and_batch_independence():
    rng = np.random.default_rng(23)
    sizes = [1, 3, 4, 2]
    parents = np.concatenate([[-1], [-1, 0, 0], [-1, 0, 1, 1], [-1, 0]]).astype(np.int32)
    p = random_rows(rng, sum(sizes), V)
    q = random_rows(rng, sum(sizes), V)
    tokens = np.full(sum(sizes), -1, np.int32)
    base = 0
    for s in sizes:
        for u in range(1, s):
            tokens[base + u] = -1
        base += s
    tokens[[2, 3]] = without_replacement(rng, q[1], 2)
    tokens[5] = draft_from(rng, q[4:5], 1)[0, 0]
    tokens[[6, 7]] = without_replacement(rng, q[5], 2)
    tokens[9] = draft_from(rng, q[8:9], 1)[0, 0]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    seeds = np.array([4, 3, 2, 1], np.int64)
    out, n, nodes = specula.verify_tree(parents, tokens, p, q, node_offsets=offsets, seeds=seeds,
                                        steps=9)
    for b, s in enumerate(sizes):
        lo, hi = offsets[b], offsets[b + 1]
        o1, n1, nodes1 = specula.verify_tree(parents[lo:hi], tokens[lo:hi], p[lo:hi], q[lo:hi],
                                             seeds=int(seeds[b]), steps=9)
        assert np.array_equal(o1, out[lo:hi]) and n1[0] == n[b]
        assert np.array_equal(nodes1, nodes[lo:hi])


def test_greedy_tree_follows_the_argmax():
    logits = np.zeros((5, V), np.float32)
    logits[0, 3] = 1    # root prefers 3: child node 2
    logits[2, 1] = 1    # node 2 prefers 1: its child node 4
    logits[4, 5] = 1    # bonus 5
    parents = np.array([-1, 0, 0, 1, 2])
    tokens = np.array([-1, 2, 3, 0, 1], np.int32)
    out, n, nodes = specula.greedy_tree(parents, tokens, logits)
    assert out.tolist() == [3, 1, 5, -1, -1] and n.tolist() == [2]
    assert nodes.tolist() == [0, 2, 4, -1, -1]


@pytest.mark.parametrize("with_replacement", [False, True])
def test_candidates_law(with_replacement):
    rng = np.random.default_rng(24)
    k = 3
    p = random_rows(rng, 1, V)[0]
    q = random_rows(rng, 1, V)[0]
    cands = np.empty((N, k), np.int32)
    for b in range(N):
        cands[b] = (draft_from(rng, q[None, :], k)[:, 0] if with_replacement
                    else without_replacement(rng, q, k))
    target = np.ascontiguousarray(np.broadcast_to(p, (N, V)))
    draft = np.ascontiguousarray(np.broadcast_to(q, (N, V)))
    idx, tok = specula.verify_candidates(target, cands, draft, seeds=np.arange(N), steps=2,
                                         with_replacement=with_replacement)
    assert g_test(np.bincount(tok, minlength=V), p) > ALPHA
    hit = idx >= 0
    assert np.array_equal(tok[hit], cands[hit, idx[hit]])


def test_candidates_equal_a_depth_one_tree():
    """A root with K children verifies its children as K candidates at position 0."""
    rng = np.random.default_rng(25)
    batch, k = 30, 3
    p = random_rows(rng, batch, V)
    q = random_rows(rng, batch, V)
    cands = np.array([without_replacement(rng, q[b], k) for b in range(batch)], np.int32)
    seeds = np.arange(batch) + 1000
    idx, tok = specula.verify_candidates(p, cands, q, seeds=seeds, steps=1)
    parents = np.tile(np.array([-1, 0, 0, 0]), (batch, 1))
    tokens = np.concatenate([np.full((batch, 1), -1, np.int32), cands], axis=1)
    tp = np.repeat(p[:, None, :], k + 1, axis=1)     # rows of the children are leaves'
    tq = np.repeat(q[:, None, :], k + 1, axis=1)
    out, n, nodes = specula.verify_tree(parents, tokens, tp, tq, seeds=seeds, steps=1)
    assert np.array_equal(out[:, 0], tok)
    assert np.array_equal(np.where(n > 0, nodes[:, 1] - 1, -1), idx)


def test_tree_rejects_row_aware_rules():
    parents = np.array([-1, 0])
    tokens = np.array([-1, 1], np.int32)
    p = np.full((2, 4), 0.25, np.float32)
    with pytest.raises(ValueError, match="tree verification takes exact, relaxed or scheduled"):
        specula.verify_tree(parents, tokens, p, p, seeds=1, steps=0,
                            rule=specula.typical_rule())
    out, _, _ = specula.verify_tree(parents, tokens, p, p, seeds=1, steps=0,
                                    rule=specula.relaxed_rule(2.0))
    assert out[0] >= 0


def test_candidates_independent_of_batch_position():
    rng = np.random.default_rng(26)
    batch, k = 12, 3
    p = random_rows(rng, batch, 40)
    q = random_rows(rng, batch, 40)
    cands = np.array([without_replacement(rng, q[b], k) for b in range(batch)], np.int32)
    seeds = rng.integers(0, 2**62, size=batch)
    positions = rng.integers(0, 8, size=batch)
    idx, tok = specula.verify_candidates(p, cands, q, seeds=seeds, steps=3, position=positions)
    perm = rng.permutation(batch)
    idx_p, tok_p = specula.verify_candidates(p[perm], cands[perm], q[perm], seeds=seeds[perm],
                                             steps=3, position=positions[perm], threads=0)
    assert np.array_equal(idx_p, idx[perm]) and np.array_equal(tok_p, tok[perm])
    for b in range(batch):
        i1, t1 = specula.verify_candidates(p[b:b + 1], cands[b:b + 1], q[b:b + 1],
                                           seeds=int(seeds[b]), steps=3,
                                           position=int(positions[b]))
        assert i1[0] == idx[b] and t1[0] == tok[b]


def test_empty_batches_with_positive_draft_shapes_are_no_ops():
    # B = 0 with L, n or K > 0: NumPy gives such arrays zero strides; an empty batch is a no-op.
    out, acc, _ = specula.chain_speculative_sampling(
        np.zeros((0, 2, V), np.float32), np.zeros((0, 2), np.int32),
        np.zeros((0, 3, V), np.float32), seeds=1, steps=0)
    assert out.shape == (0, 3) and acc.shape == (0,)
    tokens, counts, nodes = specula.verify_tree(
        np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int32), np.zeros((0, 3, V), np.float32),
        seeds=1, steps=0)
    assert tokens.shape == (0, 3) and counts.shape == (0,)
    index, picked = specula.verify_candidates(
        np.zeros((0, V), np.float32), np.zeros((0, 2), np.int32), seeds=1, steps=0)
    assert index.shape == (0,) and picked.shape == (0,)
