"""The ``torch.distributed`` backend ``"inccl"``: CPU collectives computed by the INC
switches.

    import torch.distributed as dist
    import inccl.torch                      # registers the backend (once)
    dist.init_process_group("inccl")        # torchrun's env://, or store=/rank=/world_size=

What INCCL computes in the network goes through the switches: ``all_reduce``,
``reduce``, ``broadcast``, ``all_gather`` / ``all_gather_into_tensor``,
``reduce_scatter`` / ``reduce_scatter_tensor`` and ``barrier`` on contiguous CPU
tensors of int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32 and
float64 with SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR (bitwise on integers).
Anything else (another dtype such as bool or int16, PREMUL_SUM, all_to_all,
send/recv, gather, scatter, uneven all_gather sizes) runs on a gloo process group
over the same store. Never silently: ``stats()`` counts calls and bytes per path, and
``INCCL_TORCH_STRICT`` forbids fallback (``1`` or ``all``: for every collective; a
comma list such as ``allreduce,reduce_scatter_tensor``: for those), raising instead. A
non-contiguous tensor is copied to a contiguous one and back.

Bootstrap: INCCL's group is created through torch's store (rank 0 publishes its
bootstrap address there); the controller comes from ``INCCL_CONTROLLER`` as for any
INCCL program. Collectives run when called (the returned ``Work`` is complete), in
call order on every rank, as torch requires.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

import inccl

__all__ = ["ProcessGroupINCCL", "stats", "BACKEND"]

BACKEND = "inccl"

# dtype -> (the dtype= override INCCL gets, the integer dtype whose numpy view carries
# the bits, or None when numpy has the type itself).
_DTYPES: dict[torch.dtype, tuple[str, torch.dtype | None]] = {
    torch.int8: ("int8", None),
    torch.uint8: ("uint8", None),
    torch.int32: ("int32", None),
    torch.uint32: ("uint32", None),
    torch.int64: ("int64", None),
    torch.uint64: ("uint64", None),
    torch.float16: ("float16", None),
    torch.bfloat16: ("bfloat16", torch.int16),
    torch.float32: ("float32", None),
    torch.float64: ("float64", None),
}

_OPS: dict[Any, inccl.Op] = {
    dist.ReduceOp.SUM: inccl.SUM,
    dist.ReduceOp.AVG: inccl.AVG,
    dist.ReduceOp.PRODUCT: inccl.PROD,
    dist.ReduceOp.MIN: inccl.MIN,
    dist.ReduceOp.MAX: inccl.MAX,
    dist.ReduceOp.BAND: inccl.BAND,
    dist.ReduceOp.BOR: inccl.BOR,
    dist.ReduceOp.BXOR: inccl.BXOR,
}

_STATS: Counter[str] = Counter()
_STATS_LOCK = threading.Lock()


def stats() -> dict[str, int]:
    """Calls and bytes per path in this process: ``"<collective>"`` and
    ``"<collective>:bytes"`` through the switches, ``"fallback:<collective>"`` and
    ``"fallback:<collective>:bytes"`` through gloo (bytes of the tensors the switches
    reduce or send for it on this rank; for a fallback, of every tensor it was given)."""
    with _STATS_LOCK:
        return dict(_STATS)


def _count(key: str, tensors: list[torch.Tensor]) -> None:
    nbytes = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    with _STATS_LOCK:
        _STATS[key] += 1
        _STATS[f"{key}:bytes"] += nbytes


def _strict(name: str) -> bool:
    """Whether ``INCCL_TORCH_STRICT`` forbids falling back for collective `name`."""
    v = os.environ.get("INCCL_TORCH_STRICT", "").strip()
    if v in ("", "0"):
        return False
    return v in ("1", "all") or name in {x.strip() for x in v.split(",")}


def _done(result: Any) -> dist.Work:
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _view(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A zero-copy numpy view of a contiguous CPU tensor and the INCCL type name."""
    name, carrier = _DTYPES[t.dtype]
    return (t.view(carrier) if carrier is not None else t).numpy(), name


def _why_not(tensors: list[torch.Tensor], op: Any = None) -> str | None:
    """Why INCCL cannot run a collective on these tensors, or None."""
    for t in tensors:
        if t.device.type != "cpu":
            return f"tensor on {t.device} (the inccl backend is CPU only)"
        if t.dtype not in _DTYPES:
            return f"dtype {t.dtype}"
        if t.is_sparse:
            return "sparse tensor"
    if op is not None:
        mapped = _OPS.get(op)
        if mapped is None:
            return f"operator {op}"
        if mapped in (inccl.BAND, inccl.BOR, inccl.BXOR) and any(
            t.is_floating_point() for t in tensors
        ):
            return f"bitwise {mapped.name} on a float tensor"
    return None


class _Contiguous:
    """A contiguous stand-in for `t` (itself if already), copied back on exit."""

    def __init__(self, t: torch.Tensor, write_back: bool = True):
        self.orig, self.write_back = t, write_back
        self.t = t if t.is_contiguous() else t.contiguous()

    def __enter__(self) -> torch.Tensor:
        return self.t

    def __exit__(self, *exc: Any) -> None:
        if self.write_back and self.t is not self.orig and exc[0] is None:
            self.orig.copy_(self.t)


def _op_of(opts: Any) -> Any:
    """The operator of `opts` as a ``ReduceOp.RedOpType`` (options hold a ``ReduceOp``)."""
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return getattr(op, "op", op)


class ProcessGroupINCCL(dist.ProcessGroup):
    """A ``torch.distributed`` process group whose collectives INCCL runs through the
    INC switches (see the module docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        secs = max(timeout.total_seconds(), 1.0)
        master = _publish_master(dist.PrefixStore("inccl/", store), rank, secs)
        self._group = inccl.Group(size, rank, master, timeout=secs)
        self._comm = self._group.communicator()
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("inccl-gloo/", store), rank, size,
                                           timeout)

    # --- what the switches do -------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        op = _op_of(opts)
        if (why := _why_not(tensors, op)) is not None:
            return self._fallback("allreduce", why, lambda: self._gloo.allreduce(tensors, opts), tensors)
        for t in tensors:
            with _Contiguous(t) as c:
                buf, name = _view(c)
                self._comm.Allreduce(inccl.IN_PLACE, buf, op=_OPS[op], dtype=name)
        _count("allreduce", tensors)
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        op = _op_of(opts)
        if (why := _why_not(tensors, op)) is not None:
            return self._fallback("reduce", why, lambda: self._gloo.reduce(tensors, opts), tensors)
        for t in tensors:
            with _Contiguous(t) as c:
                buf, name = _view(c)
                self._comm.Reduce(inccl.IN_PLACE, buf, op=_OPS[op], root=opts.rootRank,
                                  dtype=name)
        _count("reduce", tensors)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        if (why := _why_not(tensors)) is not None:
            return self._fallback("broadcast", why, lambda: self._gloo.broadcast(tensors, opts), tensors)
        for t in tensors:
            with _Contiguous(t, write_back=self._rank != opts.rootRank) as c:
                buf, name = _view(c)
                self._comm.Bcast(buf, root=opts.rootRank, dtype=name)
        _count("broadcast", tensors)
        return _done(tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]],
                  input_tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        flat = [t for ts in output_tensors for t in ts]
        why = _why_not(flat + input_tensors) or _uneven(output_tensors, input_tensors)
        if why is not None:
            return self._fallback("allgather", why,
                                  lambda: self._gloo.allgather(output_tensors, input_tensors, opts),
                                  input_tensors)
        for outs, inp in zip(output_tensors, input_tensors):
            whole = torch.empty(self._size * inp.numel(), dtype=inp.dtype)
            self._gather_into(whole, inp)
            for o, part in zip(outs, whole.view(self._size, -1)):
                o.copy_(part.view_as(o))
        _count("allgather", input_tensors)
        return _done(output_tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> dist.Work:
        why = _why_not([output, input]) or _sizes(output, input, self._size)
        if why is not None:
            return self._fallback("allgather_into_tensor", why,
                                  lambda: self._gloo.all_gather_single(output, input, opts), [input])
        with _Contiguous(output) as out:
            self._gather_into(out, input)
        _count("allgather_into_tensor", [input])
        return _done(output)

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        op = _op_of(opts)
        flat = [t for ts in input_tensors for t in ts]
        why = _why_not(flat + output_tensors, op) or _uneven(input_tensors, output_tensors)
        if why is not None:
            return self._fallback("reduce_scatter", why,
                                  lambda: self._gloo.reduce_scatter(output_tensors, input_tensors,
                                                                    opts), input_tensors)
        for out, ins in zip(output_tensors, input_tensors):
            whole = torch.cat([t.reshape(-1) for t in ins])
            with _Contiguous(out) as o:
                self._scatter_from(o, whole, op)
        _count("reduce_scatter", [t for ts in input_tensors for t in ts])
        return _done(output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> dist.Work:
        op = _op_of(opts)
        why = _why_not([output, input], op) or _sizes(input, output, self._size)
        if why is not None:
            return self._fallback("reduce_scatter_tensor", why,
                                  lambda: self._gloo.reduce_scatter_single(output, input, opts), [input])
        with _Contiguous(output) as o, _Contiguous(input, write_back=False) as i:
            self._scatter_from(o, i, op)
        _count("reduce_scatter_tensor", [input])
        return _done(output)

    # Older torch releases call these names for the same collectives.
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts: Any = None) -> dist.Work:
        self._comm.Barrier()
        _count("barrier", [])
        return _done(None)

    # --- what gloo does ---------------------------------------------------------------

    def alltoall_base(self, *args: Any) -> dist.Work:
        return self._fallback("alltoall_base", "all_to_all", lambda: self._gloo.alltoall_base(*args), args)

    def all_to_all_single(self, *args: Any) -> dist.Work:
        return self._fallback("all_to_all_single", "all_to_all",
                              lambda: self._gloo.all_to_all_single(*args), args)

    def alltoall(self, *args: Any) -> dist.Work:
        return self._fallback("alltoall", "all_to_all", lambda: self._gloo.alltoall(*args), args)

    def gather(self, *args: Any) -> dist.Work:
        return self._fallback("gather", "gather", lambda: self._gloo.gather(*args), args)

    def scatter(self, *args: Any) -> dist.Work:
        return self._fallback("scatter", "scatter", lambda: self._gloo.scatter(*args), args)

    def send(self, *args: Any) -> dist.Work:
        return self._fallback("send", "point-to-point", lambda: self._gloo.send(*args), args)

    def recv(self, *args: Any) -> dist.Work:
        return self._fallback("recv", "point-to-point", lambda: self._gloo.recv(*args), args)

    def recv_anysource(self, *args: Any) -> dist.Work:
        return self._fallback("recv_anysource", "point-to-point",
                              lambda: self._gloo.recv_anysource(*args), args)

    def allreduce_coalesced(self, *args: Any) -> dist.Work:
        return self._fallback("allreduce_coalesced", "coalesced",
                              lambda: self._gloo.allreduce_coalesced(*args), args)

    # --- bookkeeping ------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # A Python group has no C++ backend to keep the name and description
    # init_process_group gives it; DeviceMesh (FSDP2) reads them.
    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return getattr(self, "_group_desc", "")

    def __repr__(self) -> str:
        return f"ProcessGroupINCCL(rank={self._rank}, size={self._size})"

    def shutdown(self) -> None:
        """Destroys the INCCL communicator and group (``destroy_process_group``)."""
        comm, group = getattr(self, "_comm", None), getattr(self, "_group", None)
        self._comm = self._group = None
        if comm is not None:
            comm.destroy()
        if group is not None:
            group.destroy()

    def _fallback(self, name: str, why: str, run: Any, tensors: list[Any] = ()) -> dist.Work:
        if _strict(name):
            raise RuntimeError(
                f"inccl backend: {name} cannot run on the switches ({why}) and "
                f"INCCL_TORCH_STRICT={os.environ.get('INCCL_TORCH_STRICT')} forbids gloo for it")
        _count(f"fallback:{name}", _flat(tensors))
        return run()

    def _gather_into(self, whole: torch.Tensor, inp: torch.Tensor) -> None:
        """AllGather `inp` into the contiguous `whole` (size blocks)."""
        block = whole.view(-1)[self._rank * inp.numel():(self._rank + 1) * inp.numel()]
        block.copy_(inp.reshape(-1))
        buf, name = _view(whole)
        self._comm.Allgather(inccl.IN_PLACE, buf.reshape(-1), dtype=name)

    def _scatter_from(self, out: torch.Tensor, whole: torch.Tensor, op: Any) -> None:
        """ReduceScatter the contiguous `whole` (size blocks) into contiguous `out`."""
        send, name = _view(whole)
        recv, _ = _view(out)
        self._comm.Reduce_scatter_block(send.reshape(-1), recv.reshape(-1), op=_OPS[op],
                                        dtype=name)


def _flat(items: Any) -> list[torch.Tensor]:
    """Every tensor in nested lists (the arguments of a collective)."""
    if isinstance(items, torch.Tensor):
        return [items]
    if isinstance(items, (list, tuple)):
        return [t for i in items for t in _flat(i)]
    return []


def _uneven(lists: list[list[torch.Tensor]], singles: list[torch.Tensor]) -> str | None:
    for ts, one in zip(lists, singles):
        if any(t.numel() != one.numel() or t.dtype != one.dtype for t in ts):
            return "uneven tensor sizes or types"
    return None


def _sizes(whole: torch.Tensor, block: torch.Tensor, size: int) -> str | None:
    if whole.numel() != size * block.numel() or whole.dtype != block.dtype:
        return f"tensor sizes {whole.numel()} and {block.numel()} are not {size} blocks"
    return None


def _publish_master(store: dist.Store, rank: int, timeout: float) -> str:
    """INCCL's bootstrap address, through torch's store: rank 0 picks a free port on its
    address (``INCCL_LOCAL_IP``, else ``MASTER_ADDR``, else its host name) and publishes
    it; the others read it (waiting at most the process group's timeout)."""
    key = "master"
    if rank == 0:
        host = (os.environ.get("INCCL_LOCAL_IP") or os.environ.get("MASTER_ADDR")
                or socket.gethostbyname(socket.gethostname()))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        store.set(key, f"{host}:{port}")
    store.wait([key], timedelta(seconds=timeout))
    return store.get(key).decode()


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> ProcessGroupINCCL:
    return ProcessGroupINCCL(store, rank, size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
