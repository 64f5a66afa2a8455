#!/usr/bin/env bash
# A real Kubernetes API server (1.20.2, built from Debian bookworm's `kubernetes`
# source package) on loopback, for tests. Recipe: shared/reference/kube-apiserver.md.
#
#   scripts/kube-test-server.sh build        build once, cache the binaries outside the checkout
#   scripts/kube-test-server.sh start DIR    start etcd + kube-apiserver + kube-controller-manager,
#                                            print ICHOR_TEST_KUBECONFIG=DIR/kubeconfig
#   scripts/kube-test-server.sh stop DIR     stop what `start DIR` started (by PID only)
#   scripts/kube-test-server.sh env DIR      print the ICHOR_TEST_KUBECONFIG= line again
#
# Cache: $ICHOR_KUBE_CACHE, default $HOME/.cache/ichor/kube-1.20.2.
# Progress goes to stderr; stdout of `start`/`env` is only the ICHOR_TEST_KUBECONFIG= line.
# Limits of 1.20.2 (no policy/v1 PDB, no CEL, no scheduler/kubelet): see the reference.
set -euo pipefail

CACHE="${ICHOR_KUBE_CACHE:-$HOME/.cache/ichor/kube-1.20.2}"
KUBE_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
KUBE_ORIG_TARBALL="kubernetes_1.20.5+really1.20.2.orig.tar.gz"
TOKEN="testtoken"
READY_TIMEOUT=90
NAMESPACE_TIMEOUT=60
STOP_TIMEOUT=10
DEB_SRC_FILE=/etc/apt/sources.list.d/ichor-kube-deb-src.sources
DEBIAN_SOURCES=/etc/apt/sources.list.d/debian.sources

log() { printf '[kube-test-server] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# ---------------------------------------------------------------- apt helpers

APT_UPDATED=0
apt_update_once() {
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        as_root apt-get update -q >&2
        APT_UPDATED=1
    fi
}

# apt-get install, without letting package scripts start services (etcd-server ships one).
apt_install() {
    local added_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
        as_root chmod 755 /usr/sbin/policy-rc.d
        added_policy=1
    fi
    apt_update_once
    log "apt-get install -y $*"
    local rc=0
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2 || rc=$?
    if [ "$added_policy" -eq 1 ]; then as_root rm -f /usr/sbin/policy-rc.d; fi
    return "$rc"
}

# Runtime tools needed by `start` (also when the binaries come from a restored cache).
ensure_runtime_packages() {
    local missing=()
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    if [ "${#missing[@]}" -gt 0 ]; then
        apt_install "${missing[@]}"
    else
        log "etcd, openssl and curl already installed"
    fi
}

# A deb-src entry (bookworm main) copied from the URIs:/Signed-By: of the existing
# `Types: deb` stanza whose Suites include bookworm. No host name is written here.
ensure_deb_src() {
    if [ -f "$DEB_SRC_FILE" ]; then
        return 0
    fi
    if grep -rqsE '^[[:space:]]*(Types:.*deb-src|deb-src[[:space:]].*[[:space:]]bookworm[[:space:]].*main)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
        && apt-cache showsrc kubernetes 2>/dev/null | grep -q "^Version: ${KUBE_SRC_VERSION}\$"; then
        log "a deb-src entry for kubernetes is already configured"
        return 0
    fi
    [ -r "$DEBIAN_SOURCES" ] || die "$DEBIAN_SOURCES not found; cannot derive the deb-src entry"
    local fields uris signed
    fields="$(awk '
        function flush() {
            if (types ~ /(^|[ \t])deb([ \t]|$)/ && suites ~ /(^|[ \t])bookworm([ \t]|$)/ && uris != "" && !done) {
                print uris; print signed; done = 1
            }
            types = ""; suites = ""; uris = ""; signed = ""
        }
        /^[ \t]*$/ { flush(); next }
        /^[ \t]*#/ { next }
        /^Types:/     { sub(/^Types:[ \t]*/, "");     types = $0;  next }
        /^Suites:/    { sub(/^Suites:[ \t]*/, "");    suites = $0; next }
        /^URIs:/      { sub(/^URIs:[ \t]*/, "");      uris = $0;   next }
        /^Signed-By:/ { sub(/^Signed-By:[ \t]*/, ""); signed = $0; next }
        END { flush() }
    ' "$DEBIAN_SOURCES")"
    uris="$(printf '%s\n' "$fields" | sed -n 1p)"
    signed="$(printf '%s\n' "$fields" | sed -n 2p)"
    [ -n "$uris" ] || die "no 'Types: deb' stanza for bookworm in $DEBIAN_SOURCES"
    log "adding deb-src entry (bookworm main) in $DEB_SRC_FILE"
    {
        echo "Types: deb-src"
        echo "URIs: $uris"
        echo "Suites: bookworm"
        echo "Components: main"
        if [ -n "$signed" ]; then echo "Signed-By: $signed"; fi
    } | as_root tee "$DEB_SRC_FILE" >/dev/null
    APT_UPDATED=0 # the new entry needs its index
}

# Kubernetes 1.20.2 builds with Debian's Go 1.19. A newer Go first in PATH (the machines
# carry Go 1.26 in /usr/local/go) fails on the vendored tree, so the build puts this one
# first in PATH and never uses whichever `go` the machine has.
GO119_BIN=/usr/lib/go-1.19/bin

have_build_deps() {
    [ -x "$GO119_BIN/go" ] &&
        command -v etcd >/dev/null 2>&1 &&
        command -v rsync >/dev/null 2>&1 &&
        command -v openssl >/dev/null 2>&1 &&
        command -v curl >/dev/null 2>&1 &&
        [ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ]
}

# ---------------------------------------------------------------- build

cache_ok() {
    [ -x "$CACHE/kube-apiserver" ] && [ -x "$CACHE/kube-controller-manager" ]
}

cmd_build() {
    if cache_ok; then
        log "using cached binaries in $CACHE"
        ensure_runtime_packages
        return 0
    fi
    log "no cached binaries in $CACHE: building Kubernetes 1.20.2 (about 8 minutes on 2 cores)"
    local start_ts=$SECONDS

    # Steps 1-2: deb-src entry, toolchain and build dependencies.
    ensure_deb_src
    if [ "$APT_UPDATED" -eq 0 ] && ! ls /var/lib/apt/lists/*_Sources* >/dev/null 2>&1; then
        apt_update_once
    fi
    if [ "$APT_UPDATED" -eq 0 ] && [ -f "$DEB_SRC_FILE" ] \
        && ! apt-cache showsrc kubernetes 2>/dev/null | grep -q "^Version: ${KUBE_SRC_VERSION}\$"; then
        apt_update_once
    fi
    if have_build_deps; then
        log "build dependencies already installed"
    else
        apt_install golang-1.19-go etcd-server golang-github-modern-go-reflect2-dev rsync openssl curl
    fi

    # Step 3: the source package, in a temporary folder outside the repository.
    mkdir -p "$CACHE"
    local parent work
    parent="$(dirname "$CACHE")"
    work="$(mktemp -d "$parent/build-tmp.XXXXXX")"
    # shellcheck disable=SC2064 # expand $work now
    trap "rm -rf '$work'" EXIT
    log "work dir: $work"
    (
        cd "$work"
        log "apt-get source --download-only kubernetes=$KUBE_SRC_VERSION"
        apt-get source --download-only "kubernetes=$KUBE_SRC_VERSION" >&2
        [ -f "$KUBE_ORIG_TARBALL" ] || die "$KUBE_ORIG_TARBALL not downloaded"
        mkdir src
        tar -xzf "$KUBE_ORIG_TARBALL" -C src
    )
    local src
    src="$(find "$work/src" -mindepth 1 -maxdepth 2 -type f -name go.mod -printf '%h\n' | head -n1)"
    if [ -z "$src" ] || [ ! -d "$src/vendor" ]; then
        die "no Kubernetes tree with vendor/ in $KUBE_ORIG_TARBALL"
    fi
    log "source tree: $src"

    # Step 4: vendored reflect2 1.0.1 panics under Go >= 1.18; use Debian's 1.0.2.
    local r2="$src/vendor/github.com/modern-go/reflect2"
    [ -d "$r2" ] || die "$r2 missing"
    find "$r2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
    find /usr/share/gocode/src/github.com/modern-go/reflect2/ -maxdepth 1 -type f \
        \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp -t "$r2/" {} +
    log "reflect2 swapped: $(find "$r2" -maxdepth 1 -name '*.go' | wc -l) .go files"

    # Step 5: go-openapi reads a decoded "" as null under Go >= 1.16 (validate PR 138).
    local f
    for f in vendor/github.com/go-openapi/validate/type.go \
        vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go; do
        [ -f "$src/$f" ] || die "$f missing"
        sed -i 's/\tif data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {/\tif data == nil {/' "$src/$f"
        grep -q 'reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data))' "$src/$f" && die "sed did not apply to $f"
        grep -qP '^\tif data == nil \{' "$src/$f" || die "patched line not found in $f"
    done
    log "go-openapi type check patched"

    # Step 6: build offline (vendor/ only; no module downloads).
    log "make WHAT=\"cmd/kube-apiserver cmd/kube-controller-manager\" (log: $work/make.log)"
    (
        cd "$src"
        export PATH="$GO119_BIN:$PATH" GOROOT="${GO119_BIN%/bin}"
        export GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local
        log "go: $(command -v go) ($(go version))"
        export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
        make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$work/make.log" 2>&1
    ) || { tail -n 60 "$work/make.log" >&2; die "make failed"; }

    local b
    for b in kube-apiserver kube-controller-manager; do
        [ -x "$src/_output/bin/$b" ] || die "$src/_output/bin/$b not built"
        cp -L "$src/_output/bin/$b" "$CACHE/.$b.tmp"
        chmod 755 "$CACHE/.$b.tmp"
        mv -f "$CACHE/.$b.tmp" "$CACHE/$b"
    done
    rm -rf "$work"
    trap - EXIT
    log "built in $((SECONDS - start_ts)) s; cached:"
    ls -l "$CACHE/kube-apiserver" "$CACHE/kube-controller-manager" >&2
    "$CACHE/kube-apiserver" --version >&2 || true
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
    for f in "$dir"/etcd.log "$dir"/kube-apiserver.log "$dir"/kube-controller-manager.log; do
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

cmd_start() {
    local dir=${1:?usage: $0 start DIR}
    cache_ok || die "no binaries in $CACHE: run '$0 build' first"
    command -v etcd >/dev/null 2>&1 || die "etcd not installed: run '$0 build' first"
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
        "$dir/etcd.log" "$dir/kube-apiserver.log" "$dir/kube-controller-manager.log"
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

    launch "$dir" etcd etcd --name t --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$ep" --advertise-client-urls "http://127.0.0.1:$ep" \
        --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
        --initial-cluster "t=http://127.0.0.1:$pp"

    launch "$dir" kube-apiserver "$CACHE/kube-apiserver" \
        --etcd-servers="http://127.0.0.1:$ep" --bind-address=127.0.0.1 --secure-port="$ap" \
        --advertise-address=127.0.0.1 --cert-dir="$dir/certs" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key" \
        --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
        --service-cluster-ip-range=10.96.0.0/24 --disable-admission-plugins=ServiceAccount \
        --allow-privileged=true

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

    # The controller-manager reads the same kubeconfig (it needs the server's certificate,
    # which the API server writes at start-up), so it starts once the server is ready.
    write_kubeconfig "$dir" "$ap" "$dir/kubeconfig"
    launch "$dir" kube-controller-manager "$CACHE/kube-controller-manager" \
        --kubeconfig="$dir/kubeconfig" --leader-elect=false \
        --controllers=namespace,garbagecollector,disruption \
        --service-account-private-key-file="$dir/sa.key" \
        --bind-address=127.0.0.1 --secure-port=0 --port=0

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
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

case "${1:-}" in
build) shift; cmd_build "$@" ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
env) shift; cmd_env "$@" ;;
*) usage ;;
esac
