"""The allocator settings of the server process and the model hosts (adaserve.malloc)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

FAULTS_PROBE = """
import resource, sys
from adaserve.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def request():  # a large request's buffers: received, parsed, copied; then all freed
    blocks = [b"x" * (3 << 20) for _ in range(3)]
    del blocks
request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    request()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_memory_is_kept_so_large_blocks_are_not_faulted_in_again() -> None:
    """glibc by default gives a request's (or a forward pass's) freed blocks of some MiB back to the kernel, and the
    next one faults every page in again; the settings keep them (ten rounds of 3 × 3 MiB: page faults)."""

    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", FAULTS_PROBE, mode], capture_output=True, text=True, check=True)
        return int(done.stdout)

    assert faults("default") > 10 * 700  # 768 pages a 3 MiB buffer: at least one buffer a request, every time
    assert faults("keep") < 100
