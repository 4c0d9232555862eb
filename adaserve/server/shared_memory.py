"""Triton's system shared-memory extension: a client on the same machine puts tensors in POSIX shared memory it
created and names them in a request, instead of sending their bytes.

The client registers a region by name, giving the key of its shared-memory object (`/dev/shm/<key>`, what
`shm_open` and `tritonclient.utils.shared_memory` create), an offset into it and a byte size. An input or a
requested output then names a slice of a region in its parameters (`shared_memory_region`, `shared_memory_byte_size`,
`shared_memory_offset`). An input is read from the object with `preadv`, then copied into the input pool on arrival
(Ebird's), where otherwise it travels socket → request body → pool; an output is written into the client's slice
with `pwrite` and the response names it without data. The server reads and writes through the file, not a mapping:
a client that shrinks its object after registering (`ftruncate`) gets an error for its request, where a mapping
killed the whole server with SIGBUS.

The server keeps the object open while the region is registered, and never creates, resizes or removes one; a
request read its input when it was decoded, so unregistering cannot pull it from under the request. Registering is
off unless
the server starts with `--allow-client-shm` (as in Triton since 24.10): a client could otherwise have the server
read and write any shared-memory object the server may open, which the client itself may not. The server's own
input pools are anonymous (`memfd`), so no key reaches them.

Triton's CUDA shared-memory extension shares the names and the requests' parameters: a client registers GPU memory
by its CUDA IPC handle (`cudaIpcGetMemHandle`'s 64 bytes), the device and the byte size; the server opens the handle
(`cuda_ipc.py`), copies an input from the GPU into the input pool's host memory on arrival and an output back into
the client's GPU memory. The client must have finished writing an input (synchronized its stream) before it sends
the request, as with Triton. System and CUDA regions are one namespace, as in Triton.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from adaserve.errors import InvalidInputError, NotAllowedError
from adaserve.server.cuda_ipc import HANDLE_BYTES, CudaDriver
from adaserve.server.protocol import SharedMemoryRef

#: The two kinds of region: Triton's system and CUDA shared memory.
RegionKind = Literal["system", "cuda"]
#: Where Linux keeps POSIX shared-memory objects: `shm_open("/name")` is the file `/dev/shm/name`.
SHM_ROOT = Path("/dev/shm")
#: The most regions registered at once: each holds a file descriptor of the server's.
MAX_REGIONS = 1024
#: A POSIX shared-memory name: an optional leading slash, then one path component.
_KEY = re.compile(r"/?[^/\x00]+")


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    descriptor: int  # the client's object, open for reading and writing until the region is unregistered

    kind = "system"

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> memoryview:
        """A copy, read with `preadv`: a file the client shrank since it registered gives fewer bytes, an error
        for this request. Read through a mapping, the same shrunk file killed the whole server with SIGBUS."""
        buffer = np.empty(size, np.uint8)  # not zeroed first, as a bytearray would be: 257 against 516 µs a 3 MiB
        got = os.preadv(self.descriptor, [buffer.data], self.offset + offset)
        if got != size:
            raise InvalidInputError(
                f"shared memory region '{self.name}': key '{self.key}' now holds fewer bytes than the region names "
                f"(read {got} of {size} at offset {self.offset + offset}); was it truncated after registering?"
            )
        return buffer.data

    def write(self, offset: int, data: np.ndarray) -> None:
        """With `pwrite`, which never faults on a file the client shrank (a mapping would: SIGBUS)."""
        if os.fstat(self.descriptor).st_size < self.offset + offset + data.nbytes:
            raise InvalidInputError(
                f"shared memory region '{self.name}': key '{self.key}' now holds fewer bytes than the region names; "
                "was it truncated after registering?"
            )
        written = os.pwrite(self.descriptor, data.reshape(-1).view(np.uint8).data, self.offset + offset)
        assert written == data.nbytes  # a regular file in memory takes a whole write

    def close(self) -> None:
        os.close(self.descriptor)


@dataclass
class _CudaRegion:
    name: str
    device_id: int
    byte_size: int
    address: int  # where the client's memory is mapped in this process (its device address)
    driver: CudaDriver
    kind = "cuda"

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> memoryview:
        """A copy from the GPU (the engine copies it on into the input pool)."""
        return self.driver.read(self.device_id, self.address + offset, size)

    def write(self, offset: int, data: np.ndarray) -> None:
        self.driver.write(self.device_id, self.address + offset, data)

    def close(self) -> None:
        self.driver.close(self.device_id, self.address)


class SharedMemoryRegions:
    """The registered regions, by name; used from the server's event loop only."""

    def __init__(self, allowed: bool, root: Path = SHM_ROOT) -> None:
        self.allowed = allowed
        self.root = root
        self._regions: dict[str, _Region | _CudaRegion] = {}
        self._lock = threading.Lock()  # reads may come from a decoding thread; everything else from the loop
        self._driver: CudaDriver | None = None  # loaded at the first CUDA registration

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        where = f"system shared memory region '{name}'"
        self._check_new(name, where)
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
        except InvalidInputError:
            os.close(descriptor)
            raise
        self._regions[name] = _Region(name, key, offset, byte_size, descriptor)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """A client's GPU memory, by its CUDA IPC handle, on device `device_id`, `byte_size` bytes long."""
        where = f"CUDA shared memory region '{name}'"
        self._check_new(name, where)
        for field, value, least in (("device_id", device_id, 0), ("byte_size", byte_size, 1)):
            if type(value) is not int or value < least:
                raise InvalidInputError(f"{where}: {field} must be a whole number >= {least}, got {value!r}")
        if len(raw_handle) != HANDLE_BYTES:
            raise InvalidInputError(f"{where}: a CUDA IPC handle is {HANDLE_BYTES} bytes, got {len(raw_handle)}")
        if self._driver is None:
            self._driver = CudaDriver()
        try:
            address = self._driver.open(raw_handle, device_id)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where}: cannot open its IPC handle on device {device_id}: {exc}") from None
        self._regions[name] = _CudaRegion(name, device_id, byte_size, address, self._driver)

    def unregister(self, name: str = "", kind: RegionKind = "system") -> None:
        """One region of `kind` (system or cuda), or every one of that kind when `name` is empty; a name not
        registered as that kind is not an error (Triton's)."""
        with self._lock:
            for each in [name] if name else list(self._regions):
                region = self._regions.get(each)
                if region is not None and region.kind == kind:
                    del self._regions[each]
                    region.close()

    def status(self, name: str = "", kind: RegionKind = "system") -> list[dict[str, Any]]:
        """The status of one region of `kind`, or of every one when `name` is empty: system `{"name", "key",
        "offset", "byte_size"}`, cuda `{"name", "device_id", "byte_size"}`."""
        if not name:
            return [region.status() for region in self._regions.values() if region.kind == kind]
        region = self._region(name, "status")
        if region.kind != kind:
            raise InvalidInputError(f"status: shared memory region '{name}' is a {region.kind} region, not {kind}")
        return [region.status()]

    def read(self, ref: SharedMemoryRef, where: str) -> memoryview:
        """A copy of the bytes an input's parameters name, from system shared memory or a GPU's. Safe from a
        worker thread (a large request is decoded on one) while the event loop unregisters regions."""
        with self._lock:
            return self._slice(ref, where).read(ref.offset, ref.byte_size)

    def write(self, ref: SharedMemoryRef, array: np.ndarray, where: str) -> int:
        """Write an output into the slice its parameters name, little-endian; the number of bytes written."""
        region = self._slice(ref, where)
        data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        if data.nbytes > ref.byte_size:
            raise InvalidInputError(
                f"{where}: shared_memory_byte_size {ref.byte_size} is too small for the {data.nbytes} bytes of the "
                f"output (shape {list(array.shape)})"
            )
        with self._lock:
            region.write(ref.offset, data)
        return data.nbytes

    def close(self) -> None:
        with self._lock:
            for region in self._regions.values():
                region.close()
            self._regions.clear()

    def _check_new(self, name: str, where: str) -> None:
        if not self.allowed:
            raise NotAllowedError(
                f"cannot register {where}: client shared memory is off; start the server with --allow-client-shm"
            )
        if not name:
            raise InvalidInputError(f"{where}: a region needs a name")
        if name in self._regions:
            raise InvalidInputError(f"{where} is already registered; unregister it first")
        if len(self._regions) >= MAX_REGIONS:
            raise InvalidInputError(
                f"{where}: {MAX_REGIONS} regions are registered, the most there may be; unregister some first"
            )

    def _region(self, name: str, where: str) -> _Region | _CudaRegion:
        region = self._regions.get(name)
        if region is None:
            off = "" if self.allowed else " (client shared memory is off: start the server with --allow-client-shm)"
            raise InvalidInputError(f"{where}: shared memory region '{name}' is not registered{off}")
        return region

    def _slice(self, ref: SharedMemoryRef, where: str) -> _Region | _CudaRegion:
        region = self._region(ref.region, where)
        if ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInputError(
                f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} runs past "
                f"the end of region '{ref.region}' ({region.byte_size} bytes)"
            )
        return region
