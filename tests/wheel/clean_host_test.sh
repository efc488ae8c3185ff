#!/usr/bin/env bash
# The wheel on clean Debian 12 hosts: two containers of an image with python3 and pip only (no
# compiler, no -dev package), on a docker network of their own, without network access:
#   A: pip install of the wheel, torch==2.11.0 and its CUDA libraries from a local wheel cache
#      (scripts/wheelhouse: this machine's torch packed back into wheels; no network), `loco up --workers 2` of
#      examples/tiny-lm.yaml as it is (6 rounds of 50 steps) to success; then a head, a redis-server
#      (the wheel's) and a node, and a Python script that submits a 2-worker job with
#      loco.submit and reads its validation loss from Job.metrics();
#   B: the same wheel, `loco start --address A:7070`: a node of A's cluster, which the job's
#      second worker must run on.
# Builds the wheel first (scripts/wheel, incremental after the first time). Exits 77 (skipped)
# without a Docker engine. Cleans up its containers and network.
set -euo pipefail
ROOT=${LOCO_SOURCE:-$(cd "$(dirname "$0")/../.." && pwd)}
SKIP=77
say() { echo "wheel_clean_host: $*"; }
fail() { say "FAIL: $*" >&2; exit 1; }

if ! docker info >/dev/null 2>&1; then
  if command -v dockerd >/dev/null && [ "$(id -u)" = 0 ] && ! pgrep -x dockerd >/dev/null; then
    setsid nohup dockerd >/tmp/loco-dockerd.log 2>&1 &
    for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
  docker info >/dev/null 2>&1 || { say "no Docker engine: skipped"; exit $SKIP; }
fi

T0=$(date +%s)
"$ROOT/scripts/wheel" >/tmp/loco-wheel-test-build.log 2>&1 \
  || { tail -20 /tmp/loco-wheel-test-build.log; fail "scripts/wheel"; }
WHEEL=$(ls -t "$ROOT"/dist/loco-*.whl | head -1)
say "wheel $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)), built in $(( $(date +%s) - T0 )) s"

# The clean host: Debian 12 with python3 and pip, made once (apt, at image build time only).
IMAGE=loco-clean-python:bookworm
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  "$ROOT/scripts/docker-image" --base >/dev/null
  printf 'FROM debian:bookworm\nRUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-pip >/dev/null && rm -rf /var/lib/apt/lists/*\n' \
    | docker build -q -t "$IMAGE" - >/dev/null || fail "building $IMAGE"
fi
if docker run --rm "$IMAGE" sh -c 'command -v gcc || command -v g++ || command -v cc || ls /usr/include/python3*/Python.h' 2>/dev/null | grep -q .; then
  fail "$IMAGE has a compiler or Python headers: not a clean host"
fi

# The wheel cache torch comes from (made once, kept in build/wheelhouse: 4.4 GB, seconds).
HOUSE="$ROOT/build/wheelhouse"
(source "$ROOT/scripts/env.sh" && "$LOCO_VENV/bin/python" "$ROOT/scripts/wheelhouse" torch "$HOUSE") \
  >/tmp/loco-wheelhouse.log 2>&1 || { cat /tmp/loco-wheelhouse.log; fail "scripts/wheelhouse"; }
WORK=$(mktemp -d /tmp/loco-wheel-XXXXXX)
NET=loco-wheel-$$
cleanup() {
  docker rm -f "$NET-a" "$NET-b" >/dev/null 2>&1 || true
  docker network rm "$NET" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/wheels" "$WORK/keys"
cp "$WHEEL" "$WORK/wheels/"
cp "$ROOT/examples/tiny-lm.yaml" "$WORK/"
python3 - "$WORK/corpus.txt" <<'PY'
import random, sys
words = "in the beginning god created the heaven and the earth and the earth was without form".split()
r = random.Random(3)
with open(sys.argv[1], "w") as f:
    for _ in range(20000):
        f.write(" ".join(r.choice(words) for _ in range(10)) + "\n")
PY
cat >"$WORK/submit.py" <<'PY'
import sys
import loco
loco.connect(sys.argv[1])
nodes = [n for n in loco.status()["nodes"] if n["state"] == "alive"]
print("nodes:", sorted(n["hostname"] for n in nodes))
job = loco.submit("/work/tiny-lm.yaml", set={"name": "from-python", "workers.count": 2,
                  "workers.min": 2, "rounds": 2, "inner.steps": 10, "eval.every": 10,
                  "checkpoint.every": 100})
end = job.wait(poll_s=0.5, timeout_s=600)
rows = job.metrics()
print("job", end["state"], "val_loss", rows[-1].get("val_loss"), "rounds", rows[-1]["round"])
sys.exit(0 if end["state"] == "succeeded" and rows[-1].get("val_loss", 0) > 0 else 1)
PY

docker network create --internal "$NET" >/dev/null  # --internal: no way out of the network
# Each host: the wheel and torch installed with pip from the two folders alone (--no-index: no
# network; the containers' network is --internal anyway), into the system Python.
INSTALL='set -e
t0=$(date +%s.%N)
pip install -q --no-index --find-links /work/wheels --find-links /wheelhouse --break-system-packages loco
echo "pip install took $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || python3 -c "import time; print(round(time.time() - $t0, 2))") s"
'
T_INSTALL=$(date +%s.%N)
for h in a b; do
  docker run -d --name "$NET-$h" --hostname "host-$h" --network "$NET" \
    -v "$WORK:/work" -v "$HOUSE:/wheelhouse:ro" -e LOCO_KEY=/work/keys/cluster.key \
    "$IMAGE" sleep 3600 >/dev/null
  docker exec "$NET-$h" bash -c "$INSTALL" || fail "pip install on host $h"
done
A_IP=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$NET-a")

# 1. On A alone: loco up --workers 2 examples/tiny-lm.yaml, as it is, to success.
docker exec -w /work "$NET-a" bash -c 'mkdir -p up/data/corpus && cp corpus.txt up/data/corpus/ && cd up &&
  timeout 900 loco up --workers 2 /work/tiny-lm.yaml' >"$WORK/up.log" 2>&1 || {
  tail -20 "$WORK/up.log"; docker exec "$NET-a" bash -c 'for f in /tmp/loco-*/up-*/*.log; do echo == $f; tail -n 20 $f; done'
  fail "loco up on A"; }
grep -q "job succeeded" "$WORK/up.log" || { tail -20 "$WORK/up.log"; fail "loco up's job did not succeed"; }
say "A: $(grep 'job succeeded' "$WORK/up.log")"
say "A: from pip install (both hosts) to loco up's job done: $(python3 -c "import time; print(round(time.time() - $T_INSTALL, 1))") s"

# 2. A cluster across the two hosts: A runs redis (the wheel's), the head and a node; B a node.
docker exec -w /work "$NET-a" bash -c "{ [ -f /work/keys/cluster.key ] || loco keygen --out /work/keys/cluster.key >/dev/null; } &&
  mkdir -p data/corpus && cp corpus.txt data/corpus/ &&
  R=\$(python3 -c 'import loco, pathlib; print(pathlib.Path(loco.__file__).parent / \"bin/redis-server\")') &&
  (\$R --port 6379 --bind 0.0.0.0 --protected-mode no --save '' >/work/redis.log 2>&1 &) &&
  (loco start --head --block --host 0.0.0.0 --port 7070 --advertise $A_IP \
     --redis redis://$A_IP:6379 >/work/head.log 2>&1 &) &&
  (loco start --block --address $A_IP:7070 --advertise $A_IP --resources cpu=2 \
     --data-root /work --checkpoint-root /work >/work/node-a.log 2>&1 &)"
B_IP=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$NET-b")
docker exec -d "$NET-b" bash -c "for i in \$(seq 1 60); do [ -f /work/keys/cluster.key ] && break; sleep 1; done;
  mkdir -p /tmp/b && cd /tmp/b && exec loco start --block --address $A_IP:7070 --advertise $B_IP \
    --resources cpu=1 --data-root /work --checkpoint-root /work >/work/node-b.log 2>&1"
docker exec -w /work "$NET-a" bash -c "for i in \$(seq 1 60); do
    n=\$(loco status --address $A_IP:7070 2>/dev/null | grep -c alive || true); [ \"\$n\" -ge 2 ] && exit 0; sleep 1; done; exit 1" \
  || { cat "$WORK/head.log" "$WORK/node-b.log" | tail -20; fail "the two nodes did not join"; }
docker exec -w /work "$NET-a" timeout 600 python3 /work/submit.py "$A_IP:7070" >"$WORK/py.log" 2>&1 \
  || { cat "$WORK/py.log"; tail -20 "$WORK/node-b.log"; fail "the Python client's job"; }
cat "$WORK/py.log"
grep -q "host-a" "$WORK/py.log" && grep -q "host-b" "$WORK/py.log" || fail "the nodes are not host-a and host-b"
grep -q "created diloco.InnerWorker" "$WORK/node-b.log" \
  || { tail -20 "$WORK/node-b.log"; fail "no worker of the job ran on host B"; }
say "B: $(grep -m1 'created diloco.InnerWorker' "$WORK/node-b.log" | cut -c16-)"
say "ok in $(( $(date +%s) - T0 )) s"
