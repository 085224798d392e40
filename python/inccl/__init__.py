"""INCCL from Python: AllReduce, Reduce, Broadcast, Barrier, ReduceScatter and
AllGather computed by the INC
switches, with mpi4py's buffer methods.

    import numpy as np, inccl
    group = inccl.Group.from_env()            # or inccl.Group(world_size, rank, master_addr)
    comm = group.communicator()
    comm.Allreduce(send, recv, op=inccl.SUM)  # inccl.IN_PLACE as send
    comm.Reduce(send, recv, op=inccl.MAX, root=0)
    comm.Bcast(buf, root=0)
    comm.Barrier()
    comm.Reduce_scatter_block(send, recv, op=inccl.SUM)  # send: size blocks of len(recv)
    comm.Allgather(send, recv)                           # recv: size blocks of len(send)
    req = comm.Iallreduce(send, recv); req.Test(); req.Wait()
    comm.destroy(); group.destroy()           # or use both as context managers

Everything is implemented in Rust (``inccl._inccl``); see ``_inccl.pyi`` for the API.
"""

from ._inccl import *  # noqa: F401,F403
from ._inccl import __version__  # noqa: F401

__all__ = [
    "Group",
    "Communicator",
    "Request",
    "Op",
    "InPlace",
    "IN_PLACE",
    "SUM",
    "MAX",
    "MIN",
    "PROD",
    "AVG",
    "BAND",
    "BOR",
    "BXOR",
    "Error",
    "InvalidArgumentError",
    "ConfigError",
    "TimeoutError",
    "PeerError",
    "ControllerError",
    "IoError",
    "CollectiveError",
    "TransportUnavailableError",
    "UnusableError",
]
