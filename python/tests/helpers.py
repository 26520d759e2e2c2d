"""Shared test helpers: random problems and goodness-of-fit tests (G-test with a chi-squared
p-value from the regularised incomplete gamma function, so that no SciPy is needed)."""

import math

import numpy as np

# Every law test uses fixed seeds, so it is deterministic; a correct implementation fails a
# test at this level with probability 1e-6 per seed choice.
ALPHA = 1e-6


def random_rows(rng, rows, vocab, zeros=0, dtype=np.float32):
    """Random probability rows (Dirichlet(1)); `zeros` entries per row set to 0."""
    p = rng.dirichlet(np.ones(vocab), size=rows)
    for r in range(rows):
        if zeros:
            p[r, rng.choice(vocab, size=zeros, replace=False)] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    return p.astype(dtype)


def random_batch(seed, batch=9, vocab=50, max_draft=4):
    """A padded batch: target rows (B, L + 1, V), proposal rows (B, L, V), drafts drawn from them
    (-1 after each request's random length), the lengths, and per-request seeds and steps."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_draft + 1, size=batch)
    p = random_rows(rng, batch * (max_draft + 1), vocab).reshape(batch, max_draft + 1, vocab)
    q = random_rows(rng, batch * max_draft, vocab).reshape(batch, max_draft, vocab)
    drafts = np.full((batch, max_draft), -1, np.int32)
    for b in range(batch):
        drafts[b, :lengths[b]] = draft_from(rng, q[b, :lengths[b]], 1)[0] if lengths[b] else []
    seeds = rng.integers(0, 2**63, size=batch, dtype=np.int64)
    steps = rng.integers(0, 2**31, size=batch, dtype=np.int64)
    return p, q, drafts, lengths, seeds, steps


def _upper_gamma_regularised(a, x):
    """Q(a, x) = Gamma(a, x) / Gamma(a) (Numerical Recipes: series or continued fraction)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    b = x + 1 - a
    c = 1e300
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def chi2_sf(stat, df):
    return _upper_gamma_regularised(df / 2.0, stat / 2.0)


def g_test(observed, expected_probs, min_expected=5.0):
    """p-value of observed counts against a law (bins with small expectation pooled; an
    observation where the law is 0 gives p = 0)."""
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(expected_probs, dtype=np.float64)
    n = observed.sum()
    if np.any((probs == 0) & (observed > 0)):
        return 0.0
    expected = probs * n
    order = np.argsort(expected)
    obs, exp = [], []
    acc_o = acc_e = 0.0
    for i in order:
        if expected[i] == 0:
            continue
        acc_o += observed[i]
        acc_e += expected[i]
        if acc_e >= min_expected:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        if obs:
            obs[-1] += acc_o
            exp[-1] += acc_e
        else:
            obs.append(acc_o)
            exp.append(acc_e)
    if len(obs) < 2:
        return 1.0
    obs, exp = np.array(obs), np.array(exp)
    nz = obs > 0
    g = 2.0 * np.sum(obs[nz] * np.log(obs[nz] / exp[nz]))
    return chi2_sf(g, len(obs) - 1)


def homogeneity_test(a, b):
    """p-value (G-test of homogeneity) that two samples of hashable outcomes share one law."""
    keys = sorted(set(a) | set(b))
    index = {k: i for i, k in enumerate(keys)}
    table = np.zeros((2, len(keys)))
    for k in a:
        table[0, index[k]] += 1
    for k in b:
        table[1, index[k]] += 1
    # Pool rare outcomes together.
    total = table.sum(axis=0)
    rare = total < 10
    if rare.any():
        table = np.concatenate([table[:, ~rare], table[:, rare].sum(axis=1, keepdims=True)], 1)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0
    rows = table.sum(axis=1, keepdims=True)
    cols = table.sum(axis=0, keepdims=True)
    expected = rows * cols / table.sum()
    nz = table > 0
    g = 2.0 * np.sum(table[nz] * np.log(table[nz] / expected[nz]))
    return chi2_sf(g, table.shape[1] - 1)


def draft_from(rng, q_rows, n):
    """n independent draws from each row of q_rows: (n, rows) tokens."""
    cdf = np.cumsum(q_rows.astype(np.float64), axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random((n, q_rows.shape[0]))
    return np.stack([np.searchsorted(cdf[r], u[:, r], side="right")
                     for r in range(q_rows.shape[0])], axis=1).astype(np.int32)
