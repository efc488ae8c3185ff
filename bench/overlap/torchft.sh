# torchft 0.2.0's DiLoCo on bench/overlap's cluster (sourced by netns.sh, after cluster_up and
# cluster_corpus): the same 4 hosts, links and corpus as loco's modes.
#
#   torchft_run NAME FRAGMENTS DELAY ALPHA
#       a lighthouse on the bridge's address (root namespace, like loco's head), one
#       torchft_worker.py per host (Gloo over the host's veth, 1 torch thread), $ROUNDS
#       rounds of $H steps; the workers' records in $WORK/NAME.jsonl, their logs beside it;
#       its wall time in TWALL[NAME]. Returns 1 with the reason in TFAIL[NAME] if it failed.
#
# torchft's Gloo finds its interface by GLOO_SOCKET_IFNAME: without it, it resolves the
# machine's hostname, which inside a namespace is not the host's address.
TORCHFT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCHFT_PY="${TORCHFT_PY:-$LOCO_VENV/bin/python}"
"$TORCHFT_PY" -c "import torchft" 2>/dev/null || TORCHFT_MISSING="no torchft in $TORCHFT_PY (scripts/setup installs it)"
TORCHFT_RUNS=0

torchft_run() {  # NAME FRAGMENTS DELAY ALPHA
  local name=$1 frags=$2 delay=$3 alpha=$4
  local port=$(( 20000 + $$ % 20000 + 10 + TORCHFT_RUNS )) base_port=$(( 29500 + 20 * TORCHFT_RUNS ))
  TORCHFT_RUNS=$((TORCHFT_RUNS + 1))
  local out="$WORK/$name.jsonl" lh_log="$WORK/$name.lighthouse.log"
  rm -f "$out"
  "$TORCHFT_PY" "$TORCHFT_DIR/torchft_worker.py" lighthouse --bind "$BASE.1:$port" --replicas 4 \
    --max-s "$WAIT_S" >"$lh_log" 2>&1 &
  local lh=$!
  PIDS+=("$lh")
  for _ in $(seq 1 100); do
    if grep -q "Lighthouse listening" "$lh_log" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if ! grep -q "Lighthouse listening" "$lh_log"; then
    TFAIL[$name]="the lighthouse did not start: $(tail -3 "$lh_log")"
    return 1
  fi
  local workers=() t0=$SECONDS
  for h in 1 2 3 4; do
    ip netns exec "${TAG}h$h" env GLOO_SOCKET_IFNAME="${TAG}p$h" OMP_NUM_THREADS=1 \
      "$TORCHFT_PY" "$TORCHFT_DIR/torchft_worker.py" worker --rank $((h - 1)) --workers 4 \
      --addr "$BASE.1$h" --lighthouse "http://$BASE.1:$port" --data "$WORK/data/corpus" --out "$out" \
      --rounds "$ROUNDS" --h "$H" --fragments "$frags" --delay "$delay" --alpha "$alpha" \
      --eval-batches "${EVAL_BATCHES:-2}" \
      --store-port "$base_port" --manager-port $((base_port + 1)) --timeout-s "$WAIT_S" \
      >"$WORK/$name.worker$h.log" 2>&1 &
    workers+=($!)
    PIDS+=($!)
  done
  local end=$(( SECONDS + WAIT_S )) left
  while [ "$SECONDS" -lt "$end" ]; do
    left=0
    for p in "${workers[@]}"; do
      if kill -0 "$p" 2>/dev/null; then left=$((left + 1)); fi
    done
    if [ "$left" = 0 ]; then break; fi
    sleep 0.5
  done
  TWALL[$name]=$((SECONDS - t0))
  local failed=""
  for i in 0 1 2 3; do
    if kill -0 "${workers[$i]}" 2>/dev/null; then
      kill -9 "${workers[$i]}" 2>/dev/null || true
      failed+=" worker$((i + 1)) (still running after $WAIT_S s)"
    elif ! wait "${workers[$i]}"; then
      failed+=" worker$((i + 1)) (exit $?)"
    fi
  done
  kill "$lh" 2>/dev/null || true
  wait "$lh" 2>/dev/null || true
  if [ -n "$failed" ]; then
    for h in 1 2 3 4; do echo "--- $name worker $h:"; tail -5 "$WORK/$name.worker$h.log"; done
    TFAIL[$name]="workers failed:$failed"
    return 1
  fi
}
