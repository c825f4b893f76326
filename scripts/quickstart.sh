#!/usr/bin/env bash
# Sets up a fresh machine and runs ffkit's main job end to end: generate a
# small dataset, pack it into FFRecord shards, verify it, load an epoch and
# read random batches with their throughput, first on the local disk, then
# on a bundled cluster (ffkit fs up, embedded etcd) that it starts and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== generating 20000 samples of 1-16 KiB in $work/src" >&2
python3 - "$work/src" <<'PY'
import os, random, sys
d = sys.argv[1]; os.makedirs(d)
r = random.Random(0)
for i in range(20000):
    with open(os.path.join(d, f"{i:06d}.bin"), "wb") as f:
        f.write(r.randbytes(r.randint(1024, 16384)))
PY
echo "== ffkit pack" >&2
bin/ffkit pack "$work/src" -o "$work/ds" --shard-size 64M
echo "== ffkit inspect" >&2
bin/ffkit inspect "$work/ds"
echo "== ffkit verify" >&2
bin/ffkit verify "$work/ds"
echo "== ffkit load: one shuffled epoch" >&2
bin/ffkit load "$work/ds" --batch-size 256 --shuffle --seed 1 --epochs 1
echo "== ffkit bench read" >&2
bin/ffkit bench read "$work/ds" --batch-size 256 --duration 3s

echo "== the same on the bundled file system: ffkit fs up (embedded etcd, 3 storage processes)" >&2
bin/ffkit fs up --dir "$work/cluster" >"$work/up.out" 2>"$work/up.err" &
up=$!
trap 'kill "$up" 2>/dev/null; wait "$up" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 240); do
    [ -s "$work/up.out" ] && break
    kill -0 "$up" 2>/dev/null || { cat "$work/up.err" >&2; exit 1; }
    sleep 0.5
done
url=$(head -n 1 "$work/up.out")
[ -n "$url" ] || { echo "quickstart: ffkit fs up did not come up in 120 s" >&2; cat "$work/up.err" >&2; exit 1; }
echo "== cluster at $url: pack, verify, load one epoch, bench read" >&2
bin/ffkit pack "$work/src" -o "$url/ds" --shard-size 64M
bin/ffkit verify "$url/ds"
bin/ffkit load "$url/ds" --batch-size 256 --shuffle --seed 1 --epochs 1
bin/ffkit bench read "$url/ds" --batch-size 256 --duration 3s
