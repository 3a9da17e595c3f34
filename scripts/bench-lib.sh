# Shell functions the benchmark scripts share; sourced, not run.

# Waits (up to a minute) for "listening on HOST:PORT" in a server's log and
# prints the port; prints the log and fails when it does not come.
port_of() {
  local log="$1"
  for _ in $(seq 1 600); do
    if grep -q "listening on" "$log" 2>/dev/null; then
      grep -m1 -o "listening on [^ ]*" "$log" | sed 's/.*://'
      return 0
    fi
    sleep 0.1
  done
  echo "no 'listening on' in $log:" >&2
  cat "$log" >&2
  return 1
}
