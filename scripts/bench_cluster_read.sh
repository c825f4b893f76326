#!/usr/bin/env bash
# Reads from the bundled file system against the same data on local disk:
# brings a cluster up (ffkit fs up: embedded etcd, 3 storage processes, 3
# replicas), packs one generated dataset both locally and onto the
# cluster, runs `ffkit bench read` on each in the same run, and prints the
# cluster/local ratio. Usage: scripts/bench_cluster_read.sh [SAMPLES] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-6000}
dur=${2:-6s}
work=$(mktemp -d)
up=""
trap '[ -n "$up" ] && kill "$up" 2>/dev/null; [ -n "$up" ] && wait "$up" 2>/dev/null; rm -rf "$work"' EXIT
bin=${FFKIT_BIN:-$work/ffkit}
[ -x "$bin" ] || go build -o "$bin" ./cmd/ffkit
python3 - "$work/src" "$n" <<'PY'
import os, random, sys
d, n = sys.argv[1], int(sys.argv[2]); os.makedirs(d)
r = random.Random(2)
for i in range(n):
    with open(os.path.join(d, f"{i:06d}.bin"), "wb") as f:
        f.write(r.randbytes(r.randint(2000, 30000)))
PY
"$bin" fs up --dir "$work/cluster" >"$work/up.out" 2>"$work/up.err" &
up=$!
for _ in $(seq 240); do
    [ -s "$work/up.out" ] && break
    kill -0 "$up" 2>/dev/null || { cat "$work/up.err" >&2; exit 1; }
    sleep 0.5
done
url=$(head -n 1 "$work/up.out")
"$bin" pack "$work/src" -o "$work/local" --shard-size 64M >&2
"$bin" pack "$work/src" -o "$url/ds" --shard-size 64M >&2
"$bin" --json bench read "$work/local" --duration "$dur" >"$work/local.json"
"$bin" --json bench read "$url/ds" --duration "$dur" >"$work/cluster.json"
python3 - "$work/local.json" "$work/cluster.json" <<'PY'
import json, sys
l, c = (json.load(open(p)) for p in sys.argv[1:3])
print(f"local disk  ffkit ReadBatch {l['samples_per_s']:>10.0f} samples/s {l['mib_s']:>8.1f} MiB/s  ({l.get('cache', '')})")
print(f"cluster     ffkit ReadBatch {c['samples_per_s']:>10.0f} samples/s {c['mib_s']:>8.1f} MiB/s  ({c.get('cache', '')})")
print(f"ratio cluster/local: {c['samples_per_s'] / l['samples_per_s']:.2f}")
PY
