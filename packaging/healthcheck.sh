#!/bin/sh
# The image's health check: healthy while the hub's /health/ready answers 200, that is while it
# serves (docs/operations.md). Asks the port FERROHUB_METRICS_ADDR names (default 9464) on the
# container's own loopback; busybox's wget fails on any other status. No `-T`: Debian's busybox
# wget crashes with it; the health check's own timeout (5 s) bounds the request.
port="${FERROHUB_METRICS_ADDR:-[::]:9464}"
port="${port##*:}"
exec /usr/bin/busybox wget -q -O /dev/null "http://127.0.0.1:${port:-9464}/health/ready"
