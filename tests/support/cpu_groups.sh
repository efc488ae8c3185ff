# CPU quotas for hosts of a netns test or bench (sourced; cgroup v1's cpu controller at $CG):
#
#   cpu_group G              makes group G (a path under $CG), weighted 8192 so that the
#                            machine's other work (a nice build, say) cannot hold its processes
#                            below their quota, and remembers it
#   cpu_groups_release       moves what is left in each group back to the root, removes them
#
# Callers set quotas (cpu.cfs_quota_us) and move processes (cgroup.procs) themselves.
GROUPS_MADE=()

cpu_group() {
  mkdir "$1" || return 1
  GROUPS_MADE+=("$1")
  echo 8192 >"$1/cpu.shares"
}

cpu_groups_release() {
  for g in "${GROUPS_MADE[@]:-}"; do
    [ -n "$g" ] || continue
    while read -r p; do echo "$p" >"$CG/cgroup.procs" 2>/dev/null; done <"$g/cgroup.procs"
    rmdir "$g" 2>/dev/null || true
  done
}
