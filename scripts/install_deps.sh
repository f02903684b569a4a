#!/bin/sh
# Install the Debian packages llmtrain needs (idempotent: does nothing when
# they are present). Needs root or sudo.
#   scripts/install_deps.sh demo   what make demo needs: the build, and
#                                  numpy and matplotlib for the data and plot
#   scripts/install_deps.sh        what make test needs: the demo's, and the
#                                  tests' references, readers and clusters;
#                                  then from PyPI pyarrow and tokenizers (not
#                                  Debian's: test_prepare.sh's Parquet and BPE)
set -e
DEMO="build-essential libcjson-dev libopenblas-dev libopenmpi-dev openmpi-bin python3-numpy python3-matplotlib"
TESTS="python3-torch python3-protobuf python3-crcmod python3-pip iproute2 slurmctld slurmd slurm-client munge"
case "${1:-test}" in
    demo) PKGS="$DEMO" ;;
    test) PKGS="$DEMO $TESTS" ;;
    *) echo "usage: scripts/install_deps.sh [demo|test]" >&2; exit 2 ;;
esac
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
if [ -n "$missing" ]; then
    echo "installing:$missing"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi
# pinned to builds for Debian's numpy 1.24 (a newer pyarrow needs numpy 2)
if [ "${1:-test}" = test ] && ! /usr/bin/python3 -c 'import pyarrow, tokenizers' 2>/dev/null; then
    echo "installing from PyPI: pyarrow 16.1.0, tokenizers 0.23.3"
    $SUDO /usr/bin/python3 -m pip install -q --break-system-packages pyarrow==16.1.0 tokenizers==0.23.3
fi
