"""Triton's system shared-memory extension: a client on the same machine puts tensors in POSIX shared memory it
created and names them in a request, instead of sending their bytes.

The client registers a region by name, giving the key of its shared-memory object (`/dev/shm/<key>`, what
`shm_open` and `tritonclient.utils.shared_memory` create), an offset into it and a byte size. An input or a
requested output then names a slice of a region in its parameters (`shared_memory_region`, `shared_memory_byte_size`,
`shared_memory_offset`). An input is read in place from the mapping, so its one copy is the engine's copy into the
input pool on arrival (Ebird's), where otherwise it travels socket → request body → pool; an output is written into
the client's slice and the response names it without data.

The server maps what the client registered and never creates, resizes or removes a shared-memory object. A region
unregistered while a request still reads it stays mapped until that request lets go of it. Registering is off unless
the server starts with `--allow-client-shm` (as in Triton since 24.10): a client could otherwise have the server
read and write any shared-memory object the server may open, which the client itself may not. The server's own
input pools are anonymous (`memfd`), so no key reaches them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.errors import InvalidInputError, NotAllowedError
from adaserve.server.protocol import SharedMemoryRef

#: Where Linux keeps POSIX shared-memory objects: `shm_open("/name")` is the file `/dev/shm/name`.
SHM_ROOT = Path("/dev/shm")
#: A POSIX shared-memory name: an optional leading slash, then one path component.
_KEY = re.compile(r"/?[^/\x00]+")


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: mmap.mmap
    start: int  # where the region begins in `memory`, which starts at the page boundary at or below `offset`

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a request still reads a view of it: unmapped when that view goes
            self.memory.close()


class SharedMemoryRegions:
    """The registered regions, by name; used from the server's event loop only."""

    def __init__(self, allowed: bool, root: Path = SHM_ROOT) -> None:
        self.allowed = allowed
        self.root = root
        self._regions: dict[str, _Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        where = f"system shared memory region '{name}'"
        if not self.allowed:
            raise NotAllowedError(
                f"cannot register {where}: client shared memory is off; start the server with --allow-client-shm"
            )
        if not name:
            raise InvalidInputError("a system shared memory region needs a name")
        if name in self._regions:
            raise InvalidInputError(f"{where} is already registered; unregister it first")
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.strip("/") in (".", ".."):
            raise InvalidInputError(f"{where}: key {key!r} is not a POSIX shared-memory name such as '/input0'")
        for field, value, least in (("offset", offset, 0), ("byte_size", byte_size, 1)):
            if type(value) is not int or value < least:
                raise InvalidInputError(f"{where}: {field} must be a whole number >= {least}, got {value!r}")
        path = self.root / key.lstrip("/")
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInputError(
                f"{where}: cannot open shared memory key '{key}' ({path}): {exc.strerror}"
            ) from None
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInputError(f"{where}: key '{key}' ({path}) is not a shared-memory object")
            if info.st_size < offset + byte_size:
                raise InvalidInputError(
                    f"{where}: key '{key}' holds {info.st_size} bytes, fewer than offset {offset} + byte_size "
                    f"{byte_size}"
                )
            page_start = offset - offset % mmap.ALLOCATIONGRANULARITY
            memory = mmap.mmap(descriptor, byte_size + offset - page_start, offset=page_start)
        finally:
            os.close(descriptor)
        self._regions[name] = _Region(name, key, offset, byte_size, memory, offset - page_start)

    def unregister(self, name: str = "") -> None:
        """One region, or every region when `name` is empty; a name not registered is not an error (Triton's)."""
        for each in [name] if name else list(self._regions):
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """`[{"name", "key", "offset", "byte_size"}]` of one region, or of every region when `name` is empty."""
        if not name:
            return [region.status() for region in self._regions.values()]
        return [self._region(name, "status").status()]

    def read(self, ref: SharedMemoryRef, where: str) -> memoryview:
        """The bytes an input's parameters name, in place."""
        region, start = self._slice(ref, where)
        return memoryview(region.memory)[start : start + ref.byte_size]

    def write(self, ref: SharedMemoryRef, array: np.ndarray, where: str) -> int:
        """Write an output into the slice its parameters name, little-endian; the number of bytes written."""
        region, start = self._slice(ref, where)
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        if data.nbytes > ref.byte_size:
            raise InvalidInputError(
                f"{where}: shared_memory_byte_size {ref.byte_size} is too small for the {data.nbytes} bytes of the "
                f"output (shape {list(array.shape)})"
            )
        target = np.frombuffer(region.memory, np.uint8, count=data.nbytes, offset=start)
        target[:] = data.reshape(-1).view(np.uint8)
        return data.nbytes

    def close(self) -> None:
        self.unregister()

    def _region(self, name: str, where: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            off = "" if self.allowed else " (client shared memory is off: start the server with --allow-client-shm)"
            raise InvalidInputError(f"{where}: system shared memory region '{name}' is not registered{off}")
        return region

    def _slice(self, ref: SharedMemoryRef, where: str) -> tuple[_Region, int]:
        region = self._region(ref.region, where)
        if ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInputError(
                f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} runs past "
                f"the end of region '{ref.region}' ({region.byte_size} bytes)"
            )
        return region, region.start + ref.offset
