#!/usr/bin/env bash
# Makes the secrets packaging/compose.yaml mounts, once, in packaging/compose/secrets (or DIR):
#   cluster.secret        the cluster's secret (every hub node's, never a NATS server's)
#   hubN.password         each hub node's NATS password, and nats.env with all three for the
#                         nats-servers' configuration
#   nats-ca.pem, nats.pem, nats.key
#                         a CA and the NATS servers' certificate for nats1..3, which the hubs
#                         verify and the servers' routes require of each other
# The same set scripts/run-cluster.sh makes (docs/cluster.md, "Trust"). The directory is mode
# 700; the files in it are readable by all, since the containers read them as their own users
# (ferrohub's is uid 10001) through bind mounts of the directory.
#
#   packaging/compose/make-secrets.sh [DIR]
set -euo pipefail
DIR="${1:-$(dirname "$0")/secrets}"
if [ -f "$DIR/cluster.secret" ]; then
    echo "make-secrets: $DIR already holds a cluster's secrets; left as they are" >&2
    exit 0
fi
mkdir -p "$DIR"
chmod 700 "$DIR"
cd "$DIR"
umask 022
openssl rand -hex 32 >cluster.secret
: >nats.env
for n in 1 2 3; do
    openssl rand -hex 24 >"hub$n.password"
    echo "HUB${n}_PASSWORD=$(cat "hub$n.password")" >>nats.env
done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=ferrohub NATS CA" -keyout nats-ca.key -out nats-ca.pem 2>/dev/null
chmod 600 nats-ca.key
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=ferrohub NATS" -keyout nats.key -out nats.csr 2>/dev/null
printf '%s\n' "subjectAltName=DNS:nats1,DNS:nats2,DNS:nats3" \
    "extendedKeyUsage=serverAuth,clientAuth" "basicConstraints=CA:FALSE" >nats.ext
openssl x509 -req -in nats.csr -CA nats-ca.pem -CAkey nats-ca.key -CAcreateserial -days 3650 \
    -extfile nats.ext -out nats.pem 2>/dev/null
chmod 644 nats.key
rm -f nats.csr nats.ext
echo "make-secrets: the cluster's secrets are in $DIR"
