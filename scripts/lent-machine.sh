# Sourced by every script that runs on the lent GPU machines (none of it ships in the package),
# from the repository root: this source tree and the stack that ../shared/gpu/README.md installs
# into /tmp/site on PYTHONPATH, output unbuffered, and NVLink multicast off in this shell and so
# in every process it starts (benchmarks' children and Dask workers included): on the lent
# multi-GPU machines a program that uses multicast can put the host's shared GPUs out of
# service. dask-gpudirect itself uses none.
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
