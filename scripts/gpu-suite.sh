#!/usr/bin/env bash
# The whole GPU proof in one device call, from the repository root, on the lent H200:
#
#     bash .gpu/install.sh && bash scripts/gpu-suite.sh
#
# (after the chunk calls of ../shared/gpu/README.md have installed the stack into /tmp/site).
# Writes into $OUT: env.txt, gpu-tests.log, gpu-junit.xml, corpus-diff.md, bench-read.log, read.json, read.md,
# bench-remote-{http,s3}.log, remote-{http,s3}.json and .md, bench-shuffle.log, shuffle.json, shuffle.md, bench-etl.log, etl.json, etl.md, and prints the
# short tables last. Each part has its own time limit and a failing part does not stop the next;
# the whole run stays under 9.5 minutes, a device call's limit: each benchmark gets at most what
# the parts before it leave, and one left under a minute is reported as not run. Exit status: 0
# only if every part that ran passed. Skip parts with SKIP_TESTS=1, SKIP_READ=1, SKIP_REMOTE=1,
# SKIP_SHUFFLE=1, SKIP_ETL=1. On one H200 the tests alone took 6-8 minutes (2026-12-05: 372 s on
# one machine, about 480 s on another), the read benchmarks about 3 and the 256-file ETL sweep 5,
# so the whole proof takes three calls:
#
#     SKIP_READ=1 SKIP_REMOTE=1 SKIP_SHUFFLE=1 SKIP_ETL=1 bash scripts/gpu-suite.sh   # the tests
#     SKIP_TESTS=1 SKIP_SHUFFLE=1 SKIP_ETL=1 bash scripts/gpu-suite.sh   # bench read (and remote)
#     SKIP_TESTS=1 SKIP_READ=1 SKIP_REMOTE=1 bash scripts/gpu-suite.sh   # bench shuffle, bench etl
set -uo pipefail

OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/lent-machine.sh"  # PYTHONPATH, multicast off
BENCH_DIR=${BENCH_DIR:-/var/tmp/dask-gpudirect-bench}    # a disk, not tmpfs: the cache is dropped
BINARY_GIB=${BINARY_GIB:-8}
PARQUET_GIB=${PARQUET_GIB:-3}
BENCH_TARGET=${BENCH_TARGET:-device}                      # host: exercise the script on a CPU machine
TESTS_LIMIT=${TESTS_LIMIT:-540}                         # seconds, the tests
BENCH_LIMIT=${BENCH_LIMIT:-260}                         # seconds at most, each read benchmark
# BENCH_ARGS: more options for `bench read`, e.g. "--threads-per-worker 4 --rmm-pool-size 40GB"
SUITE_LIMIT=${SUITE_LIMIT:-565}                         # seconds for the whole script (9.5 min: 570)
SHUFFLE_GIB=${SHUFFLE_GIB:-8}
SHUFFLE_WORKERS=${SHUFFLE_WORKERS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[[ $SHUFFLE_WORKERS -ge 1 ]] || SHUFFLE_WORKERS=2        # no GPU: the host target's two workers
SHUFFLE_PROTOCOL=${SHUFFLE_PROTOCOL:-ucxx}
SHUFFLE_RMM_POOL=${SHUFFLE_RMM_POOL:-40GB}               # per worker, as in FACTS.md's Dask shuffles
# SHUFFLE_LIMIT: seconds for `bench shuffle` (default and cap: what SUITE_LIMIT leaves it)
# SHUFFLE_ARGS: more options for `bench shuffle`, e.g. "--method-timeout 200 --repeat 2"
# SHUFFLE_WORKERS above the GPU count shares the GPUs (two workers on one H200 stand in for x2)
GPU_TESTS=${GPU_TESTS:-tests/gpu}                       # test paths, e.g. tests/gpu/test_shuffle_device.py
SKIP_UCX_INFO=${SKIP_UCX_INFO:-0}
SKIP_TESTS=${SKIP_TESTS:-0}
SKIP_READ=${SKIP_READ:-0}
SKIP_REMOTE=${SKIP_REMOTE:-0}
REMOTE_GIB=${REMOTE_GIB:-1}                               # each format, for bench read --remote
REMOTE_STORES=${REMOTE_STORES:-http s3}                   # s3: moto's server (scripts/gpu-moto-wheels.sh)
# REMOTE_ARGS: more options for `bench read --remote`, e.g. "--threads-per-worker 4"
SKIP_SHUFFLE=${SKIP_SHUFFLE:-0}
SKIP_ETL=${SKIP_ETL:-0}
ETL_GIB=${ETL_GIB:-8}                                     # in memory; 256 files, as issue 14 asks
ETL_FILES=${ETL_FILES:-256}
ETL_KEYS=${ETL_KEYS:-1024,65536,16777216}                 # the group-by key's distinct values, swept
# ETL_ARGS: more options for `bench etl`, e.g. "--repeat 1 --methods gpudirect,polars"
start=$SECONDS
# The seconds a part may run: at most $1, and no more than the suite leaves it (10 s for
# timeout -k, 5 for the summary).
budget() {
  local left=$((SUITE_LIMIT - (SECONDS - start) - 15))
  echo $(( $1 < left ? $1 : left ))
}

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
             "click", "rich", "pytest", "pytest-timeout", "rapidsmpf-cu13", "cudf-streaming-cu13",
             "cudf-polars-cu13", "polars"]:
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
PY
} > "$OUT/env.txt" 2>&1
[[ -d /tmp/site/cudf ]] || echo "WARNING: /tmp/site has no cudf: run the install calls first" | tee -a "$OUT/env.txt"

# --- 1. the GPU test suite -------------------------------------------------------------------
tests_rc=skipped
if [[ $SKIP_TESTS != 1 ]]; then
  tests_limit=$(budget "$TESTS_LIMIT")
  echo "== GPU tests (limit ${tests_limit}s) =="
  timeout -s INT -k 10 "$tests_limit" \
    python3 -m pytest -m gpu $GPU_TESTS --maxfail=15 -q -ra --junitxml="$OUT/gpu-junit.xml" \
    2>&1 | tee "$OUT/gpu-tests.log"
  tests_rc=${PIPESTATUS[0]}
  echo "== GPU tests: exit $tests_rc after $((SECONDS - start))s =="
fi

# --- 1a. where cuDF and pyarrow read the public corpus differently (scripts/parquet-corpus.sh,
# carried as .corpus; the GPU tests above check dg against cuDF on the same files) -------------
if [[ $SKIP_TESTS != 1 && -d .corpus/parquet-testing/data ]]; then
  echo "== cuDF against pyarrow over the Parquet corpus =="
  timeout -s INT -k 10 120 python3 scripts/parquet-corpus-diff.py > "$OUT/corpus-diff.md" 2>&1
  head -3 "$OUT/corpus-diff.md"
fi

# --- 2. the read benchmark at the real sizes -------------------------------------------------
bench_rc=skipped
limit=$(budget "$BENCH_LIMIT")
if [[ $SKIP_READ != 1 ]] && (( limit < 60 )); then
  echo "== bench read: not run, ${limit}s left; run it alone: SKIP_TESTS=1 =="
  bench_rc="not run (${limit}s left)"
elif [[ $SKIP_READ != 1 ]]; then
  echo "== bench read: ${BINARY_GIB} GiB binary, ${PARQUET_GIB} GiB Parquet (limit ${limit}s) =="
  timeout -s INT -k 10 "$limit" \
    python3 -m dask_gpudirect.bench read --target "$BENCH_TARGET" \
      --binary-gib "$BINARY_GIB" --parquet-gib "$PARQUET_GIB" --files 8 --workers 1 \
      --protocol tcp --drop-cache --dir "$BENCH_DIR" \
      --json "$OUT/read.json" --markdown "$OUT/read.md" ${BENCH_ARGS:-} \
    > "$OUT/bench-read.log" 2>&1
  bench_rc=$?
  echo "== bench read: exit $bench_rc after $((SECONDS - start))s (log: bench-read.log) =="
fi

# --- 2b. the read benchmark from object storage (each of REMOTE_STORES: http, s3): dg against
# cudf.read_parquet(url) and dask_cudf ---------------------------------------------------------
remote_rc=skipped
remote_each=""  # each store's own status, for the summary
if [[ $SKIP_REMOTE != 1 ]]; then
  remote_rc=0
  for store in $REMOTE_STORES; do
    if [[ $store == s3 ]] && ! python3 -c "import boto3, moto.server" 2>/dev/null; then
      echo "== bench read --remote s3: not run, no moto here (scripts/gpu-moto-wheels.sh) =="
      [[ $remote_rc != 0 ]] || remote_rc="not run (no moto)"
      remote_each+="${remote_each:+, }$store: not run (no moto)"
      continue
    fi
    limit=$(budget "$BENCH_LIMIT")
    if (( limit < 60 )); then
      echo "== bench read --remote $store: not run, ${limit}s left =="
      [[ $remote_rc != 0 ]] || remote_rc="not run (${limit}s left)"  # a failure stays
      remote_each+="${remote_each:+, }$store: not run (${limit}s left)"
      continue
    fi
    echo "== bench read --remote $store: ${REMOTE_GIB} GiB each over loopback (limit ${limit}s) =="
    timeout -s INT -k 10 "$limit" \
      python3 -m dask_gpudirect.bench read --remote "$store" --target "$BENCH_TARGET" \
        --binary-gib "$REMOTE_GIB" --parquet-gib "$REMOTE_GIB" --files 16 --workers 1 \
        --dir "$BENCH_DIR/remote" --json "$OUT/remote-$store.json" \
        --markdown "$OUT/remote-$store.md" ${REMOTE_ARGS:-} > "$OUT/bench-remote-$store.log" 2>&1
    rc=$?
    (( rc == 0 )) || remote_rc=$rc
    remote_each+="${remote_each:+, }$store: exit $rc"
    echo "== bench read --remote $store: exit $rc after $((SECONDS - start))s (log: bench-remote-$store.log) =="
  done
fi

# --- 1b. UCX's own report of the transports a small dg.shuffle used --------------------------
# UCX_PROTO_INFO=y makes every worker print the protocol and transport UCX chose per endpoint
# and message kind; kept are the lines about GPU memory (cuda_ipc = NVLink/peer copy).
if [[ $SKIP_TESTS != 1 && $SKIP_UCX_INFO != 1 && $BENCH_TARGET == device ]]; then
  echo "== UCX transports of a 0.25 GiB dg.shuffle (UCX_PROTO_INFO=y) =="
  UCX_PROTO_INFO=y timeout -s INT -k 10 120 \
    python3 -m dask_gpudirect.bench shuffle --gib 0.25 --methods gpudirect --repeat 1 \
      --protocol ucxx --workers "$SHUFFLE_WORKERS" > "$OUT/ucx-proto-info.log" 2>&1
  grep -E "^\[[0-9.]+\] .*(cuda|GPU)" "$OUT/ucx-proto-info.log" | sed -E 's/^\[[0-9.]+\] \[[^]]*\] *//' \
    | sort | uniq -c | sort -rn > "$OUT/ucx-transports.txt"
  head -20 "$OUT/ucx-transports.txt"
fi

# --- 3. the shuffle benchmark: dg.shuffle, Dask's two shuffles, a raw transfer -----------------
shuffle_rc=skipped
if [[ $SKIP_SHUFFLE != 1 ]]; then
  limit=$(budget "${SHUFFLE_LIMIT:-$SUITE_LIMIT}")
  if (( limit < 60 )); then
    echo "== bench shuffle: not run, ${limit}s left; run it alone: SKIP_TESTS=1 SKIP_READ=1 SKIP_REMOTE=1 =="
    shuffle_rc="not run (${limit}s left)"
  else
    echo "== bench shuffle: ${SHUFFLE_GIB} GiB, ${SHUFFLE_WORKERS} worker(s), ${SHUFFLE_PROTOCOL} (limit ${limit}s) =="
    (( limit < 240 )) && echo "   (${limit}s may not fit every method at ${SHUFFLE_GIB} GiB: SKIP_TESTS=1 SKIP_READ=1 SKIP_REMOTE=1 gives it the whole run)"
    rmm=()
    [[ $BENCH_TARGET == device ]] && rmm=(--rmm-pool-size "$SHUFFLE_RMM_POOL")
    timeout -s INT -k 10 "$limit" \
      python3 -m dask_gpudirect.bench shuffle --target "$BENCH_TARGET" \
        --gib "$SHUFFLE_GIB" --workers "$SHUFFLE_WORKERS" --protocol "$SHUFFLE_PROTOCOL" \
        ${rmm[@]+"${rmm[@]}"} --time-limit "$((limit - 5))" \
        --json "$OUT/shuffle.json" --markdown "$OUT/shuffle.md" ${SHUFFLE_ARGS:-} \
      > "$OUT/bench-shuffle.log" 2>&1
    shuffle_rc=$?
    echo "== bench shuffle: exit $shuffle_rc after $((SECONDS - start))s (log: bench-shuffle.log) =="
  fi
fi

# --- 4. the ETL benchmark: Parquet -> shuffle -> group-by, dg against dask_cudf ----------------
etl_rc=skipped
if [[ $SKIP_ETL != 1 ]]; then
  limit=$(budget "$SUITE_LIMIT")
  if (( limit < 60 )); then
    echo "== bench etl: not run, ${limit}s left; run it alone: SKIP_TESTS=1 SKIP_READ=1 SKIP_REMOTE=1 SKIP_SHUFFLE=1 =="
    etl_rc="not run (${limit}s left)"
  else
    echo "== bench etl: ${ETL_GIB} GiB in ${ETL_FILES} files, ${SHUFFLE_WORKERS} worker(s) (limit ${limit}s) =="
    rmm=()
    [[ $BENCH_TARGET == device ]] && rmm=(--rmm-pool-size "$SHUFFLE_RMM_POOL")
    timeout -s INT -k 10 "$limit" \
      python3 -m dask_gpudirect.bench etl --target "$BENCH_TARGET" --dir "$BENCH_DIR/etl" \
        --gib "$ETL_GIB" --files "$ETL_FILES" --keys "$ETL_KEYS" --workers "$SHUFFLE_WORKERS" \
        --protocol "$SHUFFLE_PROTOCOL" ${rmm[@]+"${rmm[@]}"} --no-progress \
        --json "$OUT/etl.json" --markdown "$OUT/etl.md" ${ETL_ARGS:-} \
      > "$OUT/bench-etl.log" 2>&1
    etl_rc=$?
    echo "== bench etl: exit $etl_rc after $((SECONDS - start))s (log: bench-etl.log) =="
  fi
fi

# --- the short tables, last ------------------------------------------------------------------
echo
if [[ $tests_rc == skipped ]]; then
  echo "GPU tests: skipped (SKIP_TESTS=1)"
else
  echo "GPU tests: exit $tests_rc: $(grep -E '(passed|failed|error|skipped)' "$OUT/gpu-tests.log" | tail -1)"
fi
echo "bench read: exit $bench_rc; bench read --remote: exit $remote_rc${remote_each:+ ($remote_each)}; bench shuffle: exit $shuffle_rc; bench etl: exit $etl_rc;" \
  "total $((SECONDS - start))s"
show() {  # the Markdown a benchmark wrote, else the end of its log
  if [[ -s $OUT/$1.md ]]; then
    cat "$OUT/$1.md"
  else
    echo "no $1.md: the end of bench-$1.log:"
    tail -40 "$OUT/bench-$1.log"
  fi
}
[[ $bench_rc == skipped || $bench_rc == "not run"* ]] || show read
if [[ $remote_rc != skipped ]]; then
  for store in $REMOTE_STORES; do [[ ! -e $OUT/bench-remote-$store.log ]] || show "remote-$store"; done
fi
[[ $shuffle_rc == skipped || $shuffle_rc == "not run"* ]] || show shuffle
[[ $etl_rc == skipped || $etl_rc == "not run"* ]] || show etl
ok() { [[ $1 == 0 || $1 == skipped || $1 == "not run"* ]]; }
ok "$tests_rc" && ok "$bench_rc" && ok "$remote_rc" && ok "$shuffle_rc" && ok "$etl_rc"
