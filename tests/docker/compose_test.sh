#!/usr/bin/env bash
# End-to-end test of docker-compose.yml: builds the loco image from this
# build (scripts/docker-image), brings up redis + head + 4 workers, submits a
# small tiny-lm job from the host through the client, checks that it succeeds
# and that its final checkpoint is in the mounted folder, and always brings
# the cluster down again. Exits 77 (ctest: skipped) when no Docker engine
# answers or docker-compose is missing.
#   LOCO_BIN      folder of the host's loco (default $LOCO_BUILD/bin)
#   LOCO_DOCKER_WORK  data and checkpoints (default $LOCO_BUILD/docker-test)
#   LOCO_DOCKER_JOB  job file (default tests/docker/tiny-lm-small.yaml;
#                 examples/tiny-lm.yaml runs the full job, a few minutes)
set -euo pipefail
source "$(cd "$(dirname "$0")/../.." && pwd)/scripts/env.sh"
LOCO_BIN="${LOCO_BIN:-$LOCO_BUILD/bin}"
JOB="${LOCO_DOCKER_JOB:-$LOCO_ROOT/tests/docker/tiny-lm-small.yaml}"
WORKERS=4
SKIP=77
t0=$SECONDS
say() { echo "compose_test: [$((SECONDS - t0)) s] $*"; }
skip() { echo "SKIPPED: $*"; exit $SKIP; }

# ---- a Docker engine, or skip -------------------------------------------------
command -v docker >/dev/null || skip "no Docker engine (no docker command)"
if ! timeout 20 docker info >/dev/null 2>&1; then
  # Start dockerd when it is installed but not running (root only).
  if command -v dockerd >/dev/null && [ "$(id -u)" = 0 ] && ! pgrep -x dockerd >/dev/null; then
    say "starting dockerd (log: /tmp/loco-dockerd.log)"
    setsid nohup dockerd >/tmp/loco-dockerd.log 2>&1 &
    for _ in $(seq 1 30); do timeout 5 docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  timeout 20 docker info >/dev/null 2>&1 || skip "no Docker engine (docker info failed)"
fi
command -v docker-compose >/dev/null || skip "no docker-compose command"
[ -x "$LOCO_BIN/loco" ] || { echo "compose_test: $LOCO_BIN/loco missing"; exit 1; }

# ---- image, data, a free port ---------------------------------------------------
say "image"
timeout 900 "$LOCO_ROOT/scripts/docker-image"

WORK="${LOCO_DOCKER_WORK:-$LOCO_BUILD/docker-test}"
mkdir -p "$WORK"
"$LOCO_ROOT/scripts/fetch-corpus" "$WORK/data" >/dev/null
CKPT="$(mktemp -d "$WORK/checkpoints-XXXXXX")"
chmod 777 "$CKPT"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export LOCO_DATA="$WORK/data" LOCO_CHECKPOINTS="$CKPT" LOCO_DOCKER_PORT="$PORT" LOCO_DOCKER_BIND=127.0.0.1
# A project of its own, so that two runs on one machine do not meet.
PROJECT="loco-test-$$"
compose() { timeout "$1" docker-compose -f "$LOCO_ROOT/docker-compose.yml" -p "$PROJECT" "${@:2}"; }

# Clusters left by runs that were killed before their trap ran.
for p in $(docker ps -a --filter label=com.docker.compose.project \
             --format '{{.Label "com.docker.compose.project"}}' | sort -u); do
  case "$p" in
    loco-test-[0-9]*) kill -0 "${p#loco-test-}" 2>/dev/null && continue
      say "removing the cluster of a dead run: $p"
      timeout 120 docker-compose -f "$LOCO_ROOT/docker-compose.yml" -p "$p" down -v >/dev/null 2>&1 || true ;;
  esac
done

ok=0
KEYFILE=""
cleanup() {
  if [ "$ok" != 1 ]; then
    echo "---- docker-compose logs (last 40 lines each) ----"
    compose 60 logs --no-color --tail 40 2>&1 || true
  fi
  say "down"
  compose 120 down -v --remove-orphans >/dev/null 2>&1 || echo "compose_test: docker-compose down failed"
  # The containers write as root: clean up through one of them.
  docker run --rm --network none -v "$CKPT:/c" --entrypoint /bin/rm loco:latest -rf /c/job-* >/dev/null 2>&1 || true
  rm -rf "$CKPT" 2>/dev/null || true
  [ -z "$KEYFILE" ] || rm -f "$KEYFILE"
}
trap cleanup EXIT

# ---- up, wait for the nodes -----------------------------------------------------
say "up: redis, head, $WORKERS workers (head at 127.0.0.1:$PORT)"
compose 180 up -d --no-build --scale worker=$WORKERS
compose 30 ps
# The cluster's key, made by the head in its volume: the host's client needs it.
KEYFILE="$WORK/cluster-$$.key"
export LOCO_KEY="$KEYFILE"
for _ in $(seq 1 30); do
  compose 10 exec -T head cat /keys/cluster.key > "$LOCO_KEY" 2>/dev/null && [ -s "$LOCO_KEY" ] && break
  sleep 1
done
[ -s "$LOCO_KEY" ] || { say "FAIL: the head made no cluster key"; exit 1; }
chmod 600 "$LOCO_KEY"
# Without it the head refuses us.
if timeout 30 "$LOCO_BIN/loco" status --insecure --address "127.0.0.1:$PORT" >/dev/null 2>&1; then
  say "FAIL: a client without the key was served"; exit 1
fi
alive=0
for _ in $(seq 1 60); do
  alive="$(timeout 10 "$LOCO_BIN/loco" status --address "127.0.0.1:$PORT" 2>/dev/null | awk '$3 == "alive"' | wc -l || true)"
  [ "$alive" -ge "$WORKERS" ] && break
  sleep 1
done
timeout 10 "$LOCO_BIN/loco" status --address "127.0.0.1:$PORT" || true
[ "$alive" -ge "$WORKERS" ] || { say "FAIL: $alive of $WORKERS nodes alive after 60 s"; exit 1; }
say "$alive nodes alive"

# ---- the job --------------------------------------------------------------------
say "submit $(basename "$JOB")"
out="$WORK/submit-$$.log"
set +e
timeout 600 "$LOCO_BIN/loco" submit "$JOB" --address "127.0.0.1:$PORT" 2>&1 | tee "$out"
rc="${PIPESTATUS[0]}"
set -e
job="$(sed -n 's/^submitted .* as job \(job-[0-9a-f]*\).*/\1/p' "$out" | head -1)"
rm -f "$out"
[ "$rc" = 0 ] || { say "FAIL: loco submit exited $rc"; exit 1; }
[ -n "$job" ] || { say "FAIL: no job id in loco submit's output"; exit 1; }
final="$CKPT/$job/final.pt"
[ -s "$final" ] || { say "FAIL: no final checkpoint $final"; ls -lR "$CKPT"; exit 1; }
say "final checkpoint $final ($(stat -c %s "$final") bytes)"
ok=1
say "PASS"
