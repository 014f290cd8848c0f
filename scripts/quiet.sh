# Sourced by scripts/demo.sh: steps that are noise when they work (apt, meson, ninja).
#   run_quietly NAME LOG COMMAND...
# Runs COMMAND with its output in LOG and prints one line. On failure it prints the log's last
# 200 lines and the log's path to stderr and returns COMMAND's status, so `set -e` stops there.
run_quietly() {
  local name=$1 log=$2 rc=0
  shift 2
  mkdir -p "$(dirname "$log")"
  printf '%s ... ' "$name"
  "$@" > "$log" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "done (log: $log)"
    return 0
  fi
  echo "FAILED (exit $rc)"
  {
    echo "--- last 200 lines of $log ---"
    tail -n 200 "$log"
    echo "--- full log: $log ---"
  } >&2
  return "$rc"
}
