#!/usr/bin/env bash
# Installs what ffkit needs on a fresh Debian machine that has Go, builds
# bin/ffkit, and installs the Python package into a virtual environment in
# the checkout (.venv/). It never runs pip outside that environment, so it
# works with Debian's own Python, which refuses system-wide installs
# (PEP 668). Idempotent: a second run installs nothing new.
#
#   scripts/setup.sh          what ffkit and the quickstart need
#   scripts/setup.sh --test   also what the test suites need
set -euo pipefail
cd "$(dirname "$0")/.."

test_deps=false
case "${1:-}" in
  "") ;;
  --test) test_deps=true ;;
  *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

if ! command -v go >/dev/null 2>&1; then
  echo "setup: Go is not on PATH: install Go 1.26 (https://go.dev/dl/) and run this again" >&2
  exit 1
fi

# System packages: fio is the benchmarks' baseline, fuse3 the mount,
# python3-venv the virtual environment below. The tests also use
# chromium (rendering HTML reports), stress-ng (load), iproute2 and
# iptables (network namespaces), rsync and git (tools on the mount).
apt_pkgs=(fio fuse3 python3-venv)
if $test_deps; then
  apt_pkgs+=(chromium stress-ng iproute2 iptables rsync git)
fi
need_apt=()
for pkg in "${apt_pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]}" >&2
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >/dev/null
    $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: not a Debian system: install ${need_apt[*]} yourself" >&2
  fi
fi

echo "setup: building bin/ffkit" >&2
mkdir -p bin
go build -o bin/ffkit ./cmd/ffkit

# The Python side lives in .venv/ (python3 -m venv).
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating the virtual environment $venv" >&2
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
echo "setup: installing the Python package into $venv" >&2
"$py" -m pip install -q ./python
if [ -f python/compat/pyproject.toml ]; then
  "$py" -m pip install -q ./python/compat
fi
if $test_deps; then
  # pytest; torch and torchdata for the PyTorch tests; pyarrow, pandas and
  # duckdb for the scan tests and the FUSE Parquet test; webdataset for
  # the WebDataset round trips; hatchling for the build-hook test; ray for the DataFrame's Ray executor.
  mods="pytest torch torchdata pyarrow pandas duckdb webdataset hatchling ray"
  if ! "$py" -c "import pytest, torch, torchdata, pyarrow, pandas, duckdb, webdataset, hatchling, ray" >/dev/null 2>&1; then
    echo "setup: installing the test dependencies into $venv (torch takes a few minutes)" >&2
    "$py" -m pip install -q $mods
  fi
fi
echo "setup: done (binary bin/ffkit, Python $venv/bin/python)" >&2
