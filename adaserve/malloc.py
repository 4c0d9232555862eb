"""The C library's allocator settings that the server process and the model hosts (and the workers they fork) share.

glibc serves a block of 128 KiB or more with a fresh mmap until a freed one raises its moving threshold, and gives
freed heap back to the kernel once more than twice that threshold is free at the top. Work that holds a few blocks
of some MiB and then frees them all, a large request's buffers in the server or a forward pass's activations in a
worker, therefore gave them back each time, and the next request or pass faulted every page in again: a page fault
and a cleared page per 4 KiB. Measured on the 2-core VM (see README, "The protocol"):

- the server at 3 MiB requests over gRPC: a quarter of its CPU in those faults (`perf`); p50 at concurrency 1 from
  3.7, 6.4, 5.4 to 3.8, 3.2, 3.0 ms in three interleaved rounds; over HTTP, which joins the body once, within its
  spread;
- a ResNet-50-style CNN at 224×224, batch 4, one thread: about 19,000 page faults a forward pass and 339–344 ms, against
  none and 303–310 ms with these settings.
"""

from __future__ import annotations

import ctypes
import platform

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's own ceiling for its moving threshold
TRIM_THRESHOLD_BYTES = 128 << 20


def keep_freed_memory() -> bool:
    """Serve blocks up to 32 MiB from the heap, and keep up to 128 MiB of freed heap before giving it back to the
    kernel. Set once at a process's start; forked children inherit it. False where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
