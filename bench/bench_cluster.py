"""BEAM on a Ray cluster: candidates per second against the number of nodes (`python bench/bench_cluster.py`).

Starts a local `ray.cluster_utils.Cluster` of 1..N nodes (each one core, serving this machine's CPU), BEAM-searches
the same kernels through it (`--force`), and prints, per node count: candidates evaluated, wall seconds,
candidates/second, and the mean compile time per candidate on the workers; first the same search in this process
(no cluster) for comparison. On one machine the nodes share its cores, so this measures the cluster's overhead
and fault handling, not a real cluster's scaling (docs/DESIGN.md, "Tuning on a cluster", estimates that).
`--nodes 1,2,3`, `--width W`, `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
os.environ.setdefault("TGC_CACHE_DIR", tempfile.mkdtemp(prefix="tgc-bench-cluster-"))

WORKLOADS = [("kernels/matmul.tg", {"M": 64, "N": 64, "K": 64}), ("kernels/softmax.tg", {"N": 64, "D": 256})]


def search(session=None, width: int = 2) -> dict:
    import tgc
    from tgc.codegen.search import use_evaluator

    tried, start = 0, time.perf_counter()
    for path, dims in WORKLOADS:
        prog = tgc.load(os.path.join(ROOT, path))
        if session is None:
            res = prog.beam(device="CPU", dims=dims, width=width, force=True)
        else:
            with use_evaluator(session):
                res = prog.beam(device="CPU", dims=dims, width=width, force=True)
        tried += sum(r.get("tried", 0) for r in res["kernels"])
    return {"candidates": tried, "seconds": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2", help="comma list of node counts")
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        sys.exit("bench_cluster: Ray is not installed (pip install 'tgc[cluster]')")
    import tgc
    from tgc.backends import cluster as cl
    from tgc.backends import get_device
    from tgc.codegen.search import use_evaluator

    rows = [{"nodes": 0, **search(None, args.width)}]  # this process, no cluster
    token = "bench-token"
    os.environ.update({cl.TOKEN_ENV: token, **cl.ray_auth_env(token)})  # as `tgc worker` starts its node
    cl._refresh_ray_auth()
    ev, co = cl.resource_names(get_device("CPU"), token)
    node = {"num_cpus": 1, "object_store_memory": 80 << 20, "include_dashboard": False, "resources": {ev: 1, co: 1}}
    for n in [int(x) for x in args.nodes.split(",")]:
        cluster = Cluster(initialize_head=True, head_node_args=node)
        for _ in range(n - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        session = cl.ClusterSession(cluster.address, token)
        try:
            with use_evaluator(session):
                tgc.load(os.path.join(ROOT, "kernels/softmax.tg")).compile(device="CPU", dims={"N": 4, "D": 8})
            # (warm: the nodes' worker processes started, tgc imported there)
            session.stats["compile_s"], session.stats["tasks"] = 0.0, 0
            row = {"nodes": n, **search(session, args.width)}
            row["compile_s_per_candidate"] = session.stats["compile_s"] / max(session.stats["tasks"], 1)
            rows.append(row)
        finally:
            session.close()
            if ray.is_initialized():
                ray.shutdown()
            cluster.shutdown()
    for r in rows:
        r["candidates_per_s"] = r["candidates"] / r["seconds"] if r["seconds"] else 0.0
    if args.json:
        print(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=2))
        return
    print(f"BEAM width {args.width} of {', '.join(p for p, _ in WORKLOADS)} on this machine ({os.cpu_count()} cores)")
    print(f"{'nodes':>6} {'candidates':>11} {'seconds':>8} {'cand/s':>7} {'compile/cand':>13}")
    for r in rows:
        where = "local" if r["nodes"] == 0 else str(r["nodes"])
        comp = f"{r['compile_s_per_candidate'] * 1e3:.1f} ms" if "compile_s_per_candidate" in r else "-"
        print(f"{where:>6} {r['candidates']:>11} {r['seconds']:>8.2f} {r['candidates_per_s']:>7.1f} {comp:>13}")


if __name__ == "__main__":
    main()
