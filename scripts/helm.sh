#!/usr/bin/env bash
# Helm, for the tests that lint and render the operator's chart (deploy/chart/) and apply
# what it renders to the project's API server: built from Helm's Go module
# (helm.sh/helm/v4 v4.3.2) with the machine's Go 1.26 and scripts/helm/go.mod, as any Go
# program builds its dependencies. Test tooling only.
#
#   scripts/helm.sh build    build once, cache the binary outside the checkout
#   scripts/helm.sh env      print ICHOR_TEST_HELM=<path of the binary>
#
# Cache: $ICHOR_HELM_CACHE, default $HOME/.cache/ichor/helm-4.3.2, and the Go module cache
# in $HOME/.cache/ichor/go (shared with scripts/kube-test-server.sh and scripts/talosctl.sh).
# Progress goes to stderr; stdout of `env` is only the ICHOR_TEST_HELM= line.
set -euo pipefail

HELM_VERSION=v4.3.2
CACHE="${ICHOR_HELM_CACHE:-$HOME/.cache/ichor/helm-${HELM_VERSION#v}}"
GO_CACHE="${ICHOR_GO_CACHE:-$HOME/.cache/ichor/go}"
MODULE_DIR="$(cd "$(dirname "$0")" && pwd -P)/helm"

log() { printf '[helm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cmd_build() {
    if [ -x "$CACHE/helm" ]; then
        log "using the cached $CACHE/helm"
        return 0
    fi
    if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || die "no go in PATH: Go 1.26 builds helm"
    log "building helm $HELM_VERSION from the Go module proxy"
    local start_ts=$SECONDS
    mkdir -p "$CACHE" "$GO_CACHE"
    (
        cd "$MODULE_DIR"
        export GOTOOLCHAIN=local GOPATH="$GO_CACHE" GOFLAGS="-mod=readonly -modcacherw" CGO_ENABLED=0
        log "go: $(command -v go) ($(go version))"
        go mod download >&2
        log "downloaded in $((SECONDS - start_ts)) s; go build"
        go build -trimpath -ldflags "-s -w" -o "$CACHE/.helm.tmp" helm.sh/helm/v4/cmd/helm >&2
    ) || die "go build failed"
    mv -f "$CACHE/.helm.tmp" "$CACHE/helm"
    log "built in $((SECONDS - start_ts)) s: $CACHE/helm"
    "$CACHE/helm" version >&2 || true
}

cmd_env() {
    [ -x "$CACHE/helm" ] || die "no $CACHE/helm: run '$0 build' first"
    echo "ICHOR_TEST_HELM=$CACHE/helm"
}

case "${1:-}" in
build) shift; cmd_build "$@" ;;
env) shift; cmd_env "$@" ;;
*) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
