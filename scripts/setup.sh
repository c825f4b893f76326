#!/usr/bin/env bash
# Installs everything ffkit needs on a fresh Debian machine with Go and
# Python, then builds the ffkit binary into ./bin. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in fio fuse3 chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# pyarrow: the FUSE tests read a Parquet file through the mount with it.
python3 -c 'import pyarrow' 2>/dev/null || python3 -m pip install -q pyarrow

echo "setup: building ffkit" >&2
mkdir -p bin
go build -o bin/ffkit ./cmd/ffkit

if [ -f python/pyproject.toml ]; then
  echo "setup: installing the Python package" >&2
  python3 -m pip install -q ./python
  # Test dependencies of python/tests: pytest, torch + torchdata for the
  # PyTorch integration tests (PyPI's torch wheel, about 1-2 minutes), and
  # pyarrow for ffkit.scan.
  python3 -c "import pytest, torch, torchdata, pyarrow" >/dev/null 2>&1 ||
    python3 -m pip install -q pytest torch torchdata pyarrow
fi
