#!/usr/bin/env bash
# Side-by-side load benchmark, one command: `benches/load.sh`
#
# Starts on loopback, in one run: a fast backend (examples/upstream.rs, JSON + Service-Credits),
# bare Pingora with no auth (examples/passthrough.rs, the ceiling), svcgate's authentication
# alone (examples/auth_only.rs), and `svcgate serve` with the Redis store and the full policy
# (auth, scope, rate limit, budget, spend, audit). Drives each with wrk at a fixed concurrency,
# alternating the targets round by round, and prints requests/s, latency percentiles, added p99
# latency versus the backend alone, CPU time per request (the target's own, the backend's, the
# whole machine's), throughput ratios, Redis commands and Redis CPU time per request (from INFO
# commandstats and INFO cpu deltas) and svcgate's resident memory. Then it drives the backend, bare
# Pingora and svcgate at constant rates (examples/loadgen.rs: half and a quarter of svcgate's
# maximum) and prints the latency each adds, and the time svcgate and bare Pingora each take
# before a request goes to the backend, by their own clocks. Between the two, it measures the
# throughput ratio again in paired blocks (bare Pingora and svcgate back to back, ABBA), which
# the machine's drift moves far less than the rounds.
#
# Finally, it seeds KEYS keys (100,000) and drives svcgate with all of them, round robin, so
# every one is in its key cache, and reports its resident memory then.
#
# Knobs (environment): DURATION (s per run, 10), CONNS (32), ROUNDS (3), KEYS (100000), REDIS_URL
# (by default a redis-server of the run's own, so the command counts are svcgate's alone),
# PHASES (which parts to run: "saturation paired half many", all by default; "half" needs
# "saturation"), PAIRS and SLICE (the paired throughput blocks: 8, of 4 runs of 3 s),
# FRACTIONS (of svcgate's maximum throughput, for the constant-rate runs: "0.5 0.25"), THREADS
# (worker threads of every proxy: 0, one per CPU, by default), PIN (set: every proxy runs on
# CPU 1 alone, with one worker thread unless THREADS says otherwise, and everything else, the
# backend, Redis, wrk and the generator, on CPU 0, as a sidecar with a core of its own; unset:
# every process anywhere), QUIET (set: the machine's DAMON memory reclaim paused for the run, if
# it has one running), WRK_THREADS (2; 1 with PIN), PGO (set: the three proxies measured are
# profile-guided builds, made with one profile by benches/pgo.sh first; a directory: the ones
# benches/pgo.sh made before, in the directory it printed; unset: the usual release build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install  # cmake for the build, redis-server for the store

DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-100000}
PHASES=${PHASES:-saturation paired half many}
FRACTIONS=${FRACTIONS:-0.5 0.25}
PIN=${PIN:-}
THREADS=${THREADS:-$([ -n "$PIN" ] && echo 1 || echo 0)}  # worker threads of each proxy; 0: one per CPU
WRK_THREADS=${WRK_THREADS:-$([ -n "$PIN" ] && echo 1 || echo 2)}
export THREADS
phase() { [[ " $PHASES " == *" $1 "* ]]; }
NS="loadbench-$$"
UPSTREAM=127.0.0.1:19000 PASS=127.0.0.1:18090 AUTH=127.0.0.1:18091
PASS_TIMED=127.0.0.1:18092 PASS_METRICS=127.0.0.1:19092
GW=127.0.0.1:18080 ADMIN=127.0.0.1:18081 METRICS=127.0.0.1:19091
TOKEN=load-bench-admin

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
command -v wrk >/dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq wrk; }
cargo build --release --quiet --bin svcgate --example upstream --example passthrough --example auth_only --example loadgen --example seed_keys
rel=${CARGO_TARGET_DIR:-target}/release  # where cargo put the binaries
measured=$rel  # where the three proxies measured come from
if [ -d "${PGO:-}" ]; then
  measured=$(realpath "$PGO")
elif [ -n "${PGO:-}" ]; then
  measured=$(bash benches/pgo.sh | tail -1)
fi
[ -z "${PGO:-}" ] || echo "PGO: svcgate, bare Pingora and auth alone from $measured" >&2

. benches/common.sh
proxy=()  # the command the proxies start under
if [ -n "$PIN" ]; then
  [ "$(nproc)" -ge 2 ] || { echo "PIN needs two CPUs" >&2; exit 1; }
  taskset -pc 0 $$ >/dev/null  # this script and all it starts from here on (Redis too), but the proxies
  proxy=(taskset -c 1)
fi
# QUIET: DAMON's proactive reclaim (kdamond, on this machine kind a physical-memory monitor
# sampling every 0.5 s) takes a core for about 1.4 ms at each sample, which every process on the
# request path feels: paused for the run, and put back as it was at its end.
damon=/sys/kernel/mm/damon/admin/kdamonds/0/state
if [ -n "${QUIET:-}" ] && [ -w "$damon" ] && [ "$(cat "$damon")" = on ]; then
  echo off > "$damon"
  restore+=("echo on > $damon")
  echo "QUIET: DAMON reclaim paused for the run" >&2
fi
bench_redis
redis_cli() { redis-cli -u "$REDIS_URL" "$@"; }
redis_cli ping >/dev/null

"$rel"/examples/upstream "$UPSTREAM" & up_pid=$!; pids+=($up_pid)
"${proxy[@]}" "$measured"/examples/passthrough "$PASS" "$UPSTREAM" 2>/dev/null & pass_pid=$!; pids+=($pass_pid)
# Bare Pingora timing its own time before forwarding, as svcgate does: the constant-rate runs'.
"${proxy[@]}" "$measured"/examples/passthrough "$PASS_TIMED" "$UPSTREAM" "$PASS_METRICS" 2>/dev/null & pass_timed_pid=$!
pids+=($pass_timed_pid)
SVCGATE_SERVER_THREADS="$THREADS" bench_svcgate "$GW" "$ADMIN" "$METRICS" "$work/spool" \
  "${proxy[@]}" "$measured"/svcgate serve 2>"$work/svcgate.log"
gw_pid=$!
pids+=($gw_pid)

wait_http "http://$ADMIN/healthz"
ws=$(bench_workspace "$ADMIN" "$TOKEN")
key=$(bench_key "$ADMIN" "$TOKEN" "$ws")
"${proxy[@]}" "$measured"/examples/auth_only "$AUTH" "$UPSTREAM" "$REDIS_URL" "$NS" 2>/dev/null & auth_pid=$!; pids+=($auth_pid)
sleep 1

cat > "$work/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"load-1","messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
done = function(summary, latency, requests)
io.write(string.format("P999 %.3f\n", latency:percentile(99.9) / 1000))
end
LUA

ms() { # wrk latency like 512.00us / 1.20ms / 1.01s → milliseconds
  awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}
commands() { redis_cli info commandstats | awk -F'calls=' '/calls=/ { split($2, a, ","); s += a[1] } END { print s + 0 }'; }
# CPU time (user + system) Redis has used, in µs: on a sidecar's node it shares the cores.
redis_cpu() { redis_cli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.0f", s * 1e6 }'; }

# CPU time (user + system) a process has used, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# CPU time the whole machine has used (all cores, user to steal, not idle or iowait), in ticks.
machine_ticks() { awk 'NR == 1 { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
tick=$(getconf CLK_TCK)

declare -A RPS P50 P99 P999 REQS CMDS REDIS_CPU CPU BACKEND MACHINE
run() { # name url
  local out
  [ "$1" = svcgate ] && local before=$(commands) redis_before=$(redis_cpu)
  local cpu0 up0 m0; cpu0=$(cpu_ticks "${PID[$1]}"); up0=$(cpu_ticks "$up_pid"); m0=$(machine_ticks)
  out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DURATION}s" --latency -s "$work/post.lua" "$2")
  local cpu1 up1 m1; cpu1=$(cpu_ticks "${PID[$1]}"); up1=$(cpu_ticks "$up_pid"); m1=$(machine_ticks)
  local n; n=$(awk '/requests in/ { print $1 }' <<<"$out")
  per_request() { awk -v t="$1" -v hz="$tick" -v n="$n" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }'; }
  CPU[$1]+="$(per_request $((cpu1 - cpu0))) "
  BACKEND[$1]+="$(per_request $((up1 - up0))) "
  MACHINE[$1]+="$(per_request $((m1 - m0))) "
  if [ "$1" = svcgate ]; then
    sleep 0.5; CMDS[$1]+="$(( $(commands) - before )) "; REDIS_CPU[$1]+="$(( $(redis_cpu) - redis_before )) "
  fi
  RPS[$1]+="$(awk '/Requests\/sec/ { print $2 }' <<<"$out") "
  P50[$1]+="$(ms "$(awk '$1 == "50%" { print $2 }' <<<"$out")") "
  P99[$1]+="$(ms "$(awk '$1 == "99%" { print $2 }' <<<"$out")") "
  P999[$1]+="$(awk '$1 == "P999" { print $2 }' <<<"$out") "
  REQS[$1]+="$(awk '/requests in/ { print $1 }' <<<"$out") "
}
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
# The median over rounds of a / b, each round's runs paired (they ran minutes apart at most).
paired_ratio() {
  paste <(tr ' ' '\n' <<<"$1" | grep -v '^$') <(tr ' ' '\n' <<<"$2" | grep -v '^$') |
    awk '{ print 100 * $1 / $2 }' | sort -g | awk '{ a[NR] = $1 } END { printf "%.0f", a[int((NR + 1) / 2)] }'
}

targets=(direct passthrough auth_only svcgate)
declare -A PID=([direct]=$up_pid [passthrough]=$pass_pid [auth_only]=$auth_pid [svcgate]=$gw_pid)
declare -A URL=([direct]="http://$UPSTREAM/v1/chat/completions" [passthrough]="http://$PASS/v1/chat/completions"
                [auth_only]="http://$AUTH/v1/chat/completions" [svcgate]="http://$GW/v1/chat/completions")
if phase saturation; then
  for t in "${targets[@]}"; do wrk -t"$WRK_THREADS" -c"$CONNS" -d2s -s "$work/post.lua" "${URL[$t]}" >/dev/null; done
  for round in $(seq 1 "$ROUNDS"); do
    # Rotate the order every round, so no target always runs first or last.
    n=${#targets[@]}
    for i in $(seq 0 $((n - 1))); do
      t=${targets[$(( (i + round) % n ))]}
      run "$t" "${URL[$t]}"
    done
    echo "round $round done" >&2
  done

  rss_mb=$(awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$gw_pid/status")
  total_reqs=0; for r in ${REQS[svcgate]}; do total_reqs=$((total_reqs + r)); done
  total_cmds=0; for c in ${CMDS[svcgate]}; do total_cmds=$((total_cmds + c)); done
  total_redis_cpu=0; for c in ${REDIS_CPU[svcgate]}; do total_redis_cpu=$((total_redis_cpu + c)); done
  direct_p99=$(median "${P99[direct]}")
  printf '\n%s on %s cores, %s connections, %s rounds of %ss (medians)\n' "$(uname -m)" "$(nproc --all)" "$CONNS" "$ROUNDS" "$DURATION"
  printf '%-12s %12s %10s %10s %10s %14s %12s %12s %12s\n' target 'requests/s' 'p50 ms' 'p99 ms' 'p999 ms' \
    'added p99 ms' 'CPU us/req' 'backend us' 'machine us'
  for t in "${targets[@]}"; do
    p99=$(median "${P99[$t]}")
    printf '%-12s %12s %10s %10s %10s %14s %12s %12s %12s\n' "$t" "$(median "${RPS[$t]}")" "$(median "${P50[$t]}")" "$p99" \
      "$(median "${P999[$t]}")" "$(awk -v a="$p99" -v b="$direct_p99" 'BEGIN { printf "%.3f", a - b }')" \
      "$(median "${CPU[$t]}")" "$(median "${BACKEND[$t]}")" "$(median "${MACHINE[$t]}")"
  done
  echo "svcgate / bare Pingora, requests/s per round: $(paste -d/ <(tr ' ' '\n' <<<"${RPS[svcgate]}") <(tr ' ' '\n' <<<"${RPS[passthrough]}") | grep -v '^/$' | tr '\n' ' ')"
  printf '\nsvcgate / bare Pingora: %s%% (median of the rounds'"'"' ratios)   svcgate / auth alone: %s%%\n' \
    "$(paired_ratio "${RPS[svcgate]}" "${RPS[passthrough]}")" "$(paired_ratio "${RPS[svcgate]}" "${RPS[auth_only]}")"
  awk -v s="$(median "${CPU[svcgate]}")" -v p="$(median "${CPU[passthrough]}")" \
    -v ms="$(median "${MACHINE[svcgate]}")" -v mp="$(median "${MACHINE[passthrough]}")" \
    'BEGIN { printf "CPU time per request, svcgate / bare Pingora: %.0f%% (its own), %.0f%% (the whole machine)\n", 100 * s / p, 100 * ms / mp }'
  awk -v c="$total_cmds" -v r="$total_reqs" 'BEGIN { printf "Redis commands per request (svcgate): %.4f\n", c / r }'
  awk -v c="$total_redis_cpu" -v r="$total_reqs" 'BEGIN { printf "Redis CPU time per request (svcgate): %.2f us\n", c / r }'
  echo "svcgate resident memory: ${rss_mb} MB"
fi

if phase paired; then
  # The throughput ratio measured in pairs, to cancel the machine's drift: PAIRS blocks, each
  # bare Pingora, svcgate, svcgate, bare Pingora (or the other way round, every other block) for
  # SLICE seconds each, back to back. A block's ratio is svcgate's requests over bare Pingora's
  # in it: a speed that changes steadily over the block weighs on both alike. The rounds above
  # run each target once in a round of four, 10 to 30 s apart, and this machine's speed moves
  # by a quarter in that time.
  PAIRS=${PAIRS:-8}
  SLICE=${SLICE:-3}
  for t in passthrough svcgate; do wrk -t"$WRK_THREADS" -c"$CONNS" -d2s -s "$work/post.lua" "${URL[$t]}" >/dev/null; done
  rate() { wrk -t"$WRK_THREADS" -c"$CONNS" -d"${SLICE}s" -s "$work/post.lua" "$1" | awk '/Requests\/sec/ { print $2 }'; }
  blocks=""; all_s=0; all_p=0
  for block in $(seq 1 "$PAIRS"); do
    order="passthrough svcgate svcgate passthrough"
    (( block % 2 )) || order="svcgate passthrough passthrough svcgate"
    s=0; p=0
    for t in $order; do
      r=$(rate "${URL[$t]}")
      if [ "$t" = svcgate ]; then s=$(awk -v a="$s" -v b="${r:-0}" 'BEGIN { print a + b }')
      else p=$(awk -v a="$p" -v b="${r:-0}" 'BEGIN { print a + b }'); fi
    done
    blocks+="$(awk -v s="$s" -v p="$p" 'BEGIN { printf "%.1f", (p > 0 ? 100 * s / p : 0) }') "
    all_s=$(awk -v a="$all_s" -v b="$s" 'BEGIN { print a + b }')
    all_p=$(awk -v a="$all_p" -v b="$p" 'BEGIN { print a + b }')
  done
  printf '\nsvcgate / bare Pingora in %s paired blocks of 4 x %ss, per block (%%): %s\n' "$PAIRS" "$SLICE" "$blocks"
  printf 'svcgate / bare Pingora, paired: median %s%%, all blocks together %s%%, blocks at 85%% or more: %s of %s\n' \
    "$(tr ' ' '\n' <<<"$blocks" | grep -v '^$' | sort -g |
       awk '{ a[NR] = $1 } END { printf "%.1f", (a[int((NR + 1) / 2)] + a[int(NR / 2) + 1]) / 2 }')" \
    "$(awk -v s="$all_s" -v p="$all_p" 'BEGIN { printf "%.1f", (p > 0 ? 100 * s / p : 0) }')" \
    "$(tr ' ' '\n' <<<"$blocks" | awk '$1 >= 85' | wc -l)" "$PAIRS"
fi

if phase half && phase saturation; then
  # Latency at a constant rate (examples/loadgen.rs), at FRACTIONS of svcgate's maximum
  # throughput (half and a quarter): the load a gateway is
  # provisioned for, where the added latency is what callers feel. "busy" is how much of the
  # machine's two cores (with PIN: CPU 1, the proxies') was in use during the runs: a constant rate costs more CPU per request
  # than saturation (fewer requests per wakeup), so half of the maximum rate is not half of the
  # machine. "CPU us/req" is the target process's own CPU time (user and system) per request,
  # to set beside its figure at saturation.
  max=$(median "${RPS[svcgate]}")
  # /proc/stat's line for the whole machine, or with PIN for the proxies' core alone.
  cpu_line() { if [ -n "$PIN" ]; then grep '^cpu1 ' /proc/stat; else head -1 /proc/stat; fi; }
  busy() { # the share of CPU time not idle between two /proc/stat "cpu" lines (user to steal)
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x); split(b, y)
      for (i = 2; i <= 9; i++) { d = y[i] - x[i]; t += d; if (i == 5 || i == 6) idle += d }
      printf "%.0f", 100 * (t - idle) / t }'
  }
  # The proxies' own count of their time before forwarding (svcgate_gateway_overhead_seconds,
  # and bare Pingora's, timed the same way, passthrough_overhead_seconds, from an instance of
  # its own that times requests, used in these runs): the histogram's buckets, and the bound
  # of the first bucket holding the 99th percentile of what one run added to them.
  PID[passthrough]=$pass_timed_pid
  URL[passthrough]="http://$PASS_TIMED/v1/chat/completions"
  declare -A OWN_AT=([svcgate]="$METRICS svcgate_gateway_overhead_seconds"
                     [passthrough]="$PASS_METRICS passthrough_overhead_seconds")
  overhead_buckets() { # target
    local at metric; read -r at metric <<<"${OWN_AT[$1]}"
    curl -sf "http://$at/metrics" | awk -v m="^${metric}_bucket" '$0 ~ m {
      match($0, /le="[^"]+"/); print substr($0, RSTART + 4, RLENGTH - 5), $2 }'
  }
  overhead_p99() { # before after
    python3 - "$1" "$2" <<'PY'
import sys
read = lambda f: [(float(le), float(n)) for le, n in (l.split() for l in open(f))]
delta = [(le, b - a) for (le, b), (_, a) in zip(read(sys.argv[2]), read(sys.argv[1]))]
total = delta[-1][1] if delta else 0
print(next(f"{le * 1000:g}" for le, n in delta if n >= 0.99 * total) if total else "-")
PY
  }
  for fraction in $FRACTIONS; do
    rate=$(awk -v r="$max" -v f="$fraction" 'BEGIN { printf "%d", r * f }')
    declare -A HP50=() HP99=() HP999=() HBUSY=() HCPU=() HOWN=()
    for round in $(seq 1 "$ROUNDS"); do
      for t in direct passthrough svcgate; do
        # A scrape that fails leaves the round's figure "-", not the benchmark stopped.
        [ "$t" != direct ] && { overhead_buckets "$t" > "$work/overhead.0" || : > "$work/overhead.0"; }
        s0=$(cpu_line); c0=$(cpu_ticks "${PID[$t]}")
        out=$("$rel"/examples/loadgen "${URL[$t]}" "$rate" "$DURATION" "$CONNS" "$key")
        s1=$(cpu_line); c1=$(cpu_ticks "${PID[$t]}")
        if [ "$t" != direct ]; then
          overhead_buckets "$t" > "$work/overhead.1" || : > "$work/overhead.1"
          HOWN[$t]+="$(overhead_p99 "$work/overhead.0" "$work/overhead.1") "
        fi
        HBUSY[$t]+="$(busy "$s0" "$s1") "
        HCPU[$t]+="$(awk -v t=$((c1 - c0)) -v hz="$tick" -v n="$(sed -E 's/sent=([0-9]+).*/\1/' <<<"$out")" \
          'BEGIN { printf "%.1f", t / hz * 1e6 / n }') "
        HP50[$t]+="$(sed -E 's/.*p50_ms=([0-9.]+).*/\1/' <<<"$out") "
        HP99[$t]+="$(sed -E 's/.*p99_ms=([0-9.]+).*/\1/' <<<"$out") "
        HP999[$t]+="$(sed -E 's/.*p999_ms=([0-9.]+).*/\1/' <<<"$out") "
      done
    done
    printf '\nat a constant %s requests/s (%s of svcgate'"'"'s maximum), %s connections (medians)\n' "$rate" "$fraction" "$CONNS"
    printf '%-12s %10s %10s %10s %16s %18s %8s %12s\n' target 'p50 ms' 'p99 ms' 'p999 ms' 'added p99 ms' 'over Pingora ms' 'busy %' 'CPU us/req'
    hdirect=$(median "${HP99[direct]}")
    hpass=$(median "${HP99[passthrough]}")
    for t in direct passthrough svcgate; do
      p99=$(median "${HP99[$t]}")
      printf '%-12s %10s %10s %10s %16s %18s %8s %12s\n' "$t" "$(median "${HP50[$t]}")" "$p99" "$(median "${HP999[$t]}")" \
        "$(awk -v a="$p99" -v b="$hdirect" 'BEGIN { printf "%.3f", a - b }')" \
        "$(awk -v a="$p99" -v b="$hpass" 'BEGIN { printf "%.3f", a - b }')" "$(median "${HBUSY[$t]}")" \
        "$(median "${HCPU[$t]}")"
    done
    echo "svcgate p99 per round: ${HP99[svcgate]}; bare Pingora: ${HP99[passthrough]}"
    echo "own time before forwarding, p99 at most, per round (ms): svcgate ${HOWN[svcgate]}; bare Pingora ${HOWN[passthrough]}"
  done
fi

if phase many; then
  # Resident memory with KEYS cached keys. The keys are used in order, round and round, each wrk
  # thread taking every WRK_THREADS-th one from where the previous run stopped, until every key is
  # cached (first uses are cache misses, served from Redis). A run does not start at the cache's
  # size: the key cache's follower, catching up on the seeding's changes, drops keys it cached
  # before their change came, and those must be used again to be cached.
  "$rel"/examples/seed_keys "$REDIS_URL" "$NS" "$ws" "$KEYS" > "$work/keys.txt"
  cat > "$work/many.lua" <<LUA
local keys = {}
for line in io.lines("$work/keys.txt") do keys[#keys + 1] = line end
local threads = 0
function setup(thread) thread:set("id", threads); threads = threads + 1 end
function init(args) i = tonumber(args[1]) + id end
wrk.method = "POST"
wrk.body = '{"model":"load-1","messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
request = function()
  wrk.headers["Authorization"] = "Bearer " .. keys[(i % #keys) + 1]
  i = i + $WRK_THREADS
  return wrk.format()
end
LUA
  cached_keys() { curl -sf "http://$METRICS/metrics" | awk '$1 == "svcgate_key_cache_entries" { print $2 }'; }
  offset=0
  for _ in $(seq 1 30); do
    cached=$(cached_keys); cached=${cached:-0}
    [ "$cached" -ge "$KEYS" ] && break
    wrk -t"$WRK_THREADS" -c"$CONNS" -d5s -s "$work/many.lua" "${URL[svcgate]}" -- "$offset" > "$work/many.txt"
    echo "cached $cached; $(grep -E "requests in|Non-2xx" "$work/many.txt" | tr "\n" " ")" >&2
    # On from where this run stopped, less a tenth: the threads do not send quite as many.
    sent=$(awk '/requests in/ { print $1 }' "$work/many.txt")
    offset=$(( (offset + ${sent:-0} * 9 / 10) % KEYS ))
  done
  sleep 2
  rss_many=$(awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$gw_pid/status")
  echo "with $KEYS keys seeded: $(cached_keys) keys cached, svcgate resident memory ${rss_many} MB (target < 100 MB)"
fi
