#!/usr/bin/env bash
# Installs the build into a temporary prefix, moves the prefix (nothing may point back into it
# or into the tree), builds examples/embed against it with only that prefix on
# CMAKE_PREFIX_PATH, and runs it on a 2-node `loco up` cluster of the installed `loco`: its
# actor answers from both nodes, and the DiLoCo job it submits succeeds. Also: pkg-config
# finds loco.pc, and no private header was installed.
set -euo pipefail
BUILD=${LOCO_BUILD:?}
SRC=${LOCO_SOURCE:?}
WORK=$(mktemp -d /tmp/loco-install-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "install_embed: FAIL: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$WORK/first" >"$WORK/install.log" 2>&1 \
  || { tail -20 "$WORK/install.log"; fail "cmake --install"; }
mv "$WORK/first" "$WORK/prefix"
P="$WORK/prefix"

# What is installed: the front doors, none of the runtime's private headers, the package.
for f in include/loco/runtime.hpp include/loco/client.hpp include/loco/job.hpp \
         include/loco/version.hpp lib/cmake/loco/loco-config.cmake lib/pkgconfig/loco.pc \
         bin/loco bin/loco-train lib/loco/plugins/libloco_diloco_actors.so \
         lib/loco/plugins/libloco_diloco_actors.classes; do
  [ -e "$P/$f" ] || fail "$f was not installed"
done
for private in core.hpp wire.hpp transport.hpp plugins.hpp decisions.hpp; do
  [ ! -e "$P/include/loco/runtime/core/$private" ] || fail "private header $private installed"
done
# Nothing installed names the tree or the first prefix (relocatable).
if grep -rlI -e "$WORK/first" -e "$BUILD" "$P/lib/cmake" "$P/lib/pkgconfig" >/dev/null; then
  fail "the package names the build tree or the prefix it was installed to"
fi
for b in "$P/bin/loco" "$P/lib/libloco_runtime.so"; do
  readelf -d "$b" | grep -q 'RUNPATH.*\$ORIGIN' || fail "$b has no \$ORIGIN run path"
done
PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --modversion loco >"$WORK/pc" \
  || fail "pkg-config does not find loco"
echo "install_embed: pkg-config loco $(cat "$WORK/pc")"

# The example, out of tree, against the moved prefix only.
cmake -S "$SRC/examples/embed" -B "$WORK/embed" -G Ninja -DCMAKE_PREFIX_PATH="$P" \
  -DCMAKE_BUILD_TYPE=Release >"$WORK/configure.log" 2>&1 \
  || { cat "$WORK/configure.log"; fail "configuring examples/embed"; }
cmake --build "$WORK/embed" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log"; fail "building examples/embed"; }
[ -s "$WORK/embed/plugins/libembed_greeter.classes" ] || fail "the plugin's manifest is empty"

# A small job in the cluster's working directory (the nodes' data and checkpoint root).
mkdir -p "$WORK/run/data/corpus"
python3 - "$WORK/run/data/corpus/a.txt" <<'PY'
import random, sys
words = "in the beginning god created the heaven and the earth and the earth was without form".split()
random.seed(3)
with open(sys.argv[1], "w") as f:
    for _ in range(6000):
        f.write(" ".join(random.choice(words) for _ in range(10)) + "\n")
PY
cat >"$WORK/run/job.yaml" <<'Y'
name: embed-tiny
seed: 1
threads: 1
model: {layers: 2, width: 32, heads: 2, context: 32}
data: {dir: data, tokenizer: byte, shards: 8, val_fraction: 0.05}
workers: {count: 2, min: 2}
inner: {steps: 5, batch_size: 4, lr: 0.003, warmup: 2}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
rounds: 3
checkpoint: {dir: ck, every: 3}
eval: {every: 5, batches: 1}
Y
cd "$WORK/run"
LOCO_PLUGIN_PATH="$WORK/embed/plugins:$P/lib/loco/plugins" \
  timeout 600 "$P/bin/loco" up --workers 2 -- "$WORK/embed/embed" job.yaml >"$WORK/out" 2>&1 \
  || { tail -40 "$WORK/out"; fail "the embedded program failed on the cluster"; }
grep '^embed:' "$WORK/out"
grep -q "greeters answered from 2 node processes of 2" "$WORK/out" \
  || fail "the greeter did not answer from both nodes"
grep -q "ended succeeded" "$WORK/out" || fail "the job did not succeed"
grep -q "round 3/3" "$WORK/out" || fail "the job's rounds were not followed"
grep -q "metrics: 4 rows" "$WORK/out" || fail "JobHandle::metrics() did not give the 4 reports"
echo "install_embed: ok"
