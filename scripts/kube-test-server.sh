#!/usr/bin/env bash
# A real Kubernetes control plane (1.37.2, with etcd 3.7.0) and kwok on loopback, for tests,
# built from the Go module proxy: scripts/kube-server/go.mod requires k8s.io/kubernetes at
# the release and pins each of its staging modules (k8s.io/api, ...) at the matching
# v0.37.2, as any Go program builds its dependencies; `go build` of k8s.io/kubernetes/cmd/...,
# of go.etcd.io/etcd/server/v3 (the etcd binary) and of sigs.k8s.io/kwok/cmd/kwok (v0.8.0,
# built against the same client libraries) then needs nothing else.
#
#   scripts/kube-test-server.sh build        build once, cache the binaries outside the checkout
#                                            (only those missing from the cache are built)
#   scripts/kube-test-server.sh start DIR    start etcd, kube-apiserver, kube-controller-manager,
#                                            kube-scheduler and kwok, print
#                                            ICHOR_TEST_KUBECONFIG=DIR/kubeconfig
#                                            (DIR/kubectl: the machine's kubectl, or one of
#                                            the release built when it has none)
#   scripts/kube-test-server.sh start-apiserver DIR RUNTIME_CONFIG
#                                            only etcd and the API server, serving what
#                                            RUNTIME_CONFIG names (--runtime-config)
#   scripts/kube-test-server.sh stop DIR     stop what `start DIR` started (by PID only)
#   scripts/kube-test-server.sh env DIR      print the ICHOR_TEST_KUBECONFIG= line again
#   scripts/kube-test-server.sh restart-apiserver DIR SECONDS
#                                            stop the API server, keep it down SECONDS, start
#                                            it again; print when it was ready (Unix ms)
#
# What runs: the API server (token auth, RBAC; no TaintNodesByCondition admission, see below;
# resource.k8s.io/v1beta1 served, an API deprecated and removed in 1.38, for the test of a
# removed API still in use);
# the controller-manager's namespace, garbage collector, disruption (PodDisruptionBudget
# status), deployment, replicaset and statefulset controllers; the scheduler, which places
# the pods that name no node; and kwok, the kubelet of every Node labelled ichor.dev/kwok=true
# (the simulated fleet's with --kwok): Ready from the fleet's ichor.dev/kubelet annotation,
# Leases, pods run and deleted, as scripts/kube-server/kwok-stages.yaml says. Nodes without that label are nobody's: the
# tests that create them act as their kubelet. Not the node lifecycle controller: it would
# write the Nodes the tests make by hand (taints) under their reads; so a new Node is not
# given its not-ready taint either (nobody would lift it), and the scheduler avoids a Node
# only when it is cordoned, as the engine does before it drains and reboots one.
#
# Cache: $ICHOR_KUBE_CACHE, default $HOME/.cache/ichor/kube-1.37.2 (the binaries), and the
# Go module cache in $HOME/.cache/ichor/go. Needs Go 1.26 (the machines carry it in
# /usr/local/go) and openssl, curl, python3 (apt, installed when missing).
# Measured on these 2-core machines: go build of the four Kubernetes and etcd binaries 524 s
# (13.7 min of CPU), after `go mod download` (20 s here, about 500 MB into the module cache);
# kwok afterwards 18 s (it shares the client libraries' packages in the build cache).
# Progress goes to stderr; stdout of `start`/`env` is only the ICHOR_TEST_KUBECONFIG= line.
set -euo pipefail

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
CACHE="${ICHOR_KUBE_CACHE:-$HOME/.cache/ichor/kube-${KUBE_VERSION#v}}"
GO_CACHE="${ICHOR_GO_CACHE:-$HOME/.cache/ichor/go}"
MODULE_DIR="$(cd "$(dirname "$0")" && pwd -P)/kube-server"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
# kubectl for the tests that run it as a user does: the machine's when it has one (these
# machines do: building it costs CI minutes), else built into the cache as the rest.
command -v kubectl >/dev/null 2>&1 || BINARIES+=(kubectl)
KWOK_STAGES="$MODULE_DIR/kwok-stages.yaml"
KWOK_LABEL="ichor.dev/kwok=true"
TOKEN="testtoken"
READY_TIMEOUT=90
NAMESPACE_TIMEOUT=60
STOP_TIMEOUT=10

log() { printf '[kube-test-server] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Runtime tools needed by `start` (also when the binaries come from a restored cache).
ensure_runtime_packages() {
    local missing=()
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    if [ "${#missing[@]}" -gt 0 ]; then
        log "apt-get install -y ${missing[*]}"
        as_root apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
    else
        log "openssl and curl already installed"
    fi
}

# ---------------------------------------------------------------- build

cache_ok() { [ -z "$(missing_binaries)" ]; }

# The version the servers report (what Kubernetes' own build stamps in, hack/lib/version.sh).
version_ldflags() {
    local minor=${KUBE_VERSION#v1.}
    minor=${minor%%.*}
    local pkg flags=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    printf '%s' "-s -w$flags"
}

missing_binaries() { # the binaries not in the cache, one per line
    local b
    for b in "${BINARIES[@]}"; do [ -x "$CACHE/$b" ] || echo "$b"; done
}

# The Go package each binary is built from.
package_of() {
    case "$1" in
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    kwok) echo sigs.k8s.io/kwok/cmd/kwok ;;
    *) echo "k8s.io/kubernetes/cmd/$1" ;;
    esac
}

cmd_build() {
    local missing
    mapfile -t missing < <(missing_binaries)
    if [ "${#missing[@]}" -eq 0 ]; then
        log "using cached binaries in $CACHE"
        ensure_runtime_packages
        return 0
    fi
    ensure_runtime_packages
    # The machines carry Go in /usr/local/go; a shell that lacks it in PATH still finds it.
    if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || die "no go in PATH: Go 1.26 builds the servers"
    log "not in $CACHE: ${missing[*]}: building them (Kubernetes $KUBE_VERSION, etcd $ETCD_VERSION, kwok) from the Go module proxy"
    local start_ts=$SECONDS
    mkdir -p "$CACHE" "$GO_CACHE"
    local work
    work="$(mktemp -d "$(dirname "$CACHE")/build-tmp.XXXXXX")"
    # shellcheck disable=SC2064 # expand $work now
    trap "rm -rf '$work'" EXIT
    (
        cd "$MODULE_DIR"
        # The machine's Go, never another toolchain; modules from the proxy into the cache
        # outside the checkout; go.sum checked.
        export GOTOOLCHAIN=local GOPATH="$GO_CACHE" GOFLAGS="-mod=readonly -modcacherw" CGO_ENABLED=0
        log "go: $(command -v go) ($(go version))"
        log "go mod download"
        go mod download >&2
        log "downloaded in $((SECONDS - start_ts)) s; go build (log: $work/build.log)"
        local b kube=()
        for b in "${missing[@]}"; do
            case "$b" in
            kube-* | kubectl) kube+=("$(package_of "$b")") ;;
            *) go build -trimpath -ldflags "-s -w" -o "$work/$b" "$(package_of "$b")" >>"$work/build.log" 2>&1 ;;
            esac
        done
        if [ "${#kube[@]}" -gt 0 ]; then
            go build -trimpath -ldflags "$(version_ldflags)" -o "$work/" "${kube[@]}" >>"$work/build.log" 2>&1
        fi
    ) || { tail -n 60 "$work/build.log" >&2 2>/dev/null || true; die "go build failed"; }
    local b
    for b in "${missing[@]}"; do
        [ -x "$work/$b" ] || die "$b not built"
        mv -f "$work/$b" "$CACHE/.$b.tmp"
        mv -f "$CACHE/.$b.tmp" "$CACHE/$b"
    done
    rm -rf "$work"
    trap - EXIT
    log "built in $((SECONDS - start_ts)) s; cached:"
    ls -l "${BINARIES[@]/#/$CACHE/}" >&2
    "$CACHE/kube-apiserver" --version >&2 || true
    "$CACHE/etcd" --version >&2 || true
    "$CACHE/kwok" --version >&2 || true
}

# ---------------------------------------------------------------- start / stop

abs_dir() { (cd "$1" && pwd -P); }

free_ports() { # prints N distinct free loopback TCP ports, one per line
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
for s in socks:
    s.close()
EOF
}

pid_alive() { # pid, state dir: alive, not a zombie, and really one of ours (cmdline names DIR)
    local pid=$1 dir=$2 state
    [ -d "/proc/$pid" ] || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)"
    [ -n "$state" ] && [ "$state" != Z ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/" || return 1
}

# Starts "$@" in the background, logs to DIR/NAME.log, records "NAME PID" in DIR/pids.
launch() {
    local dir=$1 name=$2
    shift 2
    nohup "$@" </dev/null >"$dir/$name.log" 2>&1 &
    local pid=$!
    echo "$name $pid" >>"$dir/pids"
    log "started $name (pid $pid, log $dir/$name.log)"
}

stop_dir() { # stop every PID in DIR/pids, last started first
    local dir=$1
    [ -f "$dir/pids" ] || return 0
    local lines=() line name pid i waited
    mapfile -t lines <"$dir/pids"
    for ((i = ${#lines[@]} - 1; i >= 0; i--)); do
        line=${lines[$i]}
        name=${line%% *}
        pid=${line##* }
        [[ "$pid" =~ ^[0-9]+$ ]] || continue
        if ! pid_alive "$pid" "$dir"; then
            log "$name (pid $pid) not running"
            continue
        fi
        kill -TERM "$pid" 2>/dev/null || true
        waited=0
        while pid_alive "$pid" "$dir" && [ "$waited" -lt $((STOP_TIMEOUT * 10)) ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        if pid_alive "$pid" "$dir"; then
            log "$name (pid $pid) still alive after ${STOP_TIMEOUT}s: KILL"
            kill -KILL "$pid" 2>/dev/null || true
            waited=0
            while pid_alive "$pid" "$dir" && [ "$waited" -lt 50 ]; do
                sleep 0.1
                waited=$((waited + 1))
            done
        else
            log "stopped $name (pid $pid)"
        fi
    done
    rm -f "$dir/pids"
}

dump_logs() {
    local dir=$1 f
    for f in "$dir"/etcd.log "$dir"/kube-apiserver.log "$dir"/kube-controller-manager.log \
        "$dir"/kube-scheduler.log "$dir"/kwok.log; do
        [ -f "$f" ] || continue
        echo "----- tail of $f" >&2
        tail -n 40 "$f" >&2
    done
}

fail_start() {
    local dir=$1
    shift
    log "error: $*"
    dump_logs "$dir"
    stop_dir "$dir"
    exit 1
}

all_alive() { # dir: every recorded process still running
    local dir=$1 name pid
    while read -r name pid; do
        pid_alive "$pid" "$dir" || { log "$name (pid $pid) exited"; return 1; }
    done <"$dir/pids"
}

write_kubeconfig() { # dir port file
    local dir=$1 port=$2 file=$3
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ichor-test
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $dir/certs/apiserver.crt
users:
- name: ichor-test-admin
  user:
    token: $TOKEN
contexts:
- name: ichor-test
  context:
    cluster: ichor-test
    user: ichor-test-admin
current-context: ichor-test
EOF
}

# The API server and its etcd, started in DIR with the API versions RUNTIME_CONFIG
# names (--runtime-config); DIR/kubeconfig written once it is ready.
start_api_server() {
    local dir=$1 runtime=$2
    cache_ok || die "no binaries in $CACHE: run '$0 build' first"
    command -v openssl >/dev/null 2>&1 || die "openssl not installed: run '$0 build' first"
    command -v curl >/dev/null 2>&1 || die "curl not installed: run '$0 build' first"
    command -v python3 >/dev/null 2>&1 || die "python3 not found"

    mkdir -p "$dir"
    dir="$(abs_dir "$dir")"
    if [ -f "$dir/pids" ]; then
        local name pid
        while read -r name pid; do
            if pid_alive "$pid" "$dir"; then
                die "$name (pid $pid) from an earlier start is still running in $dir: run '$0 stop $dir' first"
            fi
        done <"$dir/pids"
        rm -f "$dir/pids"
    fi
    # Fresh state: remove only what an earlier start of this script wrote.
    rm -rf "$dir/etcd" "$dir/certs"
    rm -f "$dir/sa.key" "$dir/sa.pub" "$dir/tokens.csv" "$dir/kubeconfig" \
        "$dir/etcd.log" "$dir/kube-apiserver.log" "$dir/kube-controller-manager.log" \
        "$dir/kube-scheduler.log" "$dir/kwok.log"
    local t0ns
    t0ns=$(date +%s%N)

    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
    openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
    chmod 600 "$dir/sa.key"
    echo "$TOKEN,admin,admin,\"system:masters\"" >"$dir/tokens.csv"
    mkdir -p "$dir/certs"
    : >"$dir/pids"

    local ports ep pp ap
    mapfile -t ports < <(free_ports 3)
    ep=${ports[0]} pp=${ports[1]} ap=${ports[2]}
    log "ports: etcd client $ep, etcd peer $pp, kube-apiserver $ap"

    launch "$dir" etcd "$CACHE/etcd" --name t --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$ep" --advertise-client-urls "http://127.0.0.1:$ep" \
        --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
        --initial-cluster "t=http://127.0.0.1:$pp"

    # Its command line is kept for restart-apiserver.
    local apiserver=("$CACHE/kube-apiserver" \
        --etcd-servers="http://127.0.0.1:$ep" --bind-address=127.0.0.1 --secure-port="$ap" \
        --advertise-address=127.0.0.1 --endpoint-reconciler-type=none --cert-dir="$dir/certs" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key" \
        --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
        --service-cluster-ip-range=10.96.0.0/24 --disable-admission-plugins=ServiceAccount,TaintNodesByCondition \
        --runtime-config="$runtime" \
        --allow-privileged=true)
    printf '%s\n' "${apiserver[@]}" >"$dir/kube-apiserver.args"
    echo "$ap" >"$dir/kube-apiserver.port"
    launch "$dir" kube-apiserver "${apiserver[@]}"

    local deadline=$((SECONDS + READY_TIMEOUT)) out
    while :; do
        out="$(curl -sk --max-time 2 -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$ap/readyz" 2>/dev/null || true)"
        [ "$out" = ok ] && break
        all_alive "$dir" || fail_start "$dir" "a process exited before the API server was ready"
        [ "$SECONDS" -lt "$deadline" ] || fail_start "$dir" "API server not ready after ${READY_TIMEOUT}s"
        sleep 0.25
    done
    [ -s "$dir/certs/apiserver.crt" ] || fail_start "$dir" "$dir/certs/apiserver.crt missing"
    local ready_ms=$((($(date +%s%N) - t0ns) / 1000000))
    log "API server ready after ${ready_ms} ms"

    write_kubeconfig "$dir" "$ap" "$dir/kubeconfig"
}

cmd_start() {
    local dir=${1:?usage: $0 start DIR}
    local t0ns ap deadline
    t0ns=$(date +%s%N)
    start_api_server "$dir" resource.k8s.io/v1beta1=true
    dir="$(abs_dir "$dir")"
    ap=$(cat "$dir/kube-apiserver.port")
    # The controller-manager reads the same kubeconfig (it needs the server's certificate,
    # which the API server writes at start-up), so it starts once the server is ready.
    launch "$dir" kube-controller-manager "$CACHE/kube-controller-manager" \
        --kubeconfig="$dir/kubeconfig" --leader-elect=false \
        --controllers=namespace-controller,garbage-collector-controller,disruption-controller \
        --controllers=deployment-controller,replicaset-controller,statefulset-controller \
        --service-account-private-key-file="$dir/sa.key" \
        --bind-address=127.0.0.1 --secure-port=0

    launch "$dir" kube-scheduler "$CACHE/kube-scheduler" \
        --kubeconfig="$dir/kubeconfig" --leader-elect=false \
        --bind-address=127.0.0.1 --secure-port=0
    launch "$dir" kwok "$CACHE/kwok" \
        --kubeconfig="$dir/kubeconfig" --config="$KWOK_STAGES" \
        --manage-nodes-with-label-selector="$KWOK_LABEL" --node-lease-duration-seconds=40 \
        --cidr=10.244.0.0/16 --v=WARN

    deadline=$((SECONDS + NAMESPACE_TIMEOUT))
    local code
    while :; do
        code="$(curl -sk --max-time 2 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOKEN" \
            "https://127.0.0.1:$ap/api/v1/namespaces/default" 2>/dev/null || true)"
        [ "$code" = 200 ] && break
        all_alive "$dir" || fail_start "$dir" "a process exited before namespace 'default' appeared"
        [ "$SECONDS" -lt "$deadline" ] || fail_start "$dir" "namespace 'default' missing after ${NAMESPACE_TIMEOUT}s"
        sleep 0.25
    done
    sleep 1
    all_alive "$dir" || fail_start "$dir" "a process exited right after start"
    log "ready in $((($(date +%s%N) - t0ns) / 1000000)) ms; server https://127.0.0.1:$ap, token $TOKEN"
    # kubectl beside the kubeconfig, for the tests that run it as a user would (`kubectl
    # apply -k deploy/`, `kubectl explain`): the one built, else the machine's.
    if [ -x "$CACHE/kubectl" ]; then
        ln -sf "$CACHE/kubectl" "$dir/kubectl"
    else
        ln -sf "$(command -v kubectl)" "$dir/kubectl"
    fi
    echo "ICHOR_TEST_KUBECONFIG=$dir/kubeconfig"
}

# start-apiserver DIR RUNTIME_CONFIG: only etcd and the API server, serving the API
# versions RUNTIME_CONFIG names (as --runtime-config), for a test that needs a server
# shaped unlike the shared one (one that serves only a removed version of a resource,
# which the shared server's scheduler could not run beside). Stopped by `stop DIR`.
cmd_start_apiserver() {
    local dir=${1:?usage: $0 start-apiserver DIR RUNTIME_CONFIG} runtime=${2:?usage: $0 start-apiserver DIR RUNTIME_CONFIG}
    start_api_server "$dir" "$runtime"
    dir="$(abs_dir "$dir")"
    log "API server ready; server https://127.0.0.1:$(cat "$dir/kube-apiserver.port"), token $TOKEN"
    echo "ICHOR_TEST_KUBECONFIG=$dir/kubeconfig"
}

cmd_stop() {
    local dir=${1:?usage: $0 stop DIR}
    [ -d "$dir" ] || { log "$dir does not exist: nothing to stop"; return 0; }
    dir="$(abs_dir "$dir")"
    stop_dir "$dir"
}

cmd_env() {
    local dir=${1:?usage: $0 env DIR}
    [ -d "$dir" ] || die "$dir does not exist"
    dir="$(abs_dir "$dir")"
    [ -f "$dir/kubeconfig" ] || die "$dir/kubeconfig missing: run '$0 start $dir' first"
    echo "ICHOR_TEST_KUBECONFIG=$dir/kubeconfig"
}

usage() {
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# restart-apiserver DIR SECONDS: stop the API server of `start DIR` (by its PID), keep it
# down SECONDS, start it again with the same command line, wait until it is ready, and
# print the time it was ready again (Unix milliseconds) on stdout.
cmd_restart_apiserver() {
    local dir=${1:?usage: restart-apiserver DIR SECONDS} down=${2:?usage: restart-apiserver DIR SECONDS}
    [ -f "$dir/kube-apiserver.args" ] || die "$dir was not started by this script"
    local pid
    pid=$(awk '$1 == "kube-apiserver" { p = $2 } END { print p }' "$dir/pids")
    [ -n "$pid" ] || die "no kube-apiserver in $dir/pids"
    kill "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
    kill -9 "$pid" 2>/dev/null || true
    grep -v "^kube-apiserver $pid\$" "$dir/pids" >"$dir/pids.new" || true
    mv "$dir/pids.new" "$dir/pids"
    log "kube-apiserver $pid stopped; down for ${down}s"
    sleep "$down"
    local args=()
    mapfile -t args <"$dir/kube-apiserver.args"
    nohup "${args[@]}" </dev/null >>"$dir/kube-apiserver.log" 2>&1 &
    echo "kube-apiserver $!" >>"$dir/pids"
    local ap deadline=$((SECONDS + READY_TIMEOUT)) out
    ap=$(cat "$dir/kube-apiserver.port")
    while :; do
        out="$(curl -sk --max-time 2 -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$ap/readyz" 2>/dev/null || true)"
        [ "$out" = ok ] && break
        [ "$SECONDS" -lt "$deadline" ] || die "API server not ready again after ${READY_TIMEOUT}s"
        sleep 0.05
    done
    echo $(($(date +%s%N) / 1000000))
}

case "${1:-}" in
build) shift; cmd_build "$@" ;;
restart-apiserver) shift; cmd_restart_apiserver "$@" ;;
start) shift; cmd_start "$@" ;;
start-apiserver) shift; cmd_start_apiserver "$@" ;;
stop) shift; cmd_stop "$@" ;;
env) shift; cmd_env "$@" ;;
*) usage ;;
esac
