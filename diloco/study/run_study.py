#!/usr/bin/env python3
"""The convergence study of docs/results.md: DiLoCo (K = 4, 8; H = 10, 50,
250; fp32, and int8 at one H) against one worker and data-parallel with K x
batch, all with the same inner steps per worker, through `loco-train train
--simulate`. Runs `--jobs` simulations at a time with `--threads` torch
threads each, skips runs whose metrics are complete, then plots.

  diloco/study/run_study.py --base diloco/study/study.yaml --out runs/study
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


def runs(base, ks, hs, int8_h):
    out = []
    for k in ks:
        for h in hs:
            out.append((f"diloco-k{k}-h{h}", k, h, "fp32", None))
        if k == max(ks):
            out.append((f"diloco-k{k}-h{int8_h}-int8", k, int8_h, "int8", None))
        out.append((f"ddp-k{k}", k, int8_h, "fp32", "ddp"))
    out.append(("single", 1, int8_h, "fp32", "single"))
    return out


def complete(path, steps):
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        return lines and lines[-1]["inner_steps"] >= steps
    except (OSError, ValueError, KeyError):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default=os.path.join(HERE, "study.yaml"))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "study"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "loco-train"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="inner steps per worker (default: base rounds x H)")
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--hs", default="10,50,250")
    ap.add_argument("--int8-h", type=int, default=50)
    ap.add_argument("--only", default="", help="comma-separated run names")
    a = ap.parse_args()
    with open(a.base) as f:
        base = yaml.safe_load(f)
    steps = a.steps or base["rounds"] * base["inner"]["steps"]
    os.makedirs(a.out, exist_ok=True)
    todo = []
    for name, k, h, comp, baseline in runs(base, [int(x) for x in a.ks.split(",")], [int(x) for x in a.hs.split(",")], a.int8_h):
        if a.only and name not in a.only.split(","):
            continue
        if steps % h:
            sys.exit(f"steps {steps} is not a multiple of H {h}")
        job = copy.deepcopy(base)
        job["name"] = name
        job["inner"]["steps"] = h
        job["rounds"] = steps // h
        job["compression"] = comp
        job["workers"]["count"] = k
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "job.yaml"), "w") as f:
            yaml.safe_dump(job, f, sort_keys=False)
        if complete(os.path.join(d, "metrics.jsonl"), steps):
            print(f"{name}: done already", flush=True)
            continue
        cmd = [a.bin, "train", "--simulate", str(k), os.path.join(d, "job.yaml"), "--out", d, "--threads", str(a.threads)]
        if baseline:
            cmd += ["--baseline", baseline]
        todo.append((name, cmd, d))

    def go(item):
        name, cmd, d = item
        t0 = time.time()
        with open(os.path.join(d, "log.txt"), "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        return name, rc, time.time() - t0

    # Longest first: the K = 8 runs and data-parallel cost the most.
    todo.sort(key=lambda x: -int(x[1][3]))
    with cf.ThreadPoolExecutor(a.jobs) as pool:
        for name, rc, dt in pool.map(go, todo):
            print(f"{name}: rc={rc} {dt:.0f} s", flush=True)
    # matplotlib lives in the LibTorch virtual environment.
    venv = os.environ.get("LOCO_VENV", os.path.expanduser("~/.cache/loco-venv"))
    py = os.path.join(venv, "bin", "python")
    subprocess.call([py if os.path.exists(py) else sys.executable, os.path.join(HERE, "plot.py"), a.out])


if __name__ == "__main__":
    main()
