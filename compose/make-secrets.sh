#!/bin/sh
# Create compose/secrets/ with random NATS passwords (one per service) and placeholders for the
# site's BMC/PDU/SNMP credentials (edit those). Never commit compose/secrets/.
set -eu
cd "$(dirname "$0")"
mkdir -p secrets && chmod 700 secrets
pw() { head -c 24 /dev/urandom | base64 | tr -d '/+=' ; }
: > secrets/nats.env
for s in ups_monitor coordinator power_control ckpt_agent observer; do
  p=$(pw); printf '%s' "$p" > "secrets/nats_$s"
  echo "NATS_PW_$(echo "$s" | tr a-z A-Z)=$p" >> secrets/nats.env
done
[ -f secrets/bmc_username ] || printf 'admin' > secrets/bmc_username
[ -f secrets/bmc_password ] || printf '%s' "$(pw)" > secrets/bmc_password
[ -f secrets/pdu_community ] || printf 'private' > secrets/pdu_community
[ -f secrets/snmp_community ] || printf 'public' > secrets/snmp_community
chmod 600 secrets/*
# compose (v1) mounts file secrets with their host owner and mode: let the images' user (uid 10001) read them
if [ "$(id -u)" = 0 ]; then chown 10001 secrets/nats_* secrets/bmc_* secrets/pdu_community secrets/snmp_community; fi
echo "wrote $(pwd)/secrets (edit bmc_*, pdu_community, snmp_community for your site)"
