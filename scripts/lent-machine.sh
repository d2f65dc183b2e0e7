# Sourced by every script that runs on the lent GPU machines (never shipped in the package):
# NVLink multicast off in this shell and so in every process it starts, benchmarks' children and
# Dask workers included. On the lent multi-GPU machines a program that uses multicast can put the
# host's shared GPUs out of service; dask-gpudirect itself uses none.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
