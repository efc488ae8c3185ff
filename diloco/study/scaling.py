#!/usr/bin/env python3
"""Where sparse is safe: fp32 DiLoCo against topk at several model sizes and lengths (issue 24,
docs/results.md "Where sparse is safe"). Every run starts from scratch with the same job but the
model: K = 4 simulated workers, H = 12, batch 16, context 64, byte tokens of scripts/fetch-corpus's
corpus, a constant inner lr after warmup (min_lr_ratio 1), so that the validation loss at round r
of a long run is the loss an r-round run would reach: one run of R rounds gives the gap at
every --evals round up to R. Each size runs every codec of --codecs for its own number of rounds.
Runs --jobs simulations at a time (1 torch thread each, nice 19), skips those already complete,
then writes OUT/scaling_table.md and OUT/scaling.png (loss gap against bytes, one line per size).

  diloco/study/scaling.py --data data --out runs/scaling                 # everything
  diloco/study/scaling.py --out runs/scaling --plot-only
"""
import argparse
import concurrent.futures as cf
import copy
import json
import os
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_study import ROOT, complete, run, write_job  # noqa: E402

# name -> (layers, width, heads); parameter counts as loco-train reports them, with byte tokens.
SIZES = {"1m": (4, 144, 4), "6m": (8, 256, 4), "25m": (8, 512, 8)}
# name -> compression; bytes per worker come from each run's metrics.jsonl.
CODECS = {
    "fp32": "fp32",
    # >= 100x fewer bytes than fp32 at K = 4 (k <= 36 of 4,096 at 2 bits), loco's defaults otherwise
    # (β 0.95, SparseLoCo's outer rule at the job's outer lr, the mean over senders).
    "topk32": {"kind": "topk", "chunk": 4096, "k": 32},
    # 10 % density, at 4 bits: the middle of the ladder.
    "topk410q4": {"kind": "topk", "chunk": 4096, "k": 410, "bits": 4},
}
BASE = {
    "seed": 1,
    "threads": 1,
    "data": {"dir": "data", "tokenizer": "byte", "shards": 64, "val_fraction": 0.02},
    "workers": {"count": 4, "min": 4},
    "inner": {"steps": 12, "batch_size": 16, "lr": 0.003, "warmup": 12, "min_lr_ratio": 1.0,
              "weight_decay": 0.1, "grad_clip": 1.0},
    "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True},
    "checkpoint": {"every": 0, "dir": "checkpoints"},
}


def metrics(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except OSError:
        return []


def at_round(lines, r):
    """(val loss, cumulative bytes per worker) at round r, or None."""
    for l in lines:
        if l["round"] == r and l.get("val_loss") is not None:
            return l["val_loss"], l["bytes"]
    return None


def table_and_plot(out, plan, evals):
    rows, points = [], {}
    for size, rounds in plan:
        ref = metrics(os.path.join(out, f"{size}-fp32", "metrics.jsonl"))
        for codec in CODECS:
            lines = metrics(os.path.join(out, f"{size}-{codec}", "metrics.jsonl"))
            for r in (r for r in evals if r <= rounds):
                got, base = at_round(lines, r), at_round(ref, r)
                if got is None or base is None:
                    continue
                gap = 100.0 * (got[0] - base[0]) / base[0]
                ratio = base[1] / got[1] if got[1] else float("nan")
                rows.append((size, r, codec, got[0], gap, got[1], ratio))
                if codec != "fp32":
                    points.setdefault((size, r), []).append((got[1] / 1e6, gap))
    with open(os.path.join(out, "scaling_table.md"), "w") as f:
        f.write("| size | rounds | compression | val loss | vs fp32 | bytes / worker | fp32 bytes / these |\n")
        f.write("|---|---|---|---|---|---|---|\n")
        for size, r, codec, loss, gap, b, ratio in rows:
            vs = "" if codec == "fp32" else f"{gap:+.1f} %"
            x = "" if codec == "fp32" else f"{ratio:.1f}x"
            f.write(f"| {size} | {r} | {codec} | {loss:.4f} | {vs} | {b / 1e6:.1f} MB | {x} |\n")
    print(open(os.path.join(out, "scaling_table.md")).read())
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scaling: no matplotlib here, no plot (it lives in the LibTorch venv)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (size, r), pts in sorted(points.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{size}, {r} rounds")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per worker (MB, log)")
    ax.set_ylabel("validation loss over fp32 DiLoCo's (%)")
    ax.set_title("topk against fp32 DiLoCo, K = 4, H = 12, from scratch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "data"), help="scripts/fetch-corpus's folder")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "scaling"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "loco-train"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plan", default="25m:10,1m:40,6m:10", help="size:rounds, comma-separated, in run order")
    ap.add_argument("--evals", default="10,20,40", help="rounds at which to evaluate")
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--plot-only", action="store_true")
    a = ap.parse_args()
    plan = [(s, int(r)) for s, r in (x.split(":") for x in a.plan.split(",") if x)]
    evals = [int(x) for x in a.evals.split(",") if x]
    codecs = [c for c in a.codecs.split(",") if c]
    for size, _ in plan:
        if size not in SIZES:
            sys.exit(f"--plan: unknown size {size} (one of {', '.join(SIZES)})")
    for c in codecs:
        if c not in CODECS:
            sys.exit(f"--codecs: unknown codec {c} (one of {', '.join(CODECS)})")
    if not a.plot_only:
        todo = []
        for size, rounds in plan:
            layers, width, heads = SIZES[size]
            for codec in codecs:
                job = copy.deepcopy(BASE)
                job["name"] = f"{size}-{codec}"
                job["data"]["dir"] = os.path.abspath(a.data)
                job["model"] = {"layers": layers, "width": width, "heads": heads, "context": 64,
                                "tied_embeddings": True}
                job["compression"] = CODECS[codec]
                job["rounds"] = rounds
                h = job["inner"]["steps"]
                job["eval"] = {"every": h * min(e for e in evals), "batches": 16}
                d = os.path.join(a.out, job["name"])
                path = write_job(job, d)
                if complete(os.path.join(d, "metrics.jsonl"), rounds * h):
                    print(f"{job['name']}: done already", flush=True)
                    continue
                cmd = [a.bin, "train", "--simulate", "4", path, "--out", d, "--threads", "1"]
                todo.append((job["name"], cmd, d))
        with cf.ThreadPoolExecutor(a.jobs) as pool:
            for name, rc, dt in pool.map(lambda x: run(*x), todo):
                print(f"{name}: rc={rc} {dt:.0f} s", flush=True)
    table_and_plot(a.out, plan, evals)


if __name__ == "__main__":
    main()
