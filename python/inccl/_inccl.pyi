"""Type stubs of the native module inccl._inccl (re-exported by the inccl package)."""

import builtins
from types import TracebackType
from typing import Any, Final, final

from typing_extensions import Buffer, Self

__version__: str

# A datatype name (int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32
# float64), or an object whose str() is one (numpy.dtype, torch.bfloat16).
_DType = str | Any
_OpLike = Op | str

@final
class Op:
    """A reduction operator: inccl.SUM, MAX, MIN, PROD, AVG, BAND, BOR, BXOR."""

    @property
    def name(self) -> str:
        """Lower-case name ("sum", "bxor", ...)."""

@final
class InPlace:
    """The type of inccl.IN_PLACE."""

IN_PLACE: Final[InPlace]
SUM: Final[Op]
MAX: Final[Op]
MIN: Final[Op]
PROD: Final[Op]
AVG: Final[Op]
BAND: Final[Op]
BOR: Final[Op]
BXOR: Final[Op]

@final
class Group:
    """A set of ranks that know each other. Creation is collective: every rank calls
    it with the same world size and master address ("host" or "host:port"; the port
    defaults to INCCL_MASTER_PORT or 52223). Rank 0 registers the group with the
    controller (`controller` "host:port", else INCCL_CONTROLLER). `timeout` (seconds)
    bounds every bootstrap wait (INCCL_TIMEOUT_MS, default 30 s), and so how long
    Ctrl-C can take to interrupt creation."""

    def __init__(
        self,
        world_size: int,
        rank: int,
        master_addr: str,
        controller: str | None = None,
        *,
        timeout: float | None = None,
    ) -> None: ...
    @staticmethod
    def from_env(*, timeout: float | None = None) -> Group:
        """The group of RANK, WORLD_SIZE, MASTER_ADDR and the bootstrap port
        INCCL_MASTER_PORT, else MASTER_PORT, else 52223 (as torchrun and
        scripts/demo --exec set them), with the INCCL_* variables applied."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def communicator(self, *, op_timeout: float | None = None) -> Communicator:
        """Create a communicator (collective, in the same order on every rank).
        `op_timeout` (seconds; INCCL_OP_TIMEOUT_MS, default 10 s) fails a collective
        without progress, and bounds how long Ctrl-C takes to interrupt one."""
    def destroy(self) -> None:
        """Destroy the group (collective). Idempotent."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

@final
class Communicator:
    """Collectives computed by the switches, with mpi4py's buffer methods.

    Buffers: numpy arrays or any C-contiguous buffer-protocol object (writable where
    results are written), used in place without a copy. The datatype comes from the
    buffer's format; `dtype=` reinterprets the bytes as another type (e.g.
    "bfloat16" over a uint16 array). The GIL is released during a call.
    Bad arguments raise TypeError/ValueError naming the argument before anything is
    sent; INCCL's failures raise inccl.Error subclasses."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def Get_rank(self) -> int: ...
    def Get_size(self) -> int: ...
    def Allreduce(
        self,
        send: Buffer | InPlace,
        recv: Buffer,
        op: _OpLike = ...,
        *,
        dtype: _DType | None = None,
    ) -> None:
        """AllReduce `send` into `recv` (same type and length); op defaults to SUM.
        send=inccl.IN_PLACE reduces recv in place."""
    def Reduce(
        self,
        send: Buffer | InPlace,
        recv: Buffer | None = None,
        op: _OpLike = ...,
        root: int = 0,
        *,
        dtype: _DType | None = None,
    ) -> None:
        """Reduce to `root`'s `recv` (used on the root only). send=inccl.IN_PLACE:
        the root reduces in recv, the others send their recv."""
    def Bcast(self, buf: Buffer, root: int = 0, *, dtype: _DType | None = None) -> None:
        """Broadcast `buf` from `root` to every rank, in place."""
    def Reduce_scatter_block(
        self,
        send: Buffer | InPlace,
        recv: Buffer,
        op: _OpLike = ...,
        *,
        dtype: _DType | None = None,
    ) -> None:
        """`send` holds size blocks of len(recv) elements; recv receives the reduction
        of block `rank`. send=inccl.IN_PLACE: recv holds the blocks, its first block
        receives the result."""
    def Allgather(self, send: Buffer | InPlace, recv: Buffer, *, dtype: _DType | None = None) -> None:
        """recv (size blocks of len(send) elements) receives block r from rank r.
        send=inccl.IN_PLACE: this rank's block of recv holds its input."""
    def Iallreduce(
        self,
        send: Buffer | InPlace,
        recv: Buffer,
        op: _OpLike = ...,
        *,
        dtype: _DType | None = None,
    ) -> Request:
        """Start an AllReduce and return at once; do not touch the buffers until the
        request completed. Requests run in start order."""
    def Barrier(self) -> None: ...
    def destroy(self) -> None:
        """Destroy the communicator (collective). Idempotent. Raises
        InvalidArgumentError while requests are not waited for."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

class Request:
    """A started non-blocking collective; it keeps its buffers alive."""
    def Test(self) -> bool:
        """True when complete (Wait then returns at once)."""
    def Wait(self) -> None:
        """Wait (GIL released, Ctrl-C interrupts) and raise the collective's error."""

class Error(Exception):
    """Base class of every error INCCL reports; the message is INCCL's."""

class InvalidArgumentError(Error, ValueError): ...
class ConfigError(Error): ...
class TimeoutError(Error, builtins.TimeoutError): ...
class PeerError(Error): ...
class ControllerError(Error): ...
class IoError(Error, OSError): ...
class CollectiveError(Error): ...
class TransportUnavailableError(Error): ...
class UnusableError(Error): ...
