"""AllReduce of every numpy datatype through the switches, each result checked.

Run one process per host with the launcher's environment, e.g. on the emulated
1-2-4 tree:

    sudo scripts/demo topologies/1-2-4.yaml --exec "$PWD/target/python-venv/bin/python python/examples/allreduce.py"

(--count N sets the length; default 100003 elements, not a multiple of any MTU.)
Prints one line per datatype and PASS; exits 1 on a wrong result.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import inccl

DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64"]


def data(rank: int, dtype: str, n: int) -> np.ndarray:
    # Small values, negative ones for signed types: every SUM over up to 16 ranks is
    # exact in every type, so the check is exact.
    x = (np.arange(n) + rank) % 4 + 1
    if np.dtype(dtype).kind in "if":
        x = np.where((np.arange(n) + rank) % 3 == 0, -x, x)
    return x.astype(dtype)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100_003)
    args = p.parse_args()
    failed = 0
    with inccl.Group.from_env() as group, group.communicator() as comm:
        rank, world = comm.rank, comm.size
        for dtype in DTYPES:
            send = data(rank, dtype, args.count)
            recv = np.empty_like(send)
            t0 = time.perf_counter()
            comm.Allreduce(send, recv, op=inccl.SUM)
            took = time.perf_counter() - t0
            want = np.sum([data(r, dtype, args.count) for r in range(world)], axis=0,
                          dtype=dtype)
            ok = np.array_equal(recv, want)
            failed += not ok
            print(f"rank {rank}/{world} Allreduce {dtype:8} x {args.count}: "
                  f"{took * 1e3:8.2f} ms {'ok' if ok else 'WRONG'}", flush=True)
        comm.Barrier()
    print("PASS" if not failed else f"FAIL: {failed} datatypes wrong", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
