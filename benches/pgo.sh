#!/usr/bin/env bash
# Profile-guided builds of svcgate and of the load benchmark's proxies, one command:
# `benches/pgo.sh`
#
# 1. Builds `svcgate`, bare Pingora (examples/passthrough.rs) and svcgate's authentication alone
#    (examples/auth_only.rs) instrumented (`-Cprofile-generate`), in a target directory of
#    their own.
# 2. Trains them on the load benchmark's request: starts the backend (examples/upstream.rs), a
#    Redis of the run's own, and each instrumented proxy in turn, sends TRAIN_SECONDS of
#    authenticated POSTs through it at a constant rate (examples/loadgen.rs), and stops it with
#    SIGTERM, so it writes its profile as it exits.
# 3. Merges the profiles (`llvm-profdata`, from rustup's `llvm-tools` component, added if
#    missing) and builds the three again with them (`-Cprofile-use`), into `$PGO_DIR/use`.
#
# The three are built with one merged profile: Pingora's code, which all three run, is laid
# out by the same counts in each, so bare Pingora, the ceiling svcgate is measured against,
# gets the same optimization as svcgate. Each build is a whole fat-LTO release build with its
# own flags: the script takes about 20 minutes on two cores. `target/release` is not touched.
#
# Prints the directory of the optimized binaries last. `benches/load.sh` with `PGO=1` runs
# this first and measures those binaries.
#
# Knobs (environment): PGO_DIR (`${CARGO_TARGET_DIR:-target}/pgo`), TRAIN_SECONDS (15), TRAIN_RATE
# (4000 requests/s), ONLY_SVCGATE (set: svcgate alone is built and trained, for a build to
# deploy rather than to measure; not `SVCGATE_…`, which svcgate would take for its own setting).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install  # cmake for the build, redis-server for the training's store

TRAIN_SECONDS=${TRAIN_SECONDS:-15}
TRAIN_RATE=${TRAIN_RATE:-4000}
PGO_DIR=$(realpath -m "${PGO_DIR:-${CARGO_TARGET_DIR:-target}/pgo}")
NS="pgo-$$"
UPSTREAM=127.0.0.1:19030 PROXY=127.0.0.1:18197 ADMIN=127.0.0.1:18198 METRICS=127.0.0.1:19198
TOKEN=pgo-admin
PROXIES=(--bin svcgate)
[ -n "${ONLY_SVCGATE:-}" ] || PROXIES+=(--example passthrough --example auth_only)

profdata=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | awk '/^host:/ { print $2 }')/bin/llvm-profdata
[ -x "$profdata" ] || rustup component add llvm-tools
[ -x "$profdata" ] || { echo "no llvm-profdata at $profdata" >&2; exit 1; }

# The backend and the load generator are not measured: the usual build.
cargo build --release --locked --quiet --example upstream --example loadgen
rel=${CARGO_TARGET_DIR:-target}/release
rm -rf "$PGO_DIR/profiles"
mkdir -p "$PGO_DIR/profiles"
echo "pgo: instrumented build" >&2
RUSTFLAGS="-Cprofile-generate=$PGO_DIR/profiles" \
  cargo build --release --locked --quiet "${PROXIES[@]}" --target-dir "$PGO_DIR/gen"
gen=$PGO_DIR/gen/release

. benches/common.sh
bench_redis
"$rel"/examples/upstream "$UPSTREAM" >/dev/null 2>&1 & pids+=($!)

# drive NAME PID KEY: sends the training requests through the proxy process PID, then stops
# it (SIGTERM: it writes its profile as it exits) and waits for it.
drive() {
  local out
  out=$("$rel"/examples/loadgen "http://$PROXY/v1/chat/completions" "$TRAIN_RATE" "$TRAIN_SECONDS" 32 "$3")
  grep -q "errors=0" <<<"$out" || { echo "pgo: training $1 failed: $out" >&2; exit 1; }
  kill -TERM "$2"
  wait "$2" || true
  echo "pgo: trained $1: $out" >&2
}

# answers URL: waits until URL gives any HTTP answer (a minute at most): bare Pingora passes the
# probe on, auth alone refuses it unauthenticated.
answers() {
  for _ in $(seq 1 300); do curl -s -o /dev/null "$1" && return; sleep 0.2; done
  echo "pgo: no answer from $1" >&2
  exit 1
}

# svcgate first: its admin API makes the workspace and key every proxy is sent.
SVCGATE_SERVER_SHUTDOWN_GRACE_SECONDS=0 bench_svcgate "$PROXY" "$ADMIN" "$METRICS" "$work/spool" \
  "$gen"/svcgate serve 2>"$work/svcgate.log"
pid=$!; pids+=($pid)
wait_http "http://$ADMIN/healthz"
ws=$(bench_workspace "$ADMIN" "$TOKEN")
key=$(bench_key "$ADMIN" "$TOKEN" "$ws")
drive svcgate "$pid" "$key"
if [ -z "${ONLY_SVCGATE:-}" ]; then
  # auth alone reads the key from Redis, where svcgate left it.
  "$gen"/examples/passthrough "$PROXY" "$UPSTREAM" 2>"$work/passthrough.log" & pid=$!; pids+=($pid)
  answers "http://$PROXY/"
  drive passthrough "$pid" "$key"
  "$gen"/examples/auth_only "$PROXY" "$UPSTREAM" "$REDIS_URL" "$NS" 2>"$work/auth_only.log" & pid=$!; pids+=($pid)
  answers "http://$PROXY/"
  drive auth_only "$pid" "$key"
fi

shopt -s nullglob
raw=("$PGO_DIR"/profiles/*.profraw)
binaries=$(( ${#PROXIES[@]} / 2 ))  # PROXIES holds pairs: --bin svcgate, --example …
[ "${#raw[@]}" -ge "$binaries" ] ||
  { echo "pgo: expected a profile from each of $binaries binaries, found ${#raw[@]}" >&2; exit 1; }
"$profdata" merge -o "$PGO_DIR/merged.profdata" "${raw[@]}"
echo "pgo: optimized build" >&2
# From scratch: cargo does not know the profile changed, and would keep what it built with the last.
rm -rf "$PGO_DIR/use"
RUSTFLAGS="-Cprofile-use=$PGO_DIR/merged.profdata" \
  cargo build --release --locked --quiet "${PROXIES[@]}" --target-dir "$PGO_DIR/use"
echo "$PGO_DIR/use/release"
