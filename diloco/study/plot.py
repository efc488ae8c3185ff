#!/usr/bin/env python3
"""Plots and tabulates a convergence study (run_study.py's output folder).
Writes docs/convergence_tokens.png, docs/convergence_bytes.png,
docs/convergence_sweep.png and prints a
markdown table (also saved as OUT/table.md). With --sparse, instead: the
sparse pseudo-gradient study of docs/results.md (compression topk against
fp32 and int8 DiLoCo and data-parallel, GPT and llama-tiny, K = 4 and 8,
on the given seeds): docs/sparse_bytes.png (final validation loss against
bytes sent per worker) and its table (OUT/sparse_table.md of the first OUT).

  diloco/study/plot.py runs/study [--docs docs]
  diloco/study/plot.py --sparse runs/study runs/study-llama --seeds 3,4
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


def seed_dir(out, seed):
    """run_study.py's folder of a seed: OUT for the base's (2), OUT/seed-N otherwise."""
    return out if seed == 2 else os.path.join(out, f"seed-{seed}")


def sparse_kind(name):
    """fp32 | int8 | topk | dp | single | None (a run the sparse study does not plot)."""
    if name == "single":
        return "single"
    if name.startswith("ddp-k"):
        return "dp"
    if not name.startswith("diloco-") or "-streaming" in name or "-eager" in name:
        return None
    if "-topk" in name:
        return "topk"
    return "int8" if "-int8" in name else "fp32"


def sparse(outs, seeds, docs, dense_setting, h):
    """Final validation loss against bytes per worker for fp32 / int8 DiLoCo at one outer setting
    (dense_setting, e.g. olr1.2-m0.8), every topk run and data-parallel, per model (one OUT each)
    and K, averaged over `seeds` (a run missing on some seed is averaged over those it has, and
    the table says on which). Data-parallel's bytes, when not run, are fp32 DiLoCo's per round x H
    (one fp32 all-reduce a step)."""
    rows = []  # (model, K, kind, name, {seed: (val, bytes, time)})
    for out in outs:
        model = "llama-tiny" if "llama" in os.path.basename(os.path.normpath(out)) else "GPT"
        found = {}
        for s in seeds:
            for name, (job, rs) in load(seed_dir(out, s)).items():
                kind = sparse_kind(name)
                if kind is None or not rs or rs[-1]["inner_steps"] < (job["rounds"] * job["inner"]["steps"]):
                    continue
                if kind in ("fp32", "int8") and (not name.endswith(f"-h{h}-{dense_setting}")
                                                 and not name.endswith(f"-h{h}-int8-{dense_setting}")):
                    continue
                k = job["workers"]["count"]
                f = final(rs)
                found.setdefault((k, kind, name), {})[s] = (f["val_loss"], f["bytes"], f["time"], job)
        for (k, kind, name), by_seed in found.items():
            rows.append((model, k, kind, name, by_seed))
    order = {"single": -1, "dp": 0, "fp32": 1, "int8": 2, "topk": 3}
    rows.sort(key=lambda r: (r[0] != "GPT", r[1], order[r[2]], r[3]))

    def mean(xs):
        return sum(xs) / len(xs)

    def ref(model, k, kind):
        for r in rows:
            if r[0] == model and r[1] == k and r[2] == kind:
                return r
        return None

    def seeds_txt(by_seed):
        return ",".join(str(s) for s in sorted(by_seed))

    table = ["| model | run | K | H | compression | seeds | val loss (mean) | per seed | vs fp32 DiLoCo (same seeds) | "
             "vs single | bytes/worker | fp32 bytes / these | DP bytes / these | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    points = {}  # model -> [(K, kind, name, bytes, mean val, seeds note)]
    for model, k, kind, name, by_seed in rows:
        val = mean([v[0] for v in by_seed.values()])
        byts = max(v[1] for v in by_seed.values())
        job = next(iter(by_seed.values()))[3]
        fp = ref(model, k, "fp32")
        dp = ref(model, k, "dp")
        fp_bytes = max(v[1] for v in fp[4].values()) if fp else None
        dp_bytes = (max(v[1] for v in dp[4].values()) if dp else
                    (fp_bytes // fp[4][min(fp[4])][3]["rounds"] * fp[4][min(fp[4])][3]["rounds"] * h
                     if fp else None))
        if kind == "dp":
            byts = dp_bytes
        if kind == "single":
            fp = dp = fp_bytes = dp_bytes = None
        vs = ""
        if fp and kind != "fp32":
            common = sorted(set(by_seed) & set(fp[4]))
            if common:
                a_, b_ = mean([by_seed[s][0] for s in common]), mean([fp[4][s][0] for s in common])
                vs = f"{100 * (a_ / b_ - 1):+.2f} %" + ("" if common == sorted(by_seed) else f" (seeds {','.join(map(str, common))})")
        one = ref(model, 1, "single")
        vs1 = ""
        if one and kind != "single":
            common = sorted(set(by_seed) & set(one[4]))
            if common:
                a_, b_ = mean([by_seed[s][0] for s in common]), mean([one[4][s][0] for s in common])
                vs1 = f"{100 * (a_ / b_ - 1):+.2f} %"
        c = job["compression"]
        if isinstance(c, dict):
            comp = (f"topk k {c['k']}/{c['chunk']}, {c['bits']} bits, β {c['error_feedback']}, {c['outer']} "
                    f"(outer lr {job['outer']['lr']:g}" +
                    (f", momentum {job['outer']['momentum']:g})" if c["outer"] == "nesterov" else ")"))
        elif kind == "dp":
            comp = "fp32, every step"
        elif kind == "single":
            comp = "- (no communication)"
        else:
            comp = f"{c} (outer lr {job['outer']['lr']:g}, momentum {job['outer']['momentum']:g})"
        per = " / ".join(f"{by_seed[s][0]:.4f}" for s in sorted(by_seed))
        t = mean([v[2] for v in by_seed.values()])
        fpx = f"{fp_bytes / byts:.1f}x" if fp_bytes and byts and kind not in ("fp32", "dp") else ""
        dpx = f"{dp_bytes / byts:,.0f}x" if dp_bytes and byts and kind != "dp" else ""
        table.append(f"| {model} | {name} | {k} | {'1' if kind == 'dp' else '-' if kind == 'single' else job['inner']['steps']} | {comp} | "
                     f"{seeds_txt(by_seed)} | {val:.4f} | {per} | {vs} | {vs1} | {byts / 1e6:.3f} MB | {fpx} | {dpx} | {t:.0f} |")
        part = "" if sorted(by_seed) == sorted(seeds) else f" (seed {seeds_txt(by_seed)} only)"
        points.setdefault(model, []).append((k, kind, name, byts, val, part))

    fig, axes = plt.subplots(1, len(points), figsize=(6.5 * len(points), 5), squeeze=False)
    marks = {"dp": "X", "fp32": "o", "int8": "s", "topk": "^"}
    colors = {4: "tab:blue", 8: "tab:red"}
    for ax, (model, pts) in zip(axes[0], points.items()):
        for p in pts:
            if p[1] == "single":
                ax.axhline(p[4], color="black", ls="--", lw=1, label="one worker, no communication")
        for k in sorted({p[0] for p in pts if p[1] != "single"}):
            mine = sorted((p for p in pts if p[0] == k and p[1] != "dp"), key=lambda p: -p[3])
            dense = [p for p in mine if p[1] != "topk"]
            best_topk = min((p for p in mine if p[1] == "topk"), key=lambda p: p[4], default=None)
            line = dense + ([best_topk] if best_topk else [])
            ax.plot([p[3] for p in line], [p[4] for p in line], color=colors.get(k, "gray"), lw=0.8, alpha=0.6)
            for p in pts:
                if p[0] != k or p[1] == "single":
                    continue
                ax.scatter(p[3], p[4], marker=marks[p[1]], color=colors.get(k, "gray"), s=45 if p[1] != "topk" else 35,
                           alpha=1.0 if p[1] != "topk" or p is best_topk else 0.45, zorder=3,
                           label=f"K={k} {p[1]}{p[5]}" if p is (best_topk if p[1] == "topk" else p) else None)
            fp = [p for p in mine if p[1] == "fp32"]
            if fp:
                ax.axhline(fp[0][4] * 1.01, color=colors.get(k, "gray"), ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("bytes sent per worker (500 inner steps, cumulative)")
        ax.set_ylabel(f"final validation loss (mean of seeds {','.join(map(str, seeds))})")
        ax.set_title(f"{model}: loss against bytes (dotted: fp32 DiLoCo + 1 %)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=2)
    fig.tight_layout()
    path = os.path.join(docs, "sparse_bytes.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
    text = "\n".join(table)
    print(text)
    with open(os.path.join(outs[0], "sparse_table.md"), "w") as fh:
        fh.write(text + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="+", help="run_study.py's folder (--sparse: one per model)")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--sparse", action="store_true", help="the sparse pseudo-gradient study's plot and table")
    ap.add_argument("--seeds", default="3,4", help="--sparse: the seeds to average")
    ap.add_argument("--dense", default="olr1.2-m0.8", help="--sparse: the fp32 / int8 runs' outer setting")
    ap.add_argument("--h", type=int, default=50, help="--sparse: H of the fp32 / int8 runs")
    a = ap.parse_args()
    if a.sparse:
        os.makedirs(a.docs, exist_ok=True)
        return sparse(a.out, [int(s) for s in a.seeds.split(",")], a.docs, a.dense, a.h)
    if len(a.out) != 1:
        ap.error("one folder unless --sparse")
    a.out = a.out[0]
    runs = {n: v for n, v in load(a.out).items() if "-topk" not in n}  # topk: --sparse
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
