"""Every collective of the buffer API on 4 ranks through the switches (1-2-4)."""

from __future__ import annotations

import array
import threading
import time

import numpy as np
import pytest

import inccl

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64]
OPS = [inccl.SUM, inccl.MAX, inccl.MIN, inccl.PROD, inccl.AVG,
       inccl.BAND, inccl.BOR, inccl.BXOR]
N = 3001  # several packets for every type, not a multiple of the MTU


def data(rank: int, dtype, n: int = N) -> np.ndarray:
    """Small values (|x| <= 4), negative for signed types: every operator's result
    over 4 ranks is exact in every type."""
    x = (np.arange(n) + rank) % 4 + 1
    if np.dtype(dtype).kind in "if":
        x = np.where((np.arange(n) + rank) % 3 == 0, -x, x)
    return x.astype(dtype)


def expected(op: inccl.Op, dtype, world: int, n: int = N) -> np.ndarray:
    xs = np.stack([data(r, dtype, n) for r in range(world)])
    if op == inccl.SUM:
        return np.sum(xs, axis=0, dtype=dtype)
    if op == inccl.MAX:
        return xs.max(axis=0)
    if op == inccl.MIN:
        return xs.min(axis=0)
    if op == inccl.PROD:
        return np.prod(xs, axis=0, dtype=dtype)
    if op == inccl.AVG:  # floats: one division; integers: truncating
        s = np.sum(xs.astype(np.float64), axis=0) / world
        return (s if np.dtype(dtype).kind == "f" else np.trunc(s)).astype(dtype)
    ufunc = {inccl.BAND: np.bitwise_and, inccl.BOR: np.bitwise_or,
             inccl.BXOR: np.bitwise_xor}[op]
    return ufunc.reduce(xs, axis=0).astype(dtype)


def applies(op: inccl.Op, dtype) -> bool:
    return np.dtype(dtype).kind != "f" or op not in (inccl.BAND, inccl.BOR, inccl.BXOR)


def _allreduce_all(rank, world, master):
    done = []
    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        assert (comm.rank, comm.size, comm.Get_rank(), comm.Get_size()) == (rank, 4, rank, 4)
        for dtype in DTYPES:
            for op in OPS:
                if not applies(op, dtype):
                    continue
                send = data(rank, dtype)
                recv = np.zeros_like(send)
                comm.Allreduce(send, recv, op=op)
                np.testing.assert_array_equal(recv, expected(op, dtype, world),
                                              err_msg=f"{np.dtype(dtype)} {op}")
                np.testing.assert_array_equal(send, data(rank, dtype))  # untouched
                buf = data(rank, dtype)
                comm.Allreduce(inccl.IN_PLACE, buf, op=op)
                np.testing.assert_array_equal(buf, expected(op, dtype, world))
                done.append((np.dtype(dtype).name, op.name))
    return done


def test_allreduce_every_dtype_and_operator(fabric):
    done = fabric.run(_allreduce_all)
    assert len(done[0]) == 9 * 8 - 3 * 3  # bitwise operators on floats do not apply


def _allreduce_buffers(rank, world, master):
    group = inccl.Group(world, rank, master)
    comm = group.communicator()
    # Default op SUM; op by name; send is recv (in place).
    a = data(rank, np.int32)
    comm.Allreduce(a, a)
    np.testing.assert_array_equal(a, expected(inccl.SUM, np.int32, world))
    b = data(rank, np.float32)
    comm.Allreduce(inccl.IN_PLACE, b, "max")
    np.testing.assert_array_equal(b, expected(inccl.MAX, np.float32, world))
    # bytearray and memoryview: uint8; array.array('i'): int32; 2-D and sliced arrays.
    ba = bytearray(data(rank, np.uint8).tobytes())
    comm.Allreduce(inccl.IN_PLACE, memoryview(ba), op=inccl.BXOR)
    assert bytes(ba) == expected(inccl.BXOR, np.uint8, world).tobytes()
    arr = array.array("i", data(rank, np.int32).tolist())
    out = array.array("i", bytes(4 * N))
    comm.Allreduce(arr, out, op=inccl.MIN)
    assert list(out) == expected(inccl.MIN, np.int32, world).tolist()
    m = data(rank, np.float64, 3000).reshape(30, 100)
    r = np.empty((30, 100))
    comm.Allreduce(m, r, op=inccl.PROD)
    np.testing.assert_array_equal(r.ravel(), expected(inccl.PROD, np.float64, world, 3000))
    big = np.zeros(2 * N, dtype=np.int64)
    big[N:] = data(rank, np.int64)
    comm.Allreduce(inccl.IN_PLACE, big[N:])  # a contiguous slice of a larger array
    np.testing.assert_array_equal(big[N:], expected(inccl.SUM, np.int64, world))
    # A single element, and 64-bit values beyond 2**53.
    one = np.array([2**60 + rank], dtype=np.uint64)
    comm.Allreduce(inccl.IN_PLACE, one, op=inccl.MAX)
    assert one[0] == 2**60 + world - 1
    comm.Barrier()
    comm.destroy()
    group.destroy()
    return True


def test_allreduce_buffer_kinds(fabric):
    fabric.run(_allreduce_buffers)


def _reduce(rank, world, master):
    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        for root in range(world):
            for dtype, op in [(np.float32, inccl.MAX), (np.int64, inccl.SUM),
                              (np.uint8, inccl.BOR), (np.float16, inccl.AVG)]:
                send = data(rank, dtype)
                recv = np.zeros_like(send) if rank == root else None
                comm.Reduce(send, recv, op=op, root=root)
                if rank == root:
                    np.testing.assert_array_equal(recv, expected(op, dtype, world))
                # In place: the root reduces in its buffer, the others send theirs.
                buf = data(rank, dtype)
                comm.Reduce(inccl.IN_PLACE, buf, op=op, root=root)
                want = expected(op, dtype, world) if rank == root else data(rank, dtype)
                np.testing.assert_array_equal(buf, want)
        # Defaults: op SUM, root 0; recv may be omitted off the root.
        send = data(rank, np.int32)
        if rank == 0:
            recv = np.zeros_like(send)
            comm.Reduce(send, recv)
            np.testing.assert_array_equal(recv, expected(inccl.SUM, np.int32, world))
        else:
            comm.Reduce(send)
    return True


def test_reduce_every_root(fabric):
    fabric.run(_reduce)


def _bcast(rank, world, master):
    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        for root in range(world):
            for dtype in DTYPES:
                buf = data(root, dtype) if rank == root else np.zeros(N, dtype=dtype)
                comm.Bcast(buf, root=root)
                np.testing.assert_array_equal(buf, data(root, dtype))
        raw = bytearray(b"inccl" * 100) if rank == 0 else bytearray(500)
        comm.Bcast(raw)  # root 0 by default
        assert raw == bytearray(b"inccl" * 100)
    return True


def test_bcast_every_dtype_and_root(fabric):
    fabric.run(_bcast)


def _blockwise(rank, world, master):
    b = 1001  # elements per block
    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        for dtype in DTYPES:
            for op in OPS:
                if not applies(op, dtype):
                    continue
                send = data(rank, dtype, world * b)
                want = expected(op, dtype, world, world * b)[rank * b:(rank + 1) * b]
                recv = np.zeros(b, dtype=dtype)
                comm.Reduce_scatter_block(send, recv, op=op)
                np.testing.assert_array_equal(recv, want, err_msg=f"{np.dtype(dtype)} {op}")
                buf = send.copy()
                comm.Reduce_scatter_block(inccl.IN_PLACE, buf, op=op)
                np.testing.assert_array_equal(buf[:b], want)  # mpi4py: the first block
            mine = data(rank, dtype, b)
            every = np.concatenate([data(r, dtype, b) for r in range(world)])
            recv = np.zeros(world * b, dtype=dtype)
            comm.Allgather(mine, recv)
            np.testing.assert_array_equal(recv, every, err_msg=f"{np.dtype(dtype)}")
            buf = np.zeros(world * b, dtype=dtype)
            buf[rank * b:(rank + 1) * b] = mine
            comm.Allgather(inccl.IN_PLACE, buf)
            np.testing.assert_array_equal(buf, every)
        with pytest.raises(ValueError, match="blocks"):
            comm.Allgather(mine, np.zeros(3 * b, dtype=mine.dtype))
        # Eight in flight, then a blocking call keeps the order.
        sends = [data(rank + k, np.float32) for k in range(8)]
        recvs = [np.zeros(N, dtype=np.float32) for _ in range(8)]
        reqs = [comm.Iallreduce(s, r, op=inccl.MAX) for s, r in zip(sends, recvs)]
        reqs[-1].Wait()
        assert all(r.Test() for r in reqs)
        for r in reqs:
            r.Wait()
            r.Wait()  # again: nothing
        for k in range(8):
            want = np.stack([data(q + k, np.float32) for q in range(world)]).max(axis=0)
            np.testing.assert_array_equal(recvs[k], want)
        pending = comm.Iallreduce(inccl.IN_PLACE, recvs[0])
        with pytest.raises(inccl.InvalidArgumentError, match="not waited for"):
            comm.destroy()
        pending.Wait()
        comm.Barrier()
    return True


def test_reduce_scatter_allgather_and_iallreduce(fabric):
    fabric.run(_blockwise)


def _bfloat16(rank, world, master):
    # numpy has no bfloat16: its bits in a uint16 array, tagged with dtype=.
    def bf16(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        x = data(rank, np.float32)
        send, recv = bf16(x), np.zeros(N, dtype=np.uint16)
        comm.Allreduce(send, recv, op=inccl.SUM, dtype="bfloat16")
        np.testing.assert_array_equal(recv, bf16(expected(inccl.SUM, np.float32, world)))
        # dtype= as a numpy dtype, over raw bytes.
        raw = bytearray(data(rank, np.float32).tobytes())
        comm.Allreduce(inccl.IN_PLACE, raw, op=inccl.MIN, dtype=np.dtype(np.float32))
        np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.float32),
                                      expected(inccl.MIN, np.float32, world))
    return True


def test_dtype_override_bfloat16(fabric):
    fabric.run(_bfloat16)


def _gil_released(rank, world, master):
    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        comm.Barrier()
        if rank == 3:
            time.sleep(1.0)  # the others wait for it inside Allreduce
        ticks = 0
        stop = threading.Event()

        def count():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                time.sleep(0.001)

        t = threading.Thread(target=count)
        t.start()
        buf = data(rank, np.float32)
        comm.Allreduce(inccl.IN_PLACE, buf)
        stop.set()
        t.join()
        np.testing.assert_array_equal(buf, expected(inccl.SUM, np.float32, world))
        return ticks


def test_gil_is_released_during_a_collective(fabric):
    ticks = fabric.run(_gil_released)
    # Ranks 0-2 waited about 1 s for rank 3 with another thread running meanwhile.
    assert min(ticks[:3]) > 100, ticks


def _lifecycle(rank, world, master):
    group = inccl.Group(world, rank, master)
    assert (group.rank, group.size) == (rank, world)
    assert repr(group) == f"inccl.Group(rank={rank}, size={world})"
    with group.communicator(op_timeout=5.0) as comm:
        assert repr(comm) == f"inccl.Communicator(rank={rank}, size={world})"
        comm.Barrier()
    assert "destroyed" in repr(comm)
    with pytest.raises(inccl.UnusableError, match="destroyed"):
        comm.Barrier()
    comm.destroy()  # twice: nothing
    second = group.communicator()  # a group serves several communicators in turn
    second.Barrier()
    second.destroy()
    group.destroy()
    group.destroy()
    with pytest.raises(inccl.UnusableError, match="group"):
        group.communicator()
    return True


def test_lifecycle_and_context_managers(fabric):
    fabric.run(_lifecycle)


def _from_env(rank, world, master):
    import os

    host, port = master.rsplit(":", 1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=host,
                      MASTER_PORT=port)
    with inccl.Group.from_env() as group, group.communicator() as comm:
        buf = np.full(4, rank + 1, dtype=np.int32)
        comm.Allreduce(inccl.IN_PLACE, buf)
        return (group.rank, group.size, buf.tolist())


def test_group_from_env(fabric):
    out = fabric.run(_from_env)
    assert out == [(r, 4, [10] * 4) for r in range(4)]
