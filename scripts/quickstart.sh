#!/usr/bin/env bash
# Sets up a fresh machine and runs ffkit's main job end to end: generate a
# small dataset, pack it into FFRecord shards, verify it, read random
# batches and print the throughput.
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
echo "== ffkit bench read" >&2
bin/ffkit bench read "$work/ds" --batch-size 256 --duration 3s
