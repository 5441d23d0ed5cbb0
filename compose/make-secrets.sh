#!/bin/sh
# Create compose/secrets/ for the stack (never commit it):
#   secrets/nats/       NATS identities from `powerguard creds init` (operator, account, resolver.conf,
#                       one .creds per service, one per training job: JOBS="demo-train other-job")
#   secrets/tls/        a CA and the NATS server certificate (make-certs.sh)
#   bmc_*, pdu_community, snmp_community: placeholders for the site's device credentials (edit those)
#   console_token: the operator console's password (basic auth, any user name)
# Needs the `powerguard` command (POWERGUARD=/path/to/.venv/bin/powerguard) and ./site.yaml.
set -eu
cd "$(dirname "$0")"
POWERGUARD=${POWERGUARD:-powerguard}
JOBS=${JOBS:-demo-train}
[ -f site.yaml ] || { echo "make-secrets.sh: create site.yaml first (cp site.example.yaml site.yaml)" >&2; exit 2; }
mkdir -p secrets && chmod 700 secrets
pw() { head -c 24 /dev/urandom | base64 | tr -d '/+=' ; }
if [ ! -f secrets/nats/account-signing.nk ]; then
  $POWERGUARD creds init --dir secrets/nats --config site.yaml
fi
for job in $JOBS; do
  [ -f "secrets/nats/agent-$job.creds" ] || $POWERGUARD creds issue --dir secrets/nats --job "$job"
done
[ -f secrets/tls/ca.pem ] || sh make-certs.sh secrets/tls nats nats-2 nats-3 localhost
[ -f secrets/bmc_username ] || printf 'admin' > secrets/bmc_username
[ -f secrets/bmc_password ] || printf '%s' "$(pw | cut -c1-20)" > secrets/bmc_password   # IPMI 2.0: at most 20 bytes
[ -f secrets/pdu_community ] || printf 'private' > secrets/pdu_community
[ -f secrets/snmp_community ] || printf 'public' > secrets/snmp_community
[ -f secrets/console_token ] || printf '%s' "$(pw)" > secrets/console_token   # the operator console's password
chmod 600 secrets/bmc_* secrets/pdu_community secrets/snmp_community secrets/console_token
# compose (v1) mounts file secrets with their host owner and mode: the services' user (uid 10001)
# reads its credential, the broker (uid 10002) its certificate and resolver.conf
if [ "$(id -u)" = 0 ]; then
  chown 10001 secrets/nats/*.creds secrets/bmc_* secrets/pdu_community secrets/snmp_community secrets/tls/ca.pem \
    secrets/console_token
  chown 10002 secrets/nats/resolver.conf secrets/tls/server-*.pem
  chmod 755 secrets secrets/nats secrets/tls
fi
echo "wrote $(pwd)/secrets (edit bmc_*, pdu_community, snmp_community for your site)"
