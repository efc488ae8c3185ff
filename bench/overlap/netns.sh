#!/usr/bin/env bash
# Compute utilization of a DiLoCo job on slow links, blocking against streaming and eager, in one
# run:
# 4 worker hosts in network namespaces (tests/netns/cluster.sh), each host's egress limited
# by a token bucket, and the same job (a 6.4 M-parameter byte-level GPT, tests/netns'
# gpt-20mbit model, H = 12, fp32) run once per mode on the same cluster. Per mode it prints
# the job's wall time, its whole-job compute utilization (time in inner steps over the time
# the members were in the job, as the job's last line says), the median of the rounds'
# utilization and round time (rounds 1.., from metrics.jsonl), and the final validation loss;
# then each mode's ratios to blocking. Needs root (skips with exit 77 otherwise).
#
#   bench/overlap/netns.sh                          # 20 Mbit/s, the three modes
#   RATE=1gbit ROUNDS=3 bench/overlap/netns.sh
#   STREAMING="{mode: streaming, fragments: 2, overlap_steps: 3, mix: 0.5}" bench/overlap/netns.sh
#   MODES="blocking eager" bench/overlap/netns.sh
set -uo pipefail
RATE=${RATE:-20mbit}
ROUNDS=${ROUNDS:-4}
H=${H:-12}
STREAMING=${STREAMING:-"{mode: streaming, fragments: 4, overlap_steps: 3, mix: 0.5}"}
EAGER=${EAGER:-"{mode: eager, overlap_steps: 8}"}
MODES=${MODES:-blocking streaming eager}
WAIT_S=${WAIT_S:-1500}
source "$(cd "$(dirname "$0")" && pwd)/../../tests/netns/cluster.sh"

cd "$WORK"
cluster_up 4
for h in 1 2 3 4; do
  ip netns exec "${TAG}h$h" tc qdisc add dev "${TAG}p$h" root tbf rate "$RATE" burst 128kbit latency 400ms
done
cluster_corpus

job_file() {  # MODE SYNC
  cat <<JOB
name: overlap-$1
seed: 1
threads: 1
model: {layers: 8, width: 256, heads: 4, context: 64, tied_embeddings: true}
data: {dir: data, tokenizer: byte, shards: 16, val_fraction: 0.05}
workers: {count: 4, min: 4}
inner: {steps: $H, batch_size: 16, lr: 0.003, warmup: 4, weight_decay: 0.1, grad_clip: 1.0}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
compression: fp32
rounds: $ROUNDS
checkpoint: {every: 0, dir: checkpoints}
eval: {every: 100000, batches: 2}
${2:+sync: $2}
JOB
}

declare -A WALL UTIL RUTIL RTIME LOSS
run_mode() {  # MODE SYNC
  local mode=$1 file="$WORK/$1.yaml"
  job_file "$mode" "$2" >"$file"
  local t0=$SECONDS
  submit "$file"
  wait_job_end "$WAIT_S"
  WALL[$mode]=$((SECONDS - t0))
  case "$STATE" in *succeeded*) ;; *) fail "$mode: the job did not succeed: ${STATE:-no end after $WAIT_S s}" ;; esac
  local log="$WORK/$mode.log" folder="$WORK/checkpoints/$JOB"
  "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" >"$log" 2>&1 || true
  UTIL[$mode]=$(grep -o 'compute utilization [0-9.]*' "$log" | tail -1 | awk '{print $3}')
  LOSS[$mode]=$(grep -o 'validation loss [0-9.]*' "$log" | tail -1 | awk '{print $3}')
  # Rounds 1..: medians of the per-round utilization and round time.
  RUTIL[$mode]=$(grep -v '"round":0,' "$folder/metrics.jsonl" | grep -o '"utilization":[0-9.]*' |
    cut -d: -f2 | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2) * 100}')
  RTIME[$mode]=$(grep -v '"round":0,' "$folder/metrics.jsonl" | grep -o '"round_time":[0-9.]*' |
    cut -d: -f2 | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  say "$mode: wall ${WALL[$mode]} s, job utilization ${UTIL[$mode]} %, rounds: median utilization" \
    "${RUTIL[$mode]} %, median round ${RTIME[$mode]} s; final validation loss ${LOSS[$mode]}"
}

for m in $MODES; do
  case "$m" in
    blocking) run_mode blocking "" ;;
    streaming) run_mode streaming "$STREAMING" ;;
    eager) run_mode eager "$EAGER" ;;
    *) fail "unknown mode $m" ;;
  esac
done

echo
echo "# 4 workers, egress $RATE per host, 6.4 M-parameter GPT, H = $H, $ROUNDS rounds, fp32"
echo "# streaming: $STREAMING; eager: $EAGER"
printf '%-10s %8s %12s %14s %14s %10s\n' mode wall_s job_util_% round_util_% round_time_s val_loss
for m in $MODES; do
  printf '%-10s %8s %12s %14s %14s %10s\n' "$m" "${WALL[$m]}" "${UTIL[$m]}" "${RUTIL[$m]}" "${RTIME[$m]}" "${LOSS[$m]}"
done
if [ -n "${WALL[blocking]:-}" ]; then
  for m in $MODES; do
    [ "$m" = blocking ] && continue
    awk -v m="$m" -v wb="${WALL[blocking]}" -v ws="${WALL[$m]}" -v rb="${RTIME[blocking]}" \
      -v rs="${RTIME[$m]}" -v lb="${LOSS[blocking]}" -v ls="${LOSS[$m]}" 'BEGIN {
      printf "%s / blocking: wall %.2fx, round time %.2fx, validation loss %+.2f %%\n",
        m, ws / wb, rs / rb, 100 * (ls - lb) / lb }'
  done
fi
