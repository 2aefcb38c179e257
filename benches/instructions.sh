#!/usr/bin/env bash
# Instructions per proxied request, counted, not timed: `benches/instructions.sh`
#
# Wall-clock figures on a shared 2-core machine move by a quarter between minutes; instruction
# counts do not. This runs `svcgate serve` (Redis store, full policy) and bare Pingora
# (examples/passthrough.rs) in turn under callgrind, each sent the same requests (svcgate's key
# included, which bare Pingora passes on), with the backend (examples/upstream.rs) outside
# it, sends WARMUP requests, zeroes the counters, sends REQUESTS more at RATE/s over 8
# connections (examples/loadgen.rs), and prints user-space instructions per request: every
# thread of the process, the background work included (svcgate's store thread writes the
# audit records and flushes spend). Then where svcgate's extra instructions go, by function
# (inclusive cost, summed over threads).
#
# Kernel time is not counted (both proxies make the same system calls per request), and under
# valgrind SHA-256 runs without the CPU's SHA extensions, so the key digest counts ~3,500
# instructions that take ~50 ns natively.
#
# Knobs (environment): REQUESTS (2500), WARMUP (750), RATE (250), REDIS_URL, SVCGATE (a
# `svcgate` binary to count instead of this checkout's build, e.g. a variant built for an
# experiment and copied aside; the examples are built from this checkout either way).
set -euo pipefail
[ -z "${SVCGATE:-}" ] || SVCGATE=$(realpath "$SVCGATE")  # before the cd: relative to the caller
cd "$(dirname "$0")/.."
bash .ci/install  # cmake for the build, redis-server for the store

REQUESTS=${REQUESTS:-2500}
WARMUP=${WARMUP:-750}
RATE=${RATE:-250}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
NS="instrbench-$$"
UPSTREAM=127.0.0.1:19010 PROXY=127.0.0.1:18095 ADMIN=127.0.0.1:18096 METRICS=127.0.0.1:19096
TOKEN=instr-bench-admin

command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
redis-cli -u "$REDIS_URL" ping >/dev/null
cargo build --release --quiet --bin svcgate --example upstream --example passthrough --example loadgen
rel=${CARGO_TARGET_DIR:-target}/release  # where cargo put the binaries
SVCGATE=${SVCGATE:-$rel/svcgate}

. benches/common.sh

"$rel"/examples/upstream "$UPSTREAM" >/dev/null 2>&1 & pids+=($!)

# count NAME URL BEARER: drive the process under callgrind; its per-thread dumps go to $work/NAME.
count() {
  local name=$1 url=$2 bearer=$3
  "$rel"/examples/loadgen "$url" "$RATE" "$(awk -v n="$WARMUP" -v r="$RATE" 'BEGIN { print n / r }')" 8 "$bearer" >/dev/null
  sleep 1
  callgrind_control --zero "$vg_pid" >/dev/null 2>&1
  out=$("$rel"/examples/loadgen "$url" "$RATE" "$(awk -v n="$REQUESTS" -v r="$RATE" 'BEGIN { print n / r }')" 8 "$bearer")
  sleep 0.5
  callgrind_control --dump "$vg_pid" >/dev/null 2>&1
  sleep 1
  kill "$vg_pid"; wait "$vg_pid" 2>/dev/null || true
  grep -q "errors=0" <<<"$out" || { echo "$name: requests failed: $out" >&2; exit 1; }
  mkdir -p "$work/$name"
  mv "$work"/cg."$vg_pid".1-* "$work/$name/"
  for f in "$work/$name"/*; do
    callgrind_annotate --inclusive=yes --threshold=100 "$f" > "$f.txt" 2>/dev/null
  done
}

bench_svcgate "$PROXY" "$ADMIN" "$METRICS" "$work/spool" \
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$work/cg.%p" \
  "$SVCGATE" serve >/dev/null 2>"$work/svcgate.log"
vg_pid=$!; pids+=($vg_pid)
wait_http "http://$ADMIN/healthz"
ws=$(bench_workspace "$ADMIN" "$TOKEN")
key=$(bench_key "$ADMIN" "$TOKEN" "$ws")
count svcgate "http://$PROXY/v1/chat/completions" "$key"

valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$work/cg.%p" \
  "$rel"/examples/passthrough "$PROXY" "$UPSTREAM" >/dev/null 2>"$work/passthrough.log" & vg_pid=$!; pids+=($vg_pid)
sleep 3
# The same request as svcgate gets, key and all (bare Pingora passes it on).
count passthrough "http://$PROXY/v1/chat/completions" "$key"

python3 - "$work" "$REQUESTS" <<'PY'
import collections, glob, re, sys
work, n = sys.argv[1], int(sys.argv[2])
LINE = re.compile(r'\s*([\d,]+)\s+\([\s\d.]+%\)\s+\S.*?:(.+?) \[[^\]]*\]$')

def inclusive(name):
    """Inclusive instructions per request by function, summed over the process's threads."""
    costs = collections.Counter()
    for f in glob.glob(f"{work}/{name}/*.txt"):
        for line in open(f):
            m = LINE.match(line)
            if m and not m.group(2).endswith("x)"):
                costs[re.sub(r'::h[0-9a-f]{16}', '', m.group(2)).strip()] += int(m.group(1).replace(',', '')) / n
    return costs

def thread_total(f):
    for line in open(f):
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    return 0

def total(name):
    return sum(thread_total(f) for f in glob.glob(f"{work}/{name}/cg.*[0-9]")) / n

def store_thread(name):
    """All of the thread that runs the meter: svcgate's store runtime (audit records, spend
    flushes, the key cache's sync, the webhook worker, the Redis watchdog). By thread, not by
    function: what the compiler inlines into the meter's future moves from build to build."""
    for f in glob.glob(f"{work}/{name}/cg.*[0-9]"):
        if "Meter::run" in open(f).read():
            return thread_total(f) / n
    return 0

pingora, svcgate = total("passthrough"), total("svcgate")
print(f"\nuser-space instructions per proxied request ({n} requests at a constant rate, all threads)")
print(f"{'bare Pingora':<14} {pingora:>10,.0f}")
print(f"{'svcgate':<14} {svcgate:>10,.0f}   {100 * svcgate / pingora:.0f}% of bare Pingora, {svcgate - pingora:+,.0f}")
g, p = inclusive("svcgate"), inclusive("passthrough")
# Functions that keep their names whatever the compiler inlines (svcgate's own filters do not:
# their futures are inlined into Pingora's and each other's, so callgrind's inclusive figures for
# them change from build to build).
parts = [
    ("headers: Authorization out; identity, id, RateLimit-* in",
     ["pingora_http::insert_header_value", "svcgate::proxy::headers::edit_request_headers",
      "svcgate::proxy::headers::insert_response_headers"]),
    ("Pingora timer-wheel registrations (timeouts of 5 s or less)",
     ["<pingora_timeout::fast_timeout::FastTimeout as pingora_timeout::ToTimeout>::timeout"]),
    ("key digest, SHA-256 (software under valgrind)", ["sha2::sha256::compress256"]),
]
print("\nwhere svcgate's extra instructions go (inclusive, per request)")
print(f"  {'':<58} {'svcgate':>8} {'Pingora':>8} {'extra':>8}")
accounted = 0
for label, fns in parts:
    a, b = sum(g[f] for f in fns), sum(p[f] for f in fns)
    accounted += a - b
    print(f"  {label:<58} {a:>8,.0f} {b:>8,.0f} {a - b:>+8,.0f}")
store = store_thread("svcgate")
accounted += store
print(f"  {'store thread: audit records, spend, key sync, watchdog':<58} {store:>8,.0f} {0:>8,.0f} {store:>+8,.0f}")
print(f"  {'the rest: auth, policy, body model, metrics, and in Pingora':<58} {'':>8} {'':>8} {svcgate - pingora - accounted:>+8,.0f}")
PY
