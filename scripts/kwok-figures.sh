#!/usr/bin/env bash
# The operator's figures on the project's real API server with kwok Nodes, beside the
# simulator's ideal scheduler (issue 57 item 3; docs/performance.md has the results):
#
#   bash scripts/kwok-figures.sh [--workers 1000] [--max-unavailable 50] [--time-scale 10]
#
# Starts Kubernetes 1.37.2 (etcd, the API server, the controllers, the scheduler) and kwok
# on loopback with scripts/kube-test-server.sh (building them once into ~/.cache/ichor),
# builds the operator example and the kwok-figures bench in release, runs the bench (a
# fleet of kwok Nodes, workloads under budgets, an upgrade by the release operator under
# its least-privilege ServiceAccount), prints its figures beside their goals, and stops the
# server (by PID). Exit status: the bench's (0 every goal met, 1 one missed, 2 bad input).
# Not part of .ci/run: it takes minutes and measures, it does not check.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR="$(mktemp -d "${TMPDIR:-/tmp}/ichor-kwok-figures.XXXXXX")"
cleanup() {
    bash scripts/kube-test-server.sh stop "$DIR" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

cargo build --release --example operator --example kwok-figures >&2
line="$(bash scripts/kube-test-server.sh start "$DIR")"
export "${line?}"
status=0
target/release/examples/kwok-figures "$@" || status=$?
exit "$status"
