from ..cli import run
from . import bench

if __name__ == "__main__":
    run(bench)
