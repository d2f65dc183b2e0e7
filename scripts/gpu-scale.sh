#!/usr/bin/env bash
# Issue 8's scale run in one device call, from the repository root, on a lent H200 machine:
#
#     bash .gpu/install.sh && export PYTHONPATH=$PWD:/tmp/site && bash scripts/gpu-scale.sh
#
# (after the chunk calls of ../shared/gpu/README.md have installed the stack into /tmp/site).
# One worker per GPU over ucxx: `dask-gpudirect probe --local --json`, then `dask-gpudirect bench
# scale --gpus 1,<all GPUs>`: bench read and bench shuffle on one GPU and on all of them, each run
# a fresh process with its own time limit, the largest count first. Writes into $OUT (the machine
# sends back at most 8 files, so the runs' own JSON, Markdown and logs travel as one archive):
# env.txt, probe.json, gpu-scale.log, scale.json (every run's JSON inside), scale.md, scale.png,
# scale-runs.tar.gz; prints the short table last. The whole run stays under TOTAL_LIMIT seconds
# (540: 9 minutes); a failing part does not stop the next. Exit status: 0 only if the probe and
# every run passed. Sizes and options are variables, below.
#
# On a CPU machine, at a small size (LocalCluster worker processes instead of GPUs):
#
#     BENCH_TARGET=host bash scripts/gpu-scale.sh
set -uo pipefail

OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/lent-machine.sh"  # PYTHONPATH, multicast off
PYTHON=${PYTHON:-python3}
BENCH_TARGET=${BENCH_TARGET:-device}                    # host: exercise the script on a CPU machine
BENCH_DIR=${BENCH_DIR:-/var/tmp/dask-gpudirect-bench}    # bench read's data, kept and reused
RUNS_DIR=${RUNS_DIR:-/var/tmp/dask-gpudirect-scale-runs} # each run's files, archived into $OUT
TOTAL_LIMIT=${TOTAL_LIMIT:-540}                          # seconds for the whole script
PROBE_LIMIT=${PROBE_LIMIT:-90}
READ_LIMIT=${READ_LIMIT:-150}                            # seconds, each bench read run
SHUFFLE_LIMIT=${SHUFFLE_LIMIT:-210}                      # seconds, each bench shuffle run
SKIP_PROBE=${SKIP_PROBE:-0}
SCALE_BENCHES=${SCALE_BENCHES:-read,shuffle}
if [[ $BENCH_TARGET == device ]]; then
  GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  PROTOCOL=${PROTOCOL:-ucxx}
  BINARY_GIB=${BINARY_GIB:-8}
  PARQUET_GIB=${PARQUET_GIB:-3}
  SHUFFLE_GIB=${SHUFFLE_GIB:-8}
  READ_ARGS=${READ_ARGS:---threads-per-worker 4 --rmm-pool-size 40GB --repeat 3 --no-drop-cache --no-baselines}
  SHUFFLE_ARGS=${SHUFFLE_ARGS:---rmm-pool-size 40GB --repeat 2 --method-timeout 75}
  PROBE_ARGS=${PROBE_ARGS:-}
else
  GPUS=${GPUS:-2}                                        # host: worker processes
  PROTOCOL=${PROTOCOL:-tcp}
  BINARY_GIB=${BINARY_GIB:-0.002}
  PARQUET_GIB=${PARQUET_GIB:-0.002}
  SHUFFLE_GIB=${SHUFFLE_GIB:-0.002}
  READ_ARGS=${READ_ARGS:---repeat 1 --no-drop-cache --no-baselines}
  SHUFFLE_ARGS=${SHUFFLE_ARGS:---repeat 1 --raw-mib 4 --partitions 4}
  PROBE_ARGS=${PROBE_ARGS:---size 4MiB}
fi
(( GPUS >= 1 )) || { echo "no GPU visible: run with BENCH_TARGET=host"; exit 2; }
SCALE_GPUS=${SCALE_GPUS:-$( (( GPUS > 1 )) && echo "1,$GPUS" || echo 1)}
FILES=${FILES:-$(( 2 * GPUS > 8 ? 2 * GPUS : 8 ))}      # at least 2 files per worker
LOG=$OUT/gpu-scale.log
: > "$LOG"
start=$SECONDS

# --- the machine -----------------------------------------------------------------------------
{
  echo "# date -u"; date -u
  echo; echo "# nvidia-smi -L"; nvidia-smi -L 2>&1
  echo; echo "# nvidia-smi topo -m"; nvidia-smi topo -m 2>&1
  echo; echo "# nvidia-smi"; nvidia-smi 2>&1
  echo; echo "# uname -a"; uname -a
  echo; echo "# CPUs, memory"; nproc; free -g 2>&1
  mkdir -p "$BENCH_DIR"
  echo; echo "# bench data dir"; df -hT "$BENCH_DIR" 2>&1
  echo; echo "# multicast settings"; env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM|NVSHMEM_DISABLE_NVLS)' | sort
  echo; echo "# git"; git rev-parse HEAD 2>&1; git status --short 2>&1 | head -20
  echo; echo "# python and packages (PYTHONPATH=$PYTHONPATH)"
  "$PYTHON" -c 'from dask_gpudirect.bench.common import versions
for name, version in versions().items():
    print(f"{name}=={version}")' 2>&1
} > "$OUT/env.txt" 2>&1
echo "== $BENCH_TARGET target, $GPUS GPU(s)/workers, scale over $SCALE_GPUS, $PROTOCOL; log: gpu-scale.log =="

# --- 1. the probe: one worker per GPU --------------------------------------------------------
probe_rc=skipped
if [[ $SKIP_PROBE != 1 ]]; then
  echo "== probe --local --protocol $PROTOCOL --json (limit ${PROBE_LIMIT}s) ==" | tee -a "$LOG"
  # shellcheck disable=SC2086  # PROBE_ARGS is a list of options
  timeout -s INT -k 10 "$PROBE_LIMIT" \
    "$PYTHON" -m dask_gpudirect.cli probe --local --workers "$GPUS" --protocol "$PROTOCOL" --json \
      $PROBE_ARGS > "$OUT/probe.json" 2>> "$LOG"
  probe_rc=$?
  echo "== probe: exit $probe_rc after $((SECONDS - start))s ==" | tee -a "$LOG"
fi

# --- 2. bench scale: read and shuffle on 1 and on all GPUs -----------------------------------
rm -rf "$RUNS_DIR"
left=$((TOTAL_LIMIT - (SECONDS - start) - 15))           # 15 s for the archive and the summary
scale_rc="not run (${left}s left)"
if (( left >= 105 )); then  # bench scale takes --time-limit 100 s or more
  plot=()
  "$PYTHON" -c "import matplotlib" 2>/dev/null && plot=(--plot "$OUT/scale.png")
  echo "== bench scale --gpus $SCALE_GPUS: read ${BINARY_GIB} GiB binary + ${PARQUET_GIB} GiB Parquet" \
       "in $FILES files each, shuffle ${SHUFFLE_GIB} GiB (limit ${left}s) ==" | tee -a "$LOG"
  timeout -s INT -k 30 "$left" \
    "$PYTHON" -m dask_gpudirect.bench scale --target "$BENCH_TARGET" --gpus "$SCALE_GPUS" \
      --benches "$SCALE_BENCHES" --protocol "$PROTOCOL" --files "$FILES" --dir "$BENCH_DIR" \
      --runs-dir "$RUNS_DIR" --read-limit "$READ_LIMIT" --shuffle-limit "$SHUFFLE_LIMIT" \
      --time-limit "$((left - 5))" \
      --read-args "--binary-gib $BINARY_GIB --parquet-gib $PARQUET_GIB $READ_ARGS" \
      --shuffle-args "--gib $SHUFFLE_GIB $SHUFFLE_ARGS" \
      --json "$OUT/scale.json" --markdown "$OUT/scale.md" ${plot[@]+"${plot[@]}"} \
    2>&1 | tee -a "$LOG"
  scale_rc=${PIPESTATUS[0]}
  echo "== bench scale: exit $scale_rc after $((SECONDS - start))s ==" | tee -a "$LOG"
fi
[[ -d $RUNS_DIR ]] && tar -czf "$OUT/scale-runs.tar.gz" -C "$(dirname "$RUNS_DIR")" "$(basename "$RUNS_DIR")"

# --- the short tables, last ------------------------------------------------------------------
echo
if [[ $probe_rc != skipped ]]; then
  echo "probe: exit $probe_rc"
  "$PYTHON" - "$OUT/probe.json" <<'PY' 2>/dev/null || echo "  no verdicts: see gpu-scale.log"
import json, sys

for path in json.load(open(sys.argv[1]))["paths"].values():
    print("  " + path["verdict"])
PY
fi
echo "bench scale: exit $scale_rc; total $((SECONDS - start))s"
if [[ -s $OUT/scale.md ]]; then
  "$PYTHON" - "$OUT/scale.json" <<'PY'
import json, sys

for run in json.load(open(sys.argv[1]))["runs"]:
    took = f"{run['seconds']:.0f} of {run['limit']} s" if "seconds" in run else run["note"]
    print(f"  {run['bench']} on {run['gpus']}: {run['status']} ({took})")
PY
  echo
  awk '/^\| (GPUs|workers) \|/ {on = 1} /^Each cell/ {on = 0} on' "$OUT/scale.md"
else
  echo "no scale.md: the end of gpu-scale.log:"
  tail -40 "$LOG"
fi
[[ $probe_rc == 0 || $probe_rc == skipped ]] && [[ $scale_rc == 0 ]]
