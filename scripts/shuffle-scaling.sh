#!/usr/bin/env bash
# How the cost of a shuffle grows with the partition count: `bench shuffle --partitions` of the
# same bytes at each count of PARTITIONS, dg.shuffle beside Dask's shuffles, each count in a fresh
# cluster. On the lent GPU machine (after the install calls of ../shared/gpu/README.md):
#
#     bash .gpu/install.sh && bash scripts/shuffle-scaling.sh
#
# and on a CPU machine (the host target): BENCH_TARGET=host GIB=0.25 PARTITIONS=8,512 bash ...
# DATA=array does the same for dg.shuffle_array against Dask's array shuffle (records of
# RECORD_BYTES).
# Writes $OUT/shuffle-scaling.{json,md,png,log}: few files, since a device call returns at most
# eight. The counts share TOTAL_LIMIT seconds, later ones getting what earlier ones leave.
set -uo pipefail

OUT=${OUT:-$PWD/scaling-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/lent-machine.sh"  # PYTHONPATH, multicast off
PYTHON=${PYTHON:-python3}
BENCH_TARGET=${BENCH_TARGET:-device}
GIB=${GIB:-8}
PARTITIONS=${PARTITIONS:-8,64,256,1024}
DATA=${DATA:-frame}
RECORD_BYTES=${RECORD_BYTES:-1024}
if [[ $DATA == array ]]; then
  METHODS=${METHODS:-gpudirect,tasks}
else
  METHODS=${METHODS:-gpudirect,tasks,p2p}
fi
TOTAL_LIMIT=${TOTAL_LIMIT:-560}
if [[ $BENCH_TARGET == device ]]; then
  ARGS=${ARGS:---rmm-pool-size 40GB --repeat 2 --method-timeout 100}
else
  ARGS=${ARGS:---repeat 2 --method-timeout 100}
fi
# shellcheck disable=SC2086
timeout -s INT -k 20 "$((TOTAL_LIMIT + 30))" "$PYTHON" -m dask_gpudirect.bench shuffle \
  --target "$BENCH_TARGET" --gib "$GIB" --partitions "$PARTITIONS" --methods "$METHODS" \
  --data "$DATA" --record-bytes "$RECORD_BYTES" \
  --time-limit "$TOTAL_LIMIT" --no-progress $ARGS --json "$OUT/shuffle-scaling.json" \
  --markdown "$OUT/shuffle-scaling.md" --plot "$OUT/shuffle-scaling.png" 2>&1 |
  tee "$OUT/shuffle-scaling.log"
