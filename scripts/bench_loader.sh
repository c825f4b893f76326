#!/usr/bin/env bash
# Measures `ffkit load` against same-run baselines (the loader's speed
# figures in the README come from here):
#   1. 4 KiB samples, O_DIRECT: fio 4 KiB random reads (io_uring, iodepth
#      64) on the same files, `ffkit bench read --direct` (random batches
#      through ffrecord's ReadBatch), and `ffkit load --direct --shuffle`
#      over several epochs; all verify checksums.
#   2. 4-64 KiB samples, O_DIRECT: `ffkit bench read` vs `ffkit load`.
# Rounds alternate the tools, so a noisy machine hits all of them alike.
# Usage: scripts/bench_loader.sh [WORKDIR] (default: a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/ffkit}
[ -x "$BIN" ] || go build -o "$BIN" ./cmd/ffkit
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}
EPOCHS=${EPOCHS:-2}
work=${1:-$(mktemp -d)}
mkdir -p "$work"

if [ ! -d "$work/k4" ]; then
  python3 - "$work/k4.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(131072):          # 512 MiB of 4 KiB samples
        f.write(("%08d" % i) * 512 + "\n")
PY
  "$BIN" pack "$work/k4.jsonl" -o "$work/k4" --shard-size 128M --align 4096 >&2
  rm -f "$work/k4.jsonl"
fi
if [ ! -d "$work/var" ]; then
  python3 - "$work/var.jsonl" <<'PY'
import random, sys
r = random.Random(1)
with open(sys.argv[1], "w") as f:
    for i in range(24000):           # ~800 MiB of 4-64 KiB samples
        f.write("x" * r.randint(4096, 65536) + "\n")
PY
  "$BIN" pack "$work/var.jsonl" -o "$work/var" --shard-size 256M >&2
  rm -f "$work/var.jsonl"
fi

get() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['$1']))"; }
ratio() { python3 -c "print('%.2f' % ($1/$2))"; }
files=$(ls "$work"/k4/*.ffr | tr '\n' ':' | sed 's/:$//')
engine=io_uring
fio --name=probe --filename="${files%%:*}" --rw=randread --bs=4k --direct=1 --ioengine=io_uring --size=1M --runtime=1 >/dev/null 2>&1 || engine=libaio

fio_iops() {
  fio --name=rr --filename="$files" --rw=randread --bs=4k --direct=1 --ioengine=$engine --iodepth="$1" \
    --runtime="$SECS" --time_based --group_reporting --output-format=json 2>/dev/null |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['read']['iops']))"
}

echo "== 4 KiB samples, --direct, batch 256 (fio: $engine, 4 KiB randread on the same files, iodepth 64 and 256)"
for r in $(seq "$ROUNDS"); do
  f64=$(fio_iops 64)
  br=$("$BIN" bench read "$work/k4" --direct --batch-size 256 --duration "${SECS}s" --json | get samples_per_s)
  ld=$("$BIN" load "$work/k4" --direct --shuffle --batch-size 256 --epochs "$EPOCHS" ${LOADARGS:-} --json | get samples_per_s)
  f256=$(fio_iops 256)
  best=$(( f64 > f256 ? f64 : f256 ))
  echo "round $r: fio qd64 $f64 / qd256 $f256 IOPS | bench read $br samples/s | load $ld samples/s | load/fio-best $(ratio "$ld" "$best") | load/bench-read $(ratio "$ld" "$br")"
done

echo "== 4-64 KiB samples, --direct, batch 64"
for r in $(seq "$ROUNDS"); do
  br=$("$BIN" bench read "$work/var" --direct --batch-size 64 --duration "${SECS}s" --json | get mib_s)
  ld=$("$BIN" load "$work/var" --direct --shuffle --batch-size 64 --epochs "$EPOCHS" ${LOADARGS:-} --json | get mib_per_s)
  echo "round $r: bench read $br MiB/s | load $ld MiB/s | load/bench-read $(ratio "$ld" "$br")"
done
