#!/usr/bin/env python3
"""Draws docs/plots/*.svg from the benchmark results in bench/results/*.json (standard library
only: each plot is a plain SVG of horizontal bars). docs/performance.md shows them.

    plot_results.py [--source ROOT] [--check]

--check writes nothing: it exits 1 naming each plot that differs from what the JSONs give now
(the ctest Docs.PlotsAreCurrent runs it so).
"""
import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

WIDTH, LABEL_W, BAR_H, GAP, TOP = 760, 300, 18, 8, 44


def rows_of(path):
    with open(path) as f:
        doc = json.load(f)
    return {r["name"]: r for r in doc} if isinstance(doc, list) else doc


def bars_svg(title, unit, bars):
    """bars: (label, value, ceiling or None, low or None, high or None). Values and ceilings
    share one scale; a ceiling is a hollow bar behind its figure, a range a line over it."""
    top = max(max(b[1], b[2] or 0, b[4] or 0) for b in bars) or 1.0
    scale = (WIDTH - LABEL_W - 90) / top
    height = TOP + len(bars) * (BAR_H + GAP) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
           f'<text x="10" y="36" fill="#555">{escape(unit)}; a hollow bar is the figure\'s '
           f'ceiling, a line its range</text>']
    y = TOP
    for label, value, ceiling, low, high in bars:
        out.append(f'<text x="{LABEL_W - 8}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        if ceiling:
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{ceiling * scale:.1f}" '
                       f'height="{BAR_H}" fill="none" stroke="#999"/>')
        out.append(f'<rect x="{LABEL_W}" y="{y + 3}" width="{value * scale:.1f}" '
                   f'height="{BAR_H - 6}" fill="#3b6ea5"/>')
        if low is not None and high is not None:
            out.append(f'<line x1="{LABEL_W + low * scale:.1f}" x2="{LABEL_W + high * scale:.1f}" '
                       f'y1="{y + BAR_H / 2}" y2="{y + BAR_H / 2}" stroke="black" stroke-width="2"/>')
        text = f"{value / 1e3:,.0f} K" if value >= 1e4 else f"{value:.2f}"
        if ceiling:
            text += f" of {ceiling / 1e3:,.0f} K ({value / ceiling:.2f})"
        right = max(value, ceiling or 0, high or 0) * scale
        out.append(f'<text x="{LABEL_W + right + 6:.1f}" y="{y + 13}">{escape(text)}</text>')
        y += BAR_H + GAP
    out.append("</svg>")
    return "\n".join(out) + "\n"


def plots(root):
    res = os.path.join(root, "bench", "results")
    made = {}
    gpu = rows_of(os.path.join(res, "gpu_check_h200_2026-12-04.json"))["end_to_end_shards"]
    bars = []
    for depth, mode in ((0, "BSP"), (2, "SSP, 2 steps ahead")):
        for n in (1, 2, 4, 8):
            bars.append((f"{n} shard{'s' if n > 1 else ''}, {mode}",
                         gpu[f"gpu_e2e_b4096_{n}s_p{depth}"]["samples_per_second"], None, None,
                         None))
    made["h200_end_to_end_by_shards.svg"] = bars_svg(
        "H200 host: one CUDA worker, dlrm-small, batch 4096, binary data (2026-12-04)",
        "samples/s", bars)
    feed = rows_of(os.path.join(res, "feed_steady_c_2core_2026-12-05.json"))
    names = [("feed_dlrm_small_b4096_1s", "feed, text, 1 shard"),
             ("feed_dlrm_small_b4096_2s", "feed, text, 2 shards"),
             ("feed_dlrm_small_b4096_1s_binary", "feed, binary, 1 shard"),
             ("feed_dlrm_small_b4096_2s_binary", "feed, binary, 2 shards"),
             ("feed_dlrm_small_b4096_1s_binary_ssp2_depth2", "feed, binary, SSP, 1 shard"),
             ("feed_dlrm_small_b4096_2s_binary_ssp2_depth2", "feed, binary, SSP, 2 shards"),
             ("feed_vocab1e8_b4096_1s", "feed, 10^8 ids, 1 shard"),
             ("feed_vocab1e8_b4096_2s", "feed, 10^8 ids, 2 shards")]
    made["feed_2core.svg"] = bars_svg(
        "Feed rate on 2 cores: a worker's step without computation, after 20 steps (2026-12-05)",
        "samples/s against the shards' in-process rate",
        [(label, feed[n]["value"], feed[n]["ceiling"], None, None) for n, label in names])
    t = rows_of(os.path.join(res, "torch_pairs_apply_e_2core_2026-12-05.json"))
    made["training_vs_pytorch_2core.svg"] = bars_svg(
        "dlrm-small, batch 1024, 2 cores, 2 compute threads each, parsing and 20 warm-up steps left "
        "out: "
        "median of five pairs (2026-12-05)",
        "samples/s",
        [("Parasol, 1 server + 1 worker", t["train_dlrm_small_b1024_1s1w"]["value"], None,
          t["train_dlrm_small_b1024_1s1w_min"]["value"],
          t["train_dlrm_small_b1024_1s1w_max"]["value"]),
         ("PyTorch, tuned, 1 process", t["pytorch_tuned_1proc_2threads"]["value"], None,
          t["pytorch_tuned_1proc_2threads_min"]["value"],
          t["pytorch_tuned_1proc_2threads_max"]["value"])])
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    folder = os.path.join(args.source, "docs", "plots")
    stale = []
    for name, svg in plots(args.source).items():
        path = os.path.join(folder, name)
        if args.check:
            try:
                with open(path) as f:
                    if f.read() == svg:
                        continue
            except OSError:
                pass
            stale.append(path)
        else:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w") as f:
                f.write(svg)
            print("wrote", os.path.relpath(path))
    if stale:
        print("plots that differ from bench/results (run scripts/plot_results.py):",
              *[os.path.relpath(p) for p in stale])
        sys.exit(1)


if __name__ == "__main__":
    main()
