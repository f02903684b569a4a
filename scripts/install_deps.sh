#!/bin/sh
# Install the Debian packages llmtrain needs (idempotent: does nothing when
# they are present). Needs root or sudo.
#   scripts/install_deps.sh demo   what make demo needs: the build, and
#                                  numpy and matplotlib for the data and plot
#   scripts/install_deps.sh        what make test needs: the demo's, and the
#                                  tests' references, readers and clusters;
#                                  then from PyPI pyarrow and tokenizers (not
#                                  Debian's: test_prepare.sh's Parquet and BPE),
#                                  and transformers in a venv, tests/.venv-hf
#                                  (test_transformers.py; skipped without it)
set -e
DEMO="build-essential libcjson-dev libopenblas-dev libopenmpi-dev openmpi-bin python3-numpy python3-matplotlib"
TESTS="python3-torch python3-protobuf python3-crcmod python3-pip python3-venv iproute2 slurmctld slurmd slurm-client munge"
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
# transformers 4.46.3 (a release that runs on Debian's torch 1.13 and has
# Mixtral) in a venv over the system's packages, so its tokenizers pin does
# not meet the one above; a failed download only skips that suite
VENV=tests/.venv-hf
if [ "${1:-test}" = test ] && ! "$VENV/bin/python" -c 'import transformers' 2>/dev/null; then
    echo "installing from PyPI into $VENV: transformers 4.46.3"
    if ! { /usr/bin/python3 -m venv --system-site-packages "$VENV" && "$VENV/bin/pip" install -q transformers==4.46.3; }; then
        echo "warning: transformers could not be installed; tests/test_transformers.py will be skipped" >&2
        rm -rf "$VENV"
    fi
fi
