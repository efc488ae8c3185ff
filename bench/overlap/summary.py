#!/usr/bin/env python3
"""The figures bench/overlap compares, from a loco job's metrics.jsonl or torchft_worker.py's
JSONL, over the training rounds (1..; loco's round 0 is the evaluation before training):

    round_time   median of the rounds' wall time (loco: the job's round; torchft: each
                 worker's, from its first inner step of the round to the end of its 12th step's
                 hook)
    steps_s      median over workers and rounds of a worker's seconds in inner steps, per H steps
    util_%       median over workers and rounds of seconds in inner steps / round time
                 (loco's streaming and eager rounds have no per-member figures yet: there, the
                 sum over the round's steps of the slowest member's step, from "steps", marked
                 with a *; an upper bound of every member's)
    val_loss     the final validation loss (loco: its last evaluation; torchft: worker 0's)

    summary.py loco|torchft FILE H    prints "round_time steps_s util_% val_loss rounds"
"""
import json
import statistics
import sys


def main() -> None:
    kind, path, h = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rows = [json.loads(line) for line in open(path) if line.strip()]
    times, steps, utils, loss, rounds = [], [], [], None, set()
    bound, bound_utils = [], []
    for r in rows:
        if r.get("val_loss") is not None:
            loss = r["val_loss"]
        if r["round"] < 1:
            continue
        rounds.add(r["round"])
        if kind == "loco":
            times.append(r["round_time"])
            for m in r.get("members", []):
                if m["steps"] > 0:
                    steps.append(m["seconds"] * h / m["steps"])
                    utils.append(m["seconds"] / r["round_time"])
            if not r.get("members") and r.get("steps"):
                slowest = sum(s["tokens"] / s["tokens_per_s"] for s in r["steps"] if s.get("tokens_per_s"))
                bound.append(slowest * h / len(r["steps"]))
                bound_utils.append(slowest / r["round_time"])
        else:
            times.append(r["round_time"])
            steps.append(r["seconds"] * h / r["steps"])
            utils.append(r["seconds"] / r["round_time"])
    mark = ""
    if not steps and bound:
        steps, utils, mark = bound, bound_utils, "*"
    med = lambda v: f"{statistics.median(v):.2f}{mark}" if v else "-"
    util = f"{100 * statistics.median(utils):.1f}{mark}" if utils else "-"
    print(f"{statistics.median(times):.2f}" if times else "-", med(steps), util, f"{loss:.4f}" if loss is not None else "-", len(rounds))


if __name__ == "__main__":
    main()
