# Sourced by launch/cuda/env.sh and launch/rocm/env.sh: appends the platform's XLA flags to XLA_FLAGS.
# The one list of them, one flag per line with why ('#' starts a comment), is
# zaya_jax/planning/gpu_targets/<platform>.xla_flags; the compile-only GPU check (zaya_jax.planning.gpu_target)
# reads the same file.
zaya_export_xla_flags() {  # zaya_export_xla_flags cuda|rocm
  local file line flags=()
  file="$(dirname "${BASH_SOURCE[0]}")/../zaya_jax/planning/gpu_targets/$1.xla_flags"
  if [[ ! -r "$file" ]]; then
    echo "env.sh: $file (the XLA flags) is missing" >&2
    return 1
  fi
  while read -r line; do
    line="${line%%#*}"
    if [[ -n "${line//[[:space:]]/}" ]]; then flags+=("${line%%[[:space:]]*}"); fi
  done <"$file"
  export XLA_FLAGS="${XLA_FLAGS:-} ${flags[*]}"
}
