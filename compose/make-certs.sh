#!/bin/sh
# A CA and the NATS servers' certificate for the compose stack (and the tests):
#   ./make-certs.sh DIR [NAME...]     (names: DNS names of the servers; default nats nats-2 nats-3 localhost)
# Writes DIR/ca.pem (give it to every client as NATS_CA), DIR/server-cert.pem, DIR/server-key.pem
# (serverAuth + clientAuth: the cluster routes use it both ways), each key 0600 in a 0700 DIR.
# DIR/ca-key.pem signs certificates every client trusts: move it off the host (the deployment
# guide's step tls-creds). To renew the server's certificate with that CA later, bring it back:
#   CA_KEY=/path/to/ca-key.pem ./make-certs.sh DIR [NAME...]   (DIR/ca.pem kept)
set -eu
umask 077
dir=${1:?usage: make-certs.sh DIR [NAME...]}
shift
[ $# -gt 0 ] || set -- nats nats-2 nats-3 localhost
mkdir -p "$dir" && chmod 700 "$dir"
sans="IP:127.0.0.1"
for n in "$@"; do sans="$sans,DNS:$n"; done
days=825
if [ -n "${CA_KEY:-}" ]; then
  [ -f "$CA_KEY" ] && [ -f "$dir/ca.pem" ] || { echo "CA_KEY=$CA_KEY: needs that key and $dir/ca.pem" >&2; exit 2; }
  cakey=$CA_KEY
else
  cakey="$dir/ca-key.pem"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=PowerGuard NATS CA" -keyout "$cakey" -out "$dir/ca.pem" 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
  -keyout "$dir/server-key.pem" -out "$dir/server.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' "$sans" > "$dir/server.ext"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$cakey" -CAcreateserial \
  -days "$days" -extfile "$dir/server.ext" -out "$dir/server-cert.pem" 2>/dev/null
rm -f "$dir/server.csr" "$dir/server.ext" "$dir/ca.srl"
chmod 600 "$dir"/*-key.pem
chmod 644 "$dir/ca.pem" "$dir/server-cert.pem"
echo "wrote $dir/ca.pem, $dir/server-cert.pem, $dir/server-key.pem ($*)"
if [ -z "${CA_KEY:-}" ]; then
  echo "$dir/ca-key.pem signs certificates every client trusts: move it off this host (keep it offline)" >&2
fi
