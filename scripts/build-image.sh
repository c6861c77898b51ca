#!/usr/bin/env bash
# Builds the ferrohub container image from the release build, with no registry: the image is
# FROM scratch over a root file system made here from this machine's Debian packages
# (docs/container.md says why, and what it holds).
#
#   scripts/build-image.sh                  tags ferrohub:<version> and ferrohub:latest
#   scripts/build-image.sh --tag NAME:TAG   tags NAME:TAG only (repeat for more)
#   scripts/build-image.sh --binary PATH    another ferrohub binary than the release build
#
# The binary is by default the release build in $CARGO_TARGET_DIR (scripts/lib.sh); build it
# from this checkout first (scripts/run-hub.sh or the test command), since the image's
# revision label is this checkout's commit. FERROHUB_IMAGE_SOURCE sets the source label
# (default: the origin remote's URL, if any). Needs root: the root file system's owners and the
# binary's capability are set here, and the image goes to root's podman storage.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

USAGE="usage: scripts/build-image.sh [--tag NAME:TAG]... [--binary PATH]"
TAGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAGS+=("${2:?$USAGE}"); shift 2 ;;
        --binary) FERROHUB_BIN="$(realpath "${2:?$USAGE}")"; shift 2 ;;
        *) echo "$USAGE" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "build-image: run as root (owners and capabilities in the image, root's podman storage)" >&2
    exit 1
fi
if [ ! -x "$FERROHUB_BIN" ]; then
    echo "build-image: no release build at $FERROHUB_BIN (scripts/run-hub.sh builds it)" >&2
    exit 1
fi
ensure_container_tools

VERSION="$("$FERROHUB_BIN" --version | awk '{print $2}')"
[ ${#TAGS[@]} -gt 0 ] || TAGS=("ferrohub:$VERSION" "ferrohub:latest")
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then REVISION="$REVISION-dirty"; fi
SOURCE="${FERROHUB_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || true)}"
# Every file in the image carries the commit's time, so the same binary makes the same layer.
EPOCH="$(git log -1 --format=%ct 2>/dev/null || date +%s)"
APP_UID=10001

WORK="$(mktemp -d /tmp/ferrohub-image.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/rootfs"

make_rootfs() {
    mkdir -p "$ROOT"/{usr/bin,usr/local/bin,usr/lib,usr/lib64,usr/share,etc/ssl/certs,etc/ferrohub,data,tmp}
    for d in bin lib lib64; do ln -s "usr/$d" "$ROOT/$d"; done

    cp "$FERROHUB_BIN" "$ROOT/usr/local/bin/ferrohub"
    install -m 755 packaging/entrypoint.sh "$ROOT/usr/local/bin/ferrohub-entrypoint"
    install -m 755 packaging/healthcheck.sh "$ROOT/usr/local/bin/ferrohub-healthcheck"

    # busybox: the scripts' shell, the health check's HTTP client, and a few tools for a look
    # inside (`podman exec NAME ls /data`).
    cp /bin/busybox "$ROOT/usr/bin/busybox"
    for applet in sh ls cat cp mkdir rm id ps du df env grep tar wget; do ln -s busybox "$ROOT/usr/bin/$applet"; done
    copy_libraries "$ROOT" "$ROOT/usr/local/bin/ferrohub" "$ROOT/usr/bin/busybox"

    # Trust for outbound TLS (Azure Blob Storage for file upload and import/export), and time
    # zones for whatever reads TZ.
    cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"
    cp -a /usr/share/zoneinfo "$ROOT/usr/share/"

    printf '%s\n' "root:x:0:0:root:/:/bin/sh" "ferrohub:x:$APP_UID:$APP_UID:ferrohub:/data:/bin/sh" >"$ROOT/etc/passwd"
    printf '%s\n' "root:x:0:" "ferrohub:x:$APP_UID:" >"$ROOT/etc/group"
    printf '%s\n' "passwd: files" "group: files" "hosts: files dns" >"$ROOT/etc/nsswitch.conf"

    chown -R 0:0 "$ROOT"
    # A new named volume takes /data's owner and mode from the image.
    chown "$APP_UID:$APP_UID" "$ROOT/data"
    chmod 750 "$ROOT/data"
    chmod 1777 "$ROOT/tmp"
    # Port 443 below 1024 without root: the capability rides on the file (a tar xattr that
    # `podman build`'s ADD keeps), within the bounding set Docker and podman give by default.
    # Set last: a chown clears it.
    setcap cap_net_bind_service=+ep "$ROOT/usr/local/bin/ferrohub"
}

make_rootfs
tar --create --file "$WORK/rootfs.tar" --directory "$ROOT" --numeric-owner --sort=name \
    --mtime="@$EPOCH" --xattrs --xattrs-include=security.capability .
cp packaging/Containerfile "$WORK/Containerfile"

OLD_ID="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "${TAGS[0]}" 2>/dev/null || true)"
LABELS=(
    --label "org.opencontainers.image.title=ferrohub"
    --label "org.opencontainers.image.description=A self-hosted hub that speaks the Azure IoT Hub protocols"
    --label "org.opencontainers.image.version=$VERSION"
    --label "org.opencontainers.image.revision=$REVISION"
    --label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    --label "org.opencontainers.image.licenses=Apache-2.0"
)
[ -z "$SOURCE" ] || LABELS+=(--label "org.opencontainers.image.source=$SOURCE")
TAG_ARGS=()
for t in "${TAGS[@]}"; do TAG_ARGS+=(--tag "$t"); done
"${PODMAN[@]}" build --quiet --pull=never --format docker "${LABELS[@]}" "${TAG_ARGS[@]}" \
    --file "$WORK/Containerfile" "$WORK" >/dev/null
NEW_ID="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "${TAGS[0]}")"
# The image this build replaced under the same tag would stay behind untagged.
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
    "${PODMAN[@]}" rmi "$OLD_ID" >/dev/null 2>&1 || true
fi

SIZE="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "${TAGS[0]}")"
echo "built ${TAGS[*]} (image $NEW_ID, ferrohub $VERSION, revision $REVISION): $((SIZE / 1000000)) MB"
