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
# Then torchft 0.2.0's DiLoCo on the same hosts, links and corpus (bench/overlap/torchft.sh,
# torchft_worker.py: the same model, optimizers and H in PyTorch, 1 torch thread per worker):
# blocking (one fragment) and streaming (TORCHFT_FRAGMENTS fragments, each all-reduced
# TORCHFT_DELAY steps before it is needed: torchft allows at most H / P - 1). For every mode,
# loco's and torchft's, bench/overlap/summary.py adds the per-worker figures: the median over
# workers and rounds 1.. of the seconds in H inner steps and of those over the round's time.
#
#   bench/overlap/netns.sh                          # 20 Mbit/s, the three modes, torchft's two
#   RATE=1gbit ROUNDS=3 bench/overlap/netns.sh
#   STREAMING="{mode: streaming, fragments: 2, overlap_steps: 3, mix: 0.5}" bench/overlap/netns.sh
#   MODES="blocking eager" TORCHFT_MODES="" bench/overlap/netns.sh
#   ALLREDUCE="{peer_timeout_s: 30}" bench/overlap/netns.sh   # the jobs' allreduce settings
#   TOGETHER=1 MODES=blocking TORCHFT_MODES=blocking bench/overlap/netns.sh
#   MODES="streaming streaming-ckpt" TORCHFT_MODES= bench/overlap/netns.sh
#   EVAL_BATCHES=16 H=24 bench/overlap/netns.sh     # a final loss over 16 × 16 windows
#   MODES="blocking blocking-int8 blocking-topk streaming streaming-int8 streaming-topk" \
#     TORCHFT_MODES= bench/overlap/netns.sh         # fp32, int8 and the sparse codec
#
# MODE-noguard is MODE with the guard off (guard: {on: false}); every mode prints the guard's
# summary exchange time (metrics.jsonl "guard_time", a member's, median over rounds 1..) and its
# share of the median round time: what robust averaging costs a round.
#   MODES="blocking blocking-noguard streaming streaming-noguard" TORCHFT_MODES= bench/overlap/netns.sh
#   RATE=1gbit MODES="blocking blocking-noguard" TORCHFT_MODES= bench/overlap/netns.sh
#
# A mode named MODE-ckpt is MODE with a checkpoint after every CKPT_EVERY rounds (default 1;
# the others write final.pt only): what checkpoints cost a round, side by side with MODE.
# MODE-int8, MODE-bf16, MODE-topk and MODE-auto run MODE with compression int8, bf16, TOPK
# (default the sparse codec's defaults, {kind: topk}) or AUTO (default auto: the codec chosen
# for the link, docs/decisions/0052); the others fp32. Each mode's rounds' codecs (metrics.jsonl
# "codec", or its fragments' "fragment_codecs") and utilizations are printed round by round.
#
# LINK_SCHEDULE="4:5mbit 8:100mbit" changes every host's egress rate (tc change) once the job
# has ended round 3 (so round 4 runs at 5 Mbit/s), and again after round 7; each mode starts
# at RATE. With it, a per-phase table: each mode's median utilization in each phase.
#   RATE=100mbit ROUNDS=12 LINK_SCHEDULE="4:5mbit 8:100mbit" TORCHFT_MODES= \
#     MODES="streaming streaming-int8 streaming-topk streaming-auto" bench/overlap/netns.sh
#
# SEED (default 1): the job's seed (its initial θ and its data order), for a comparison over
# several: SEED=2 RATE=100mbit ROUNDS=12 LINK_SCHEDULE=... bench/overlap/netns.sh
#
# TOGETHER=1 runs each torchft mode at the same time as loco's mode of the same name (8
# workers on the 4 hosts), instead of after all of loco's: on a machine whose other load comes
# and goes, one after the other compares two different machines; side by side both see the
# same one.
set -uo pipefail
RATE=${RATE:-20mbit}
ROUNDS=${ROUNDS:-4}
SEED=${SEED:-1}
H=${H:-12}
STREAMING=${STREAMING:-"{mode: streaming, fragments: 4, overlap_steps: 3, mix: 0.5}"}
EAGER=${EAGER:-"{mode: eager, overlap_steps: 8}"}
MODES=${MODES:-blocking streaming eager}
WAIT_S=${WAIT_S:-1500}
CKPT_EVERY=${CKPT_EVERY:-1}
EVAL_BATCHES=${EVAL_BATCHES:-2}  # of 16 windows each, at round 0 and the end: the final loss
TORCHFT_MODES=${TORCHFT_MODES-blocking streaming}
TOPK=${TOPK:-"{kind: topk}"}
AUTO=${AUTO:-auto}
LINK_SCHEDULE=${LINK_SCHEDULE:-}
TORCHFT_FRAGMENTS=${TORCHFT_FRAGMENTS:-4}
TORCHFT_DELAY=${TORCHFT_DELAY:-2}
TORCHFT_ALPHA=${TORCHFT_ALPHA:-0.5}
source "$(cd "$(dirname "$0")" && pwd)/../../tests/netns/cluster.sh"
source "$(cd "$(dirname "$0")" && pwd)/torchft.sh"
SUMMARY="$(cd "$(dirname "$0")" && pwd)/summary.py"

cd "$WORK"
cluster_up 4
NODE_PIDS=("${PIDS[@]:2:4}")  # cluster_up's order: redis, the head, then the 4 nodes
# CPU seconds (user + system) the processes PIDS... have used so far.
cpu_seconds() {
  local ticks=0 p f
  for p in "$@"; do
    if f=$(cat "/proc/$p/stat" 2>/dev/null); then
      f=${f##*) }  # the fields after the command's name; utime and stime are fields 14 and 15
      ticks=$((ticks + $(awk '{print $12 + $13}' <<<"$f")))
    fi
  done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz}'
}
for h in 1 2 3 4; do
  ip netns exec "${TAG}h$h" tc qdisc add dev "${TAG}p$h" root tbf rate "$RATE" burst 128kbit latency 400ms
done
cluster_corpus

job_file() {  # MODE SYNC CHECKPOINT_EVERY COMPRESSION GUARD
  cat <<JOB
name: overlap-$1
seed: $SEED
threads: 1
model: {layers: 8, width: 256, heads: 4, context: 64, tied_embeddings: true}
data: {dir: data, tokenizer: byte, shards: 16, val_fraction: 0.05}
workers: {count: 4, min: 4}
inner: {steps: $H, batch_size: 16, lr: 0.003, warmup: 4, weight_decay: 0.1, grad_clip: 1.0}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
compression: ${4:-fp32}
rounds: $ROUNDS
checkpoint: {every: ${3:-0}, dir: checkpoints}
eval: {every: 100000, batches: $EVAL_BATCHES}
${2:+sync: $2}
${ALLREDUCE:+allreduce: $ALLREDUCE}
${5:+guard: $5}
JOB
}

declare -A WALL UTIL RUTIL RTIME LOSS STEPS WUTIL SLOW MID TWALL TFAIL TSUM LFAIL NCPU TCPU CPUS THRS GTIME CODECS PHASES
shape_all() {  # RATE: every host's egress
  for h in 1 2 3 4; do
    ip netns exec "${TAG}h$h" tc qdisc change dev "${TAG}p$h" root tbf rate "$1" burst 128kbit latency 400ms
  done
}
# LINK_SCHEDULE's changes, as the job's metrics.jsonl reaches each round (a background loop,
# polling the file: a bench's clock, not a test's synchronization).
follow_schedule() {  # METRICS_FILE
  trap - EXIT  # a background subshell: the cluster's cleanup is the main script's alone
  local change round rate
  for change in $LINK_SCHEDULE; do
    round=${change%%:*} rate=${change#*:}
    until [ -f "$1" ] && grep -q "\"round\":$((round - 1))," "$1"; do sleep 0.5; done
    shape_all "$rate"
    say "link: every host's egress now $rate (round $((round - 1)) ended)"
  done
}
run_mode() {  # MODE SYNC CHECKPOINT_EVERY COMPRESSION GUARD
  local mode=$1 file="$WORK/$1.yaml"
  job_file "$mode" "$2" "${3:-0}" "${4:-fp32}" "${5:-}" >"$file"
  local t0=$SECONDS c0 follower=""
  c0=$(cpu_seconds "${NODE_PIDS[@]}")
  shape_all "$RATE"
  submit "$file"
  if [ -n "$LINK_SCHEDULE" ]; then
    follow_schedule "$WORK/checkpoints/$JOB/metrics.jsonl" &
    follower=$!
  fi
  if [ -n "${TOGETHER:-}" ] && [[ " $TORCHFT_MODES " == *" $mode "* ]]; then
    torchft_mode "$mode"
    TOGETHER_DONE+=" $mode"
  fi
  wait_job_end "$WAIT_S"
  if [ -n "$follower" ]; then kill "$follower" 2>/dev/null || true; wait "$follower" 2>/dev/null || true; fi
  WALL[$mode]=$((SECONDS - t0))
  NCPU[$mode]=$(awk -v a="$c0" -v b="$(cpu_seconds "${NODE_PIDS[@]}")" 'BEGIN {printf "%.1f", b - a}')
  local log="$WORK/$mode.log" folder="$WORK/checkpoints/$JOB"
  "$LOCO_BIN/loco" logs "$JOB" --address "$HEAD" >"$log" 2>&1 || true
  case "$STATE" in
    *succeeded*) ;;
    *)  # Cancelled, so that the modes after it run on a quiet cluster; the table says why.
      LFAIL[$mode]="the job did not succeed after ${WALL[$mode]} s (${STATE:-no end after $WAIT_S s});"
      "$LOCO_BIN/loco" cancel "$JOB" --address "$HEAD" >/dev/null 2>&1 || true
      wait_job_end 60
      tail -20 "$log"
      LFAIL[$mode]+=" $(grep -c 'goes back to its start' "$log" || true) restarts from the start"
      say "$mode: ${LFAIL[$mode]}"
      return 0 ;;
  esac
  UTIL[$mode]=$(grep -o 'compute utilization [0-9.]*' "$log" | tail -1 | awk '{print $3}')
  LOSS[$mode]=$(grep -o 'validation loss [0-9.]*' "$log" | tail -1 | awk '{print $3}')
  # Rounds 1..: medians of the per-round utilization and round time.
  RUTIL[$mode]=$(grep -v '"round":0,' "$folder/metrics.jsonl" | grep -o '"utilization":[0-9.]*' |
    cut -d: -f2 | sort -n | awk '{a[NR]=$1} END {printf "%.1f", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2) * 100}')
  RTIME[$mode]=$(grep -v '"round":0,' "$folder/metrics.jsonl" | grep -o '"round_time":[0-9.]*' |
    cut -d: -f2 | sort -n | awk '{a[NR]=$1} END {printf "%.2f", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  # The guard's summary exchanges (a member's seconds in a round), median over rounds 1..; "-"
  # where none ran (guard off, or topk: judged on the gathered codes, nothing extra sent).
  GTIME[$mode]=$(grep -v '"round":0,' "$folder/metrics.jsonl" | { grep -o '"guard_time":[0-9.e-]*' || true; } |
    cut -d: -f2 | sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else printf "%.4f", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  # Round by round: "R:CODEC:UTIL%" (the codec "-" where the job fixes it; with codecs agreed
  # per fragment operation, the round's fragments' as "fp32/int8/topk:64/topk:64").
  CODECS[$mode]=$(python3 - "$folder/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
frag = {}
for l in lines:
    for e in l.get("fragment_codecs", []):
        frag[(e["round"], e["fragment"])] = e["codec"]
out = []
for l in lines:
    r = l["round"]
    if r == 0:
        continue
    mine = [c for (rr, f), c in sorted(frag.items()) if rr == r]
    c = "/".join(mine) if mine else l.get("codec", "-")
    out.append("%d:%s:%.1f" % (r, c, 100 * l.get("utilization", 0)))
print(" ".join(out))
PY
)
  if [ -n "$LINK_SCHEDULE" ]; then
    # Median utilization of each phase's rounds: [1, first change), [change, next), ...
    PHASES[$mode]=$(awk -v sched="$LINK_SCHEDULE" -v rounds="${CODECS[$mode]}" 'BEGIN {
      n = split(sched, ch, " "); starts[1] = 1
      for (i = 1; i <= n; ++i) { split(ch[i], p, ":"); starts[i + 1] = p[1] }
      m = split(rounds, rs, " ")
      for (ph = 1; ph <= n + 1; ++ph) {
        k = 0
        for (j = 1; j <= m; ++j) {
          nf = split(rs[j], f, ":"); r = f[1] + 0  # "R:CODEC:UTIL", CODEC perhaps "topk:64"
          if (r >= starts[ph] && (ph > n || r < starts[ph + 1])) v[++k] = f[nf] + 0
        }
        # insertion sort, then the median
        for (a = 2; a <= k; ++a) { x = v[a]; b = a - 1; while (b > 0 && v[b] > x) { v[b + 1] = v[b]; --b } v[b + 1] = x }
        med = k == 0 ? "-" : (k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2)
        printf "%s%s", (ph > 1 ? " " : ""), med
      }
    }')
  fi
  say "$mode: rounds (round:codec:utilization %): ${CODECS[$mode]}"
  read -r _ STEPS[$mode] WUTIL[$mode] SLOW[$mode] _ _ MID[$mode] CPUS[$mode] THRS[$mode] \
    <<<"$("$TORCHFT_PY" "$SUMMARY" loco "$folder/metrics.jsonl" "$H")"
  say "$mode: wall ${WALL[$mode]} s, job utilization ${UTIL[$mode]} %, rounds: median utilization" \
    "${RUTIL[$mode]} %, median round ${RTIME[$mode]} s; final validation loss ${LOSS[$mode]};" \
    "per worker: ${STEPS[$mode]} s in $H inner steps, ${WUTIL[$mode]} % of the round;" \
    "the slowest worker's $H steps: ${SLOW[$mode]} s; rounds 2 to $((ROUNDS - 1)) together:" \
    "${MID[$mode]} % in inner steps; the guard's exchange ${GTIME[$mode]} s a round"
}

TOGETHER_DONE=""
torchft_mode() {  # MODE: torchft's run of it, then its figures
  local m=$1 c0
  if [ -n "${TORCHFT_MISSING:-}" ]; then TFAIL[torchft-$m]=$TORCHFT_MISSING; return 0; fi
  c0=$(cpu_seconds "${NODE_PIDS[@]}")
  case "$m" in
    blocking) torchft_run torchft-blocking 1 0 0 || true ;;
    streaming) torchft_run torchft-streaming "$TORCHFT_FRAGMENTS" "$TORCHFT_DELAY" "$TORCHFT_ALPHA" || true ;;
    *) fail "unknown torchft mode $m" ;;
  esac
  NCPU[torchft-$m]=$(awk -v a="$c0" -v b="$(cpu_seconds "${NODE_PIDS[@]}")" 'BEGIN {printf "%.1f", b - a}')
  if [ -z "${TFAIL[torchft-$m]:-}" ]; then
    TSUM[torchft-$m]="$("$TORCHFT_PY" "$SUMMARY" torchft "$WORK/torchft-$m.jsonl" "$H")"
    TCPU[torchft-$m]=$(grep -o '"cpu_s": [0-9.]*' "$WORK/torchft-$m.jsonl" | awk '{s += $2} END {printf "%.1f", s}')
    say "torchft-$m: wall ${TWALL[torchft-$m]} s; round time, s in $H steps, util %, slowest," \
      "val loss, rounds:" \
      "${TSUM[torchft-$m]}"
  else
    say "torchft-$m: ${TFAIL[torchft-$m]}"
  fi
}

for m in $MODES; do
  every=0
  guard=""
  base=${m%-noguard}
  [ "$base" != "$m" ] && guard="{on: false}"
  b=${base%-ckpt}
  [ "$b" != "$base" ] && every=$CKPT_EVERY
  base=$b
  codec=fp32
  case "$base" in
    *-int8) codec=int8; base=${base%-int8} ;;
    *-topk) codec=$TOPK; base=${base%-topk} ;;
    *-bf16) codec=bf16; base=${base%-bf16} ;;
    *-auto) codec=$AUTO; base=${base%-auto} ;;
  esac
  case "$base" in
    blocking) run_mode "$m" "" "$every" "$codec" "$guard" ;;
    streaming) run_mode "$m" "$STREAMING" "$every" "$codec" "$guard" ;;
    eager) run_mode "$m" "$EAGER" "$every" "$codec" "$guard" ;;
    *) fail "unknown mode $m" ;;
  esac
done

for m in $TORCHFT_MODES; do
  [[ " $TOGETHER_DONE " == *" $m "* ]] || torchft_mode "$m"
done

echo
echo "# 4 workers, egress $RATE per host, 6.4 M-parameter GPT, H = $H, $ROUNDS rounds, fp32 unless the mode says int8 or topk ($TOPK)"
echo "# streaming: $STREAMING; eager: $EAGER"
echo "# torchft 0.2.0 streaming: $TORCHFT_FRAGMENTS fragments, delay $TORCHFT_DELAY, alpha $TORCHFT_ALPHA"
echo "# steps_s: a worker's seconds in $H inner steps, worker_util_%: those over the round's time"
echo "# (medians over workers and rounds 1..); slowest_s: per round, the sum of the slowest"
echo "# worker's steps (median over rounds); round_util_% and job_util_%: loco's own figures;"
echo "# mid_util_%: rounds 2 to R-1 (no start, no final landing), inner seconds over round time"
echo "# added up over workers and rounds"
echo "# cpu_s: a worker's process's CPU seconds in its $H inner steps (median over workers and"
echo "# rounds): the work in steps_s, the rest waiting (for a core, when the machine is shared)"
echo "# step_cpu_s: of cpu_s, the stepping thread's (loco); the rest the process's other threads"
echo "# guard_s: the guard's summary exchange, a member's seconds a round (median over rounds"
echo "# 1..), guard_%: that over the median round time (-: none, guard off or topk)"
row() { printf '%-22s %7s %11s %13s %13s %9s %8s %14s %10s %11s %6s %10s %8s %8s\n' "$@"; }
row mode wall_s job_util_% round_util_% round_time_s val_loss steps_s worker_util_% slowest_s \
  mid_util_% cpu_s step_cpu_s guard_s guard_%
for m in $MODES; do
  if [ -n "${LFAIL[$m]:-}" ]; then echo "$m: ${LFAIL[$m]}"; continue; fi
  share=-
  [ "${GTIME[$m]}" != "-" ] && share=$(awk -v g="${GTIME[$m]}" -v r="${RTIME[$m]}" 'BEGIN {printf "%.3f", 100 * g / r}')
  row "$m" "${WALL[$m]}" "${UTIL[$m]}" "${RUTIL[$m]}" "${RTIME[$m]}" "${LOSS[$m]}" "${STEPS[$m]}" \
    "${WUTIL[$m]}" "${SLOW[$m]}" "${MID[$m]}" "${CPUS[$m]:--}" "${THRS[$m]:--}" "${GTIME[$m]}" "$share"
done
for m in $TORCHFT_MODES; do
  t=torchft-$m
  if [ -n "${TSUM[$t]:-}" ]; then
    read -r RTIME[$t] STEPS[$t] WUTIL[$t] SLOW[$t] LOSS[$t] _ MID[$t] CPUS[$t] <<<"${TSUM[$t]}"
    WALL[$t]=${TWALL[$t]}
    row "$t" "${WALL[$t]}" - - "${RTIME[$t]}" "${LOSS[$t]}" "${STEPS[$t]}" "${WUTIL[$t]}" \
      "${SLOW[$t]}" "${MID[$t]}" "${CPUS[$t]:--}" -
  else
    echo "$t: failed: ${TFAIL[$t]:-}"
  fi
done
echo "# CPU seconds (user + system) during each mode: loco's 4 node processes (idle ones during"
echo "# torchft's modes${TOGETHER:+, but here busy with the loco mode run with them}), torchft's 4 worker"
echo "# processes (their own count, at exit)"
for m in $MODES $(for t in $TORCHFT_MODES; do echo "torchft-$t"; done); do
  echo "$m: wall ${WALL[$m]:--} s, loco nodes ${NCPU[$m]:--} s${TCPU[$m]:+, torchft workers ${TCPU[$m]} s}"
done
for m in $MODES; do
  [ -n "${CODECS[$m]:-}" ] && echo "$m rounds (round:codec:utilization %): ${CODECS[$m]}"
done
if [ -n "$LINK_SCHEDULE" ]; then
  echo "# median round utilization % per phase; phases start at round 1 and at: $LINK_SCHEDULE (from $RATE)"
  for m in $MODES; do
    [ -n "${PHASES[$m]:-}" ] && echo "$m phases: ${PHASES[$m]}  final val_loss ${LOSS[$m]:--}"
  done
fi
# loco against torchft, mode by mode: a worker's H steps where loco reports them per member
# (blocking), else the slowest worker's; loco's utilization per member, else its round's.
for m in $MODES; do
  t=torchft-$m
  [ -n "${RTIME[$t]:-}" ] && [ -n "${RTIME[$m]:-}" ] || continue
  if [ "${STEPS[$m]:--}" != - ]; then
    what="a worker's $H inner steps" sl=${STEPS[$m]} st=${STEPS[$t]} ul=${WUTIL[$m]}
  else
    what="the slowest worker's $H inner steps" sl=${SLOW[$m]} st=${SLOW[$t]} ul=${RUTIL[$m]}
  fi
  awk -v m="$m" -v what="$what" -v sl="$sl" -v st="$st" -v rl="${RTIME[$m]}" -v rt="${RTIME[$t]}" \
    -v ul="$ul" -v ut="${WUTIL[$t]}" -v ll="${LOSS[$m]}" -v lt="${LOSS[$t]}" 'BEGIN {
    printf "loco / torchft, %s: %s %.2fx (%.2f s / %.2f s), round time %.2fx (%.2f s / %.2f s), " \
      "utilization %.1f %% / %.1f %%, validation loss %+.2f %%\n",
      m, what, sl / st, sl, st, rl / rt, rl, rt, ul, ut, 100 * (ll - lt) / lt }'
done
if [ -n "${RTIME[blocking]:-}" ]; then
  for m in $MODES; do
    [ "$m" = blocking ] || [ -z "${RTIME[$m]:-}" ] && continue
    awk -v m="$m" -v wb="${WALL[blocking]}" -v ws="${WALL[$m]}" -v rb="${RTIME[blocking]}" \
      -v rs="${RTIME[$m]}" -v lb="${LOSS[blocking]}" -v ls="${LOSS[$m]}" 'BEGIN {
      printf "%s / blocking: wall %.2fx, round time %.2fx, validation loss %+.2f %%\n",
        m, ws / wb, rs / rb, 100 * (ls - lb) / lb }'
  done
fi
