#!/usr/bin/env python3
"""Plots and tabulates a convergence study (run_study.py's output folder).
Writes docs/convergence_tokens.png, docs/convergence_bytes.png and prints a
markdown table (also saved as OUT/table.md).

  diloco/study/plot.py runs/study [--docs docs]
"""
import argparse
import glob
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load(out):
    runs = {}
    for d in sorted(glob.glob(os.path.join(out, "*"))):
        m = os.path.join(d, "metrics.jsonl")
        if not os.path.exists(m):
            continue
        with open(m) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        with open(os.path.join(d, "job.yaml")) as f:
            job = yaml.safe_load(f)
        runs[os.path.basename(d)] = (job, rows)
    return runs


def style(name):
    if name == "single":
        return dict(color="black", ls="--")
    if name.startswith("ddp"):
        return dict(color="tab:red" if "k8" in name else "tab:orange", ls="-.", lw=2)
    k8 = "-k8-" in name
    h = int(name.split("-h")[1].split("-")[0])
    colors = {10: "tab:blue", 50: "tab:green", 250: "tab:purple"}
    return dict(color=colors.get(h, "gray"), ls=":" if "int8" in name else "-", alpha=1.0 if k8 else 0.55,
                marker="o" if k8 else None, ms=3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    a = ap.parse_args()
    runs = load(a.out)
    os.makedirs(a.docs, exist_ok=True)

    for kind in ("tokens", "bytes"):
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, (job, rows) in runs.items():
            pts = [(r[kind], r["val_loss"]) for r in rows if r["val_loss"] is not None]
            if kind == "bytes":
                pts = [(x, y) for x, y in pts if x > 0]
                if not pts:
                    continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **style(name))
        if kind == "tokens":
            ax.set_xlabel("tokens per worker (inner steps x batch x context)")
        else:
            ax.set_xscale("log")
            ax.set_xlabel("bytes sent per worker (cumulative, butterfly all-reduce)")
        ax.set_ylabel("validation loss (nats/token)")
        lo = min(min(r["val_loss"] for r in rows if r["val_loss"] is not None) for _, rows in runs.values())
        ax.set_ylim(lo - 0.05, lo + 1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(f"DiLoCo vs baselines: validation loss against {kind}")
        fig.tight_layout()
        path = os.path.join(a.docs, f"convergence_{kind}.png")
        fig.savefig(path, dpi=110)
        print(f"wrote {path}")

    def final(rows):
        return [r for r in rows if r["val_loss"] is not None][-1]

    table = ["| run | K | H | compression | val loss | ppl | vs DP (same K) | vs single | bytes/worker | DP bytes / these | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    single = final(runs["single"][1])["val_loss"] if "single" in runs else None
    for name, (job, rows) in runs.items():
        f = final(rows)
        k = job["workers"]["count"]
        dp = runs.get(f"ddp-k{k}")
        dpf = final(dp[1]) if dp else None
        vs_dp = f"{100 * (f['val_loss'] / dpf['val_loss'] - 1):+.2f} %" if dpf and name != "single" else ""
        vs_single = f"{100 * (f['val_loss'] / single - 1):+.2f} %" if single and name != "single" else ""
        ratio = f"{dpf['bytes'] / f['bytes']:.0f}x" if dpf and f["bytes"] and not name.startswith("ddp") else ""
        h = "1 (every step)" if name.startswith("ddp") else ("-" if name == "single" else job["inner"]["steps"])
        table.append(f"| {name} | {k if name != 'single' else 1} | {h} | {job['compression'] if name != 'single' else '-'} | "
                     f"{f['val_loss']:.4f} | {math.exp(f['val_loss']):.3f} | {vs_dp} | {vs_single} | "
                     f"{f['bytes'] / 1e6:.1f} MB | {ratio} | {f['time']:.0f} |")
    text = "\n".join(table)
    print(text)
    with open(os.path.join(a.out, "table.md"), "w") as fh:
        fh.write(text + "\n")


if __name__ == "__main__":
    main()
