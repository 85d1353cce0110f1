#!/usr/bin/python3
"""Plots a training run from the workers' metrics logs (`parasol worker --metrics-log FILE`,
or `parasol launch --metrics-log PREFIX`): loss, eval AUC and samples/s against samples seen.

    scripts/plot.py LOG [LOG ...] --out DIR
Writes DIR/loss.png, DIR/eval_auc.png and DIR/samples_per_second.png.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    points = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                points.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON object: {e}")
    return points


def plot(runs, key, ylabel, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for name, points in runs:
        xs = [p["samples"] for p in points if key in p]
        ys = [p[key] for p in points if key in p]
        if xs:
            ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, label=name)
            drawn = True
    ax.set_xlabel("samples seen (per worker)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend()
    else:
        ax.text(0.5, 0.5, f"no {key} in the logs", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    runs = []
    for path in a.logs:
        points = read(path)
        name = f"worker {points[0]['worker']}" if points else os.path.basename(path)
        runs.append((name, points))
    plot(runs, "loss", "train log loss (last 100 steps)", os.path.join(a.out, "loss.png"))
    plot(runs, "eval_auc", "eval AUC", os.path.join(a.out, "eval_auc.png"))
    plot(runs, "samples_per_second", "samples/s", os.path.join(a.out, "samples_per_second.png"))
    print(f"wrote {a.out}/loss.png, eval_auc.png, samples_per_second.png")


if __name__ == "__main__":
    main()
