#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh) and runs ffkit's main job end
# to end: generate a small dataset, pack it into FFRecord shards, verify
# it, load a shuffled epoch, read random batches beside a same-run plain
# pread baseline, and read it from Python; then the same on a bundled
# cluster (ffkit fs up: embedded metadata store, three storage processes)
# that it starts and stops.
#
# Everything it makes stays in quickstart-out/ (the dataset, the cluster's
# directory and logs, each step's output in steps/); the last line says
# what ran and whether everything passed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

out=$PWD/quickstart-out
rm -rf "$out"
mkdir -p "$out/steps"
ffkit=$PWD/bin/ffkit
py=$PWD/.venv/bin/python
up=""
cleanup() {
  if [ -n "$up" ]; then kill "$up" 2>/dev/null; wait "$up" 2>/dev/null; fi
  return 0
}
trap cleanup EXIT

# step NAME CMD...: runs CMD with its output in steps/NAME.out.
step() {
  local name=$1; shift
  echo "== $name: $*" >&2
  if ! "$@" >"$out/steps/$name.out" 2>"$out/steps/$name.err"; then
    cat "$out/steps/$name.out" "$out/steps/$name.err" >&2
    echo "quickstart: FAILED at $name (outputs in $out/steps/)" >&2
    exit 1
  fi
}
# field FILE KEY: a number from a JSON document.
field() { "$py" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))[sys.argv[2]]))' "$1" "$2"; }

echo "== generating 20000 samples of 1-16 KiB in $out/src" >&2
"$py" - "$out/src" <<'PY'
import os, random, sys
d = sys.argv[1]; os.makedirs(d)
r = random.Random(0)
for i in range(20000):
    with open(os.path.join(d, f"{i:06d}.bin"), "wb") as f:
        f.write(r.randbytes(r.randint(1024, 16384)))
PY

# run PREFIX DATASET [BENCH-READ-FLAGS...]: pack, verify, load and bench
# read one dataset.
run() {
  local p=$1 ds=$2
  shift 2
  step "$p-pack" "$ffkit" pack "$out/src" -o "$ds" --shard-size 64M
  step "$p-verify" "$ffkit" verify "$ds"
  step "$p-load" "$ffkit" load "$ds" --batch-size 256 --shuffle --seed 1 --epochs 1 --json
  step "$p-bench-read" "$ffkit" bench read "$ds" --batch-size 256 "$@" --json
}

# The local read check is the warm one (the dataset is read into the page
# cache before each phase), the case the pread baseline is the yardstick
# for: without --warm each phase starts from an evicted cache and refills it
# as it goes, and 2 s in 3 rounds on a shared machine swung 0.6-1.3x from
# run to run (docs/perf/loader.md, "The quickstart's read check").
run local "$out/ds" --warm --duration 6s --rounds 6 --warmup 200ms
step local-inspect "$ffkit" inspect "$out/ds"
step python "$py" -c '
import sys, ffkit
loader = ffkit.Loader(sys.argv[1], batch_size=256, shuffle=True, seed=1)
n = 0
for batch in loader:
    n += len(batch)
loader.close()
assert n == 20000, n
print("python: one shuffled epoch of", n, "samples")
' "$out/ds"

echo "== starting a cluster in $out/cluster (ffkit fs up)" >&2
"$ffkit" fs up --dir "$out/cluster" >"$out/steps/fs-up.out" 2>"$out/steps/fs-up.err" &
up=$!
for _ in $(seq 600); do
  [ -s "$out/steps/fs-up.out" ] && break
  kill -0 "$up" 2>/dev/null || { cat "$out/steps/fs-up.err" >&2; echo "quickstart: FAILED: ffkit fs up exited" >&2; exit 1; }
  sleep 0.5
done
url=$(head -n 1 "$out/steps/fs-up.out")
[ -n "$url" ] || { cat "$out/steps/fs-up.err" >&2; echo "quickstart: FAILED: ffkit fs up did not come up in 5 min" >&2; exit 1; }
run cluster "$url/ds" --duration 2s

s=$out/steps
echo "quickstart: ok: packed, verified and loaded 20000 samples locally and on a 3-node cluster" \
  "(outputs in quickstart-out/). local: load $(field "$s/local-load.out" samples_per_s) samples/s," \
  "warm ReadBatch $(field "$s/local-bench-read.out" samples_per_s) vs plain pread $(field "$s/local-bench-read.out" baseline_samples_per_s) samples/s (CRCs checked, median sample 8.5 KiB);" \
  "cluster: load $(field "$s/cluster-load.out" samples_per_s) samples/s," \
  "ReadBatch $(field "$s/cluster-bench-read.out" samples_per_s) vs pread $(field "$s/cluster-bench-read.out" baseline_samples_per_s) samples/s"
