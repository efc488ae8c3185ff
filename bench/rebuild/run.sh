#!/usr/bin/env bash
# Rebuild time after touching one header, before and after a restructuring (issue 22, item 6):
# for each of two commits, the build tree is brought up to date (ccache on), then each header is
# touched and the build timed with ccache off (2 jobs), counting the compiles ninja runs.
#   bench/rebuild/run.sh BEFORE AFTER "HDR_BEFORE:HDR_AFTER" ... > result.txt
# e.g. bench/rebuild/run.sh 67b1780 main diloco/config.hpp:diloco/job/config.hpp \
#        runtime/core/runtime.hpp:runtime/core/runtime.hpp
# Checks out each commit in this working tree (it must be clean) and comes back to AFTER. Run
# it on a quiet machine: nothing else compiles meanwhile.
set -euo pipefail
source "$(dirname "$0")/../../scripts/env.sh"
cd "$LOCO_ROOT"
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "working tree not clean" >&2; exit 2; }
before=$1 after=$2
shift 2
measure() {  # LABEL HEADER
  touch "$2"
  local n t0 t1
  n=$(ninja -C "$LOCO_BUILD" -n 2>/dev/null | grep -c "Building CXX" || true)
  t0=$(date +%s.%N)
  CCACHE_DISABLE=1 ninja -C "$LOCO_BUILD" -j2 >/dev/null
  t1=$(date +%s.%N)
  echo "$1 $2: $n compiles, $(python3 -c "print(round($t1 - $t0, 1))") s"
}
for side in before after; do
  commit=${!side}
  git checkout -q "$commit"
  ninja -C "$LOCO_BUILD" -j2 >/dev/null
  for pair in "$@"; do
    header=${pair%%:*}
    [ "$side" = after ] && header=${pair##*:}
    measure "$side ($commit)" "$header"
  done
done
