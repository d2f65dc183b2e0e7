#!/usr/bin/env bash
# Start a dask-gpudirect cluster over ssh: one `dask scheduler` on the first host, one
# `dask cuda worker` (one worker process per GPU) on every host, UCX comms (protocol ucxx).
#
#   HOSTS="node1 node2" examples/multinode/launch.sh start   # prints the scheduler address
#   HOSTS="node1 node2" examples/multinode/launch.sh stop
#
# Every host needs the same Python environment (ACTIVATE is sourced there) and passwordless ssh.
# Settings (environment variables; docs/deployment.md explains each):
#   HOSTS        hosts to start workers on; the scheduler runs on the first  (required)
#   PORT         scheduler port                                             (8786)
#   INTERFACE    network interface to listen on, e.g. ib0 (InfiniBand + RDMACM) or eth0
#   UCX_MODE     auto: UCX picks its transports (recommended); nvlink | ib | nvlink+ib: name
#                them (dask-cuda's --enable-* flags, for diagnosis and benchmarks)   (auto)
#   THREADS      gpudirect.reader.threads on every worker                   (16)
#   RMM_POOL     RMM pool per GPU, e.g. 0.8 or 60GB (one mapping for NVLink/IB)  (0.8)
#   ALLOWED_ROOTS  gpudirect.allowed-roots, e.g. /data or /data:/scratch  (unset: no limit)
#   TLS_CA, TLS_CERT, TLS_KEY  PEM files (same path on every host): comms become tls://
#                (TCP + TLS; UCX comms have no encryption, so TLS replaces ucxx)
#   ACTIVATE     script sourced on each host before starting, e.g. ~/venv/bin/activate
#   LOGDIR       where each host writes its log and pid files            (/tmp/dask-gpudirect)
set -euo pipefail

action=${1:-start}
read -r -a hosts <<<"${HOSTS:?set HOSTS to a space-separated list of hosts}"
scheduler_host=${hosts[0]}
port=${PORT:-8786}
interface=${INTERFACE:-}
ucx_mode=${UCX_MODE:-auto}
threads=${THREADS:-16}
rmm_pool=${RMM_POOL:-0.8}
logdir=${LOGDIR:-/tmp/dask-gpudirect}
activate=${ACTIVATE:+source $(printf %q "$ACTIVATE") &&}

# Protocol and the options every process needs (scheduler, workers, client).
tls_opts=()
if [[ -n ${TLS_CERT:-} ]]; then
  protocol=tls
  tls_opts=(--tls-ca-file "${TLS_CA:?TLS_CA too}" --tls-cert "$TLS_CERT" --tls-key "${TLS_KEY:?TLS_KEY too}")
else
  protocol=ucxx
fi

# UCX: in auto mode dask-cuda creates each worker's CUDA context before UCX starts, and UCX
# then finds NVLink (cuda_ipc) and InfiniBand (rc/dc) on its own; the scheduler and the client
# need the same, through distributed-ucxx's config.
# UCXX progresses in a thread of its own (its default spins each process's event loop).
env_common=(DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT=True UCXPY_PROGRESS_MODE=thread UCXPY_ENABLE_PYTHON_FUTURE=1)
worker_ucx=()
case $ucx_mode in
  auto) ;;
  nvlink) worker_ucx=(--enable-tcp-over-ucx --enable-nvlink) ;;
  ib) worker_ucx=(--enable-tcp-over-ucx --enable-infiniband --enable-rdmacm) ;;
  nvlink+ib) worker_ucx=(--enable-tcp-over-ucx --enable-nvlink --enable-infiniband --enable-rdmacm) ;;
  *) echo "UCX_MODE must be auto, nvlink, ib or nvlink+ib" >&2; exit 2 ;;
esac
# The scheduler has no --enable-* flags: the same choices as distributed-ucxx config.
[[ $ucx_mode != auto ]] && env_common+=(DASK_DISTRIBUTED_UCXX__TCP=True DASK_DISTRIBUTED_UCXX__CUDA_COPY=True)
[[ $ucx_mode == *nvlink* ]] && env_common+=(DASK_DISTRIBUTED_UCXX__NVLINK=True)
[[ $ucx_mode == *ib* ]] && env_common+=(DASK_DISTRIBUTED_UCXX__INFINIBAND=True DASK_DISTRIBUTED_UCXX__RDMACM=True)
[[ $protocol == tls ]] && env_common=()

iface_opts=()
[[ -n $interface ]] && iface_opts=(--interface "$interface")

worker_env=("${env_common[@]}" DASK_GPUDIRECT__READER__THREADS="$threads")
[[ -n ${ALLOWED_ROOTS:-} ]] && worker_env+=(DASK_GPUDIRECT__ALLOWED_ROOTS="$ALLOWED_ROOTS")

remote() {  # remote HOST WORDS...: run WORDS on HOST in the background, logged, pid kept
  local host=$1 name=$2
  shift 2
  local cmd
  cmd=$(printf '%q ' "$@")
  # braces: "&" backgrounds the service alone (not the mkdir && cd before it), so that the pid
  # kept is the service's, the folder exists first, and ssh returns once it has started
  ssh "$host" "mkdir -p $logdir && $activate cd $logdir && \
    { nohup env $cmd >$logdir/$name.log 2>&1 </dev/null & echo \$! >$logdir/$name.pid; }"
}

case $action in
  start)
    remote "$scheduler_host" scheduler "${env_common[@]}" dask scheduler \
      --protocol "$protocol" --port "$port" "${iface_opts[@]}" "${tls_opts[@]}"
    # Give the address as the worker's argument, never with --scheduler-file: the worker CLI
    # would take the preload's flags for the address (dask_gpudirect/preload.py).
    address=
    for _ in $(seq 60); do
      address=$(ssh "$scheduler_host" "grep -o '$protocol://[^ ]*:$port' $logdir/scheduler.log | head -1" || true)
      [[ -n $address ]] && break
      sleep 1
    done
    [[ -n $address ]] || { echo "no scheduler address in $scheduler_host:$logdir/scheduler.log" >&2; exit 1; }
    for host in "${hosts[@]}"; do
      # Plugin options as DASK_GPUDIRECT__* env vars rather than --gpudirect-* flags:
      # dask cuda worker hands every flag to each preload, dask_cuda.initialize included.
      remote "$host" worker "${worker_env[@]}" dask cuda worker "$address" \
        --preload dask_gpudirect.preload "${iface_opts[@]}" "${worker_ucx[@]}" \
        --rmm-pool-size "$rmm_pool" "${tls_opts[@]}"
    done
    echo "$address"
    echo "client: ${env_common[*]} python examples/multinode/client.py $address --data ... --on ..." >&2
    echo "check:  ${env_common[*]} dask-gpudirect probe --scheduler-address $address" >&2
    ;;
  stop)
    for host in "${hosts[@]}" "$scheduler_host"; do
      for name in worker scheduler; do
        ssh "$host" "[ -f $logdir/$name.pid ] && kill \$(cat $logdir/$name.pid) && rm $logdir/$name.pid" || true
      done
    done
    ;;
  *)
    echo "usage: HOSTS='node1 node2' $0 start|stop" >&2
    exit 2
    ;;
esac
