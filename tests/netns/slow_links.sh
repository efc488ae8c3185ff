#!/usr/bin/env bash
# A job over slow links: three hosts as network namespaces, each host's egress limited to
# 1 Mbit/s, shared by two streams. There one default chunk (512 KiB) takes 4 to 8 s, longer
# than the default peer timeout (3 s), and the members call each other lost, every attempt
# (seen: the job did not finish a round in 5 minutes); even 64 KiB chunks failed the first two
# attempts once (one stream starved for 3 s by the other). With
# `allreduce: {chunk_kb: 64, peer_timeout_s: 15}` the job must finish its 3 rounds with all 3
# workers. Not asserted: that no attempt fails. In 1 run of 3, one member saw its connection
# to another reported closed in round 1 while the other two completed; the round could then
# not be re-run (they had applied the step) and was redone from the job's start, which gave
# the same validation loss (3.1864) as the clean runs. The cause of that drop is not known.
# Needs root and iproute2; exits 77 (ctest: skipped) otherwise.
source "$(cd "$(dirname "$0")" && pwd)/cluster.sh"

cluster_up 3
for h in 1 2 3; do
  ip netns exec "${TAG}h$h" tc qdisc add dev "${TAG}p$h" root tbf rate 1mbit burst 32kbit latency 400ms
done
cluster_corpus

cat >"$WORK/job.yaml" <<YAML
name: netns-slow
seed: 5
threads: 1
model: {layers: 2, width: 64, heads: 2, context: 32}
data: {dir: $WORK/data, tokenizer: byte, shards: 12, val_fraction: 0.05}
workers: {count: 3, min: 3}
inner: {steps: 5, batch_size: 8, lr: 0.003, warmup: 5}
compression: fp32
allreduce: {chunk_kb: 64, peer_timeout_s: 15}
rounds: 3
checkpoint: {every: 0, dir: $WORK/ckpt}
eval: {every: 25, batches: 2}
YAML
submit "$WORK/job.yaml"
wait_job_end 300
echo "$STATE"
case "$STATE" in *succeeded*) ;; *) fail "job did not succeed: $STATE" ;; esac
failed="$("$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" | grep -c 'failed the all-reduce' || true)"
last="$(tail -1 "$WORK/ckpt/$JOB/metrics.jsonl")"
grep -q '"round":3,' <<<"$last" || fail "the last report is not of round 3: $last"
grep -q '"workers":3' <<<"$last" || fail "the job did not end with 3 workers: $last"
say "PASSED: 3 rounds on 1 Mbit/s links with 3 workers (${failed:-0} failed attempts on the way)"
