"""Fixtures: the emulated network and ranks as processes.

The network is `inccl-test-fabric` (python/test-fabric): the Rust tests' in-process
controller and switch engines of topologies/1-2-4.yaml over UDP on the loopback of a
private network namespace (needs root). Each rank is a forked process that joins that
namespace (setns) and uses its topology host address as data-plane IP.

scripts/python-test builds the helper and sets INCCL_TEST_FABRIC to it.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import multiprocessing as mp
import os
import subprocess
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLONE_NEWNET = 0x40000000
# Below Linux's ephemeral range (32768-60999 by default): a rank that connects before the
# master listens could otherwise draw the master's port as its own source port and
# connect to itself (torch's TCPStore then reads its own ping: "invalid value returned").
_ports = itertools.count(21000)


class Fabric:
    def __init__(self, proc: subprocess.Popen, info: dict[str, Any]):
        self.proc = proc
        self.controller: str = info["controller"]
        self.hosts: list[str] = info["hosts"]
        self.netns: str = info["netns"]

    def run(
        self,
        body: Callable[..., Any],
        *args: Any,
        world: int = 4,
        timeout: float = 120.0,
        env: dict[str, str] | None = None,
        on_started: Callable[[list[mp.Process]], None] | None = None,
    ) -> list[Any]:
        """Run `body(rank, world, master_addr, *args)` in `world` processes; return
        their results by rank, or fail naming every rank that raised."""
        ctx = mp.get_context("fork")
        master = f"127.0.0.1:{next(_ports)}"
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(self, r, world, master, body, args, env or {}, results),
                name=f"rank{r}",
            )
            for r in range(world)
        ]
        for p in procs:
            p.start()
        if on_started is not None:
            on_started(procs)
        out: dict[int, tuple[bool, Any]] = {}
        try:
            for _ in range(world):
                rank, ok, value = results.get(timeout=timeout)
                out[rank] = (ok, value)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
        failed = {r: v for r, (ok, v) in out.items() if not ok}
        missing = sorted(set(range(world)) - set(out))
        if failed or missing:
            msg = "".join(f"--- rank {r}\n{tb}" for r, tb in sorted(failed.items()))
            pytest.fail(f"ranks failed: {sorted(failed)}, no result from {missing}\n{msg}")
        return [out[r][1] for r in range(world)]


def _rank_main(fabric, rank, world, master, body, args, env, results):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(fabric.netns) as ns:
            if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {fabric.netns}")
        os.environ.update(
            INCCL_CONTROLLER=fabric.controller,
            INCCL_LOCAL_IP=fabric.hosts[rank],
            INCCL_TIMEOUT_MS="20000",
            INCCL_OP_TIMEOUT_MS="10000",
        )
        os.environ.update(env)
        results.put((rank, True, body(rank, world, master, *args)))
    except BaseException:  # noqa: BLE001 - report everything, KeyboardInterrupt too
        results.put((rank, False, traceback.format_exc()))


@pytest.fixture(scope="session")
def fabric():
    exe = os.environ.get("INCCL_TEST_FABRIC") or str(
        ROOT / "target" / "python-fabric" / "release" / "inccl-test-fabric"
    )
    if not Path(exe).exists():
        pytest.fail(f"{exe} not found: run scripts/python-test (it builds it)")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the fabric needs root (a private network namespace)")
        pytest.skip("the fabric needs root (a private network namespace)")
    topology = str(ROOT / "topologies" / "1-2-4.yaml")
    proc = subprocess.Popen([exe, topology], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        pytest.fail(f"{exe} exited with {proc.returncode} before starting")
    try:
        yield Fabric(proc, json.loads(line))
    finally:
        proc.stdin.close()  # the helper stops when its input closes
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
