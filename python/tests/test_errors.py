"""Bad input raises TypeError/ValueError naming the argument, before anything is sent
(so every rank can go on); INCCL's own failures raise inccl.Error subclasses with its
message; Ctrl-C interrupts a blocked call within the op timeout."""

from __future__ import annotations

import os
import signal
import socket
import time

import numpy as np
import pytest

import inccl


def _bad_input(rank, world, master):
    f32 = np.arange(8, dtype=np.float32)
    out = np.zeros(8, dtype=np.float32)
    checks = [
        # (exception, message part, call)
        (TypeError, "recv: datatype int32 does not match send's float32",
         lambda c: c.Allreduce(f32, np.zeros(8, dtype=np.int32))),
        (ValueError, "recv: 4 elements",
         lambda c: c.Allreduce(f32, np.zeros(4, dtype=np.float32))),
        (ValueError, "send: buffer is not C-contiguous",
         lambda c: c.Allreduce(np.arange(16, dtype=np.float32)[::2], out)),
        (ValueError, "recv: buffer is not C-contiguous",
         lambda c: c.Allreduce(f32, np.zeros((8, 2), dtype=np.float32)[:, 0])),
        (ValueError, "recv: buffer is read-only",
         lambda c: c.Allreduce(f32, np.zeros(8, dtype=np.float32).setflags(write=False) or
                               _readonly(8))),
        (ValueError, "recv: buffer is read-only",
         lambda c: c.Allreduce(inccl.IN_PLACE, bytes(8))),
        (ValueError, "buf: buffer is read-only", lambda c: c.Bcast(bytes(8))),
        (ValueError, "op: operator band does not apply to datatype float32",
         lambda c: c.Allreduce(f32, out, op=inccl.BAND)),
        (ValueError, "op: operator bxor does not apply to datatype float64",
         lambda c: c.Reduce(inccl.IN_PLACE, np.zeros(3), op="bxor")),
        (TypeError, "send: list object does not support the buffer protocol",
         lambda c: c.Allreduce([1, 2, 3], out)),
        (TypeError, "send: buffer format 'h'",
         lambda c: c.Allreduce(np.zeros(8, dtype=np.int16), np.zeros(8, dtype=np.int16))),
        (TypeError, "buf: buffer format '?'", lambda c: c.Bcast(np.zeros(8, dtype=bool))),
        (TypeError, "recv: buffer format 'Zf'",
         lambda c: c.Allreduce(inccl.IN_PLACE, np.zeros(8, dtype=np.complex64))),
        (TypeError, "recv: buffer format '>i'",
         lambda c: c.Allreduce(inccl.IN_PLACE, np.zeros(8, dtype=">i4"))),
        (TypeError, "op: expected inccl.SUM",
         lambda c: c.Allreduce(f32, out, op=3)),
        (ValueError, "op: unknown operator 'mean'",
         lambda c: c.Allreduce(f32, out, op="mean")),
        (ValueError, "dtype: unknown datatype 'int16'",
         lambda c: c.Allreduce(f32, out, dtype="int16")),
        (ValueError, "recv: 6 bytes are not a whole number of float32 elements",
         lambda c: c.Allreduce(inccl.IN_PLACE, bytearray(6), dtype="float32")),
        (ValueError, "root: 4 is out of range for size 4",
         lambda c: c.Reduce(f32, out, root=4)),
        (ValueError, "root: -1 is out of range for size 4", lambda c: c.Bcast(out, root=-1)),
        (TypeError, "recv: required with send=inccl.IN_PLACE",
         lambda c: c.Reduce(inccl.IN_PLACE)),
        (ValueError, "send and recv overlap partially",
         lambda c: (lambda a: c.Allreduce(a[:8], a[4:12]))(np.zeros(12, dtype=np.float32))),
    ]
    if rank == 0:
        checks.append((TypeError, "recv: required on the root (rank 0)",
                       lambda c: c.Reduce(f32, None, root=0)))
    with inccl.Group(world, rank, master) as group, group.communicator() as comm:
        for exc, part, call in checks:
            with pytest.raises(exc) as info:
                call(comm)
            assert part in str(info.value), (part, str(info.value))
            assert not isinstance(info.value, inccl.Error)
        # Nothing was sent: the communicator still works on every rank.
        buf = np.full(5, rank, dtype=np.int64)
        comm.Allreduce(inccl.IN_PLACE, buf)
        assert buf.tolist() == [6] * 5
    return len(checks)


def _readonly(n):
    a = np.zeros(n, dtype=np.float32)
    a.setflags(write=False)
    return a


def test_bad_input_names_the_argument(fabric):
    assert fabric.run(_bad_input)[0] >= 22


@pytest.fixture
def loopback(monkeypatch):
    """Outside the fabric: INCCL on 127.0.0.1, no controller from the environment."""
    monkeypatch.setenv("INCCL_LOCAL_IP", "127.0.0.1")
    for v in ("INCCL_CONTROLLER", "INCCL_MASTER_PORT", "RANK", "WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_group_arguments(loopback):
    with pytest.raises(inccl.InvalidArgumentError, match="rank 4 is out of range") as e:
        inccl.Group(4, 4, "127.0.0.1")
    assert isinstance(e.value, ValueError) and isinstance(e.value, inccl.Error)
    with pytest.raises(ValueError, match="world_size: -1 is out of range"):
        inccl.Group(-1, 0, "127.0.0.1")
    with pytest.raises(ValueError, match="rank: 70000 is out of range"):
        inccl.Group(4, 70000, "127.0.0.1")
    with pytest.raises(ValueError, match="timeout: 0 is not a positive number"):
        inccl.Group(1, 0, "127.0.0.1", timeout=0)


def test_library_errors_carry_inccls_message(loopback, monkeypatch):
    port = _free_port()
    with pytest.raises(inccl.ControllerError, match="controller 127.0.0.1:1"):
        inccl.Group(1, 0, f"127.0.0.1:{port}", controller="127.0.0.1:1", timeout=2)
    t0 = time.monotonic()
    with pytest.raises(inccl.TimeoutError, match=r"waiting for ranks \[1\]") as e:
        inccl.Group(2, 0, f"127.0.0.1:{_free_port()}", controller="127.0.0.1:1", timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert isinstance(e.value, TimeoutError)
    with pytest.raises(inccl.ConfigError, match="environment variable RANK is not set"):
        inccl.Group.from_env()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(inccl.ConfigError, match="RANK=`x`"):
        inccl.Group.from_env()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("INCCL_OP_TIMEOUT_MS", "soon")
    monkeypatch.setenv("INCCL_CONTROLLER", "127.0.0.1:1")
    with pytest.raises(inccl.ControllerError):
        inccl.Group.from_env(timeout=2)
    for cls in (inccl.InvalidArgumentError, inccl.ConfigError, inccl.TimeoutError,
                inccl.PeerError, inccl.ControllerError, inccl.IoError, inccl.CollectiveError,
                inccl.TransportUnavailableError, inccl.UnusableError):
        assert issubclass(cls, inccl.Error) and cls.__module__ == "inccl" and cls.__doc__


OP_TIMEOUT = 3.0


def _interrupted(rank, world, master):
    group = inccl.Group(world, rank, master)
    comm = group.communicator(op_timeout=OP_TIMEOUT)
    comm.Barrier()
    buf = np.ones(1000, dtype=np.float32)
    if rank == 3:
        time.sleep(OP_TIMEOUT + 2)  # never joins: the others stall
        outcome = "absent"
    else:
        t0 = time.monotonic()
        try:
            if rank == 0:
                os.kill(os.getppid(), signal.SIGUSR1)  # "about to block": parent sends SIGINT
            comm.Allreduce(inccl.IN_PLACE, buf)
            outcome = "returned"
        except KeyboardInterrupt as e:
            outcome = ("KeyboardInterrupt", type(e.__cause__).__name__,
                       time.monotonic() - t0)
        except inccl.CollectiveError as e:
            outcome = ("CollectiveError", "stall" if "progress" in str(e) else str(e),
                       time.monotonic() - t0)
    # The process is usable for cleanup: destroying fails (peers are gone) but returns.
    for obj in (comm, group):
        try:
            obj.destroy()
        except inccl.Error:
            pass
    return outcome


def test_ctrl_c_interrupts_a_blocked_call_within_the_op_timeout(fabric):
    got = []

    def on_usr1(*_):
        got.append(time.monotonic())

    old = signal.signal(signal.SIGUSR1, on_usr1)

    def interrupt_rank0(procs):
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # rank 0 is inside Allreduce by now
        os.kill(procs[0].pid, signal.SIGINT)

    try:
        out = fabric.run(_interrupted, env={"INCCL_TIMEOUT_MS": "10000"},
                         on_started=interrupt_rank0)
    finally:
        signal.signal(signal.SIGUSR1, old)
    kind, cause, took = out[0]
    assert kind == "KeyboardInterrupt", out
    assert cause == "CollectiveError"  # INCCL's stall error is the cause
    assert took < OP_TIMEOUT + 2.5, out
    for r in (1, 2):
        assert out[r][:2] == ("CollectiveError", "stall"), out
    assert out[3] == "absent"
