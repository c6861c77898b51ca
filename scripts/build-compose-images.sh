#!/usr/bin/env bash
# Builds the nats-server and HAProxy images packaging/compose.yaml can use where no registry is
# reachable (as on this project's machines), the way scripts/build-image.sh builds ferrohub's:
# FROM scratch over the binary and the libraries it loads.
#   localhost/ferrohub-nats:<version>     the pinned nats-server (scripts/nats-server.txt), laid
#                                         out as the official image (/nats-server, its entrypoint)
#   localhost/ferrohub-haproxy:<version>  Debian's HAProxy, run as `haproxy -f FILE` like the
#                                         official image's command (as root: it binds 443)
# Prints NATS_IMAGE=... and HAPROXY_IMAGE=..., the variables compose.yaml reads. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
if [ "$(id -u)" != 0 ]; then
    echo "build-compose-images: run as root (root's podman storage)" >&2
    exit 1
fi
ensure_container_tools
ensure_cluster_tools

WORK="$(mktemp -d /tmp/ferrohub-compose-images.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# build_from_rootfs TAG ROOT CONTAINERFILE-LINES...: an image of ROOT with those instructions.
build_from_rootfs() {
    local tag="$1" root="$2"
    shift 2
    for d in bin lib lib64; do [ -e "$root/$d" ] || ln -s "usr/$d" "$root/$d"; done
    tar --create --file "$WORK/rootfs.tar" --directory "$root" --numeric-owner --sort=name .
    printf '%s\n' "FROM scratch" "ADD rootfs.tar /" "$@" >"$WORK/Containerfile"
    local old
    old="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
    "${PODMAN[@]}" build --quiet --pull=never --format docker --tag "$tag" --file "$WORK/Containerfile" "$WORK" >/dev/null
    if [ -n "$old" ] && [ "$old" != "$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$tag")" ]; then
        "${PODMAN[@]}" rmi "$old" >/dev/null 2>&1 || true
    fi
    rm -f "$WORK/rootfs.tar"
}

NATS_VERSION="$("$FERROHUB_NATS/bin/nats-server" --version | awk '{print $NF}' | sed 's/^v//')"
mkdir -p "$WORK/nats/usr/bin" "$WORK/nats/tmp"
cp "$FERROHUB_NATS/bin/nats-server" "$WORK/nats/nats-server"
copy_libraries "$WORK/nats" "$WORK/nats/nats-server"
build_from_rootfs "localhost/ferrohub-nats:$NATS_VERSION" "$WORK/nats" \
    'EXPOSE 4222 6222 8222' 'ENTRYPOINT ["/nats-server"]'

HAPROXY_VERSION="$(haproxy -v | awk 'NR == 1 {print $3}' | sed 's/[^0-9.].*//')"
mkdir -p "$WORK/haproxy/usr/sbin" "$WORK/haproxy/etc" "$WORK/haproxy/tmp" "$WORK/haproxy/run"
cp "$(command -v haproxy)" "$WORK/haproxy/usr/sbin/haproxy"
copy_libraries "$WORK/haproxy" "$WORK/haproxy/usr/sbin/haproxy"
printf '%s\n' "root:x:0:0:root:/:/sbin/nologin" >"$WORK/haproxy/etc/passwd"
printf '%s\n' "root:x:0:" >"$WORK/haproxy/etc/group"
chmod 1777 "$WORK/haproxy/tmp"
build_from_rootfs "localhost/ferrohub-haproxy:$HAPROXY_VERSION" "$WORK/haproxy" \
    'ENV PATH=/usr/local/sbin:/usr/sbin:/usr/bin' 'STOPSIGNAL SIGUSR1' \
    'CMD ["haproxy", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]'

echo "NATS_IMAGE=localhost/ferrohub-nats:$NATS_VERSION"
echo "HAPROXY_IMAGE=localhost/ferrohub-haproxy:$HAPROXY_VERSION"
