"""End to end: examples/allreduce.py as 4 ranks through `scripts/demo --exec` on
topologies/1-2-4.yaml (real inc-switch and inc-controller processes, hosts in network
namespaces on veths, af_packet switch), and nothing left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix + "-")]


def test_allreduce_example_through_demo_exec():
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("scripts/demo needs root")
        pytest.skip("scripts/demo needs root")
    bin_dir = Path(os.environ.get("INC_BIN_DIR") or ROOT / "target" / "release")
    for b in ("inc-switch", "inc-controller"):
        if not (bin_dir / b).exists():
            pytest.fail(f"{bin_dir / b} not found: scripts/python-test builds it")
    prefix = f"py{os.getpid() % 100000}"
    example = ROOT / "python" / "examples" / "allreduce.py"
    # The e2e suites' lock: one demo at a time on this small machine.
    cmd = ["flock", "-w", "300", "/tmp/inc-e2e.lock", str(ROOT / "scripts" / "demo"),
           "--no-build", "--prefix", prefix, "topologies/1-2-4.yaml",
           "--exec", f"{sys.executable} {example} --count 30001"]
    env = dict(os.environ, INC_BIN_DIR=str(bin_dir))
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        left = _namespaces(prefix)
    transcript = f"{run.stdout}\n--- stderr\n{run.stderr}"
    assert run.returncode == 0, transcript
    assert "ALL 4 RANKS PASS" in run.stdout, transcript
    for rank, host in enumerate(["h0", "h1", "h2", "h3"]):
        assert f"[rank{rank}-{host}] PASS" in run.stdout, transcript
        assert len(re.findall(rf"\[rank{rank}-{host}\] rank {rank}/4 Allreduce .* ok",
                              run.stdout)) == 9, transcript
    assert "WRONG" not in run.stdout and "FAIL" not in run.stdout, transcript
    assert left == [], f"namespaces left behind: {left}"
