#!/usr/bin/env bash
# Runs every test suite: go vet, the build, the Go tests, the Go tests of
# every package that starts goroutines under the race detector, and the
# Python tests in .venv/. A failing suite does not stop the others: the
# run ends with one line per suite and "suites: N passed, N failed", keeps
# each suite's log in test-logs/, and exits 1 if any suite failed.
#
# A Go test package that fails is run once more, alone, with just its
# failed tests. A test that passes then is reported as FLAKY in the summary
# and in test-logs/flaky.txt (a flaky test is a bug to fix: see
# docs/testing.md); it does not fail the run.
#
# Environment: FFKIT_TEST_SKIP_SETUP=1 skips scripts/setup.sh --test.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "${FFKIT_TEST_SKIP_SETUP:-}" != 1 ]; then
  bash scripts/setup.sh --test || { echo "test: scripts/setup.sh --test failed" >&2; exit 1; }
fi

logs=$root/test-logs
rm -rf "$logs"
mkdir -p "$logs"
: >"$logs/flaky.txt"

# The Go tests run python3 (pyarrow through the mount, DuckDB checks):
# they get the virtual environment's.
export PATH="$root/.venv/bin:$PATH"
bindir=$(mktemp -d)
trap 'rm -rf "$bindir"' EXIT
export FFKIT_TEST_BINARY="$bindir/ffkit"

results=()
failed=0
passed=0

# gotest NAME ARGS...: go test with ARGS; failed packages are retried once
# with only their failed tests.
gotest() {
  local name=$1; shift
  local log=$logs/$name.log
  go test -count=1 "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] && return 0
  # Packages that failed, and their failed top-level tests.
  local pkgs
  pkgs=$(awk '$1=="FAIL" && NF>=2 && $2 !~ /^\[/ {print $2}' "$log" | sort -u)
  if [ -z "$pkgs" ]; then
    echo "test: $name failed without a failing package (build error?)" >>"$log"
    return 1
  fi
  # The flags: every argument but the package patterns (./...).
  local flags=()
  for a in "$@"; do
    case "$a" in ./*) ;; *) flags+=("$a") ;; esac
  done
  local ok=0
  for p in $pkgs; do
    local tests
    tests=$(awk -v p="$p" '
      /^=== RUN/ {next}
      /^--- FAIL: / {split($3, a, "/"); t[a[1]]=1}
      ($1=="FAIL" || $1=="ok") && NF>=2 { if ($2 == p) { for (k in t) printf "%s|", k; exit } ; delete t }
    ' "$log" | sed 's/|$//')
    local run=()
    [ -n "$tests" ] && run=(-run "^(${tests})\$")
    echo "=== RETRY $p ${tests:-(whole package)}" >>"$log"
    if go test -count=1 "${flags[@]}" "${run[@]}" "$p" >>"$log" 2>&1; then
      echo "$name: $p: ${tests:-package} failed, then passed alone" >>"$logs/flaky.txt"
    else
      ok=1
    fi
  done
  return $ok
}

suite() {
  local name=$1; shift
  local start=$SECONDS
  echo "== $name: $*" >&2
  if "$@"; then
    passed=$((passed + 1)); results+=("PASS $name ($((SECONDS - start)) s)")
  else
    failed=$((failed + 1)); results+=("FAIL $name ($((SECONDS - start)) s): see test-logs/$name.log")
    tail -n 40 "$logs/$name.log" >&2
  fi
}

vet() { go vet ./... >"$logs/vet.log" 2>&1; }
build() { go build -o "$FFKIT_TEST_BINARY" ./cmd/ffkit >"$logs/build.log" 2>&1; }
# Every package that starts goroutines, under the race detector. -short
# keeps the long stress and simulation runs to the plain suite.
race_pkgs=(./ffrecord/... ./loader/... ./internal/... ./scan/... ./bench/... ./fs/localfs/
  ./fs/transport/ ./fs/mgmtd/ ./fs/storage/... ./fs/client/ ./fs/kv/... ./fs/meta/ ./fs/clusterfs/ ./fs/fuse/...)
[ -d pack ] && race_pkgs+=(./pack/...)
# A hung Python test must not hang the run: the suite gets 20 minutes (it
# takes about one), then it is stopped and fails.
python_tests() {
  timeout -k 30s 20m .venv/bin/python -m pytest -q python/tests >"$logs/python.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "test: the python suite did not finish in 20 minutes (a hung test)" >>"$logs/python.log"
  return $rc
}

suite vet vet
suite build build
suite go gotest go -timeout 25m ./...
suite race gotest race -race -short -timeout 20m "${race_pkgs[@]}"
suite python python_tests

echo
echo "== summary"
for r in "${results[@]}"; do echo "$r"; done
if [ -s "$logs/flaky.txt" ]; then
  echo "FLAKY (failed, then passed alone; see test-logs/flaky.txt):"
  sed 's/^/  /' "$logs/flaky.txt"
fi
echo "suites: $passed passed, $failed failed"
[ $failed -eq 0 ]
