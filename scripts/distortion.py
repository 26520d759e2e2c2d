#!/usr/bin/env python3
"""Distortion of relaxed speculative decoding on the demo's image task, measured on samples.

For every configuration (e.g. Cool-SD at some schedule and delta, LANTERN++ at some lambda) the
script decodes N images with `specula_demo --task image` and compares them with N images of
an exact reference ("A", exact SD by default) from the same labels (N / labels images per
label; different random streams). A second exact run ("B", other seeds) gives the noise floor:
the distance between two samples of the same law at the same N, which is what a relaxed
configuration's distance to A must be read against (every plug-in TV estimator below is biased
upwards at finite N, so only like-with-like comparisons at the same N mean anything).

    scripts/distortion.py --demo build/examples/demo/specula_demo
        --scorer build/examples/specula_example_image_label_score
        [--n 256] [--labels 0,1,2,3,4,5,6,7] [--image-model image-ar-256]
        [--common "--cfg 3 --top-k 32"] [--exact "--method sd --draft-length 4"]
        [--preset cool-sd [--draft-length 4]] [--config "NAME::ARGS" ...] [--n-sweep N]
        [--permutations 200] [--cache-dir DIR [--cached-only]] [--nice 10]
        [--json out.json] [--svg figure.svg] [--check-same NAME] [--check-different NAME]

Distances, each between a configuration's samples R and the reference A (and B vs A for the
noise floor):

- marginal TV: the mean over the grid positions of the total variation between the empirical
  token distributions at that position (images of all labels pooled; both sets have the same
  number of images per label);
- bigram TV (h, v): the total variation between the empirical distributions of horizontally
  (vertically) adjacent token pairs, pooled over the grid;
- class consistency: the image model's own posterior of the label given the image,
  p(c | x) = p(x | c) / sum_c' p(x | c') (uniform prior over the classes; log p(x | c) from
  `specula_example_image_label_score`, the target model's unguided likelihood at temperature 1
  restricted to image tokens); the distance is mean_A p(label | x) - mean_R p(label | x) (positive:
  R is less class-consistent). The mean posterior is reported rather than the mean log posterior,
  which is heavy-tailed (a misclassified image has log p(label | x) in the -100s); both are in
  the JSON, with the Bayes classifier's accuracy.

Confidence intervals (95 %, normal, d +- 1.96 se) use the delete-one jackknife over images:
the variance of a distance between two sets is the sum of the jackknife variances over each
set's images, and that of the excess over the noise floor, TV(R, A) - TV(B, A), the sum over
R's, A's (both terms move together) and B's images. The class-posterior means use the variance
of a mean stratified by label. (A bootstrap is not used: resampling with replacement repeats
images, which shifts every plug-in TV upwards by more than its spread at these N.) The
jackknife's standard error of the marginal TV was checked against the spread of TV(R_j, A) over
12 independent exact sets R_j (AR on image-ar, N = 64): 0.031 observed, 0.032 estimated.
Whether R is distinguishable from the exact law is decided by a permutation test of R against A
(the images of both sets relabelled at random between the two within each label,
--permutations times; the p-value of the observed marginal / horizontal bigram TV): p >= 0.05
reads as "not distinguishable at this N". Step compression is tokens per target forward pass
(sums over the images), with a jackknife interval.

Decoded sets are cached in --cache-dir (JSON, keyed by the demo arguments), so re-running with
other statistics or another figure does not decode again. Seeds: set s (A = 1, B = 2, the
configurations 3, 4, ... in the order given: presets, then --config) decodes label c with
`--seed 1000 * s + c`, image i with request id i.

--preset cool-sd adds the sweep of docs/RESULTS.md: uniform, exponential (nu = 0.7) and linear
(ell = 8) schedules at several delta, LANTERN++ (paper cap, k = 10) at several lambda, and plain
AR decoding as a second exact control. --check-same NAME makes the script exit 1 unless NAME is
not distinguishable from A (marginal TV: permutation p >= 0.05 and an excess interval holding
0), --check-different NAME unless it is (p < 0.05 and the interval above 0); the ctest
`examples.distortion_tool` compares AR with AR (same law, other seeds) and with AR at
temperature 2 on the 8x8 image-ar model.
"""

import argparse
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # the ctest skips (exit code 77) where numpy is missing
    print("distortion.py: numpy is not available (skipped)", file=sys.stderr)
    sys.exit(77)

def preset_cool_sd(L):
    """The sweep of docs/RESULTS.md (draft length L for the drafting methods)."""
    sd = f"--draft-length {L}"
    rows = [("ar", "AR (exact)", 0.0, "--method ar")]
    for d in (1.5, 2, 3, 5, 10, 30):
        rows.append((f"uniform d={d:g}", "uniform", d,
                     f"--method cool-sd {sd} --cool-schedule uniform --delta {d:g}"))
    for d in (1.5, 2, 3, 5, 10, 30):
        rows.append((f"exponential d={d:g}", "exponential", d,
                     f"--method cool-sd {sd} --cool-schedule exponential --nu 0.7 --delta {d:g}"))
    for d in (1.5, 2, 3, 5, 10, 30):
        rows.append((f"linear d={d:g}", "linear", d,
                     f"--method cool-sd {sd} --cool-schedule linear --ell 8 --delta {d:g}"))
    for lam in (0.5, 1, 3, 10):
        rows.append((f"lantern l={lam:g}", "lantern", lam,
                     f"--method lantern {sd} --lantern-k 10 --lambda {lam:g}"))
    return rows


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", default="build/examples/demo/specula_demo")
    ap.add_argument("--scorer", default="build/examples/specula_example_image_label_score")
    ap.add_argument("--n", type=int, default=256, help="images per set (exact A, exact B, configs)")
    ap.add_argument("--n-sweep", type=int, default=0, help="images per configuration (default --n)")
    ap.add_argument("--labels", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--image-model", default="image-ar-256")
    ap.add_argument("--common", default="--cfg 3 --top-k 32", help="demo flags of every set")
    ap.add_argument("--exact", default="--method sd --draft-length 4",
                    help="the exact reference's demo flags")
    ap.add_argument("--draft-length", type=int, default=4, help="the preset's draft length")
    ap.add_argument("--preset", choices=["cool-sd"], action="append", default=[])
    ap.add_argument("--config", action="append", default=[], metavar="NAME::ARGS")
    ap.add_argument("--permutations", type=int, default=200)
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--json", default="", help="write every statistic here")
    ap.add_argument("--svg", default="", help="write the trade-off figure here")
    ap.add_argument("--cached-only", action="store_true",
                    help="decode nothing: skip the configurations not in --cache-dir")
    ap.add_argument("--nice", type=int, default=0, help="run the demo and scorer under nice -n")
    ap.add_argument("--check-same", action="append", default=[], metavar="NAME")
    ap.add_argument("--check-different", action="append", default=[], metavar="NAME")
    return ap.parse_args()


# ---------------------------------------------------------------------------------------------
# Decoding and scoring


def nice_prefix(args):
    return ["nice", "-n", str(args.nice)] if args.nice else []


def decode_set(args, flags, n, labels, set_id, tmp):
    """Decodes n images (n / len(labels) per label) with `flags`; returns a dict of arrays."""
    per = n // len(labels)
    key_src = json.dumps(
        {"flags": flags, "per": per, "labels": labels, "set": set_id, "model": args.image_model}
    )
    key = hashlib.sha1(key_src.encode()).hexdigest()[:16]
    path = os.path.join(args.cache_dir, f"set_{key}.json") if args.cache_dir else ""
    if path and os.path.exists(path):
        with open(path) as f:
            d = json.load(f)
        if d.get("key") == key_src:
            return {k: np.asarray(v) if isinstance(v, list) else v for k, v in d.items()}
    if args.cached_only:
        return None
    toks, labs, ntok, nfwd, ndraft, steps, wall = [], [], [], [], [], [], 0.0
    for c in labels:
        cmd = nice_prefix(args) + [args.demo, "--task", "image", "--image-model", args.image_model]
        cmd += shlex.split(flags) + ["--label", str(c), "--num-samples", str(per)]
        cmd += ["--seed", str(1000 * set_id + c), "--json", "--quiet", "--scale", "1"]
        cmd += ["--out-dir", tmp]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        j = json.loads(out)
        wall += j["wall_seconds"]
        for s in j["samples"]:
            toks.append(s["image_tokens"])
            labs.append(c)
            ntok.append(s["tokens"])
            nfwd.append(s["target_forwards"])
            ndraft.append(s["draft_forwards"])
            steps.append(s["steps"])
    d = {
        "key": key_src,
        "tokens": np.asarray(toks, dtype=np.int64),
        "labels": np.asarray(labs, dtype=np.int64),
        "n_tokens": np.asarray(ntok),
        "target_forwards": np.asarray(nfwd),
        "draft_forwards": np.asarray(ndraft),
        "steps": np.asarray(steps),
        "wall_seconds": wall,
    }
    d["loglik"] = score_images(args, d["tokens"])
    if path:
        os.makedirs(args.cache_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in d.items()}, f)
        os.replace(path + ".tmp", path)
    return d


def score_images(args, tokens):
    """log p(x | c) for every image and class, from the scorer."""
    text = "".join(" ".join(map(str, row)) + "\n" for row in tokens.tolist())
    cmd = nice_prefix(args) + [args.scorer, "--stdin", "--model", args.image_model]
    out = subprocess.run(cmd, input=text, check=True, capture_output=True, text=True).stdout
    ll = np.array([[float(x) for x in line.split()] for line in out.splitlines() if line.strip()])
    if ll.shape[0] != tokens.shape[0]:
        raise RuntimeError(f"scorer returned {ll.shape[0]} rows for {tokens.shape[0]} images")
    return ll


# ---------------------------------------------------------------------------------------------
# Statistics


class Features:
    """Per-image histogram codes (marginal: position * V + token; bigrams: a * V + b), the class
    posterior and the step statistics of one decoded set."""

    def __init__(self, d, vocab, grid):
        t = d["tokens"]
        n, P = t.shape
        self.n = n
        self.labels = d["labels"]
        g = t.reshape(n, grid, grid)
        # name -> (codes [n, K], bins S, entries per image K)
        self.hists = {
            "marginal_tv": ((np.arange(P)[None, :] * vocab + t).astype(np.int64), P * vocab),
            "bigram_tv_h": ((g[:, :, :-1] * vocab + g[:, :, 1:]).reshape(n, -1), vocab * vocab),
            "bigram_tv_v": ((g[:, :-1, :] * vocab + g[:, 1:, :]).reshape(n, -1), vocab * vocab),
        }
        self.counts = {m: np.bincount(c.ravel(), minlength=S).astype(float)
                       for m, (c, S) in self.hists.items()}
        ll = d["loglik"]
        mx = ll.max(1, keepdims=True)
        lp = ll - (mx + np.log(np.exp(ll - mx).sum(1, keepdims=True)))
        self.log_post = lp[np.arange(n), self.labels]
        self.post = np.exp(self.log_post)
        self.correct = (ll.argmax(1) == self.labels).astype(float)
        self.ntok = d["n_tokens"].astype(float)
        self.nfwd = d["target_forwards"].astype(float)

    def loo(self, m, i):
        """Histogram counts of `m` without image i."""
        c, S = self.hists[m]
        return self.counts[m] - np.bincount(c[i], minlength=S)


TV_METRICS = ["marginal_tv", "bigram_tv_h", "bigram_tv_v"]
METRICS = TV_METRICS + ["class_posterior_drop"]


def tv(ca, na, cb, nb, K):
    """Plug-in TV from counts: marginal, the mean over positions (K = positions, each image one
    entry per position); bigrams, over the pooled pairs (K = pairs per image)."""
    return float(np.abs(ca / na - cb / nb).sum() / (2 * K))


def jack_var(values):
    """Delete-one jackknife variance from the leave-one-out values of one sample."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    return float((n - 1) / n * ((v - v.mean()) ** 2).sum()) if n > 1 else 0.0


def loo_tv(fx, fy, m):
    """TV(x, y) with each image of x left out in turn."""
    c, _ = fx.hists[m]
    K = c.shape[1]
    return np.array([tv(fx.loo(m, i), fx.n - 1, fy.counts[m], fy.n, K) for i in range(fx.n)])


def mean_var(f):
    """Variance of the mean class posterior of a set, stratified by label (every set has the
    same number of images per label, so the between-label spread is no sampling noise)."""
    n = len(f.post)
    return float(sum((f.post[f.labels == c].var(ddof=1) * (f.labels == c).sum()) / n**2
                     for c in np.unique(f.labels)))


def ci_normal(v, var):
    h = 1.96 * math.sqrt(max(var, 0.0))
    return [float(v - h), float(v + h)]


def permutation_p(fa, fr, n_perm, rng):
    """p-values of the observed (marginal, bigram h) TV of R vs A when the images of A and R are
    relabelled at random between the two sets within each label (n_perm times)."""
    if n_perm <= 0:
        return [float("nan"), float("nan")]
    ms = ["marginal_tv", "bigram_tv_h"]
    codes = {m: np.concatenate([fa.hists[m][0], fr.hists[m][0]]) for m in ms}
    sizes = {m: fa.hists[m][1] for m in ms}
    labels = np.concatenate([fa.labels, fr.labels])
    groups = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    na_per = [int((fa.labels == labels[g[0]]).sum()) for g in groups]

    def stat(ia, ir):
        out = []
        for m in ms:
            K = codes[m].shape[1]
            ca = np.bincount(codes[m][ia].ravel(), minlength=sizes[m])
            cr = np.bincount(codes[m][ir].ravel(), minlength=sizes[m])
            out.append(tv(ca, len(ia), cr, len(ir), K))
        return np.array(out)

    obs = stat(np.arange(fa.n), fa.n + np.arange(fr.n))
    ge = np.zeros(2)
    for _ in range(n_perm):
        xa, xr = [], []
        for g, k in zip(groups, na_per):
            p = rng.permutation(g)
            xa.append(p[:k])
            xr.append(p[k:])
        ge += stat(np.concatenate(xa), np.concatenate(xr)) >= obs - 1e-12
    return [float((1 + ge[0]) / (1 + n_perm)), float((1 + ge[1]) / (1 + n_perm))]


def step_compression_ci(f):
    T, F = f.ntok.sum(), f.nfwd.sum()
    v = T / F
    loo = (T - f.ntok) / (F - f.nfwd)
    return v, ci_normal(v, jack_var(loo))


# ---------------------------------------------------------------------------------------------
# Figure (plain SVG; no plotting library needed)

COLOURS = {
    "uniform": "#1f77b4",
    "exponential": "#d62728",
    "linear": "#2ca02c",
    "lantern": "#9467bd",
    "exact": "#000000",
    "other": "#7f7f7f",
}


def svg_figure(rows, floor, path, title):
    panels = [
        ("marginal_tv", "per-position marginal TV to exact SD"),
        ("bigram_tv_h", "horizontal bigram TV to exact SD"),
        ("class_posterior_drop", "drop of mean p(label | x) vs exact SD"),
    ]
    W, H, ml, mr, mt, mb = 360, 300, 62, 12, 30, 46
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(panels)}" height="{H + 40}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{W * len(panels) / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
    ]
    rows = [r for r in rows if r["family"] != "AR (exact)"]  # x = 1 would squeeze the rest
    sc0 = floor["exact_step_compression"]
    xs = [r["step_compression"] for r in rows] + [sc0, 1.3 * sc0]
    xlo, xhi = min(xs) - 0.1, max(xs) + 0.1
    for k, (m, label) in enumerate(panels):
        ox = k * W
        ys = [r[m] for r in rows] + [r[m + "_ci"][1] for r in rows] + [floor[m + "_ci"][1]]
        ys += [r[m + "_ci"][0] for r in rows] + [floor[m + "_ci"][0]]
        ylo, yhi = min(ys), max(ys)
        pad = 0.05 * (yhi - ylo or 1)
        ylo, yhi = ylo - pad, yhi + pad

        def X(x):
            return ox + ml + (x - xlo) / (xhi - xlo) * (W - ml - mr)

        def Y(y):
            return 20 + mt + (yhi - y) / (yhi - ylo) * (H - mt - mb)

        out.append(
            f'<rect x="{ox + ml}" y="{20 + mt}" width="{W - ml - mr}" height="{H - mt - mb}" '
            'fill="none" stroke="#444"/>'
        )
        # The noise floor: exact B vs exact A, its CI as a band.
        lo, hi = floor[m + "_ci"]
        out.append(
            f'<rect x="{ox + ml}" y="{Y(hi):.1f}" width="{W - ml - mr}" '
            f'height="{max(Y(lo) - Y(hi), 1):.1f}" fill="#dddddd"/>'
        )
        out.append(
            f'<line x1="{ox + ml}" x2="{ox + W - mr}" y1="{Y(floor[m]):.1f}" y2="{Y(floor[m]):.1f}" '
            'stroke="#888" stroke-dasharray="4 3"/>'
        )
        for i in range(5):
            yv = ylo + (yhi - ylo) * i / 4
            out.append(f'<text x="{ox + ml - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.3f}</text>')
            xv = xlo + (xhi - xlo) * i / 4
            out.append(f'<text x="{X(xv):.1f}" y="{20 + H - mb + 14}" text-anchor="middle">{xv:.2f}</text>')
        out.append(
            f'<text x="{ox + (W + ml) / 2}" y="{20 + H - 12}" text-anchor="middle">'
            "tokens per target forward</text>"
        )
        out.append(f'<text x="{ox + (W + ml) / 2}" y="{20 + mt - 6}" text-anchor="middle">{label}</text>')
        # Exact SD at its step compression (its distance: the floor), and 1.3x its speed.
        out.append(f'<circle cx="{X(sc0):.1f}" cy="{Y(floor[m]):.1f}" r="3.5" fill="#000"/>')
        out.append(
            f'<line x1="{X(1.3 * sc0):.1f}" x2="{X(1.3 * sc0):.1f}" y1="{20 + mt}" y2="{20 + H - mb}" '
            'stroke="#000" stroke-dasharray="2 3"/>'
        )
        out.append(f'<text x="{X(1.3 * sc0) + 3:.1f}" y="{20 + H - mb - 4}">1.3x exact SD</text>')
        fams = {}
        for r in rows:
            fams.setdefault(r["family"], []).append(r)
        for fam, rs in fams.items():
            col = COLOURS.get(fam, COLOURS["other"])
            rs = sorted(rs, key=lambda r: r["param"])
            if len(rs) > 1:
                pts = " ".join(f"{X(r['step_compression']):.1f},{Y(r[m]):.1f}" for r in rs)
                out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="1.2"/>')
            for r in rs:
                x, y = X(r["step_compression"]), Y(r[m])
                lo, hi = r[m + "_ci"]
                out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{Y(lo):.1f}" y2="{Y(hi):.1f}" stroke="{col}"/>')
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{col}"/>')
        if k == 0:
            ly = 20 + mt + 8
            for fam in fams:
                out.append(
                    f'<circle cx="{ox + ml + 10}" cy="{ly}" r="3" fill="{COLOURS.get(fam, COLOURS["other"])}"/>'
                )
                out.append(f'<text x="{ox + ml + 18}" y="{ly + 4}">{fam}</text>')
                ly += 14
            out.append(f'<circle cx="{ox + ml + 10}" cy="{ly}" r="3.5" fill="#000"/>')
            out.append(f'<text x="{ox + ml + 18}" y="{ly + 4}">exact SD</text>')
            ly += 14
            out.append(f'<rect x="{ox + ml + 6}" y="{ly - 4}" width="8" height="8" fill="#dddddd"/>')
            out.append(f'<text x="{ox + ml + 18}" y="{ly + 4}">exact vs exact (noise floor)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


# ---------------------------------------------------------------------------------------------


def main():
    args = parse_args()
    labels = [int(x) for x in args.labels.split(",")]
    n_sweep = args.n_sweep or args.n
    for n in (args.n, n_sweep):
        if n % len(labels):
            sys.exit(f"--n / --n-sweep must be a multiple of the number of labels ({len(labels)})")
    configs = []
    for p in args.preset:
        if p == "cool-sd":
            configs += preset_cool_sd(args.draft_length)
    for c in args.config:
        name, _, flags = c.partition("::")
        if not flags:
            sys.exit(f"--config {c!r}: expected NAME::ARGS")
        configs.append((name, "other", 0.0, flags))
    grid = 16 if args.image_model == "image-ar-256" else 8
    vocab = 128
    rng = np.random.default_rng(12345)

    with tempfile.TemporaryDirectory() as tmp:

        def dec(flags, n, set_id):
            full = f"{args.common} {flags}".strip()
            if not args.cached_only:
                print(f"decoding set {set_id}: {full} ({n} images)", file=sys.stderr, flush=True)
            return decode_set(args, full, n, labels, set_id, tmp)

        da = dec(args.exact, args.n, 1)
        db = dec(args.exact, args.n, 2)
        if da is None or db is None:
            sys.exit("--cached-only: the exact sets are not in --cache-dir")
        fa, fb = Features(da, vocab, grid), Features(db, vocab, grid)
        K = {m: fa.hists[m][0].shape[1] for m in TV_METRICS}
        # The noise floor TV(B, A) and its leave-one-out values over A and over B.
        floor_obs = {m: tv(fb.counts[m], fb.n, fa.counts[m], fa.n, K[m]) for m in TV_METRICS}
        floor_loo_a = {m: loo_tv(fa, fb, m) for m in TV_METRICS}
        floor_loo_b = {m: loo_tv(fb, fa, m) for m in TV_METRICS}
        exact_sc = float((fa.ntok.sum() + fb.ntok.sum()) / (fa.nfwd.sum() + fb.nfwd.sum()))
        pooled = Features.__new__(Features)
        pooled.ntok = np.concatenate([fa.ntok, fb.ntok])
        pooled.nfwd = np.concatenate([fa.nfwd, fb.nfwd])
        floor = {"n": args.n, "exact_step_compression": exact_sc,
                 "exact_step_compression_ci": step_compression_ci(pooled)[1],
                 "permutation_p": permutation_p(fa, fb, args.permutations, rng)}
        for m in TV_METRICS:
            floor[m] = floor_obs[m]
            floor[m + "_ci"] = ci_normal(floor_obs[m], jack_var(floor_loo_a[m]) + jack_var(floor_loo_b[m]))
        cls = float(fa.post.mean() - fb.post.mean())
        floor["class_posterior_drop"] = cls
        floor["class_posterior_drop_ci"] = ci_normal(cls, mean_var(fa) + mean_var(fb))
        floor["class_posterior_exact"] = float(fa.post.mean())
        floor["class_accuracy_exact"] = float(fa.correct.mean())
        floor["class_log_posterior_exact"] = float(fa.log_post.mean())

        rows = []
        for set_id, (name, fam, param, flags) in enumerate(configs, start=3):
            d = dec(flags, n_sweep, set_id)
            if d is None:
                continue
            fr = Features(d, vocab, grid)
            sc, sc_ci = step_compression_ci(fr)
            r = {"name": name, "family": fam, "param": param, "flags": f"{args.common} {flags}".strip(),
                 "n": fr.n, "step_compression": float(sc), "step_compression_ci": sc_ci,
                 "draft_forwards_per_image": float(d["draft_forwards"].mean()),
                 "wall_seconds_per_image": float(d["wall_seconds"] / fr.n),
                 "class_posterior": float(fr.post.mean()), "class_accuracy": float(fr.correct.mean()),
                 "class_log_posterior": float(fr.log_post.mean()),
                 "permutation_p": permutation_p(fa, fr, args.permutations, rng)}
            r["speedup_vs_exact_sd"] = r["step_compression"] / exact_sc
            for m in TV_METRICS:
                v = tv(fr.counts[m], fr.n, fa.counts[m], fa.n, K[m])
                loo_r = loo_tv(fr, fa, m)  # R's images left out
                loo_a = loo_tv(fa, fr, m)  # A's images left out
                r[m] = v
                r[m + "_ci"] = ci_normal(v, jack_var(loo_r) + jack_var(loo_a))
                e = v - floor_obs[m]
                r[m + "_excess"] = e
                r[m + "_excess_ci"] = ci_normal(
                    e, jack_var(loo_r) + jack_var(loo_a - floor_loo_a[m]) + jack_var(floor_loo_b[m]))
            c = float(fa.post.mean() - fr.post.mean())
            r["class_posterior_drop"] = c
            r["class_posterior_drop_ci"] = ci_normal(c, mean_var(fa) + mean_var(fr))
            rows.append(r)
            print(
                f"  {name}: step compression {r['step_compression']:.3f}, marginal TV "
                f"{r['marginal_tv']:.4f} (floor {floor['marginal_tv']:.4f}), p {r['permutation_p'][0]:.3f}",
                file=sys.stderr,
                flush=True,
            )

    result = {
        "image_model": args.image_model,
        "common": args.common,
        "exact": args.exact,
        "labels": labels,
        "n_exact": args.n,
        "n_sweep": n_sweep,
        "permutations": args.permutations,
        "noise_floor": floor,
        "configs": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))
    if args.svg and rows:
        svg_figure(rows, floor, args.svg,
                   f"{args.image_model}, {args.common}; exact: {args.exact}; N = {n_sweep}")

    failed = check_structure(result)
    by_name = {r["name"]: r for r in rows}
    for name in args.check_same + args.check_different:
        if name not in by_name:
            sys.exit(f"--check-*: no configuration named {name!r}")
    for name in args.check_same:
        r = by_name[name]
        lo, hi = r["marginal_tv_excess_ci"]
        if not (r["permutation_p"][0] >= 0.05 and lo <= 0.0 <= hi):
            failed.append(f"{name}: distinguishable from the exact law (p {r['permutation_p'][0]}, "
                          f"excess CI {lo:.4f}..{hi:.4f})")
    for name in args.check_different:
        r = by_name[name]
        lo, _ = r["marginal_tv_excess_ci"]
        if not (r["permutation_p"][0] < 0.05 and lo > 0.0):
            failed.append(f"{name}: not distinguishable from the exact law (p {r['permutation_p'][0]}, "
                          f"excess CI lower end {lo:.4f})")
    for f in failed:
        print("check failed: " + f, file=sys.stderr)
    return 1 if failed else 0


def check_structure(res):
    """Every statistic present and finite, every interval around its value."""
    bad = []
    items = [("noise floor", res["noise_floor"])] + [(r["name"], r) for r in res["configs"]]
    for name, r in items:
        for m in METRICS + ["step_compression" if name != "noise floor" else "exact_step_compression"]:
            v, (lo, hi) = r.get(m), r.get(m + "_ci", (None, None))
            if v is None or lo is None or not all(math.isfinite(x) for x in (v, lo, hi)):
                bad.append(f"{name}: {m} missing or not finite")
            elif not lo <= v <= hi:
                bad.append(f"{name}: {m} = {v} outside its interval [{lo}, {hi}]")
        if name != "noise floor" and not r["step_compression"] >= 1.0:
            bad.append(f"{name}: step compression {r['step_compression']} < 1")
    return bad


def fmt_ci(v, c, digits=4):
    return f"{v:.{digits}f} [{c[0]:.{digits}f}, {c[1]:.{digits}f}]"


def markdown(res):
    fl = res["noise_floor"]
    lines = [
        f"Exact reference: `{res['common']} {res['exact']}`, N = {res['n_exact']} per exact set; "
        f"configurations N = {res['n_sweep']}; 95 % jackknife intervals, "
        f"{res['permutations']} permutations.",
        "",
        f"Noise floor (exact B vs exact A): marginal TV {fmt_ci(fl['marginal_tv'], fl['marginal_tv_ci'])}, "
        f"bigram TV h {fmt_ci(fl['bigram_tv_h'], fl['bigram_tv_h_ci'])}, "
        f"v {fmt_ci(fl['bigram_tv_v'], fl['bigram_tv_v_ci'])}, "
        f"class posterior drop {fmt_ci(fl['class_posterior_drop'], fl['class_posterior_drop_ci'], 3)} "
        f"(exact A: mean p(label | x) {fl['class_posterior_exact']:.3f}, accuracy "
        f"{fl['class_accuracy_exact']:.3f}); permutation p {fl['permutation_p'][0]:.3f} / "
        f"{fl['permutation_p'][1]:.3f}; exact step compression {fl['exact_step_compression']:.3f}.",
        "",
        "| configuration | tokens / target pass | vs exact SD | marginal TV | excess over floor | p | "
        "bigram TV h | excess | p | bigram TV v | class p(label \\| x) drop | accuracy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in res["configs"]:
        lines.append(
            f"| {r['name']} | {fmt_ci(r['step_compression'], r['step_compression_ci'], 3)} | "
            f"{r['speedup_vs_exact_sd']:.2f}x | {r['marginal_tv']:.4f} | "
            f"{fmt_ci(r['marginal_tv_excess'], r['marginal_tv_excess_ci'])} | {r['permutation_p'][0]:.3f} | "
            f"{r['bigram_tv_h']:.4f} | {fmt_ci(r['bigram_tv_h_excess'], r['bigram_tv_h_excess_ci'])} | "
            f"{r['permutation_p'][1]:.3f} | "
            f"{r['bigram_tv_v']:.4f} | "
            f"{fmt_ci(r['class_posterior_drop'], r['class_posterior_drop_ci'], 3)} | "
            f"{r['class_accuracy']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
