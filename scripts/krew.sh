#!/usr/bin/env bash
# krew, the kubectl plugin manager, for the test that installs `kubectl ichor` from its
# krew manifest (deploy/krew/ichor.yaml); and the archive and manifest of a built plugin.
#
#   scripts/krew.sh build                          build krew once, cached outside the checkout
#   scripts/krew.sh env                            print ICHOR_TEST_KREW=<path of the binary>
#   scripts/krew.sh package BINARY OUTDIR [TAG]    OUTDIR/kubectl-ichor_TAG_OS_ARCH.tar.gz of
#                                                  BINARY (and LICENSE), and OUTDIR/ichor.yaml:
#                                                  deploy/krew/ichor.yaml for that archive
#
# krew is built from its Go module (sigs.k8s.io/krew v0.4.3) with the machine's Go 1.26
# and scripts/krew/go.mod. Cache: $ICHOR_KREW_CACHE, default $HOME/.cache/ichor/krew-0.4.3,
# and the Go module cache in $HOME/.cache/ichor/go (shared with the other servers' builds).
# TAG defaults to v<the workspace's version>; OS and ARCH are this machine's. Progress goes
# to stderr; stdout of `env` is only the ICHOR_TEST_KREW= line.
set -euo pipefail

KREW_VERSION=v0.4.3
CACHE="${ICHOR_KREW_CACHE:-$HOME/.cache/ichor/krew-${KREW_VERSION#v}}"
GO_CACHE="${ICHOR_GO_CACHE:-$HOME/.cache/ichor/go}"
HERE="$(cd "$(dirname "$0")" && pwd -P)"

log() { printf '[krew] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cmd_build() {
    if [ -x "$CACHE/krew" ]; then
        log "using the cached $CACHE/krew"
        return 0
    fi
    if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
        export PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null 2>&1 || die "no go in PATH: Go 1.26 builds krew"
    log "building krew $KREW_VERSION from the Go module proxy"
    local start_ts=$SECONDS
    mkdir -p "$CACHE" "$GO_CACHE"
    (
        cd "$HERE/krew"
        export GOTOOLCHAIN=local GOPATH="$GO_CACHE" GOFLAGS="-mod=readonly -modcacherw" CGO_ENABLED=0
        go mod download >&2
        go build -trimpath -ldflags "-s -w" -o "$CACHE/.krew.tmp" sigs.k8s.io/krew/cmd/krew >&2
    ) || die "go build failed"
    mv -f "$CACHE/.krew.tmp" "$CACHE/krew"
    log "built in $((SECONDS - start_ts)) s: $CACHE/krew"
}

cmd_env() {
    [ -x "$CACHE/krew" ] || die "no $CACHE/krew: run '$0 build' first"
    echo "ICHOR_TEST_KREW=$CACHE/krew"
}

cmd_package() {
    [ $# -ge 2 ] || die "usage: $0 package BINARY OUTDIR [TAG]"
    local binary="$1" out="$2" tag="${3:-}"
    [ -x "$binary" ] || die "no executable $binary (cargo build --release -p ichor-operator --bin kubectl-ichor)"
    if [ -z "$tag" ]; then
        tag="v$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$HERE/../Cargo.toml" | head -1)"
    fi
    local os arch
    os="$(uname -s | tr '[:upper:]' '[:lower:]')"
    case "$(uname -m)" in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no krew platform for $(uname -m)" ;;
    esac
    mkdir -p "$out"
    local stage archive sha
    stage="$(mktemp -d "${TMPDIR:-/tmp}/ichor-krew.XXXXXX")"
    cp "$binary" "$stage/kubectl-ichor"
    cp "$HERE/../LICENSE" "$stage/LICENSE"
    archive="$out/kubectl-ichor_${tag}_${os}_${arch}.tar.gz"
    tar -czf "$archive" -C "$stage" kubectl-ichor LICENSE
    rm -rf "$stage"
    sha="$(sha256sum "$archive" | cut -d' ' -f1)"
    # The template with its tag, and the one platform packaged: its addURIAndSha made
    # `uri` and `sha256`, the other platforms left out (they have no archive here).
    awk -v tag="$tag" -v os="$os" -v arch="$arch" -v sha="$sha" '
        function flush() { if (block != "" && keep) printf "%s", block; block = ""; keep = 0 }
        /^  - selector:/ { flush(); inblock = 1 }
        inblock && /^    bin:/ { block = block $0 "\n"; flush(); inblock = 0; next }
        inblock {
            if ($0 ~ "os: " os "$") seen_os = 1
            if ($0 ~ "arch: " arch "$") seen_arch = 1
            if ($0 ~ /addURIAndSha/) {
                keep = seen_os && seen_arch; seen_os = 0; seen_arch = 0
                match($0, /"[^"]*"/); uri = substr($0, RSTART + 1, RLENGTH - 2)
                gsub(/\{\{ \.TagName \}\}/, tag, uri)
                block = block "    uri: " uri "\n    sha256: " sha "\n"
                next
            }
            block = block $0 "\n"; next
        }
        { gsub(/\{\{ \.TagName \}\}/, tag); print }
    ' "$HERE/../deploy/krew/ichor.yaml" >"$out/ichor.yaml"
    grep -q "sha256: $sha" "$out/ichor.yaml" || die "deploy/krew/ichor.yaml has no platform $os/$arch"
    log "packaged $archive and $out/ichor.yaml ($os/$arch, $tag)"
}

case "${1:-}" in
build) shift; cmd_build "$@" ;;
env) shift; cmd_env "$@" ;;
package) shift; cmd_package "$@" ;;
*) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
