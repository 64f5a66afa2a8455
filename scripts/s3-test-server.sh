#!/usr/bin/env bash
# An S3-speaking server (moto in server mode) on loopback, for the tests of S3Store.
#
#   scripts/s3-test-server.sh start DIR    start moto_server on 127.0.0.1 and a free port,
#                                          print ICHOR_TEST_S3_ENDPOINT=http://127.0.0.1:PORT
#   scripts/s3-test-server.sh stop DIR     stop what `start DIR` started (by PID only)
#   scripts/s3-test-server.sh install      install moto only (what `start` does first)
#
# moto is installed once, with pip, into a virtual environment outside the checkout:
# $ICHOR_MOTO_VENV, default ${XDG_CACHE_HOME:-$HOME/.cache}/ichor/moto-venv. Python 3 is
# needed; its venv module is installed with apt-get (python3-venv) when missing.
# State: DIR/pid (the server's PID), DIR/log (its output).
# Progress goes to stderr; stdout of `start` is only the ICHOR_TEST_S3_ENDPOINT= line.
# moto takes any credentials and keeps everything in memory: each start is empty.
set -euo pipefail

VENV="${ICHOR_MOTO_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ichor/moto-venv}"
# Pinned, so that every machine tests against the same server.
MOTO_SPEC="moto[server]==5.2.5"
READY_TIMEOUT=60
STOP_TIMEOUT=10

log() { printf '[s3-test-server] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
    log "apt-get update"
    as_root apt-get update -q >&2
    log "apt-get install -y $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2
}

# ---------------------------------------------------------------- the virtual environment

venv_ready() {
    [ -f "$VENV/.ichor-ready" ] && [ -x "$VENV/bin/moto_server" ] && [ -x "$VENV/bin/python" ]
}

ensure_venv() {
    if venv_ready; then
        log "using moto in $VENV"
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || die "python3 not found"
    log "installing $MOTO_SPEC into $VENV (once)"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    if ! python3 -m venv "$VENV" >&2; then
        # Debian's python3 comes without venv and ensurepip.
        rm -rf "$VENV"
        apt_install python3-venv
        python3 -m venv "$VENV" >&2 || { rm -rf "$VENV"; die "python3 -m venv failed"; }
    fi
    if ! "$VENV/bin/python" -m pip install -q "$MOTO_SPEC" >&2; then
        rm -rf "$VENV"
        die "pip install $MOTO_SPEC failed"
    fi
    [ -x "$VENV/bin/moto_server" ] || { rm -rf "$VENV"; die "no moto_server in $VENV/bin"; }
    touch "$VENV/.ichor-ready"
    log "moto installed: $("$VENV/bin/python" -c 'import moto; print(moto.__version__)')"
}

# ---------------------------------------------------------------- start / stop

abs_dir() { (cd "$1" && pwd -P); }

free_port() { # a free loopback TCP port
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

pid_alive() { # pid: alive, not a zombie, and a moto_server (not a PID reused since)
    local pid=$1 state
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ -d "/proc/$pid" ] || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)"
    [ -n "$state" ] && [ "$state" != Z ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "moto_server" || return 1
}

answers() { # port: the server answers an S3 request (ListBuckets) with 200
    "$VENV/bin/python" - "$1" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
# No proxy: the request must stay on loopback whatever the environment says.
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(f"http://127.0.0.1:{sys.argv[1]}/", timeout=2) as reply:
    sys.exit(0 if reply.status == 200 else 1)
EOF
}

stop_pid() { # dir
    local dir=$1 pid waited
    [ -f "$dir/pid" ] || return 0
    pid="$(cat "$dir/pid")"
    if ! pid_alive "$pid"; then
        log "moto_server (pid $pid) not running"
        rm -f "$dir/pid"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    waited=0
    while pid_alive "$pid" && [ "$waited" -lt $((STOP_TIMEOUT * 10)) ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    if pid_alive "$pid"; then
        log "moto_server (pid $pid) still alive after ${STOP_TIMEOUT}s: KILL"
        kill -KILL "$pid" 2>/dev/null || true
        waited=0
        while pid_alive "$pid" && [ "$waited" -lt 50 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
    else
        log "stopped moto_server (pid $pid)"
    fi
    rm -f "$dir/pid"
}

fail_start() {
    local dir=$1
    shift
    log "error: $*"
    if [ -f "$dir/log" ]; then
        echo "----- tail of $dir/log" >&2
        tail -n 40 "$dir/log" >&2
    fi
    stop_pid "$dir"
    exit 1
}

cmd_start() {
    local dir=${1:?usage: $0 start DIR}
    ensure_venv
    mkdir -p "$dir"
    dir="$(abs_dir "$dir")"
    if [ -f "$dir/pid" ] && pid_alive "$(cat "$dir/pid")"; then
        die "moto_server (pid $(cat "$dir/pid")) from an earlier start is still running: run '$0 stop $dir' first"
    fi
    rm -f "$dir/pid" "$dir/log"

    local port pid t0ns
    t0ns=$(date +%s%N)
    port="$(free_port)"
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" </dev/null >"$dir/log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/pid"
    log "started moto_server (pid $pid, port $port, log $dir/log)"

    local deadline=$((SECONDS + READY_TIMEOUT))
    until answers "$port"; do
        pid_alive "$pid" || fail_start "$dir" "moto_server exited before it answered"
        [ "$SECONDS" -lt "$deadline" ] || fail_start "$dir" "moto_server not answering after ${READY_TIMEOUT}s"
        sleep 0.2
    done
    log "ready in $((($(date +%s%N) - t0ns) / 1000000)) ms"
    echo "ICHOR_TEST_S3_ENDPOINT=http://127.0.0.1:$port"
}

cmd_stop() {
    local dir=${1:?usage: $0 stop DIR}
    [ -d "$dir" ] || { log "$dir does not exist: nothing to stop"; return 0; }
    stop_pid "$(abs_dir "$dir")"
}

usage() {
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

case "${1:-}" in
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
install) ensure_venv ;;
*) usage ;;
esac
