#!/usr/bin/env bash
# Prometheus, promtool and Alertmanager, for the tests of the operator's alert rules
# (deploy/monitoring/ichor-rules.yaml: `promtool test rules`, and a Prometheus scraping a
# running operator) and of alert gates (a real Alertmanager's alerts and silences): built
# from their Go modules (github.com/prometheus/prometheus v0.316.0, that is Prometheus
# 3.16.0, and github.com/prometheus/alertmanager v0.35.0) with the machine's Go 1.26 and
# scripts/monitoring/*/go.mod, as the API server is. Test tooling only.
#
#   scripts/monitoring.sh build    build once, cache the binaries outside the checkout
#   scripts/monitoring.sh env      print ICHOR_TEST_PROMETHEUS=, ICHOR_TEST_PROMTOOL= and
#                                  ICHOR_TEST_ALERTMANAGER= lines
#
# Prometheus is built with `-tags remove_all_sd` (no cloud service discovery: the tests
# scrape static targets). Alertmanager's module ships no built web UI (its `ui/app/dist`
# comes from npm), so its source is copied beside the build and given a one-page
# placeholder there: the API the tests use is untouched.
# Cache: $ICHOR_MONITORING_CACHE, default $HOME/.cache/ichor/monitoring-3.16.0-0.35.0, and
# the Go module cache in $HOME/.cache/ichor/go (shared with the other scripts). On these
# 2-core machines: 100 s of module download and 170 s of build for Prometheus and
# promtool, 60 s and 36 s for Alertmanager (its dependencies mostly built by then).
set -euo pipefail

PROMETHEUS_MODULE=v0.316.0
ALERTMANAGER_MODULE=v0.35.0
CACHE="${ICHOR_MONITORING_CACHE:-$HOME/.cache/ichor/monitoring-3.16.0-0.35.0}"
GO_CACHE="${ICHOR_GO_CACHE:-$HOME/.cache/ichor/go}"
MODULES="$(cd "$(dirname "$0")" && pwd -P)/monitoring"

log() { printf '[monitoring] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

have_all() { [ -x "$CACHE/prometheus" ] && [ -x "$CACHE/promtool" ] && [ -x "$CACHE/alertmanager" ]; }

cmd_build() {
    if have_all; then
        log "using the cached binaries in $CACHE"
        return 0
    fi
    if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || die "no go in PATH: Go 1.26 builds Prometheus and Alertmanager"
    export GOTOOLCHAIN=local GOPATH="$GO_CACHE" GOFLAGS="-modcacherw" CGO_ENABLED=0
    mkdir -p "$CACHE" "$GO_CACHE"
    local start_ts=$SECONDS work
    work="$(mktemp -d "${TMPDIR:-/tmp}/ichor-monitoring.XXXXXX")"
    trap 'rm -rf "$work"' RETURN
    log "building Prometheus $PROMETHEUS_MODULE and promtool from the Go module proxy"
    (
        cd "$MODULES/prometheus"
        go build -mod=readonly -trimpath -tags remove_all_sd -ldflags "-s -w" -o "$work/" \
            github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool >&2
    ) || die "go build of Prometheus failed"
    log "Prometheus built in $((SECONDS - start_ts)) s; Alertmanager $ALERTMANAGER_MODULE"
    (
        cd "$MODULES/alertmanager"
        go mod download github.com/prometheus/alertmanager >&2
        local src
        src="$(go list -mod=readonly -m -f '{{.Dir}}' github.com/prometheus/alertmanager)"
        [ -d "$src" ] || die "no source of github.com/prometheus/alertmanager in the module cache"
        mkdir -p "$work/am"
        cp -r "$src" "$work/am/src"
        chmod -R u+w "$work/am/src"
        mkdir -p "$work/am/src/ui/app/dist/elm" "$work/am/src/ui/app/dist/mantine"
        for ui in elm mantine; do
            echo '<!doctype html><title>Alertmanager</title><p>No web UI in this test build.' \
                >"$work/am/src/ui/app/dist/$ui/index.html"
        done
        cp go.mod go.sum tools.go "$work/am/"
        cd "$work/am"
        go mod edit -replace github.com/prometheus/alertmanager=./src
        go build -mod=mod -trimpath -ldflags "-s -w" -o "$work/" github.com/prometheus/alertmanager/cmd/alertmanager >&2
    ) || die "go build of Alertmanager failed"
    mv -f "$work/prometheus" "$work/promtool" "$work/alertmanager" "$CACHE/"
    log "built in $((SECONDS - start_ts)) s: $CACHE"
    "$CACHE/promtool" --version 2>&1 | head -1 >&2 || true
}

cmd_env() {
    have_all || die "no binaries in $CACHE: run '$0 build' first"
    echo "ICHOR_TEST_PROMETHEUS=$CACHE/prometheus"
    echo "ICHOR_TEST_PROMTOOL=$CACHE/promtool"
    echo "ICHOR_TEST_ALERTMANAGER=$CACHE/alertmanager"
}

case "${1:-}" in
build) shift; cmd_build "$@" ;;
env) shift; cmd_env "$@" ;;
*) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
