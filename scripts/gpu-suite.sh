#!/usr/bin/env bash
# The whole GPU proof in one device call, from the repository root, on the lent H200:
#
#     bash .gpu/install.sh && bash scripts/gpu-suite.sh
#
# (after the chunk calls of ../shared/gpu/README.md have installed the stack into /tmp/site).
# Writes into $OUT: env.txt, gpu-tests.log, gpu-junit.xml, bench-read.log, read.json, read.md,
# and prints the short table last. Each part has its own time limit and a failing part does not
# stop the next; the whole run stays under 9 minutes. Exit status: 0 only if both parts passed.
set -uo pipefail

OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
BENCH_DIR=${BENCH_DIR:-/var/tmp/dask-gpudirect-bench}    # a disk, not tmpfs: the cache is dropped
BINARY_GIB=${BINARY_GIB:-8}
PARQUET_GIB=${PARQUET_GIB:-3}
BENCH_TARGET=${BENCH_TARGET:-device}                      # host: exercise the script on a CPU machine
TESTS_LIMIT=${TESTS_LIMIT:-220}                         # seconds, each part
BENCH_LIMIT=${BENCH_LIMIT:-260}
# BENCH_ARGS: more options for `bench read`, e.g. "--threads-per-worker 4 --rmm-pool-size 40GB"
start=$SECONDS

# --- the machine -----------------------------------------------------------------------------
{
  echo "# date -u"; date -u
  echo; echo "# nvidia-smi -L"; nvidia-smi -L 2>&1
  echo; echo "# nvidia-smi"; nvidia-smi 2>&1
  echo; echo "# uname -a"; uname -a
  echo; echo "# CPUs, memory"; nproc; free -g 2>&1
  mkdir -p "$BENCH_DIR"
  echo; echo "# bench data dir"; df -hT "$BENCH_DIR" 2>&1
  echo; echo "# /proc/driver/nvidia-fs (GPUDirect Storage)"; ls /proc/driver/nvidia-fs 2>&1
  echo; echo "# git"; git rev-parse HEAD 2>&1; git status --short 2>&1 | head -20
  echo; echo "# python and packages (PYTHONPATH=$PYTHONPATH)"
  python3 - <<'PY'
import importlib.metadata as md
import sys

print(sys.version)
for dist in ["dask", "distributed", "dask-cuda", "cudf-cu13", "pylibcudf-cu13", "dask-cudf-cu13",
             "libcudf-cu13", "kvikio-cu13", "libkvikio-cu13", "rmm-cu13", "cupy-cuda13x",
             "ucxx-cu13", "distributed-ucxx-cu13", "libucx-cu13", "pyarrow", "numpy", "pandas",
             "click", "rich", "pytest", "pytest-timeout"]:
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
PY
} > "$OUT/env.txt" 2>&1
[[ -d /tmp/site/cudf ]] || echo "WARNING: /tmp/site has no cudf: run the install calls first" | tee -a "$OUT/env.txt"

# --- 1. the GPU test suite -------------------------------------------------------------------
echo "== GPU tests (limit ${TESTS_LIMIT}s) =="
timeout -s INT -k 10 "$TESTS_LIMIT" \
  python3 -m pytest -m gpu tests/gpu --maxfail=15 -q -ra --junitxml="$OUT/gpu-junit.xml" \
  2>&1 | tee "$OUT/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
echo "== GPU tests: exit $tests_rc after $((SECONDS - start))s =="

# --- 2. the read benchmark at the real sizes -------------------------------------------------
echo "== bench read: ${BINARY_GIB} GiB binary, ${PARQUET_GIB} GiB Parquet (limit ${BENCH_LIMIT}s) =="
timeout -s INT -k 10 "$BENCH_LIMIT" \
  python3 -m dask_gpudirect.bench read --target "$BENCH_TARGET" \
    --binary-gib "$BINARY_GIB" --parquet-gib "$PARQUET_GIB" --files 8 --workers 1 \
    --protocol tcp --drop-cache --dir "$BENCH_DIR" \
    --json "$OUT/read.json" --markdown "$OUT/read.md" ${BENCH_ARGS:-} \
  > "$OUT/bench-read.log" 2>&1
bench_rc=$?
echo "== bench read: exit $bench_rc after $((SECONDS - start))s (log: bench-read.log) =="

# --- the short table, last -------------------------------------------------------------------
echo
echo "GPU tests: exit $tests_rc: $(grep -E '(passed|failed|error|skipped)' "$OUT/gpu-tests.log" | tail -1)"
echo "bench read: exit $bench_rc; total $((SECONDS - start))s"
if [[ -s $OUT/read.md ]]; then
  cat "$OUT/read.md"
else
  echo "no read.md: the end of bench-read.log:"
  tail -40 "$OUT/bench-read.log"
fi
[[ $tests_rc == 0 && $bench_rc == 0 ]]
