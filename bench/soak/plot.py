#!/usr/bin/env python3
"""The soak bench's growth plots (issue "25 ·", item 4): one panel per quantity that
bench/soak/sample.py took, every process a line, the faults of faults.tsv as vertical lines, the
window the slopes are fitted over shaded.

  bench/soak/plot.py --samples OUT/samples.jsonl --faults OUT/faults.tsv --last-minutes 100 \\
      --out docs/soak-growth.png
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (panel title, sample kind, quantity, which names: None for all, or a predicate)
PANELS = [
    ("nodes: resident memory (MB)", "procs", "rss_mb", lambda n: n.startswith("node")),
    ("head, relay, Redis: resident memory (MB)", "procs", "rss_mb",
     lambda n: not n.startswith("node")),
    ("open file descriptors", "procs", "fds", None),
    ("threads", "procs", "threads", None),
    ("Redis: keys", "redis", "keys", None),
    ("Redis: used memory (MB)", "redis", "redis_mb", None),
    ("logs and checkpoints on disk (MB)", "paths", None, None),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", required=True)
    ap.add_argument("--faults")
    ap.add_argument("--last-minutes", type=float, default=100.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lines = [json.loads(l) for l in open(a.samples) if l.strip()]
    t0_unix, t0 = lines[0]["unix"], lines[0]["t"]
    minutes = [(l["t"] - t0) / 60.0 for l in lines]
    faults = []
    if a.faults:
        for row in open(a.faults):
            f = row.rstrip("\n").split("\t")
            if len(f) >= 3 and f[2] == "begin":
                faults.append(((float(f[0]) - t0_unix) / 60.0, f[1]))
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(10, 2.3 * len(PANELS)), sharex=True)
    window = minutes[-1] - a.last_minutes
    for ax, (title, kind, q, which) in zip(axes, PANELS):
        names = sorted({n for l in lines for n in l.get(kind, {})})
        for name in names:
            if which and not which(name):
                continue
            if kind == "paths":
                ys = [l[kind].get(name) for l in lines]
            else:
                ys = [(l[kind].get(name) or {}).get(q) for l in lines]
            ax.plot(minutes, [float("nan") if y is None else y for y in ys], lw=0.9,
                    label=name)
        ax.axvspan(max(0.0, window), minutes[-1], color="0.93", zorder=0)
        for at, name in faults:
            ax.axvline(at, color="tab:red", lw=0.6, alpha=0.6)
        ax.set_title(title, fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=6, ncol=6, loc="upper left", frameon=False)
    top = axes[0]
    for at, name in faults:
        top.annotate(name, (at, 1.0), xycoords=("data", "axes fraction"), fontsize=6,
                     rotation=90, va="bottom", ha="center", color="tab:red")
    axes[-1].set_xlabel("minutes since the soak job's start (shaded: the last "
                        f"{a.last_minutes:g} minutes, where the slopes are fitted)", fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=90)


if __name__ == "__main__":
    main()
