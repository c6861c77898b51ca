#!/bin/sh
# The container image's entrypoint (scripts/build-image.sh builds the image; docs/container.md).
#
#   no arguments, or flags       ferrohub serve --data-dir /data FLAGS..., with the settings
#                                the FERROHUB_* variables below give
#   serve FLAGS...               the same
#   COMMAND ARGS...              ferrohub COMMAND ARGS... as it is (connection-string, backup,
#                                export, restore, ca, --version, --help)
#
# The variables, as users of other brokers' images expect to configure a container. An unset or
# empty one leaves its setting to the configuration file, then to ferrohub's default; a flag on
# the command line wins over its variable (ferrohub refuses a flag given twice, so the variable
# is then left out).
#   FERROHUB_CONFIG        configuration file, used when it exists
#                          (the image says /etc/ferrohub/ferrohub.toml: mount one there)
#   FERROHUB_HOST_NAME     --host-name: the name clients use (the server certificate is made
#                          for it; on an existing hub it must be the stored one)
#   FERROHUB_HUB_NAME      --hub-name (a new hub only)
#   FERROHUB_LOG_FORMAT    --log-format: text or json
#   FERROHUB_METRICS_ADDR  --metrics-addr: metrics and health over plain HTTP (the image says
#                          [::]:9464, so that the health check and a scraper outside reach it)
#   FERROHUB_NATS          --nats: cluster mode's NATS servers, comma-separated
#   FERROHUB_NODE_NAME     --node-name: this node's name in a cluster
#   FERROHUB_LOG           the log filter; ferrohub reads it itself
set -eu

case "${1:-}" in
    "" | -*) ;;
    serve) shift ;;
    *) exec /usr/local/bin/ferrohub "$@" ;;
esac

# given FLAG ARGS...: whether ARGS hold FLAG (as `--flag value` or `--flag=value`).
given() {
    flag="$1"
    shift
    for arg in "$@"; do
        case "$arg" in "$flag" | "$flag"=*) return 0 ;; esac
    done
    return 1
}

config="${FERROHUB_CONFIG:-}"
if [ -n "$config" ] && [ ! -f "$config" ]; then config=""; fi

# Each option as one `--flag=value` word, so a value is passed exactly as it is.
for option in \
    "--data-dir=/data" \
    "--config=$config" \
    "--host-name=${FERROHUB_HOST_NAME:-}" \
    "--hub-name=${FERROHUB_HUB_NAME:-}" \
    "--log-format=${FERROHUB_LOG_FORMAT:-}" \
    "--metrics-addr=${FERROHUB_METRICS_ADDR:-}" \
    "--nats=${FERROHUB_NATS:-}" \
    "--node-name=${FERROHUB_NODE_NAME:-}"; do
    flag="${option%%=*}"
    value="${option#*=}"
    [ -n "$value" ] || continue
    given "$flag" "$@" && continue
    set -- "$@" "$option"
done

# exec: ferrohub is the container's first process, so the stop signal (SIGTERM) reaches it and
# it drains its connections before the store closes.
exec /usr/local/bin/ferrohub serve "$@"
