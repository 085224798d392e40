"""Train the digits MLP of ddp_train.py with FSDP (FSDP2 ``fully_shard``) instead of DDP.

One process per rank with the launcher's environment, e.g. on the emulated 1-2-4 tree:

    sudo scripts/demo topologies/1-2-4.yaml --exec \
        "$PWD/target/python-venv/bin/python python/examples/fsdp_train.py --backend inccl"

Same data, shards, seeds, optimizer and output as ddp_train.py (accuracy, SHA-256 of
the final full parameters, median step time, ``inccl.torch.stats()``, ``--save``).
Parameters are sharded across the ranks: each forward and backward all-gathers them
(``all_gather_into_tensor``) and the gradients are reduce-scattered
(``reduce_scatter_tensor``); ``stats()`` shows which of those went through the
switches and which (if any) fell back to gloo. ``--fsdp 1`` uses the FSDP1 wrapper
(also the fallback when ``fully_shard`` is missing, torch older than 2.6).
``DTensor.full_tensor()`` (functional collectives) finds no C++ backend in a Python
process group, so the final parameters are gathered with ``all_gather_into_tensor``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_train import accuracy, flat_params, init, leave, load, model, parse, report, train


def shard(net, world: int, want: str):
    why = "--fsdp 1"
    if want == "2":
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
        except (ImportError, RuntimeError) as e:  # torch < 2.6 has no fully_shard
            why = f"FSDP2 unavailable: {type(e).__name__}: {e}"
        else:
            for layer in net:
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh)
            fully_shard(net, mesh=mesh)
            return net, "fsdp2", ""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    return (FullyShardedDataParallel(net, use_orig_params=True, device_id=torch.device("cpu"),
                                     sharding_strategy=ShardingStrategy.FULL_SHARD),
            "fsdp1", why)


def full_params(net, kind: str):
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(net):
            return flat_params([(n, p.detach().clone()) for n, p in net.named_parameters()])
    return flat_params([(n, _gather(p)) for n, p in net.named_parameters()])


def _gather(p: torch.Tensor) -> torch.Tensor:
    """An FSDP2 parameter (a DTensor sharded on dim 0 as torch.chunk splits it), whole:
    each rank's shard padded to the largest, all_gather_into_tensor, trimmed."""
    world = dist.get_world_size()
    local = p.to_local().detach()
    rows = p.shape[0]
    chunk = -(-rows // world)
    padded = torch.zeros((chunk,) + tuple(p.shape[1:]), dtype=local.dtype)
    padded[:local.shape[0]] = local
    whole = torch.empty((chunk * world,) + tuple(p.shape[1:]), dtype=local.dtype)
    dist.all_gather_into_tensor(whole, padded)
    return whole[:rows]


def main() -> int:
    args = parse(__doc__, fsdp=True)
    rank, world = init(args.backend)
    data = load(rank, world)
    net, kind, why = shard(model(), world, args.fsdp)
    print(f"rank {rank} sharding {kind} {why}".rstrip(), flush=True)
    times = train(net, list(net.parameters()), data, args.epochs, args.batch, args.lr)
    acc = accuracy(net, data)
    flat = full_params(net, kind)
    report(rank, args.backend, acc, flat, times, args.save)
    dist.barrier()
    dist.destroy_process_group()
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    leave(main())
