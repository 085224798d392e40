"""Time comm.Allreduce on numpy int32 the way the Rust host program inccl-allreduce
times its AllReduce: per iteration, zero the result, time the call, check it; report
this rank's median. For docs/PERFORMANCE.md (Python overhead), e.g.

    sudo scripts/demo topologies/1-2-4.yaml --exec \
        "$PWD/target/python-venv/bin/python python/examples/bench_allreduce.py 262144 --iters 20"
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import inccl


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("count", type=int, nargs="+", help="elements per rank (int32), one run each")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    ok = True
    with inccl.Group.from_env() as group, group.communicator() as comm:
        rank, world = comm.rank, comm.size
        for n in args.count:
            # Element i of rank r is i + r (wrapping), so the SUM is known exactly.
            send = (np.arange(n, dtype=np.int64) + rank).astype(np.int32)
            want = (np.arange(n, dtype=np.int64) * world + world * (world - 1) // 2).astype(np.int32)
            recv = np.empty_like(send)
            times = []
            for it in range(args.warmup + args.iters):
                recv.fill(0)
                t0 = time.perf_counter()
                comm.Allreduce(send, recv, op=inccl.SUM)
                took = time.perf_counter() - t0
                ok &= bool(np.array_equal(recv, want))
                if it >= args.warmup:
                    times.append(took)
            print(f"# python rank {rank} allreduce int32 size(B) {4 * n} iters {args.iters} "
                  f"p50(us) {statistics.median(times) * 1e6:.1f} "
                  f"min(us) {min(times) * 1e6:.1f}", flush=True)
    print("PASS" if ok else "FAIL: wrong result", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
