#!/usr/bin/env python3
"""Where speculation pays on a CPU: two SVG figures drawn from measured JSON.

  cost     the cost curve c(n)/c(1) of a pass of n nodes, from the JSON output of
           `specula_bench --benchmark_filter=transformer/cost/ --benchmark_out=cost.json`
           (counters ratio_min, model_ratio, stream_fastest_GBps, peak_fastest_GFLOPs, c1_frac_of_stream):
           measured points and the streaming model line c(1) (1 + (n - 1) BW / (2 F)) of each
           model, one panel per thread count; also prints a markdown table.
  speedup  runs specula_demo (text task) for each draft length and draft model against ar,
           DEMO rounds interleaved, writes the medians to --json and draws speedup (wall) against
           draft length; or draws an earlier --json again (--from-json).

  scripts/speculation_figures.py cost build/cost.json [more.json ...] --svg docs/cost_curve.svg
  scripts/speculation_figures.py speedup --demo build/examples/demo/specula_demo \\
      --json build/speedup.json --svg docs/speedup_draft_length.svg
"""

import argparse
import json
import math
import re
import statistics
import subprocess
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def svg_lines(series, title, xlabel, ylabel, logx=False, hline=None, width=420, height=320):
    """series: list of dict(label, points [(x, y)], dashed, colour, marker). One panel."""
    ml, mr, mt, mb = 52, 12, 34, 44
    xs = [x for s in series for x, _ in s["points"]]
    ys = [y for s in series for _, y in s["points"]] + ([hline[0]] if hline else [])
    fx = math.log2 if logx else (lambda v: v)
    xlo, xhi = fx(min(xs)), fx(max(xs))
    ylo, yhi = 0.0, max(ys) * 1.08
    W, H = width, height

    def X(x):
        return ml + (fx(x) - xlo) / ((xhi - xlo) or 1) * (W - ml - mr)

    def Y(y):
        return mt + (yhi - y) / ((yhi - ylo) or 1) * (H - mt - mb)

    out = [f'<g><text x="{W / 2}" y="16" text-anchor="middle" font-size="12">{title}</text>',
           f'<rect x="{ml}" y="{mt}" width="{W - ml - mr}" height="{H - mt - mb}" fill="none" '
           'stroke="#444"/>']
    for i in range(6):
        yv = ylo + (yhi - ylo) * i / 5
        out.append(f'<text x="{ml - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        out.append(f'<line x1="{ml}" x2="{W - mr}" y1="{Y(yv):.1f}" y2="{Y(yv):.1f}" '
                   'stroke="#eee"/>')
    ticks = sorted(set(xs))
    if len(ticks) > 10:
        ticks = [t for t in ticks if t in (1, 2, 4, 8, 16, 32, 64)] or ticks[::2]
    for xv in ticks:
        out.append(f'<text x="{X(xv):.1f}" y="{H - mb + 14}" text-anchor="middle">{xv:g}</text>')
    out.append(f'<text x="{(W + ml) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="12" y="{(H + mt - mb) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 12 {(H + mt - mb) / 2})">{ylabel}</text>')
    if hline:
        out.append(f'<line x1="{ml}" x2="{W - mr}" y1="{Y(hline[0]):.1f}" y2="{Y(hline[0]):.1f}" '
                   'stroke="#000" stroke-dasharray="2 3"/>')
        out.append(f'<text x="{W - mr - 4}" y="{Y(hline[0]) - 4:.1f}" text-anchor="end">'
                   f'{hline[1]}</text>')
    ly = mt + 12
    for s in series:
        col = s["colour"]
        pts = sorted(s["points"])
        dash = ' stroke-dasharray="5 3"' if s.get("dashed") else ""
        out.append('<polyline points="' + " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
                   + f'" fill="none" stroke="{col}" stroke-width="1.3"{dash}/>')
        if s.get("marker", True):
            for x, y in pts:
                out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2.6" fill="{col}"/>')
        out.append(f'<line x1="{ml + 8}" x2="{ml + 24}" y1="{ly}" y2="{ly}" stroke="{col}" '
                   f'stroke-width="1.5"{dash}/>')
        out.append(f'<text x="{ml + 28}" y="{ly + 4}">{s["label"]}</text>')
        ly += 14
    out.append("</g>")
    return out


def write_svg(panels, path, width=420, height=320):
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * len(panels)}" '
           f'height="{height}" font-family="sans-serif" font-size="10">']
    for i, p in enumerate(panels):
        out.append(f'<g transform="translate({i * width},0)">')
        out += p
        out.append("</g>")
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


# --- cost curve ------------------------------------------------------------------------------

NAME = re.compile(r"^transformer/cost/(?P<model>[^/]+)/threads:(?P<t>\d+)/n:(?P<n>\d+)")


def read_cost(paths):
    """{(model, threads): {n: counters}} from Google Benchmark JSON files (a later file's cases
    replace an earlier one's): the median aggregate where repetitions were run, the single run
    otherwise."""
    out = {}
    for path in paths:
        part, ctx = read_cost_file(path)
        for key, pts in part.items():
            out.setdefault(key, {}).update(pts)
    return out, ctx


def read_cost_file(path):
    data = json.load(open(path))
    out, have_median = {}, set()
    for b in data["benchmarks"]:
        m = NAME.match(b["name"])
        if not m:
            continue
        key, n = (m["model"], int(m["t"])), int(m["n"])
        median = b.get("aggregate_name") == "median"
        if b.get("run_type") == "aggregate" and not median:
            continue
        if (key, n) in have_median and not median:
            continue
        if median:
            have_median.add((key, n))
        out.setdefault(key, {})[n] = b
    return out, data.get("context", {})


def cost(args):
    curves, ctx = read_cost(args.json)
    for key in [k for k in curves if args.exclude and re.search(args.exclude, f"{k[0]}/threads:{k[1]}")]:
        del curves[key]
    models = [m for m in ("text-target", "text-target-xl") if any(k[0] == m for k in curves)]
    threads = sorted({k[1] for k in curves})
    panels, rows = [], []
    for t in threads:
        series = []
        for i, m in enumerate(models):
            pts = curves.get((m, t))
            if not pts:
                continue
            col = COLOURS[i]
            one = pts.get(1)
            bw, peak = one["stream_fastest_GBps"], one["peak_fastest_GFLOPs"]
            series.append(dict(label=f"{m} measured (fastest)", colour=col,
                               points=[(n, c["ratio_min"]) for n, c in pts.items()]))
            series.append(dict(label=f"{m} model, BW {bw:.0f} GB/s, F {peak:.0f} GFLOP/s",
                               colour=col, dashed=True, marker=False,
                               points=[(n, c["model_ratio"]) for n, c in pts.items()]))
            for n, c in sorted(pts.items()):
                rows.append((m, t, n, c))
        panels.append(svg_lines(series, f"c(n)/c(1), {t} thread{'s' if t > 1 else ''}",
                                "nodes per pass n", "c(n) / c(1)", logx=True))
    if args.svg:
        write_svg(panels, args.svg)
    print(f"CPU: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
          f"{ctx.get('mhz_per_cpu', '?')} MHz; caches: "
          + ", ".join(f"L{c['level']} {c['type']} {c['size'] // 1024} KiB"
                      for c in ctx.get("caches", [])))
    print("\n| model | threads | n | c(n) fastest µs | c(1) fastest µs | c(n)/c(1) | model line |"
          " stream GB/s (fastest pass) | c(1) bytes/s / stream | kernel GFLOP/s (fastest call) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m, t, n, c in rows:
        print(f"| {m} | {t} | {n} | {c['cn_min_us']:.0f} | {c['c1_min_us']:.0f} | "
              f"{c['ratio_min']:.2f} | {c['model_ratio']:.2f} | {c['stream_fastest_GBps']:.1f} | "
              f"{c['c1_frac_of_stream']:.2f} | {c['peak_fastest_GFLOPs']:.0f} |")


# --- speedup against draft length -------------------------------------------------------------

def run_demo(args, method, model, extra):
    cmd = [args.demo, "--task", "text", "--method", method, "--json", "--quiet", "--seed",
           str(args.seed), "--num-samples", str(args.samples), "--threads", str(args.threads),
           "--max-new-tokens", str(args.tokens), "--model", model] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def speedup(args):
    if args.from_json:
        res = json.load(open(args.from_json))
    else:
        lengths = [int(x) for x in args.draft_lengths.split(",")]
        pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
        cases = [(tgt, "ar", None, 0) for tgt in sorted({t for t, _ in pairs})]
        cases += [(tgt, args.method, d, k) for tgt, d in pairs for k in lengths]
        walls = {c: [] for c in cases}
        stats = {}
        for r in range(args.repeats):  # rounds interleaved: load changes reach every case
            for c in cases:
                tgt, method, draft, k = c
                extra = [] if method == "ar" else ["--draft-model", draft, "--draft-length",
                                                   str(k)]
                d = run_demo(args, method, tgt, extra)
                walls[c].append(d["wall_seconds"])
                stats[c] = d
            print(f"round {r + 1}/{args.repeats} done", file=sys.stderr)
        res = dict(threads=args.threads, samples=args.samples, tokens=args.tokens,
                   method=args.method, repeats=args.repeats, rows=[])
        for c in cases:
            tgt, method, draft, k = c
            d = stats[c]
            res["rows"].append(dict(target=tgt, method=method, draft=draft, draft_length=k,
                                    wall_median_s=statistics.median(walls[c]),
                                    wall_s=walls[c], tokens=d["tokens"],
                                    target_forwards=d["target_forwards"],
                                    step_compression=d["step_compression"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    ar = {r["target"]: r["wall_median_s"] for r in res["rows"] if r["method"] == "ar"}
    groups = {}
    for r in res["rows"]:
        if r["method"] != "ar":
            groups.setdefault((r["target"], r["draft"]), []).append(
                (r["draft_length"], ar[r["target"]] / r["wall_median_s"], r["step_compression"]))
    series = [dict(label=f"{t} / draft {d}", colour=COLOURS[i], points=[(k, s) for k, s, _ in v])
              for i, ((t, d), v) in enumerate(groups.items())]
    panel = svg_lines(series, f"{res['method']}: speedup (wall) over ar, {res['threads']} "
                      f"thread(s)", "draft length", "speedup (wall) vs ar", hline=(1.0, "ar"))
    sc = [dict(label=f"{t} / draft {d}", colour=COLOURS[i], points=[(k, c) for k, _, c in v])
          for i, ((t, d), v) in enumerate(groups.items())]
    panel2 = svg_lines(sc, "tokens per target forward", "draft length",
                       "step compression")
    if args.svg:
        write_svg([panel, panel2], args.svg)
    print("| target | draft | draft length | step compression | wall ms (median) | speedup |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (t, d), v in groups.items():
        walls = {r["draft_length"]: r["wall_median_s"] for r in res["rows"]
                 if r["target"] == t and r["draft"] == d}
        for k, s, c in v:
            print(f"| {t} | {d} | {k} | {c:.2f} | {1e3 * walls[k]:.0f} | {s:.2f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cost")
    c.add_argument("json", nargs="+", help="benchmark JSON files (later ones replace cases)")
    c.add_argument("--svg", default="")
    c.add_argument("--exclude", default="",
                   help="leave out the curves whose 'model/threads:t' matches this regex")
    s = sub.add_parser("speedup")
    s.add_argument("--demo", default="build/examples/demo/specula_demo")
    s.add_argument("--from-json", default="")
    s.add_argument("--json", default="")
    s.add_argument("--svg", default="")
    s.add_argument("--method", default="sd")
    s.add_argument("--pairs", default="text-target:text-draft,text-target-xl:text-draft,"
                                      "text-target-xl:text-target",
                   help="target:draft pairs")
    s.add_argument("--draft-lengths", default="1,2,3,4,5,6,8")
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--samples", type=int, default=2)
    s.add_argument("--tokens", type=int, default=128)
    s.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    return cost(args) if args.cmd == "cost" else speedup(args)


if __name__ == "__main__":
    sys.exit(main())
