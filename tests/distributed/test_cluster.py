"""The cluster on real Ray: `adaserve cluster up --nodes 3` in a loopback-only network namespace (Ray listens on
every interface whatever it is told), driven by tritonclient. The scenarios live in `cluster_scenarios.py`; this
test runs them with pytest inside the namespace and reports their outcome."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.server_utils import ROOT

pytest.importorskip("ray", reason="the cluster needs the 'cluster' extra (Ray)")


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs a network namespace (unshare -rn) to keep Ray on loopback")
@pytest.mark.timeout(900)
def test_cluster_scenarios_in_a_loopback_namespace() -> None:
    scenarios = ROOT / "tests" / "distributed" / "cluster_scenarios.py"
    command = f"ip link set lo up && exec {sys.executable} -m pytest -q -p no:cacheprovider -x {scenarios}"
    env = {**os.environ, "ADASERVE_IN_NAMESPACE": "1"}
    done = subprocess.run(["unshare", "-rn", "sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-3000:]
