from ..cluster import progress_ucx_in_a_thread
from . import bench

if __name__ == "__main__":
    progress_ucx_in_a_thread()  # as the dask-gpudirect command does
    bench()
