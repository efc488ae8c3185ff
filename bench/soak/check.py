#!/usr/bin/env python3
"""The soak bench's verdict on its job (bench/soak/run.sh): what was lost, and whether each fault
left its trace where a user looks.

  bench/soak/check.py --faults faults.tsv --timeline timeline.jsonl --metrics metrics.jsonl \\
      --state "$(loco jobs | grep JOB)"

  - the job succeeded;
  - no round's members held different θ (the aggregator compares the members' θ hashes every
    round and fails the round, saying "holds a different θ", when they differ);
  - every redo of a round follows a fault by at most --window seconds, and no fault is followed
    by more than one redo of the same round;
  - every fault (faults.tsv: unix seconds, name, begin|end, what; its begin is its moment) is in
    the job's log, its dashboard timeline and its metrics.jsonl within --window seconds after it:
    what each kind of fault must show is EVIDENCE below.

Prints one line per fault and check, and exits 1 when one fails.
"""
import argparse
import json
import re
import sys

# fault -> (log line pattern, timeline kinds, metrics test on a round's line). A fault shows in
# the log by what the job says of it, on the timeline by an entry of one of the kinds, and in
# metrics.jsonl by a round whose line shows it.
LOST = ("left", "retry", "late", "redo", "cluster")


def lost_members(m):
    return (m.get("failed_attempts") or 0) > 0 or bool(m.get("late")) or (m.get("redo") or 0) > 0


def cluster(kind):
    return lambda m: any(e.get("kind") == kind for e in m.get("cluster") or [])


EVIDENCE = {
    "corrupt": (r"the guard left worker", ("left_out",), lambda m: bool(m.get("left_out"))),
    "head": (r"cluster: the head started", ("cluster",), cluster("head")),
    "uplink": (r" left: | lost worker| tried again|late worker|failed round", LOST, lost_members),
    "relay": (r"cluster: the relay at .* does not accept", ("cluster",),
              lambda m: cluster("relay")(m) or lost_members(m)),
    "join-relay": (r"cluster: the relay at .* does not accept", ("cluster",),
                   lambda m: cluster("relay")(m) or lost_members(m)),
    "redis": (r"cluster: the head's Redis", ("cluster",), cluster("redis")),
    "node": (r" left: ", ("left",), lambda m: True),
    "join": (r" joined ", ("join",), lambda m: True),
    "scale": (r"scale: \d+ -> \d+ workers", ("left", "join"), lambda m: True),
    "scale-down": (r"scale: \d+ -> \d+ workers", ("left",), lambda m: True),
    "scale-up": (r"scale: \d+ -> \d+ workers", ("join",), lambda m: True),
}


# Faults whose trace in the metrics is members lost: when a later fault sent the job back past
# the rounds they fell in, metrics.jsonl no longer has those rounds' lines (each round once),
# and their failed attempts stay in attempts.jsonl (never removed), which has no clock.
LOST_FAULTS = ("uplink", "relay", "join-relay")


def undone_attempts(metrics, attempts, t, round_at):
    """The failed attempts of rounds undone after the fault at unix time t: of the rounds after
    the last line that survives from before t, at that line's redo count, whose round came again
    with a higher one."""
    before = [m for m in metrics if round_at(m) <= t]
    last = max(before, key=round_at) if before else {"round": 0, "redo": 0}
    r0, redo0 = int(last["round"]), int(last.get("redo") or 0)
    redone = {int(m["round"]) for m in metrics if int(m.get("redo") or 0) > redo0}
    return [x for x in attempts
            if int(x.get("redo") or 0) == redo0 and int(x["round"]) > r0
            and int(x["round"]) in redone
            and (x.get("outcome") == "failed" or any(e.get("lost") for e in x.get("errors") or []))]


def attempt_text(x):
    lost = [str(e["worker"]) for e in x.get("errors") or [] if e.get("lost")]
    return (f"round {x['round']} (redo {x.get('redo', 0)}) {x.get('outcome')}"
            + (f": workers {', '.join(lost)} lost" if lost else ""))


def read_jsonl(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", required=True)
    ap.add_argument("--timeline", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--start", type=float, default=0.0,
                    help="unix seconds of the job's submission (default: its first log line)")
    ap.add_argument("--window", type=float, default=180.0, help="seconds a fault's trace may take")
    ap.add_argument("--attempts", default="",
                    help="the job's attempts.jsonl: where rounds a later rewind undid keep their "
                         "failed attempts (metrics.jsonl removes those rounds' lines)")
    a = ap.parse_args()
    bad = 0

    def verdict(ok, what):
        nonlocal bad
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    # `loco jobs`' line: ID NAME (OWNER) STATE MESSAGE...
    words = a.state.split()
    end = next((w for w in words if w in ("succeeded", "failed", "cancelled", "running")), "?")
    verdict(end == "succeeded", f"the job's end: {end}" +
            (f" ({' '.join(words[words.index(end) + 1:])[:300]})" if end in words else ""))
    rows = read_jsonl(a.timeline)
    log = [(r["unix_ms"] / 1000.0, r["text"]) for r in rows if r["source"] == "log"]
    timeline = [(r["unix_ms"] / 1000.0, r["kind"], r["text"]) for r in rows
                if r["source"] == "timeline"]
    metrics = read_jsonl(a.metrics)
    attempts = read_jsonl(a.attempts) if a.attempts else []
    diverged = [t for _, t in log if "holds a different θ" in t]
    verdict(not diverged, f"members' θ hashes agreed in every round ({len(diverged)} disagreements)")

    # The faults: each one's "begin" line is its moment.
    starts = []
    for line in open(a.faults):
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 4 and parts[2] == "begin":
            starts.append((float(parts[0]), parts[1], parts[3]))

    # Metrics lines carry seconds since the job's submission (job_time; time leaves out the
    # rounds undone by a redo).
    t0 = a.start or min((t for t, _ in log), default=0.0)

    def round_at(m):
        return t0 + float(m.get("job_time", m.get("time")) or 0.0)

    # Redos: each follows a fault within the window, at most once per fault and round.
    redos = []
    for t, text in log:
        g = re.match(r"round (\d+) failed: .*it is redone", text)
        if g:
            redos.append((t, int(g.group(1))))
    per = {}
    for t, r in redos:
        before = [f for f in starts if f[0] <= t <= f[0] + a.window]
        key = (before[-1][0] if before else None, r)
        per[key] = per.get(key, 0) + 1
    unexplained = [r for (f, r), n in per.items() if f is None]
    twice = [(r, n) for (f, r), n in per.items() if f is not None and n > 1]
    verdict(not unexplained, f"{len(redos)} redone rounds, each after a fault "
                             f"(unexplained: {unexplained or 'none'})")
    verdict(not twice, f"no round redone twice for one fault ({twice or 'none'})")

    for t, name, what in starts:
        pattern, kinds, test = EVIDENCE.get(name, (None, (), None))
        if pattern is None:
            verdict(False, f"{name}: no rule for this fault")
            continue
        in_log = [x for x in log if t - 2 <= x[0] <= t + a.window and re.search(pattern, x[1])]
        in_tl = [x for x in timeline if t - 2 <= x[0] <= t + a.window and x[1] in kinds]
        in_m = [m for m in metrics if t - 2 <= round_at(m) <= t + a.window + 60 and test(m)]
        in_m_text = f"round {in_m[0]['round']}" if in_m else "nothing"
        if not in_m and name in LOST_FAULTS:
            undone = undone_attempts(metrics, attempts, t, round_at)
            if undone:
                in_m = undone
                in_m_text = "undone by a later rewind; attempts.jsonl " + "; ".join(
                    attempt_text(x) for x in undone[:2])
        ok = bool(in_log and in_tl and in_m)
        first = in_log[0] if in_log else None
        verdict(ok, f"{name} at +{t - t0:.0f} s ({what}): log "
                    f"{'+%.1f s: %s' % (first[0] - t, first[1][:90]) if first else 'nothing'}; "
                    f"timeline {sorted({x[1] for x in in_tl}) or 'nothing'}; "
                    f"metrics {in_m_text}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
