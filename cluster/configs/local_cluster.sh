#!/usr/bin/env bash
# A two-node Ray cluster plus a lean MLflow server on this machine, for trying `geosweep submit`.
#
#   cluster/configs/local_cluster.sh start     # head (2 CPUs) + node2 (1 CPU, {"node2": 1}) + MLflow
#   cluster/configs/local_cluster.sh status
#   cluster/configs/local_cluster.sh stop      # stops exactly what `start` started (pid files)
#
# Settings (environment): HOST (127.0.0.1), RAY_PORT (6390), DASHBOARD_PORT (8265),
# MLFLOW_PORT (5055), GEOSWEEP_PY (the venv's python; default: $VIRTUAL_ENV, then the
# checkout's .venv, then PATH; ray is taken from the same folder), CLIENT_PORT (10001),
# HEAD_AGENT_PORT/NODE2_AGENT_PORT (52365/52366; ports must stay outside Ray's worker range
# 10002-19999), HEAD_CPUS (2), NODE2_CPUS (1), NODE2_IP (only when HOST is not loopback; default
# HOST), STATE (~/.geosweep-local: logs, pid files, the MLflow store, sweep results).
# On HOST=127.0.0.1 (the default) every server of both Ray nodes, the dashboard/Jobs API and
# MLflow listen on 127.0.0.1 only (docs/cluster.md, "What listens where"): the head with
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, node2 through cluster/ray_loopback.py (plain `ray start`
# moves a joining node to the routable IP). Another HOST exposes the Ray dashboard/Jobs API and
# MLflow to the network, and this script warns. Ray token auth stays on (Ray 2.60's default):
# `ray start` keeps the token in ~/.ray/auth_token, where `geosweep submit` finds it; the token
# is never printed.
# Each service runs in its own process group (setsid); `stop` signals those groups only, so
# other Ray clusters on this machine (e.g. other users' ray.init()) are left alone.
set -euo pipefail

HOST="${HOST:-127.0.0.1}"
RAY_PORT="${RAY_PORT:-6390}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
MLFLOW_PORT="${MLFLOW_PORT:-5055}"
HEAD_CPUS="${HEAD_CPUS:-2}"
NODE2_CPUS="${NODE2_CPUS:-1}"
CLIENT_PORT="${CLIENT_PORT:-10001}"
HEAD_AGENT_PORT="${HEAD_AGENT_PORT:-52365}"
NODE2_AGENT_PORT="${NODE2_AGENT_PORT:-52366}"
STATE="${STATE:-$HOME/.geosweep-local}"
LOOPBACK_VAR=RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
unset "$LOOPBACK_VAR"  # set per node below: loopback only, or Ray's default
if [ "$HOST" = "127.0.0.1" ] || [ "$HOST" = "localhost" ]; then
  HOST=127.0.0.1
  NODE2_IP=127.0.0.1
else
  NODE2_IP="${NODE2_IP:-$HOST}"
fi
export RAY_USAGE_STATS_ENABLED=0
# Ray gives the head's dashboard 60 s to come up, which a loaded machine can miss (its imports
# alone took longer on 2 busy cores)
export RAY_DASHBOARD_STARTUP_TIMEOUT_S="${RAY_DASHBOARD_STARTUP_TIMEOUT_S:-300}"
# Token auth for head AND node2 (a joining `ray start` does not default to it); the token is
# ~/.ray/auth_token, created by the head's `ray start` if missing.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
log() { echo "[local_cluster] $*"; }

# The venv's python and ray, never whatever is first on PATH: the head runs the job's
# entrypoint with the interpreter of the `ray` that started it, so both must be geosweep's.
# Order: $GEOSWEEP_PY (a python), $VIRTUAL_ENV, the checkout's .venv (two levels up from
# this script), then python3/ray on PATH. $PYTHON / $RAY still override each one.
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
resolve_bin() {  # resolve_bin NAME: the venv's NAME, else NAME on PATH, else nothing
  local d
  for d in "${GEOSWEEP_PY:+$(dirname "$GEOSWEEP_PY")}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin}" \
           "$SCRIPT_DIR/../../.venv/bin"; do
    if [ -n "$d" ] && [ -x "$d/$1" ]; then echo "$d/$1"; return 0; fi
  done
  command -v "$1" 2>/dev/null || true
}
PY="${PYTHON:-${GEOSWEEP_PY:-$(resolve_bin python)}}"
RAY="${RAY:-$(resolve_bin ray)}"

wait_for() {  # wait_for SECONDS NAME COMMAND...: until COMMAND succeeds or a service dies
  local t="$1" name="$2" pidf dead; shift 2
  for _ in $(seq "$t"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    for pidf in "$STATE"/*.pid; do  # any started service (the head dies with its children)
      [ -f "$pidf" ] || continue
      if ! kill -0 "$(cat "$pidf")" 2>/dev/null; then
        dead="$(basename "$pidf" .pid)"
        log "error: $dead exited; last lines of $STATE/$dead.log:"; tail -n 5 "$STATE/$dead.log"
        stop; exit 1
      fi
    done
    sleep 1
  done
  log "error: $name not up after ${t}s (log: $STATE/$name.log)"; stop; exit 1
}

start_node() {  # start_node NAME COMMAND...: a Ray node, up when its log says so
  # Ray gives a new node 30 s (not configurable) to register with the GCS; a loaded machine
  # can miss that ("timed out during startup"): such a start is retried, twice at most.
  local name="$1" attempt; shift
  for attempt in 1 2 3; do
    launch "$name" "$@"
    for _ in $(seq 120); do
      if grep -q "Ray runtime started" "$STATE/$name.log"; then return 0; fi
      kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null || break
      sleep 1
    done
    if [ "$attempt" -lt 3 ] && grep -q "timed out during startup" "$STATE/$name.log"; then
      log "$name: Ray's node registration timed out (a loaded machine?); retrying"
      stop_one "$name"
      continue
    fi
    break
  done
  log "error: $name did not start; last lines of $STATE/$name.log:"; tail -n 5 "$STATE/$name.log"
  stop; exit 1
}

launch() {  # launch NAME COMMAND...: own process group, pid file, log file
  local name="$1"; shift
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo $! >"$STATE/$name.pid"
}

start() {
  if [ -z "$PY" ] || [ -z "$RAY" ]; then
    log "error: no python/ray found: activate geosweep's venv, or set GEOSWEEP_PY=/path/to/venv/bin/python"
    exit 2
  fi
  mkdir -p "$STATE/mlflow" "$STATE/runs"
  for s in head node2 mlflow; do
    if [ -f "$STATE/$s.pid" ] && kill -0 "$(cat "$STATE/$s.pid")" 2>/dev/null; then
      log "error: already running ($s, pid $(cat "$STATE/$s.pid")); run: $0 stop"; exit 1
    fi
  done
  if [ "$HOST" != "127.0.0.1" ]; then
    log "warning: binding $HOST: the Ray dashboard/Jobs API (port $DASHBOARD_PORT) runs any code"
    log "warning: it is sent, and MLflow (port $MLFLOW_PORT) serves all results; protect both"
    log "warning: (firewall, VPN or SSH tunnel) and keep Ray token auth on."
  fi
  # Each node its own temp dir (short paths: Ray's unix sockets live there). A shared one
  # made node2 delete the job's working directory on the head when it set up its own session:
  # the job then failed with FileNotFoundError after all trials finished.
  local tmp tmp2
  tmp="$(mktemp -d /tmp/gslocal-XXXXXX)"
  tmp2="$(mktemp -d /tmp/gslocal2-XXXXXX)"
  printf '%s\n%s\n' "$tmp" "$tmp2" >"$STATE/ray_tmp"
  log "using $RAY and $PY"
  # the job's entrypoint (`python -m orchestrator.cli run ...`) is resolved on the raylet's PATH
  PATH="$(dirname "$PY"):$PATH"; export PATH
  # On loopback: the head with Ray's own switch (it also makes `ray start` refuse to join a
  # head), node2 through our launcher of Ray's CLI that keeps 127.0.0.1 as given.
  # Elsewhere Ray's Linux default ("1": node IP as given, servers on all interfaces).
  local loopback=1 node2_ray=("$RAY")
  if [ "$HOST" = "127.0.0.1" ]; then
    loopback=0
    node2_ray=("$PY" "$SCRIPT_DIR/../ray_loopback.py")
  fi
  log "starting the Ray head ($HEAD_CPUS CPUs; ~10-30 s)..."
  start_node head env "$LOOPBACK_VAR=$loopback" "$RAY" start --block --head --port="$RAY_PORT" \
    --num-cpus="$HEAD_CPUS" \
    --node-ip-address="$HOST" --dashboard-host="$HOST" --dashboard-port="$DASHBOARD_PORT" \
    --dashboard-agent-listen-port="$HEAD_AGENT_PORT" --ray-client-server-port="$CLIENT_PORT" \
    --temp-dir="$tmp" --disable-usage-stats
  # one at a time: Ray gives a raylet 30 s to register, which a loaded machine that is also
  # importing MLflow can miss
  log "head up (${SECONDS}s); starting node2 ($NODE2_CPUS CPU, resource node2)..."
  start_node node2 env "$LOOPBACK_VAR=1" "${node2_ray[@]}" start --block \
    --address="$HOST:$RAY_PORT" --num-cpus="$NODE2_CPUS" \
    --resources='{"node2": 1}' --node-ip-address="$NODE2_IP" \
    --dashboard-agent-listen-port="$NODE2_AGENT_PORT" --temp-dir="$tmp2" --disable-usage-stats
  log "node2 up (${SECONDS}s); starting the MLflow server..."
  launch mlflow env MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false "$PY" -m mlflow server \
    --workers 1 --host "$HOST" --port "$MLFLOW_PORT" \
    --backend-store-uri "sqlite:///$STATE/mlflow/mlflow.db" \
    --artifacts-destination "$STATE/mlflow/artifacts"
  wait_for 120 mlflow "$PY" -c \
    "import urllib.request; urllib.request.urlopen('http://$HOST:$MLFLOW_PORT/health', timeout=2)"
  log "all up in ${SECONDS}s"
  log "Ray dashboard / Jobs API: http://$HOST:$DASHBOARD_PORT (token: ~/.ray/auth_token)"
  log "MLflow server:            http://$HOST:$MLFLOW_PORT"
  log "try:  geosweep submit quickstart --address http://$HOST:$DASHBOARD_PORT \\"
  log "        --mlflow-uri http://$HOST:$MLFLOW_PORT --out $STATE/runs --wait"
  log "stop: $0 stop"
}

stop_one() {  # SIGTERM the leader (Ray shuts down cleanly), then SIGKILL what is left of its group
  local name="$1" pid
  [ -f "$STATE/$name.pid" ] || return 0
  pid="$(cat "$STATE/$name.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 15); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$STATE/$name.pid"
  log "stopped $name"
}

stop() {
  stop_one node2
  stop_one head
  stop_one mlflow
  if [ -f "$STATE/ray_tmp" ]; then
    while IFS= read -r d; do [ -n "$d" ] && rm -rf "$d"; done <"$STATE/ray_tmp"
    rm -f "$STATE/ray_tmp"
  fi
}

status() {
  for s in head node2 mlflow; do
    if [ -f "$STATE/$s.pid" ] && kill -0 "$(cat "$STATE/$s.pid")" 2>/dev/null; then
      log "$s: running (pid $(cat "$STATE/$s.pid"))"
    else
      log "$s: not running"
    fi
  done
}

case "${1:-}" in
  start) SECONDS=0; start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
