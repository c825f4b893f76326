"""A Ray cluster of one-CPU nodes on this machine, for the benchmarks that
compare ffkit's local and Ray executors (bench_frame.py, bench_graysort.py)."""

import os


def start(nodes):
    """Starts a head and nodes-1 more nodes, connects ray to them and
    returns the ray.cluster_utils.Cluster (call .shutdown() at the end).
    The workers import ffkit from where this process did."""
    import ray
    from ray.cluster_utils import Cluster

    import ffkit

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.dirname(os.path.dirname(ffkit.__file__)), os.environ.get("PYTHONPATH", "")] if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return cluster
