#!/usr/bin/env python3
"""The convergence study of docs/results.md, in the DiLoCo paper's setting:
pretrain one model (one worker, diloco/study/pretrain.yaml), then start every
run from that checkpoint (`loco-train train --init`) with the same inner steps
per worker: one worker, data-parallel with K x batch (K = 4, 8), DiLoCo
(K = 4, 8; H = 10, 50, 250; fp32, and int8 at one H), and a sweep of the outer
learning rate for K = 8 (and int8 at the best). Runs `--jobs` simulations at a time with `--threads`
torch threads each under `nice -n 19`, skips runs whose metrics are complete,
then plots (plot.py). `--seed N` repeats runs with another data order
(OUT/seed-N/NAME, from the same pretrained checkpoint). `--sync` adds, for each
int8 sweep run, the same run in other sync modes (streaming fragments, the
eager outer step). `--topk` adds SparseLoCo runs (compression topk: sparse
pseudo-gradients with error feedback, docs/results.md "Sparse pseudo-gradients");
`--arch llama` runs the same study for llama-tiny (pretrain-llama.yaml,
study-llama.yaml, OUT runs/study-llama).

  diloco/study/run_study.py --data data --out runs/study
  diloco/study/run_study.py --data data --topk 8:12:1.0:sparseloco,4:32:1.0:sparseloco --only ...
"""
import argparse
import concurrent.futures as cf
import copy
import json
import os
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def topk_name(k, h, c, lr, mom):
    """diloco-k8-h50-topk12-sparseloco-olr1-b0.95 (-m0.8 with a momentum given for nesterov)."""
    name = f"diloco-k{k}-h{h}-topk{c['k']}-{c['outer']}-olr{lr:g}-b{c['error_feedback']:g}"
    if c["chunk"] != 4096 or c["bits"] != 2:
        name += f"-c{c['chunk']}-q{c['bits']}"
    return name + (f"-m{mom:g}" if mom is not None else "")


def runs(ks, hs, int8_h, sweep_k, sweep, int8_lrs, default_lr, syncs=(), topk=()):
    """(name, K, H, compression, baseline, outer lr, outer momentum or None, sync or None), in the
    order to run them. compression: fp32, int8 or a topk map."""
    out = []
    for k in sorted(ks, reverse=True):
        for h in hs:
            out.append((f"diloco-k{k}-h{h}", k, h, "fp32", None, default_lr, None, None))
        if k == max(ks):
            out.append((f"diloco-k{k}-h{int8_h}-int8", k, int8_h, "int8", None, default_lr, None, None))
        out.append((f"ddp-k{k}", k, int8_h, "fp32", "ddp", default_lr, None, None))
    out.append(("single", 1, int8_h, "fp32", "single", default_lr, None, None))
    for h, lr, mom in sweep:
        name = f"diloco-k{sweep_k}-h{h}-olr{lr:g}" + (f"-m{mom:g}" if mom is not None else "")
        out.append((name, sweep_k, h, "fp32", None, lr, mom, None))
    for lr, mom in int8_lrs:
        name = f"diloco-k{sweep_k}-h{int8_h}-int8-olr{lr:g}" + (f"-m{mom:g}" if mom is not None else "")
        out.append((name, sweep_k, int8_h, "int8", None, lr, mom, None))
        for mode, frags, tau, mix in syncs:
            sync = {"mode": mode, "fragments": frags, "overlap_steps": tau, "mix": mix}
            out.append((f"{name}-{mode}-p{frags}-t{tau}-a{mix:g}", sweep_k, int8_h, "int8", None, lr, mom, sync))
    for k, c, lr, mom in topk:
        out.append((topk_name(k, int8_h, c, lr, mom), k, int8_h, c, None, lr, mom, None))
    return out


def parse_topk(spec):
    """K:k:outer_lr:rule[:beta[:momentum[:chunk[:bits]]]], comma-separated -> (K, compression map,
    lr, momentum or None). rule: sparseloco (θ -= lr * mean, no momentum) or nesterov (the
    job's Nesterov outer step on the sparse mean; momentum the base's unless given)."""
    out = []
    for x in (x for x in spec.split(",") if x):
        p = x.split(":")
        if len(p) < 4 or p[3] not in ("sparseloco", "nesterov"):
            sys.exit(f"--topk {x}: want K:k:outer_lr:sparseloco|nesterov[:beta[:momentum[:chunk[:bits]]]]")
        beta = float(p[4]) if len(p) > 4 and p[4] else 0.95
        mom = float(p[5]) if len(p) > 5 and p[5] else None
        chunk = int(p[6]) if len(p) > 6 else 4096
        bits = int(p[7]) if len(p) > 7 else 2
        c = {"kind": "topk", "chunk": chunk, "k": int(p[1]), "bits": bits, "error_feedback": beta, "outer": p[3]}
        out.append((int(p[0]), c, float(p[2]), mom))
    return out


def complete(path, steps):
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        return bool(lines) and lines[-1]["inner_steps"] >= steps
    except (OSError, ValueError, KeyError):
        return False


def run(name, cmd, d):
    t0 = time.time()
    with open(os.path.join(d, "log.txt"), "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.call(["nice", "-n", "19"] + cmd, stdout=log, stderr=subprocess.STDOUT)
    return name, rc, time.time() - t0


def write_job(job, d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "job.yaml"), "w") as f:
        yaml.safe_dump(job, f, sort_keys=False)
    return os.path.join(d, "job.yaml")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=("gpt", "llama"), default="gpt",
                    help="llama: llama-tiny (byte tokens, about the GPT's size): --pretrain, --base and "
                         "--out default to pretrain-llama.yaml, study-llama.yaml and runs/study-llama")
    ap.add_argument("--pretrain", default=None, help="default pretrain.yaml (pretrain-llama.yaml)")
    ap.add_argument("--base", default=None, help="default study.yaml (study-llama.yaml)")
    ap.add_argument("--data", default=os.path.join(ROOT, "data"), help="scripts/fetch-corpus's folder")
    ap.add_argument("--out", default=None, help="default runs/study (runs/study-llama)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "loco-train"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="inner steps per worker (default: base rounds x H)")
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--hs", default="10,50,250")
    ap.add_argument("--int8-h", type=int, default=50)
    ap.add_argument("--sweep-k", type=int, default=8)
    ap.add_argument("--sweep", default="50:0.35,50:1.0,50:1.4,250:0.35,250:1.0,50:1.0:0.8,50:0.85",
                    help="outer sweep: H:lr or H:lr:momentum, besides the base's ('' for none)")
    ap.add_argument("--int8-sweep", default="1.0,1.0:0.8", help="lr or lr:momentum of extra int8 runs at --int8-h")
    ap.add_argument("--only", default="", help="comma-separated run names ('topk': every --topk run)")
    ap.add_argument("--sync", default="",
                    help="other sync modes of each int8 sweep run: mode:fragments:overlap_steps:mix, "
                         "comma-separated (e.g. streaming:2:5:0.5,eager:1:5:0)")
    ap.add_argument("--seed", type=int, default=None,
                    help="the runs' data-order seed (default: the base's); another seed than the base's "
                         "writes its runs to OUT/seed-N/NAME (pretraining is the same for every seed)")
    ap.add_argument("--topk", default="",
                    help="SparseLoCo runs at --int8-h: K:k:outer_lr:rule[:beta[:momentum[:chunk[:bits]]]], "
                         "comma-separated, rule sparseloco or nesterov, beta (error feedback) 0.95, chunk "
                         "4096, bits 2 unless given (e.g. 8:12:1.0:sparseloco,8:16:0.7:nesterov:0.95:0.8)")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    llama = a.arch == "llama"
    a.pretrain = a.pretrain or os.path.join(HERE, "pretrain-llama.yaml" if llama else "pretrain.yaml")
    a.base = a.base or os.path.join(HERE, "study-llama.yaml" if llama else "study.yaml")
    a.out = a.out or os.path.join(ROOT, "runs", "study-llama" if llama else "study")
    data = os.path.abspath(a.data)
    os.makedirs(a.out, exist_ok=True)

    # 1. Pretraining: one worker from scratch.
    with open(a.pretrain) as f:
        pre = yaml.safe_load(f)
    pre["data"]["dir"] = data
    pre_dir = os.path.join(a.out, "pretrain")
    pre_steps = pre["rounds"] * pre["inner"]["steps"]
    pre_job = write_job(pre, pre_dir)
    if complete(os.path.join(pre_dir, "metrics.jsonl"), pre_steps):
        print("pretrain: done already", flush=True)
    else:
        cmd = [a.bin, "train", "--simulate", "1", pre_job, "--out", pre_dir, "--threads", str(a.threads),
               "--baseline", "single"]
        name, rc, dt = run("pretrain", cmd, pre_dir)
        print(f"pretrain: rc={rc} {dt:.0f} s", flush=True)
        if rc != 0:
            sys.exit(f"pretraining failed, see {pre_dir}/log.txt")
    init = os.path.join(pre_dir, pre["checkpoint"]["dir"], "latest.pt")

    # 2. Every run from the pretrained θ, the same inner steps per worker.
    with open(a.base) as f:
        base = yaml.safe_load(f)
    base["data"]["dir"] = data
    runs_out = a.out
    if a.seed is not None and a.seed != base["seed"]:
        base["seed"] = a.seed
        runs_out = os.path.join(a.out, f"seed-{a.seed}")
    steps = a.steps or base["rounds"] * base["inner"]["steps"]
    ints = lambda s: [int(x) for x in s.split(",") if x]
    todo = []
    sweep = [(int(p[0]), float(p[1]), float(p[2]) if len(p) > 2 else None)
             for p in (x.split(":") for x in a.sweep.split(",") if x)]
    int8_sweep = [(float(p[0]), float(p[1]) if len(p) > 1 else None)
                  for p in (x.split(":") for x in a.int8_sweep.split(",") if x)]
    syncs = [(p[0], int(p[1]), int(p[2]), float(p[3]))
             for p in (x.split(":") for x in a.sync.split(",") if x)]
    for name, k, h, comp, baseline, olr, mom, sync in runs(ints(a.ks), ints(a.hs), a.int8_h, a.sweep_k,
                                                           sweep, int8_sweep, base["outer"]["lr"], syncs,
                                                           parse_topk(a.topk)):
        only = a.only.split(",")
        if a.only and name not in only and not ("topk" in only and isinstance(comp, dict)):
            continue
        if steps % h:
            sys.exit(f"steps {steps} is not a multiple of H {h}")
        job = copy.deepcopy(base)
        job["name"] = name
        job["inner"]["steps"] = h
        job["rounds"] = steps // h
        job["compression"] = comp
        job["workers"]["count"] = k
        job["outer"]["lr"] = olr
        if mom is not None:
            job["outer"]["momentum"] = mom
        if sync is not None:
            job["sync"] = sync
        d = os.path.join(runs_out, name)
        path = write_job(job, d)
        if complete(os.path.join(d, "metrics.jsonl"), steps):
            print(f"{name}: done already", flush=True)
            continue
        cmd = [a.bin, "train", "--simulate", str(k), path, "--out", d, "--threads", str(a.threads), "--init", init]
        if baseline:
            cmd += ["--baseline", baseline]
        todo.append((name, cmd, d))

    t0 = time.time()
    with cf.ThreadPoolExecutor(a.jobs) as pool:
        for name, rc, dt in pool.map(lambda x: run(*x), todo):
            print(f"{name}: rc={rc} {dt:.0f} s (study wall time so far {time.time() - t0:.0f} s)", flush=True)
    if a.no_plot:
        return
    # matplotlib lives in the LibTorch virtual environment.
    venv = os.environ.get("LOCO_VENV", os.path.expanduser("~/.cache/loco-venv"))
    py = os.path.join(venv, "bin", "python")
    subprocess.call([py if os.path.exists(py) else sys.executable, os.path.join(HERE, "plot.py"), a.out])


if __name__ == "__main__":
    main()
