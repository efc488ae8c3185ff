#!/usr/bin/env python3
"""The soak's fault-free reference (issue "25 ·", item 3: "the final validation loss is within 1 %
of a fault-free run of the same tokens on the same topology"): the soak's own job file run by
the simulator with all of its workers in every round and no fault, each round at the codec the
soak's job chose (its metrics.jsonl replayed with --codec-trace), evaluated every round. Then
the soak's final validation loss against the reference's at the same round (the same schedule,
which is fixed by the job's rounds, and at least as many tokens: the soak's rounds lost members
to its faults) and at the first round whose tokens reach the soak's.

  bench/soak/reference.py --soak runs/soak-record2 --loco-train build/bin/loco-train

The job file names the data where the soak's hosts read it (its work folder under /tmp, kept
with LOCO_KEEP_LOGS=1); --data DIR points the reference at another copy of the same folder.
Exits 1 when the soak's loss is more than --bound (1 %) above the reference's at the same round.
"""
import argparse
import json
import os
import subprocess
import sys


def rounds(path):
    out = {}
    for line in open(path):
        if line.strip():
            m = json.loads(line)
            if "round" in m:
                out[m["round"]] = m  # a redone round: its last line counts
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--soak", required=True, help="the soak's OUT folder (soak.yaml, metrics.jsonl)")
    ap.add_argument("--loco-train", required=True)
    ap.add_argument("--out", help="the reference's folder (default SOAK/reference)")
    ap.add_argument("--data", help="the job's data folder, if not where soak.yaml says")
    ap.add_argument("--threads", type=int, default=1, help="torch threads a worker")
    ap.add_argument("--parallel", type=int, default=os.cpu_count() or 1,
                    help="workers stepping at once (default: one a core)")
    ap.add_argument("--bound", type=float, default=0.01)
    ap.add_argument("--workers", type=int, default=7, help="the soak's workers.count")
    a = ap.parse_args()
    soak = rounds(os.path.join(a.soak, "metrics.jsonl"))
    last = max(r for r, m in soak.items() if m.get("val_loss") is not None)
    out = a.out or os.path.join(a.soak, "reference")
    cmd = [a.loco_train, "train", os.path.join(a.soak, "soak.yaml"), "--simulate", str(a.workers),
           "--threads", str(a.threads), "--parallel", str(a.parallel), "--rounds", str(last), "--out", out,
           "--codec-trace", os.path.join(a.soak, "metrics.jsonl"),
           "--set", f"eval.every={soak[last]['inner_steps'] // max(1, last)}"]
    if a.data:
        cmd += ["--set", f"data.dir={a.data}", "--set", f"data.tokenizer={a.data}/tokenizer.json"]
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    ref = rounds(os.path.join(out, "metrics.jsonl"))
    mine = soak[last]["val_loss"]
    same_round = ref[last]["val_loss"]
    reach = min((r for r, m in ref.items()
                 if m.get("val_loss") is not None and m["tokens_total"] >= soak[last]["tokens_total"]),
                default=None)
    print(f"soak: round {last}, {soak[last]['tokens_total']} tokens, validation loss {mine:.4f}")
    print(f"reference, round {last}: {ref[last]['tokens_total']} tokens, validation loss "
          f"{same_round:.4f}: the soak's is {100 * (mine / same_round - 1):+.2f} %")
    if reach is not None:
        at = ref[reach]["val_loss"]
        print(f"reference, round {reach} (the first with the soak's tokens): "
              f"{ref[reach]['tokens_total']} tokens, validation loss {at:.4f}: the soak's is "
              f"{100 * (mine / at - 1):+.2f} %")
    ok = mine <= same_round * (1 + a.bound)
    verdict = "within" if ok else "more than"
    print(f"{'PASSED' if ok else 'FAILED'}: {verdict} {100 * a.bound:g} % of the fault-free run's "
          "loss at the same round")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
