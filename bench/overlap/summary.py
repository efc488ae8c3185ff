#!/usr/bin/env python3
"""The figures bench/overlap compares, from a loco job's metrics.jsonl or torchft_worker.py's
JSONL, over the training rounds (1..; loco's round 0 is the evaluation before training):

    round_time   median of the rounds' wall time (loco: the job's round; torchft: each
                 worker's, from its first inner step of the round to the end of its H-th step's
                 hook, which holds the last sync)
    steps_s      median over workers and rounds of a worker's seconds in H inner steps
    util_%       median over workers and rounds of those seconds over the round's time
    slowest_s    median over rounds of the sum over the round's H steps of the slowest worker's
                 step (an upper bound of every worker's steps_s; loco's streaming and eager
                 rounds have no per-member figures yet, only this, from "steps")
    val_loss     the final validation loss (loco: its last evaluation; torchft: worker 0's)
    mid_util_%   over the rounds between the first and the last (2..R-1: no start, no last
                 round's final landing), the workers' seconds in inner steps over their rounds'
                 time, all added up: when rounds follow each other with no barrier (loco's
                 streaming), a member may begin a round before the previous one's results are
                 all in, and a single round's figure can pass 100 %
    cpu_s        median over workers and rounds of the CPU seconds a worker's process used in
                 its H inner steps (loco: the members' "cpu_seconds"; torchft: "step_cpu_seconds"):
                 next to steps_s, the work in them apart from the waiting for a core on a shared
                 machine ("-" for records without them)
    step_cpu_s   loco: of cpu_s, the stepping thread's (the members' "step_cpu_seconds"; with one
                 torch thread the steps' own compute): cpu_s minus this is what the process's
                 other threads (the collective's) used during the steps ("-" without them)

    summary.py loco|torchft FILE H
        prints "round_time steps_s util_% slowest_s val_loss rounds mid_util_% cpu_s step_cpu_s"
"""
import json
import statistics
import sys
from collections import defaultdict


def main() -> None:
    kind, path, h = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rows = [json.loads(line) for line in open(path) if line.strip()]
    times, steps, utils, slowest, cpu, step_cpu, loss = [], [], [], [], [], [], None
    last = max((r["round"] for r in rows), default=0)
    mid_inner = mid_time = 0.0  # rounds 2..last-1
    per_round = defaultdict(list)  # torchft: round -> each worker's step_seconds
    for r in rows:
        if r.get("val_loss") is not None:
            loss = r["val_loss"]
        if r["round"] < 1:
            continue
        times.append(r["round_time"])
        if kind == "loco":
            for m in r.get("members", []):
                if m["steps"] > 0:
                    steps.append(m["seconds"] * h / m["steps"])
                    utils.append(m["seconds"] / r["round_time"])
                    if m.get("cpu_seconds"):
                        cpu.append(m["cpu_seconds"] * h / m["steps"])
                    if m.get("step_cpu_seconds"):
                        step_cpu.append(m["step_cpu_seconds"] * h / m["steps"])
                if 2 <= r["round"] < last:
                    mid_inner += m["seconds"]
                    mid_time += r["round_time"]
            # "steps": per step, the members' tokens and the slowest member's seconds.
            s = [x["tokens"] / x["tokens_per_s"] for x in r.get("steps", []) if x.get("tokens_per_s")]
            if s:
                slowest.append(sum(s) * h / len(s))
        else:
            steps.append(r["seconds"] * h / r["steps"])
            utils.append(r["seconds"] / r["round_time"])
            if 2 <= r["round"] < last:
                mid_inner += r["seconds"]
                mid_time += r["round_time"]
            per_round[r["round"]].append(r["step_seconds"])
            if r.get("step_cpu_seconds"):
                cpu.append(sum(r["step_cpu_seconds"]) * h / r["steps"])
    for workers in per_round.values():
        slowest.append(sum(max(w[i] for w in workers) for i in range(len(workers[0]))))
    med = lambda v, scale=1.0, digits=2: f"{scale * statistics.median(v):.{digits}f}" if v else "-"
    rounds = len({r["round"] for r in rows if r["round"] >= 1})
    print(med(times), med(steps), med(utils, 100, 1), med(slowest),
          f"{loss:.4f}" if loss is not None else "-", rounds,
          f"{100 * mid_inner / mid_time:.1f}" if mid_time > 0 else "-", med(cpu), med(step_cpu))


if __name__ == "__main__":
    main()
