#!/usr/bin/env python3
"""Plots and tabulates a convergence study (run_study.py's output folder).
Writes docs/convergence_tokens.png, docs/convergence_bytes.png,
docs/convergence_sweep.png and prints a
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


def final(rows):
    return [r for r in rows if r["val_loss"] is not None][-1]


def style(name):
    if name == "single":
        return dict(color="black", ls="--")
    if name.startswith("ddp"):
        return dict(color="tab:red" if "k8" in name else "tab:orange", ls="-.", lw=2)
    k8 = "-k8-" in name
    h = int(name.split("-h")[1].split("-")[0])
    colors = {10: "tab:blue", 50: "tab:green", 250: "tab:purple"}
    ls = ":" if "int8" in name else ((0, (5, 1)) if "-olr" in name else "-")
    lw = 0.9 if "-olr" in name else 1.5
    return dict(color=colors.get(h, "gray"), ls=ls, lw=lw, alpha=1.0 if k8 else 0.55,
                marker="o" if k8 and "-olr" not in name else None, ms=3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    a = ap.parse_args()
    runs = load(a.out)
    pre = runs.pop("pretrain", None)
    start = final(pre[1])["val_loss"] if pre else None  # the checkpoint every run starts from
    os.makedirs(a.docs, exist_ok=True)

    # The main figures: every run of the grid, plus the best run of the outer sweep (fp32 and
    # int8); convergence_sweep.png: the whole sweep against the baselines.
    swept = {n: final(r)["val_loss"] for n, (_, r) in runs.items() if "-olr" in n}
    best = {min((n for n in swept if ("int8" in n) == q), key=swept.get, default=None) for q in (False, True)}
    grid = {n: v for n, v in runs.items() if "-olr" not in n or n in best}
    sweep = {n: v for n, v in runs.items() if n.startswith("ddp-k8") or n == "single" or
             (n.startswith("diloco-k8-") and "int8" not in n)}
    figures = [("tokens", "tokens", grid), ("bytes", "bytes", grid), ("sweep", "tokens", sweep)]
    for fig_name, kind, chosen in figures:
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, (job, rows) in chosen.items():
            pts = [(r[kind], r["val_loss"]) for r in rows if r["val_loss"] is not None]
            if kind == "bytes":
                pts = [(x, y) for x, y in pts if x > 0]
                if not pts:
                    continue
            st = style(name)
            if fig_name == "sweep" and "-olr" in name:  # one color per setting
                st.update(color=None, alpha=1.0, lw=1.2)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **st)
        if kind == "tokens":
            ax.set_xlabel("tokens per worker (inner steps x batch x context)")
        else:
            ax.set_xscale("log")
            ax.set_xlabel("bytes sent per worker (cumulative, butterfly all-reduce)")
        ax.set_ylabel("validation loss (nats/token)")
        lo = min(min(r["val_loss"] for r in rows if r["val_loss"] is not None) for _, rows in chosen.values())
        hi = start if start else lo + 1.0
        ax.set_ylim(lo - 0.02, hi + 0.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        pre_txt = f", from a checkpoint at {start:.3f}" if start else ""
        what = "K = 8, outer lr / momentum sweep" if fig_name == "sweep" else "DiLoCo vs baselines"
        ax.set_title(f"{what}: validation loss against {kind}{pre_txt}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(a.docs, f"convergence_{fig_name}.png")
        fig.savefig(path, dpi=110)
        print(f"wrote {path}")

    table = ["| run | K | H | compression | outer lr / momentum | val loss | ppl | vs DP (same K) | share of DP's gain | vs single | "
             "bytes/worker | DP bytes / these | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if pre:
        f = final(pre[1])
        table.append(f"| pretrained start ({f['inner_steps']} steps) | 1 | - | - | - | {f['val_loss']:.4f} | "
                     f"{math.exp(f['val_loss']):.3f} |  |  |  |  |  | {f['time']:.0f} |")
    single = final(runs["single"][1])["val_loss"] if "single" in runs else None
    def order(item):
        name, (job, _) = item
        if name == "single":
            return (0,)
        h = 0 if name.startswith("ddp") else job["inner"]["steps"]
        return (job["workers"]["count"], "-olr" in name, h, "int8" in name)

    for name, (job, rows) in sorted(runs.items(), key=order):
        f = final(rows)
        k = job["workers"]["count"]
        dp = runs.get(f"ddp-k{k}")
        dpf = final(dp[1]) if dp else None
        vs_dp = f"{100 * (f['val_loss'] / dpf['val_loss'] - 1):+.2f} %" if dpf and name != "single" else ""
        # How much of data-parallel's loss reduction from the common start this run achieves.
        gain = (f"{100 * (start - f['val_loss']) / (start - dpf['val_loss']):.0f} %"
                if start and dpf and name != "single" and start != dpf["val_loss"] else "")
        vs_single = f"{100 * (f['val_loss'] / single - 1):+.2f} %" if single and name != "single" else ""
        ratio = f"{dpf['bytes'] / f['bytes']:.0f}x" if dpf and f["bytes"] and not name.startswith("ddp") else ""
        h = "1 (every step)" if name.startswith("ddp") else ("-" if name == "single" else job["inner"]["steps"])
        olr = f"{job['outer']['lr']} / {job['outer']['momentum']}" if name.startswith("diloco") else "-"
        table.append(f"| {name} | {k if name != 'single' else 1} | {h} | {job['compression'] if name != 'single' else '-'} | "
                     f"{olr} | {f['val_loss']:.4f} | {math.exp(f['val_loss']):.3f} | {vs_dp} | {gain} | {vs_single} | "
                     f"{f['bytes'] / 1e6:.1f} MB | {ratio} | {f['time']:.0f} |")
    text = "\n".join(table)
    print(text)
    with open(os.path.join(a.out, "table.md"), "w") as fh:
        fh.write(text + "\n")


if __name__ == "__main__":
    main()
