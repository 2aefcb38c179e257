#!/usr/bin/env bash
# Two builds of svcgate side by side: `benches/ab.sh A B` (paths to two `svcgate` binaries)
#
# For a change to the request path that is too small for `load.sh` to tell from the machine's
# drift. Starts the backend (examples/upstream.rs), bare Pingora (examples/passthrough.rs) and
# both svcgate binaries on one Redis namespace (full policy, one key), then runs ROUNDS rounds of
# bare Pingora, A, B, B, A, bare Pingora (A and B swapped every other round), SLICE seconds each
# with wrk, and prints each target's median requests/s and CPU time per request (the process's
# user + system time over its requests), and B against A per pair of runs: requests/s and CPU
# per request, and their medians. Build the binaries first, e.g. `cargo build --release --bin
# svcgate && cp target/release/svcgate /tmp/svcgate.a`, change, build and copy again.
#
# Run it once with the same binary as A and B to see the machine's noise: on a 2-vCPU machine
# the median of B − A over 16 pairs read −1.3 µs per request, and +2% requests/s.
#
# Knobs (environment): ROUNDS (8), SLICE (s per run, 4), CONNS (32), REDIS_URL (by default a
# redis-server of the run's own), PIN (set: every proxy on CPU 1 with one worker thread, the
# backend, Redis and wrk on CPU 0, as `benches/load.sh` runs them with PIN).
set -euo pipefail
A=$(realpath "${1:?usage: benches/ab.sh A B}"); B=$(realpath "${2:?usage: benches/ab.sh A B}")
cd "$(dirname "$0")/.."
bash .ci/install  # cmake for the build, redis-server for the store

ROUNDS=${ROUNDS:-8}
SLICE=${SLICE:-4}
CONNS=${CONNS:-32}
PIN=${PIN:-}
NS="abbench-$$"
UPSTREAM=127.0.0.1:19020 PASS=127.0.0.1:18190
TOKEN=ab-bench-admin

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
command -v wrk >/dev/null || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq wrk; }
cargo build --release --quiet --example upstream --example passthrough
rel=${CARGO_TARGET_DIR:-target}/release  # where cargo put the binaries

. benches/common.sh
proxy=()  # the command the proxies start under
WRK_THREADS=2
if [ -n "$PIN" ]; then
  [ "$(nproc)" -ge 2 ] || { echo "PIN needs two CPUs" >&2; exit 1; }
  taskset -pc 0 $$ >/dev/null  # this script and all it starts from here on, but the proxies
  proxy=(taskset -c 1)
  export THREADS=1  # examples/passthrough.rs's worker threads
  WRK_THREADS=1
fi
bench_redis

"$rel"/examples/upstream "$UPSTREAM" >/dev/null 2>&1 & pids+=($!)
"${proxy[@]}" "$rel"/examples/passthrough "$PASS" "$UPSTREAM" >/dev/null 2>&1 & pass_pid=$!; pids+=($pass_pid)
# start_gateway BINARY PORT: svcgate on PORT, its admin API on PORT + 1, its metrics on PORT + 2.
start_gateway() {
  SVCGATE_SERVER_THREADS="$([ -n "$PIN" ] && echo 1 || echo 0)" \
    bench_svcgate "127.0.0.1:$2" "127.0.0.1:$(($2 + 1))" "127.0.0.1:$(($2 + 2))" "$work/spool-$2" \
    "${proxy[@]}" "$1" serve 2>"$work/svcgate-$2.log"
}
start_gateway "$A" 18180; a_pid=$!; pids+=($a_pid)
start_gateway "$B" 18184; b_pid=$!; pids+=($b_pid)
wait_http "http://127.0.0.1:18181/healthz"
wait_http "http://127.0.0.1:18185/healthz"
ws=$(bench_workspace 127.0.0.1:18181 "$TOKEN")
key=$(bench_key 127.0.0.1:18181 "$TOKEN" "$ws")

cat > "$work/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"load-1","messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
LUA

declare -A URL=([P]="http://$PASS/v1/chat/completions" [A]="http://127.0.0.1:18180/v1/chat/completions"
                [B]="http://127.0.0.1:18184/v1/chat/completions")
declare -A PID=([P]=$pass_pid [A]=$a_pid [B]=$b_pid)
declare -A NAME=([P]="bare Pingora" [A]="A" [B]="B")
# CPU time (user + system) a process has used, in clock ticks; the fields after its name.
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
tick=$(getconf CLK_TCK)

for t in P A B; do wrk -t"$WRK_THREADS" -c"$CONNS" -d2s -s "$work/post.lua" "${URL[$t]}" >/dev/null; done
declare -A RPS CPU
for round in $(seq 1 "$ROUNDS"); do
  order="P A B B A P"
  (( round % 2 )) || order="P B A A B P"
  for t in $order; do
    c0=$(cpu_ticks "${PID[$t]}")
    out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${SLICE}s" -s "$work/post.lua" "${URL[$t]}")
    c1=$(cpu_ticks "${PID[$t]}")
    n=$(awk '/requests in/ { print $1 }' <<<"$out")
    RPS[$t]+="$(awk '/Requests\/sec/ { print $2 }' <<<"$out") "
    CPU[$t]+="$(awk -v t=$((c1 - c0)) -v hz="$tick" -v n="$n" 'BEGIN { printf "%.1f", (n > 0 ? t / hz * 1e6 / n : 0) }') "
  done
  echo "round $round done" >&2
done

python3 - "${RPS[P]}" "${CPU[P]}" "${RPS[A]}" "${CPU[A]}" "${RPS[B]}" "${CPU[B]}" <<'PY'
import statistics, sys
p_rps, p_cpu, a_rps, a_cpu, b_rps, b_cpu = ([float(x) for x in arg.split()] for arg in sys.argv[1:])
med = statistics.median
print(f"\n{'target':<14}{'requests/s':>12}{'CPU us/req':>12}   (medians)")
for name, rps, cpu in (("bare Pingora", p_rps, p_cpu), ("A", a_rps, a_cpu), ("B", b_rps, b_cpu)):
    print(f"{name:<14}{med(rps):>12.0f}{med(cpu):>12.1f}")
# Runs of A and B in the same round were back to back (ABBA): pair them in order.
ratios = [100 * b / a for a, b in zip(a_rps, b_rps) if a > 0]
deltas = [b - a for a, b in zip(a_cpu, b_cpu)]
print("B / A, requests/s per pair (%):", " ".join(f"{r:.1f}" for r in ratios), f"  median {med(ratios):.1f}%")
print("B - A, CPU us/req per pair:", " ".join(f"{d:+.1f}" for d in deltas), f"  median {med(deltas):+.2f}")
print(f"A / bare Pingora {100 * med(a_rps) / med(p_rps):.0f}%, B / bare Pingora {100 * med(b_rps) / med(p_rps):.0f}%")
PY
