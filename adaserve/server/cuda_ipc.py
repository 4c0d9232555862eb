"""The CUDA driver calls Triton's CUDA shared-memory extension needs: open the IPC handle of a client's GPU memory,
copy from it and into it, close it. Through ctypes on the driver library (`libcuda.so.1`, there on any machine
that runs CUDA): the frontend imports neither torch nor a CUDA runtime, and makes a CUDA context (the device's
primary one) only when a client first registers such a region.

Every call comes from the server's event loop thread, so each makes the region's context current on it first.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import POINTER, byref, c_char, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p

import numpy as np

from adaserve.errors import InvalidInputError

#: cuIpcOpenMemHandle's flag that lets a handle of another GPU be opened on this one (peer access on demand).
_LAZY_ENABLE_PEER_ACCESS = 1
#: A CUipcMemHandle is 64 opaque bytes, what cudaIpcGetMemHandle gives a client (tritonclient's raw handle).
HANDLE_BYTES = 64


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", c_char * HANDLE_BYTES)]


#: The driver functions used, with their argument types (CUdeviceptr is 64 bits; the _v2 names are what cuda.h's
#: macros call since CUDA 3.2, and since 11 for cuIpcOpenMemHandle).
_SIGNATURES: dict[str, list[type]] = {
    "cuInit": [c_uint],
    "cuDeviceGet": [POINTER(c_int), c_int],
    "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int],
    "cuCtxSetCurrent": [c_void_p],
    "cuIpcOpenMemHandle_v2": [POINTER(c_uint64), _IpcHandle, c_uint],
    "cuIpcCloseMemHandle": [c_uint64],
    "cuMemcpyDtoH_v2": [c_void_p, c_uint64, c_size_t],
    "cuMemcpyHtoD_v2": [c_uint64, c_void_p, c_size_t],
    "cuCtxSynchronize": [],
    "cuGetErrorName": [c_int, POINTER(c_char_p)],
}


@functools.cache
def cuda_driver_present() -> bool:
    """Whether this machine has a CUDA driver to open clients' IPC handles with (the server then announces the CUDA
    shared-memory extension)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


class CudaDriver:
    """The driver library, initialised once; InvalidInputError (naming the call and the driver's error) for what
    a client's registration or request can cause."""

    def __init__(self) -> None:
        try:
            self._lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise InvalidInputError(
                f"CUDA shared memory needs a CUDA driver, and this machine has none ({exc})"
            ) from None
        for name, arguments in _SIGNATURES.items():
            function = getattr(self._lib, name)
            function.argtypes, function.restype = arguments, c_int
        self._contexts: dict[int, c_void_p] = {}
        self._call("cuInit", 0)

    def open(self, handle: bytes, device_id: int) -> int:
        """The device address of the memory a client's IPC handle (HANDLE_BYTES long) names, mapped into this
        process on `device_id`."""
        self._use(device_id)
        raw = _IpcHandle()
        ctypes.memmove(ctypes.addressof(raw), handle, HANDLE_BYTES)  # a c_char field would stop at a zero byte
        address = c_uint64()
        self._call("cuIpcOpenMemHandle_v2", byref(address), raw, _LAZY_ENABLE_PEER_ACCESS)
        return address.value

    def close(self, device_id: int, address: int) -> None:
        self._use(device_id)
        self._call("cuIpcCloseMemHandle", address)

    def read(self, device_id: int, address: int, size: int) -> memoryview:
        """`size` bytes from device memory, copied to the host."""
        buffer = bytearray(size)
        if not size:
            return memoryview(buffer)
        self._use(device_id)
        host = (c_char * size).from_buffer(buffer)
        self._call("cuMemcpyDtoH_v2", ctypes.addressof(host), address, size)
        return memoryview(buffer)

    def write(self, device_id: int, address: int, data: np.ndarray) -> None:
        """A contiguous array's bytes into device memory, there before this returns (the client reads them once
        the response arrives; from pageable memory the copy alone may return before its DMA ends)."""
        if not data.nbytes:
            return
        self._use(device_id)
        self._call("cuMemcpyHtoD_v2", address, data.ctypes.data, data.nbytes)
        self._call("cuCtxSynchronize")

    def _use(self, device_id: int) -> None:
        """Make the device's primary context current on this thread (retained once per device, for the server's
        life)."""
        context = self._contexts.get(device_id)
        if context is None:
            device, context = c_int(), c_void_p()
            self._call("cuDeviceGet", byref(device), device_id)
            self._call("cuDevicePrimaryCtxRetain", byref(context), device)
            self._contexts[device_id] = context
        self._call("cuCtxSetCurrent", context)

    def _call(self, name: str, *arguments: object) -> None:
        result = getattr(self._lib, name)(*arguments)
        if result != 0:
            text = c_char_p()
            self._lib.cuGetErrorName(result, byref(text))
            error = text.value.decode() if text.value else f"error {result}"
            raise InvalidInputError(f"CUDA driver: {name} failed: {error}")
