#!/usr/bin/env bash
# Three hosts as network namespaces (veth pairs on a bridge, each link shaped
# to 4 Mbit/s so that the all-reduce takes seconds), a head and Redis on the
# bridge's address, one worker per host. After round 2 one host is cut off
# (its veth set down) while the round's all-reduce runs: the job must go on
# with the other two; then the link comes back: the host joins again as a new
# node and the worker rejoins the job, which ends with 3 workers.
# Needs root and iproute2; exits 77 (ctest: skipped) otherwise.
#   LOCO_BIN  folder of loco (default $LOCO_BUILD/bin)
source "$(cd "$(dirname "$0")" && pwd)/cluster.sh"

cluster_up 3
for h in 1 2 3; do
  # Both directions shaped: the host's egress in the namespace, its ingress on the bridge side.
  ip netns exec "${TAG}h$h" tc qdisc add dev "${TAG}p$h" root tbf rate 4mbit burst 32kbit latency 400ms
  tc qdisc add dev "${TAG}v$h" root tbf rate 4mbit burst 32kbit latency 400ms
done
cluster_corpus

cat >"$WORK/job.yaml" <<YAML
name: netns
seed: 3
threads: 1
model: {layers: 2, width: 64, heads: 2, context: 32}
data: {dir: $WORK/data, tokenizer: byte, shards: 12, val_fraction: 0.05}
workers: {count: 3, min: 2, max_restarts: 5}
inner: {steps: 5, batch_size: 8, lr: 0.003, warmup: 5}
compression: fp32
rounds: 9
checkpoint: {every: 0, dir: $WORK/ckpt}
eval: {every: 5, batches: 2}
YAML
submit "$WORK/job.yaml"

# Round reports are not log lines; wait for the third round to be under way:
# the all-reduce dominates a round on these links (about 2 s of 2.5).
for _ in $(seq 1 300); do
  n=$(grep -c '"round"' "$WORK/ckpt/$JOB/metrics.jsonl" 2>/dev/null || true)
  n=${n:-0}
  [ "$n" -ge 3 ] && break
  sleep 0.2
done
[ "${n:-0}" -ge 3 ] || fail "the job did not reach round 2"
VICTIM="$(worker_host 1)"
[ -n "$VICTIM" ] || fail "where is worker 1?"
sleep 0.5  # into the round's all-reduce (not a synchronization: any point of the round must do)
say "cutting host $VICTIM off (${TAG}v$VICTIM down)"
ip link set "${TAG}v$VICTIM" down
wait_log "worker 1 left" 30 || fail "the cut-off worker was not dropped"
say "dropped: $("$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | grep 'worker 1 left' | head -1)"
wait_log "going on with 2 workers" 30 || fail "the round did not complete with the other two"
say "restoring host $VICTIM"
ip link set "${TAG}v$VICTIM" up
wait_log "worker 1 joined at round" 90 || fail "worker 1 did not rejoin"
say "rejoined: $("$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | grep 'worker 1 joined' | head -1)"
grep -q "joining again as node" "$WORK/node$VICTIM.log" || fail "host $VICTIM did not join again as a new node"

wait_job_end 300
echo "$STATE"
case "$STATE" in *succeeded*) ;; *) fail "job did not succeed: $STATE" ;; esac
last="$(tail -1 "$WORK/ckpt/$JOB/metrics.jsonl")"
echo "$last" | grep -q '"workers":3' || fail "the job did not end with 3 workers: $last"
say "PASSED: cut off mid-round, went on with 2, rejoined, ended with 3 workers"
