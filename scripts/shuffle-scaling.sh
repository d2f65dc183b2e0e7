#!/usr/bin/env bash
# How the cost of a shuffle grows with the partition count: `bench shuffle` of the same bytes at
# each count of PARTITIONS, dg.shuffle beside Dask's task shuffle, each count in a fresh cluster.
# On the lent GPU machine (after the install calls of ../shared/gpu/README.md):
#
#     bash .gpu/install.sh && bash scripts/shuffle-scaling.sh
#
# and on a CPU machine (the host target): BENCH_TARGET=host GIB=0.25 PARTITIONS=8,512 bash ...
# Writes $OUT/shuffle-p<N>.json for each count, $OUT/shuffle-scaling.log (every run's output) and
# $OUT/shuffle-scaling.md (the table, also printed last): few files, since a device call returns at
# most eight. The counts share TOTAL_LIMIT seconds, later ones getting what earlier ones leave.
set -uo pipefail

OUT=${OUT:-$PWD/scaling-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
BENCH_TARGET=${BENCH_TARGET:-device}
GIB=${GIB:-8}
PARTITIONS=${PARTITIONS:-8,64,256,1024}
METHODS=${METHODS:-gpudirect,tasks}
TOTAL_LIMIT=${TOTAL_LIMIT:-560}
if [[ $BENCH_TARGET == device ]]; then
  ARGS=${ARGS:---rmm-pool-size 40GB --repeat 2 --method-timeout 100}
else
  ARGS=${ARGS:---repeat 2 --method-timeout 100}
fi
start=$SECONDS
IFS=, read -r -a counts <<< "$PARTITIONS"
for i in "${!counts[@]}"; do
  n=${counts[$i]}
  left=$((TOTAL_LIMIT - (SECONDS - start) - 10))
  limit=$((left / (${#counts[@]} - i)))
  (( limit >= 40 )) || { echo "== $n partitions: not run (time)"; continue; }
  echo "== bench shuffle --partitions $n (limit ${limit}s) =="
  # shellcheck disable=SC2086
  timeout -s INT -k 20 "$limit" "$PYTHON" -m dask_gpudirect.bench shuffle --target "$BENCH_TARGET" \
    --gib "$GIB" --partitions "$n" --methods "$METHODS" --no-progress $ARGS \
    --json "$OUT/shuffle-p$n.json" >> "$OUT/shuffle-scaling.log" 2>&1
  echo "   exit $?"
done

"$PYTHON" - "$OUT" "$PARTITIONS" "$METHODS" <<'PY' | tee "$OUT/shuffle-scaling.md"
import json, pathlib, sys

out, counts, methods = pathlib.Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(",")
rows, first = [], {}
for n in counts:
    path = out / f"shuffle-p{n}.json"
    result = json.loads(path.read_text()) if path.exists() else {"records": []}
    by = {r["key"]: r for r in result["records"]}
    cells = []
    for m in methods:
        r = by.get(m)
        if not r or r.get("status") != "ok":
            cells.append(f"{(r or {}).get('status', 'not run')}")
            continue
        first.setdefault(m, r["seconds"])
        cells.append(
            f"{r['seconds']:.2f} s ({r['gbps_per_gpu']:.2f} GB/s/GPU, "
            f"{r['seconds'] / first[m]:.1f} x)"
        )
    rows.append(f"| {n} | " + " | ".join(cells) + " |")
print(f"Shuffle of the same frame by partition count (median warm run; x: time over the first count's)\n")
print("| partitions | " + " | ".join(methods) + " |")
print("| --- | " + " | ".join("---" for _ in methods) + " |")
print("\n".join(rows))
PY
