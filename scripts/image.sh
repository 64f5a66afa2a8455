#!/usr/bin/env bash
# The operator's image, built with buildah (Debian's package: daemonless, no Docker, works
# as root with the vfs storage driver) from a binary already built, into an OCI archive:
#
#   scripts/image.sh build BINARY ARCHIVE [REFERENCE]
#   scripts/image.sh install      only install buildah (apt) when missing
#
# BINARY is an `ichor-operator` cargo built (`cargo build --release -p ichor-operator`
# for an image to ship: target/release/ichor-operator; CI packs the one its test build
# made). ARCHIVE is the OCI archive written (`oci-archive:` transport: `skopeo copy
# oci-archive:ARCHIVE docker://REGISTRY/ichor-operator:TAG` or `podman load -i ARCHIVE`
# puts it in a registry). REFERENCE names the image in the archive, default
# localhost/ichor-operator:<the workspace's version>.
#
# The image holds what distroless/cc holds for this binary and nothing else: the binary,
# stripped, as /ichor-operator; the shared libraries it loads (as ldd lists them) and
# the loader; the CA bundle; /etc/passwd and /etc/group naming the user 65532 (nonroot)
# it runs as; an empty /tmp. Its entrypoint is /ichor-operator, as deploy/Dockerfile's.
# buildah's storage is a temporary directory removed at the end: the machine keeps no
# image. buildah is installed with apt when missing (as root, or with sudo).
set -euo pipefail

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

ensure_buildah() {
    command -v buildah >/dev/null 2>&1 && return 0
    log "installing buildah (apt)"
    sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
    sudo_if_needed apt-get update -q >&2
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends buildah >&2
}

# The version of the workspace (Cargo.toml's [workspace.package]).
workspace_version() {
    sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml" | head -1
}

cmd_build() {
    [ $# -ge 2 ] || die "usage: $0 build BINARY ARCHIVE [REFERENCE]"
    local binary="$1" archive="$2" reference="${3:-localhost/ichor-operator:$(workspace_version)}"
    [ -x "$binary" ] || die "no executable $binary: build it first (cargo build --release -p ichor-operator)"
    ensure_buildah
    # Global: the EXIT trap reads it after this function returned.
    WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ichor-image.XXXXXX")"
    # buildah's storage and the root filesystem go with the work directory.
    trap 'buildah --root "$WORK_DIR/storage" --runroot "$WORK_DIR/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true; rm -rf "$WORK_DIR"' EXIT
    local work="$WORK_DIR"
    local root="$work/rootfs"
    mkdir -p "$root/etc/ssl/certs" "$root/tmp"
    chmod 1777 "$root/tmp"
    strip -o "$root/ichor-operator" "$binary" 2>/dev/null || cp "$binary" "$root/ichor-operator"
    chmod 0755 "$root/ichor-operator"
    # The shared libraries and the loader, at the paths the binary names.
    local lib
    for lib in $(ldd "$binary" | grep -oE '/[^ ]+' | sort -u); do
        cp -L --parents "$lib" "$root/"
    done
    [ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
        >"$root/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"

    local b=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
    local container
    container="$("${b[@]}" from --quiet scratch)"
    "${b[@]}" copy --quiet "$container" "$root/" / >/dev/null
    "${b[@]}" config \
        --entrypoint '["/ichor-operator"]' --user 65532:65532 --workingdir / \
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        --label org.opencontainers.image.title=ichor-operator \
        --label "org.opencontainers.image.version=${reference##*:}" \
        --label org.opencontainers.image.description="Rolls Talos Linux clusters to a new Talos or Kubernetes version" \
        "$container"
    mkdir -p "$(dirname "$archive")"
    rm -f "$archive"
    "${b[@]}" commit --quiet --format oci --disable-compression=false "$container" "oci-archive:$archive:$reference" >/dev/null
    log "built $reference into $archive ($(du -h "$archive" | cut -f1))"
}

case "${1:-}" in
install) shift; ensure_buildah; buildah --version >&2 ;;
build) shift; cmd_build "$@" ;;
*) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
