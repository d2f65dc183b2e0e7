from . import bench

if __name__ == "__main__":
    bench()
