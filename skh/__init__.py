"""skh: SkeletonHunter — find and localize network failures in containerized RDMA GPU training
clusters by probing only each job's traffic skeleton."""

__version__ = "0.1.0"
