"""Train an MLP on scikit-learn's bundled digits data set with DistributedDataParallel.

One process per rank with the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ...), e.g. 4 ranks on the emulated 1-2-4 tree:

    sudo scripts/demo topologies/1-2-4.yaml --exec \
        "$PWD/target/python-venv/bin/python python/examples/ddp_train.py --backend inccl"

(`--backend gloo` runs the same over the management network.) Each rank trains on its
own shard of the training set (every world_size-th sample); seeds are fixed, so two
runs see the same data, initial weights and batches. Every rank prints its final
test accuracy, a SHA-256 of the final parameters (float32, in named_parameters order),
the median training step time (forward + backward with the gradient allreduce +
optimizer step) and, for inccl, ``inccl.torch.stats()``. ``--save PATH`` writes the
final parameters (rank 0, numpy .npy, flat float32) for comparison between runs.
Needs torch and scikit-learn (load_digits ships inside the package: no download).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

SEED = 0


def load(rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's shard of the training set and the whole test set (same on every rank)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(SEED).permutation(len(x))
    x, y = x[order], y[order]
    n_test = 297
    x_test, y_test = x[:n_test], y[:n_test]
    x_train, y_train = x[n_test:], y[n_test:]
    n = len(x_train) // world * world  # every shard the same size: the same steps per rank
    xs, ys = x_train[rank:n:world], y_train[rank:n:world]
    return (torch.from_numpy(xs), torch.from_numpy(ys).long(),
            torch.from_numpy(x_test), torch.from_numpy(y_test).long())


def model() -> nn.Module:
    torch.manual_seed(SEED)  # identical initial weights on every rank and every run
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def flat_params(named: list[tuple[str, torch.Tensor]]) -> np.ndarray:
    return np.concatenate([p.detach().reshape(-1).to(torch.float32).numpy() for _, p in named])


def parse(doc: str, fsdp: bool = False) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    if fsdp:
        p.add_argument("--fsdp", choices=["1", "2"], default="2",
                       help="FSDP2 fully_shard (falls back to 1 if unavailable) or FSDP1")
    p.add_argument("--backend", choices=["inccl", "gloo"], default="inccl")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=25, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--save", help="rank 0 writes the final parameters here (.npy)")
    return p.parse_args()


def init(backend: str) -> tuple[int, int]:
    torch.set_num_threads(1)  # 4 ranks on a small machine; also keeps CPU math steady
    if backend == "inccl":
        import inccl.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def train(net: nn.Module, params: list[torch.Tensor], data: tuple[torch.Tensor, ...],
          epochs: int, batch: int, lr: float) -> list[float]:
    """Plain SGD, fixed batch order; returns each step's time in seconds."""
    x, y = data[0], data[1]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(SEED)
    times = []
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
    return times


def report(rank: int, backend: str, acc: float, flat: np.ndarray, times: list[float],
           save: str | None) -> None:
    digest = hashlib.sha256(flat.tobytes()).hexdigest()[:16]
    print(f"rank {rank} backend {backend} steps {len(times)} test_accuracy {acc:.4f}", flush=True)
    print(f"rank {rank} params sha256 {digest} sum {float(flat.astype(np.float64).sum()):.6f}",
          flush=True)
    print(f"rank {rank} step_time median(ms) {statistics.median(times) * 1e3:.3f} "
          f"min(ms) {min(times) * 1e3:.3f}", flush=True)
    if backend == "inccl":
        import inccl.torch

        print(f"rank {rank} stats {json.dumps(inccl.torch.stats(), sort_keys=True)}", flush=True)
    if save and rank == 0:
        np.save(save, flat)


def accuracy(net: nn.Module, data: tuple[torch.Tensor, ...]) -> float:
    with torch.no_grad():
        return float((net(data[2]).argmax(1) == data[3]).float().mean())


def main() -> int:
    args = parse(__doc__)
    rank, world = init(args.backend)
    data = load(rank, world)
    net = model()
    ddp = nn.parallel.DistributedDataParallel(net)
    times = train(ddp, list(ddp.parameters()), data, args.epochs, args.batch, args.lr)
    acc = accuracy(net, data)
    report(rank, args.backend, acc, flat_params(list(net.named_parameters())), times, args.save)
    dist.barrier()
    dist.destroy_process_group()
    print("PASS", flush=True)
    return 0


def leave(code: int) -> None:
    """Exit without the interpreter's teardown: torch's gloo and FSDP threads can abort
    it ("terminate called without an active exception", exit 134; seen once here after
    a rank had printed PASS), which would turn a finished run into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
