"""The torch.distributed backend "inccl" on 4 ranks through the switches (1-2-4)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _init(rank: int, world: int, master: str):
    import torch.distributed as dist

    import inccl.torch

    host, port = master.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, rank == 0)
    dist.init_process_group("inccl", store=store, rank=rank, world_size=world)
    assert dist.get_backend() == "inccl"
    return dist, inccl.torch


def _collectives(rank, world, master):
    dist, it = _init(rank, world, master)
    dtypes = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64]
    n = 1000
    for dt in dtypes:
        x = (torch.arange(n) % 4 + rank + 1).to(dt)
        want = sum((torch.arange(n) % 4 + r + 1).to(torch.float64) for r in range(world))
        for op, ref in [(dist.ReduceOp.SUM, want), (dist.ReduceOp.MAX, None)]:
            y = x.clone()
            dist.all_reduce(y, op=op)
            if ref is None:
                ref = (torch.arange(n) % 4 + world).to(torch.float64)
            assert torch.equal(y.to(torch.float64), ref), (dt, op)
        # Broadcast, from every root.
        for root in range(world):
            b = x.clone() if rank == root else torch.zeros(n, dtype=dt)
            dist.broadcast(b, src=root)
            assert torch.equal(b, (torch.arange(n) % 4 + root + 1).to(dt))
        # AllGather: list and into one tensor.
        outs = [torch.zeros(n, dtype=dt) for _ in range(world)]
        dist.all_gather(outs, x)
        for r in range(world):
            assert torch.equal(outs[r], (torch.arange(n) % 4 + r + 1).to(dt))
        whole = torch.zeros(world * n, dtype=dt)
        dist.all_gather_into_tensor(whole, x)
        assert torch.equal(whole, torch.cat(outs))
        # ReduceScatter: list and from one tensor.
        big = torch.cat([x + k for k in range(world)])
        out = torch.zeros(n, dtype=dt)
        dist.reduce_scatter_tensor(out, big)
        expect = sum((torch.arange(n) % 4 + r + 1 + rank).to(torch.float64) for r in range(world))
        assert torch.equal(out.to(torch.float64), expect), dt
        out2 = torch.zeros(n, dtype=dt)
        dist.reduce_scatter(out2, list(big.chunk(world)))
        assert torch.equal(out2, out)
    # Reduce to root 2, AVG on floats, a non-contiguous tensor.
    y = torch.full((4, 6), float(rank + 1)).t()
    assert not y.is_contiguous()
    dist.reduce(y, dst=2, op=dist.ReduceOp.AVG)
    if rank == 2:
        assert torch.equal(y, torch.full((6, 4), 2.5))
    dist.barrier()
    s = it.stats()
    assert not any(k.startswith("fallback:") for k in s), s
    # Complex tensors reach the backend as float pairs: through the switches too.
    c = torch.full((3,), complex(rank, 1))
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((3,), complex(6, 4)))
    # What the switches do not do goes through gloo, counted.
    out = torch.zeros(world, dtype=torch.int64)
    dist.all_to_all_single(out, torch.arange(world) + 10 * rank)
    assert torch.equal(out, torch.arange(world) * 10 + rank)
    s = it.stats()
    assert s["fallback:all_to_all_single"] == 1 and s["fallback:all_to_all_single:bytes"] == 64
    assert s["allreduce:bytes"] > 16 * 1000
    dist.destroy_process_group()
    return it.stats()


def test_every_collective_through_the_switches(fabric):
    stats = fabric.run(_collectives)
    assert all(s["allreduce"] >= 16 for s in stats), stats


def _strict(rank, world, master):
    dist, _ = _init(rank, world, master)
    with pytest.raises(RuntimeError, match="INCCL_TORCH_STRICT"):
        dist.all_to_all_single(torch.zeros(world), torch.ones(world))
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), 4.0))
    dist.destroy_process_group()
    return True


def test_strict_mode_refuses_fallbacks(fabric):
    fabric.run(_strict, env={"INCCL_TORCH_STRICT": "gather,all_to_all_single"})


def _ddp(rank, world, master):
    dist, it = _init(rank, world, master)
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1))
    reference.load_state_dict(model.state_dict())
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    data = torch.randn(world, 5, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        opt.zero_grad()
        ddp(data[rank]).pow(2).mean().backward()
        opt.step()
        # One process doing what DDP averages: the mean of the ranks' gradients.
        ref_opt.zero_grad()
        sum(reference(data[r]).pow(2).mean() for r in range(world)).div(world).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
    s = it.stats()
    dist.destroy_process_group()
    return s


def test_ddp_trains_like_one_process(fabric):
    stats = fabric.run(_ddp)
    for s in stats:
        assert s.get("allreduce", 0) >= 3 and s.get("broadcast", 0) >= 1, s
        assert not any(k.startswith("fallback:") for k in s), s
