#!/usr/bin/env bash
# A 6.4 M-parameter GPT (tests/netns/gpt-20mbit.yaml) on four hosts whose egress is
# 20 Mbit/s, with the all-reduce's DEFAULT settings: no `allreduce:` section in the
# job file. Links of this speed are common between sites; nobody should have to tune
# the collective for them. Each round's all-reduce sends 38.4 MB per worker (about
# 15 s at 20 Mbit/s). The job must finish its 3 rounds with no all-reduce attempt
# failing (attempts.jsonl, and the log's "failed the all-reduce") and without going
# back to its start (no "going back to" in the log, every "redo" 0).
# Prints, pass or fail, what the attempts were: how many, how many failed, and the
# errors by kind.
# Needs root and iproute2; exits 77 (ctest: skipped) otherwise.
#   LOCO_BIN        folder of loco (default $LOCO_BUILD/bin)
#   LOCO_KEEP_LOGS  set: keep $WORK (logs, metrics.jsonl, attempts.jsonl)
source "$(cd "$(dirname "$0")" && pwd)/cluster.sh"
JOB_FILE="$LOCO_ROOT/tests/netns/gpt-20mbit.yaml"
WAIT_S="${LOCO_NETNS_WAIT_S:-450}"  # ctest's TIMEOUT is 600

# The nodes start in $WORK: the job file's relative data/ and checkpoints/ are there.
cd "$WORK"
cluster_up 4
for h in 1 2 3 4; do
  ip netns exec "${TAG}h$h" tc qdisc add dev "${TAG}p$h" root tbf rate 20mbit burst 128kbit latency 400ms
done
cluster_corpus

submit "$JOB_FILE"
wait_job_end "$WAIT_S"
echo "$STATE"
case "$STATE" in
  *succeeded*|*failed*|*cancelled*) ;;
  *)
    say "no end after $WAIT_S s: cancelling"
    "$LOCO_BIN/loco" cancel "$JOB" --address "$HEAD" >/dev/null 2>&1 || true
    ;;
esac

LOG="$WORK/job.log"
"$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" >"$LOG" 2>&1 || true
FOLDER="$WORK/checkpoints/$JOB"
ATTEMPTS="$FOLDER/attempts.jsonl"
touch "$ATTEMPTS"
n_attempts=$(grep -c . "$ATTEMPTS" || true)
n_failed=$(grep -c '"outcome":"failed"' "$ATTEMPTS" || true)
n_failed_log=$(grep -c 'failed the all-reduce' "$LOG" || true)
n_back=$(grep -c 'going back to' "$LOG" || true)
say "all-reduce attempts: ${n_attempts:-0}, failed: ${n_failed:-0} (log: ${n_failed_log:-0} members" \
  "failed the all-reduce); went back to the start or a checkpoint: ${n_back:-0} times"
say "attempts (round, attempt, workers, seconds, outcome):"
sed -E 's/.*"round":([0-9]+),"redo":([0-9]+),"attempt":([0-9]+),"workers":([0-9]+).*"outcome":"([a-z]+)","seconds":([0-9.e+-]+).*/  round \1 (redo \2) attempt \3: \4 workers, \6 s, \5/' "$ATTEMPTS"
if [ "${n_failed:-0}" -gt 0 ]; then
  say "errors of the failed attempts, by kind (names and numbers masked):"
  grep -o '"error":"[^"]*' "$ATTEMPTS" | sed -E 's/"error":"//; s/[0-9]+(\.[0-9]+)?/N/g' |
    sort | uniq -c | sort -rn | head -20
fi
[ -f "$FOLDER/metrics.jsonl" ] && { say "metrics.jsonl:"; cat "$FOLDER/metrics.jsonl"; }

case "$STATE" in *succeeded*) ;; *) fail "job did not succeed: ${STATE:-no end after $WAIT_S s}" ;; esac
[ "${n_failed:-0}" -eq 0 ] || fail "$n_failed all-reduce attempts failed"
[ "${n_failed_log:-0}" -eq 0 ] || fail "the log has $n_failed_log 'failed the all-reduce' lines"
[ "${n_back:-0}" -eq 0 ] || fail "the job went back $n_back times"
grep -q '"redo":[1-9]' "$FOLDER/metrics.jsonl" && fail "rounds were redone"
last="$(tail -1 "$FOLDER/metrics.jsonl")"
grep -q '"round":3,' <<<"$last" || fail "the last report is not of round 3: $last"
grep -q '"workers":4' <<<"$last" || fail "the job did not end with 4 workers: $last"
say "PASSED: 3 rounds of a 6.4 M-parameter GPT on 20 Mbit/s links, default all-reduce settings," \
  "no failed attempt"
