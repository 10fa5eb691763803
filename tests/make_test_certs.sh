#!/usr/bin/env bash
# Writes a throwaway PKI for the TLS tests into DIR (openssl CLI, EC P-256,
# valid one day), so no key is ever committed:
#   ca.pem ca.key                 the cluster CA
#   node.pem node.key             signed by it; subjectAltName IP:127.0.0.1, DNS:localhost
#   client.pem client.key         signed by it; for mutual TLS
#   elsewhere.pem elsewhere.key   signed by it, but for IP:10.9.9.9 only (a host-name mismatch here)
#   rogue-ca.pem rogue.pem rogue.key   another CA and a certificate it signed for 127.0.0.1
# Usage: make_test_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
ca() {  # ca NAME CN
  openssl req -x509 "${ec[@]}" -keyout "$1.key" -out "$1.pem" -days 1 -subj "/CN=$2" 2> /dev/null
}
leaf() {  # leaf NAME CA SAN USAGE
  openssl req "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" 2> /dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days 1 \
    -extfile "$1.ext" 2> /dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca kvmesh-test-ca
ca rogue-ca kvmesh-rogue-ca
leaf node ca "IP:127.0.0.1,DNS:localhost" "serverAuth,clientAuth"
leaf client ca "DNS:client" "clientAuth"
leaf elsewhere ca "IP:10.9.9.9" "serverAuth,clientAuth"
leaf rogue rogue-ca "IP:127.0.0.1,DNS:localhost" "serverAuth,clientAuth"
