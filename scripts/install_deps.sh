#!/bin/sh
# Install the Debian packages llmtrain builds and tests with (idempotent:
# does nothing when they are present). Needs root or sudo.
set -e
PKGS="build-essential libcjson-dev libopenblas-dev libopenmpi-dev openmpi-bin python3-numpy python3-torch python3-matplotlib python3-protobuf python3-crcmod iproute2 slurmctld slurmd slurm-client munge"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
