#!/usr/bin/env bash
# From a fresh clone to the demo's job, cold (issue "23 ·", item 7): clones this checkout into a
# temporary folder and runs scripts/demo there with ccache off, so that every object is compiled
# again, and timestamps each line. It prints how many build steps the demo took against a whole
# build of the same tree, and the seconds to the job's submission, its first round and its end.
# The Debian packages and the LibTorch venv (~/.cache/loco-venv) are what they are on this
# machine: installs are not timed (a fresh machine adds them: scripts/setup --no-build).
#   bench/demo_cold/run.sh            (about 20-30 minutes on 2 cores)
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d /tmp/loco-demo-cold-XXXXXX)"
trap 'rm -rf "$WORK/loco/build"' EXIT
git clone -q "$SRC" "$WORK/loco"
cd "$WORK/loco"
export CCACHE_DISABLE=1
export LOCO_BUILD="$WORK/loco/build"
LOG="$WORK/demo.log"
start=$(date +%s)
scripts/demo 2>&1 | while IFS= read -r line; do
  printf '%6d %s\n' "$(($(date +%s) - start))" "$line"
done > "$LOG" || true
first() { grep -m1 -E "$1" "$LOG" | awk '{print $1}'; }
steps=$(grep -E '^ *[0-9]+ \[[0-9]+/[0-9]+\]' "$LOG" | tail -1 | sed -E 's/.*\[[0-9]+\/([0-9]+)\].*/\1/')
whole=$(ninja -C "$LOCO_BUILD" -n all 2>/dev/null | grep -cE '^\[[0-9]+/[0-9]+\]' || true)
echo "demo_cold: $(git -C "$SRC" rev-parse --short HEAD), $(date -u +%F), $(nproc) cores"
echo "demo_cold: build steps for the demo: ${steps:-?}; left for a whole build after it: ${whole:-?}"
echo "demo_cold: seconds to the end of the build: $(first 'Linking CXX shared library plugins/libloco_diloco_actors.so|ninja: no work')"
echo "demo_cold: seconds to the job's submission: $(first 'as job ')"
echo "demo_cold: seconds to its first round: $(first ' round 1/')"
echo "demo_cold: seconds to the end of the demo: $(tail -1 "$LOG" | awk '{print $1}')"
echo "demo_cold: log $LOG"
