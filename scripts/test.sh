#!/usr/bin/env bash
# Runs every test: Go (with the race detector on the concurrent packages)
# and, when the Python package exists, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
go vet ./...
# The CLI and system tests run the real binary: build it once for all of them.
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
go build -o "$bindir/ffkit" ./cmd/ffkit
export FFKIT_TEST_BINARY="$bindir/ffkit"
go test -count=1 -timeout 20m ./...
go test -race -count=1 -timeout 5m ./bench/
go test -race -count=1 -timeout 5m ./fs/transport/ ./fs/mgmtd/ ./fs/storage/ ./fs/client/
go test -race -short -count=1 -timeout 10m ./fs/kv/... ./fs/meta/ ./fs/clusterfs/
go test -race -short -count=1 -timeout 5m ./fs/fuse/
if [ -f python/pyproject.toml ]; then
  python3 -m pytest -q python/tests
fi
