"""Jacobi Forcing data layout in plain Python (no numpy, no torch): noisy-view selection, the
packed token sequence, its position ids and attention mask, and the slots each loss term reads.

tools/jacobi_forcing.py (the trainer) builds its tensors from these lists; the ctest
`tools.jf_packing_matches_cpp` (tests/tools/check_jf_packing.py) compares them with the C++
library (specula/decode/jacobi_forcing.hpp: jacobi_packing, jacobi_noise_for,
select_noisy_view) on several shapes. The two sides are separate readings of the same rules
(docs/jacobi_forcing.md; paper: arXiv 2512.14681, §3.1, Fig. 2b, Appendix C):

  layout   [prompt (P) | noisy 0 | clean 0 | noisy 1 | clean 1 | ... | noisy N-1 | clean N-1]
  ids      prompt slot i -> i; offset r of block b -> P + b*n + r in its noisy and clean copies
  mask     the prompt is causal; a clean block sees the prompt, the earlier clean blocks and
           itself causally; a noisy block sees the prompt, itself causally and the earlier
           blocks' copies chosen by the mask kind: "nc" the noisy ones (Fig. 2b), "cllm" the
           clean ones (Fig. 2a), "nc_ic" the clean ones of earlier windows and the noisy ones of
           its own window of `window` blocks (NC-IC, Table 5)
"""

MASKS = ("nc", "nc_ic", "cllm")  # Table 5: noise-conditioned, NC + intra-window clean, CLLM


def released_noise_ratios(num_blocks, window):
    """t_b = linspace(0, 1, w)[b mod w] as numpy computes it (j * (1 / (w - 1)), the last point
    exactly 1): the released data preparation's progressive schedule; w = 1 gives 0."""
    def point(j):
        if window == 1 or j == 0:
            return 0.0
        if j == window - 1:
            return 1.0
        return j * (1.0 / (window - 1))
    return [point(b % window) for b in range(num_blocks)]


def first_divergence(point, fixed):
    """First offset where `point` differs from `fixed` (len(fixed) when they are equal)."""
    for r, (a, b) in enumerate(zip(point, fixed)):
        if a != b:
            return r
    return len(fixed)


def suffix_noise(point, fixed):
    """The released noise fraction of a trajectory point: (n - first divergence) / n."""
    n = len(fixed)
    return (n - first_divergence(point, fixed)) / n


def select_noisy_view(points, fixed, ratio):
    """Index of the trajectory point (a list of n-token points) whose suffix noise fraction is
    nearest to `ratio`; ties go to the earliest point (numpy's argmin)."""
    best, best_gap = 0, None
    for k, p in enumerate(points):
        gap = abs(suffix_noise(p, fixed) - ratio)
        if best_gap is None or gap < best_gap:
            best, best_gap = k, gap
    return best


def noisy_begin(P, n, b):
    return P + 2 * b * n


def clean_begin(P, n, b):
    return P + (2 * b + 1) * n


def packed_length(P, N, n):
    return P + 2 * N * n


def position_ids(P, N, n):
    """Position id of every packed slot (a noisy block and its clean block share them)."""
    pos = list(range(P))
    for b in range(N):
        block = [P + b * n + r for r in range(n)]
        pos += block + block
    return pos


def pack_tokens(prompt, clean, noisy, n):
    """The packed sequence from the prompt (P tokens), the clean generation and the concatenated
    noisy views (N * n tokens each)."""
    if len(clean) != len(noisy) or len(clean) % n:
        raise ValueError(f"clean ({len(clean)}) and noisy ({len(noisy)}) must both hold N * {n} "
                         "tokens")
    seq = list(prompt)
    for b in range(len(clean) // n):
        seq += list(noisy[b * n:(b + 1) * n]) + list(clean[b * n:(b + 1) * n])
    return seq


def packed_mask(P, N, n, kind="nc", window=1):
    """[L][L] booleans (L = P + 2 N n), True where slot i attends to slot j."""
    if kind not in MASKS:
        raise ValueError(f"mask kind {kind!r}: expected one of {MASKS}")
    if kind == "nc_ic" and window < 1:
        raise ValueError(f"window {window}: must be >= 1")
    L = packed_length(P, N, n)
    m = [[False] * L for _ in range(L)]

    def see(i, lo, hi):
        row = m[i]
        for j in range(lo, hi):
            row[j] = True

    for i in range(P):
        see(i, 0, i + 1)
    for b in range(N):
        for noisy in (True, False):
            start = noisy_begin(P, n, b) if noisy else clean_begin(P, n, b)
            for r in range(n):
                i = start + r
                see(i, 0, P)
                see(i, start, i + 1)
                for e in range(b):
                    if not noisy or kind == "cllm":
                        src = clean_begin(P, n, e)
                    elif kind == "nc" or e // window == b // window:
                        src = noisy_begin(P, n, e)
                    else:  # nc_ic, a block of an earlier window
                        src = clean_begin(P, n, e)
                    see(i, src, src + n)
    return m


def ar_slots(P, N, n):
    """(inputs, targets): the slots of the AR term's next-token pairs. The clean stream is the
    prompt followed by the clean blocks (in this layout block 0 starts with the last prompt
    token, its root, and the prompt slots hold the prompt without it); slot inputs[k]'s logits
    predict the token at slot targets[k]."""
    stream = list(range(P)) + [clean_begin(P, n, b) + r for b in range(N) for r in range(n)]
    return stream[:-1], stream[1:]


def consistency_keep(packed, P, N, n, positions="all"):
    """N * n booleans, one per noisy slot in packing order (block b, offset r at b * n + r): does
    the consistency term compare that noisy slot with the clean slot of the same offset?
    positions="all": every offset of every block; "from_divergence" (the released trainer): in
    each block only the offsets at or after the first token where the noisy view differs from
    the clean block (a block equal to its clean copy contributes nothing)."""
    if positions not in ("all", "from_divergence"):
        raise ValueError(f"positions {positions!r}: expected 'all' or 'from_divergence'")
    keep = []
    for b in range(N):
        s0, t0 = noisy_begin(P, n, b), clean_begin(P, n, b)
        first = 0
        if positions == "from_divergence":
            first = first_divergence(packed[s0:s0 + n], packed[t0:t0 + n])
        keep += [r >= first for r in range(n)]
    return keep


def noisy_slots(P, N, n):
    """The noisy slots in packing order; the clean slot of the same offset is n further."""
    return [noisy_begin(P, n, b) + r for b in range(N) for r in range(n)]
