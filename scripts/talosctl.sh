#!/usr/bin/env bash
# The real talosctl, for the tests that run it against Ichor's Talos API stand-in: built
# from the Talos project's Go module (github.com/siderolabs/talos v1.14.1) with the
# machine's Go 1.26 and scripts/talosctl/go.mod, as any Go program builds its dependencies.
#
#   scripts/talosctl.sh build    build once, cache the binary outside the checkout
#   scripts/talosctl.sh env      print ICHOR_TEST_TALOSCTL=<path of the binary>
#
# Cache: $ICHOR_TALOSCTL_CACHE, default $HOME/.cache/ichor/talosctl-1.14.1, and the Go module
# cache in $HOME/.cache/ichor/go (shared with scripts/kube-test-server.sh).
# Measured on these 2-core machines: 312 s (16 s of it the module download, about 300 MB),
# with the Go build cache warm from scripts/kube-test-server.sh build (they share packages).
# Progress goes to stderr; stdout of `env` is only the ICHOR_TEST_TALOSCTL= line.
set -euo pipefail

TALOS_VERSION=v1.14.1
CACHE="${ICHOR_TALOSCTL_CACHE:-$HOME/.cache/ichor/talosctl-${TALOS_VERSION#v}}"
GO_CACHE="${ICHOR_GO_CACHE:-$HOME/.cache/ichor/go}"
MODULE_DIR="$(cd "$(dirname "$0")" && pwd -P)/talosctl"

log() { printf '[talosctl] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cmd_build() {
    if [ -x "$CACHE/talosctl" ]; then
        log "using the cached $CACHE/talosctl"
        return 0
    fi
    if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || die "no go in PATH: Go 1.26 builds talosctl"
    log "building talosctl $TALOS_VERSION from the Go module proxy"
    local start_ts=$SECONDS
    mkdir -p "$CACHE" "$GO_CACHE"
    (
        cd "$MODULE_DIR"
        export GOTOOLCHAIN=local GOPATH="$GO_CACHE" GOFLAGS="-mod=readonly -modcacherw" CGO_ENABLED=0
        log "go: $(command -v go) ($(go version))"
        go mod download >&2
        log "downloaded in $((SECONDS - start_ts)) s; go build"
        go build -trimpath -ldflags "-s -w" -o "$CACHE/.talosctl.tmp" github.com/siderolabs/talos/cmd/talosctl >&2
    ) || die "go build failed"
    mv -f "$CACHE/.talosctl.tmp" "$CACHE/talosctl"
    log "built in $((SECONDS - start_ts)) s: $CACHE/talosctl"
    "$CACHE/talosctl" version --client >&2 || true
}

cmd_env() {
    [ -x "$CACHE/talosctl" ] || die "no $CACHE/talosctl: run '$0 build' first"
    echo "ICHOR_TEST_TALOSCTL=$CACHE/talosctl"
}

case "${1:-}" in
build) shift; cmd_build "$@" ;;
env) shift; cmd_env "$@" ;;
*) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
