# Shared by the benchmark scripts (sourced, not run). Expects NS (the Redis key namespace of
# this run) to be set; provides a work directory, process cleanup, a Redis of the run's own if
# REDIS_URL is not set, svcgate started as every benchmark runs it, and the benchmark's workspace
# and key.

work=$(mktemp -d)
pids=()
restore=()  # commands that put back what a run changed on the machine, run at its end

redis_pid=

# Stops the started processes, drops this run's keys from Redis (or stops the run's own
# redis-server) and the work directory (kept, and named, when KEEP is set).
bench_cleanup() {
  for r in "${restore[@]}"; do eval "$r" || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  if [ -n "$redis_pid" ]; then
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  else
    for pattern in "$NS:*" "{$NS}*"; do
      redis-cli -u "$REDIS_URL" --scan --pattern "$pattern" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null
    done
  fi
  if [ -n "${KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap bench_cleanup EXIT

# Unless REDIS_URL is set, starts a redis-server of this run's own on a free port and points
# REDIS_URL at it: INFO commandstats counts every client's commands, so on a shared server the
# benchmark would count other work's too.
bench_redis() {
  [ -n "${REDIS_URL:-}" ] && return
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no >"$work/redis.log" 2>&1 &
  redis_pid=$!
  REDIS_URL="redis://127.0.0.1:$port"
  for _ in $(seq 1 50); do
    redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "redis-server did not start: $(cat "$work/redis.log")" >&2
  exit 1
}

# Waits until URL answers 2xx (a minute at most).
wait_http() {
  for _ in $(seq 1 300); do curl -sf "$1" >/dev/null && return; sleep 0.2; done
  echo "no answer from $1" >&2
  exit 1
}

# bench_workspace ADMIN TOKEN: creates a workspace with a large monthly allowance; prints its id.
bench_workspace() {
  curl -sf -X POST "http://$1/admin/v1/workspaces" -H "Authorization: Bearer $2" \
    -H 'Content-Type: application/json' \
    -d '{"name":"bench","admin_emails":["ops@example.com"],"monthly_credits":1000000000}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'
}

# bench_key ADMIN TOKEN WORKSPACE: creates a live key for chat completions, with a budget (so the
# budget check runs); prints the key.
bench_key() {
  curl -sf -X POST "http://$1/admin/v1/keys" -H "Authorization: Bearer $2" \
    -H 'Content-Type: application/json' \
    -d "{\"workspace\":\"$3\",\"environment\":\"live\",\"scopes\":[\"chat.completions:create\"],\"monthly_budget\":1000000000}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])'
}

# bench_svcgate LISTEN ADMIN METRICS SPOOL_DIR COMMAND...: starts COMMAND (`svcgate serve`, under
# whatever runs it: taskset, valgrind) in the background, set up as every benchmark runs it: the
# Redis store at REDIS_URL under NS, the backend at UPSTREAM, the admin token TOKEN, limits too
# high to refuse anything, logging at warn. Its process id is in $! after the call; a script's
# own settings (worker threads, shutdown grace) go before the call, as the caller's redirections
# go after it.
bench_svcgate() {
  local listen=$1 admin=$2 metrics=$3 spool=$4
  shift 4
  SVCGATE_STORE_KIND=redis SVCGATE_STORE_URL="$REDIS_URL" SVCGATE_STORE_NAMESPACE="$NS" \
  SVCGATE_SERVER_LISTEN="$listen" SVCGATE_SERVER_ADMIN_LISTEN="$admin" \
  SVCGATE_SERVER_METRICS_LISTEN="$metrics" SVCGATE_SERVER_ADMIN_TOKEN="$TOKEN" \
  SVCGATE_UPSTREAM_LIVE="$UPSTREAM" \
  SVCGATE_LIMITS_LIVE_REQUESTS_PER_MINUTE=1000000000 SVCGATE_LIMITS_LIVE_BURST=1000000000 \
  SVCGATE_METERING_SPOOL_DIR="$spool" SVCGATE_LOG_LEVEL=warn \
    "$@" &
}
