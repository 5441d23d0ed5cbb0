#!/bin/sh
# Make the base image every PowerGuard image builds on, without a registry: a minimal Debian
# bookworm with python3 and ipmitool (power-control's IPMI transport; debootstrap), imported into the
# local Docker engine.
#   compose/build-base.sh [IMAGE]        (default local/powerguard-base:bookworm; needs root, debootstrap)
# The mirror is the one this machine's apt already uses (never hard-coded here).
set -eu
IMAGE=${1:-local/powerguard-base:bookworm}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then echo "$IMAGE exists"; exit 0; fi
MIRROR=$( (grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}';
           grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}') | grep -m1 '/debian/*$' || true)
[ -n "$MIRROR" ] || { echo "no Debian mirror in this machine's apt sources; set MIRROR" >&2; exit 1; }
ROOTFS=$(mktemp -d)
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,ipmitool bookworm "$ROOTFS" "$MIRROR"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import - "$IMAGE"
echo "built $IMAGE"
