# Shared settings for loco's scripts. Source it; do not run it.
# The virtual environment that carries LibTorch lives outside the repository so
# that a fresh clone (CI's, for one) reuses it instead of downloading 3 GB again.
LOCO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCO_VENV="${LOCO_VENV:-$HOME/.cache/loco-venv}"
LOCO_BUILD="${LOCO_BUILD:-$LOCO_ROOT/build}"
LOCO_TORCH_VERSION="2.11.0"
# ccache keys on paths relative to the checkout, so clones and worktrees share hits.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$LOCO_ROOT}"
# Without this ccache hashes the build folder into every key when compiling with -g, and no two
# checkouts ever share a hit.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
export LOCO_ROOT LOCO_VENV LOCO_BUILD LOCO_TORCH_VERSION
