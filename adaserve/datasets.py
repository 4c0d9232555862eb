"""Fashion-MNIST from the IDX gzip files that Debian's `dataset-fashion-mnist` package installs.

Reading the original files (rather than a downloader) keeps examples and tests offline and reproducible.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Literal

import numpy as np

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")

#: The IDX element type code 0x08 (unsigned byte) is the only one Fashion-MNIST uses.
_UBYTE = 0x08

_PREFIX = {"train": "train", "test": "t10k"}


#: Fashion-MNIST's class names, by label (its README's order).
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


class DatasetError(ValueError):
    """A dataset file that is missing or not what its name promises; the message names the file."""


def load_fashion_mnist(split: Literal["train", "test"], root: Path = DEFAULT_ROOT) -> tuple[np.ndarray, np.ndarray]:
    """Images float32 in [0, 1] shaped (N, 1, 28, 28) and labels int64 shaped (N,)."""
    if split not in _PREFIX:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not root.is_dir():
        raise DatasetError(f"{root}: Fashion-MNIST not found; install it with `apt-get install dataset-fashion-mnist`")
    prefix = _PREFIX[split]
    images = _read_idx(root / f"{prefix}-images-idx3-ubyte.gz", row_shape=(28, 28))
    labels = _read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", row_shape=())
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(f"{root}: {split} split has {images.shape[0]} images but {labels.shape[0]} labels")
    pixels = images.astype(np.float32)[:, np.newaxis] / np.float32(255.0)
    return pixels, labels.astype(np.int64)


def _read_idx(path: Path, *, row_shape: tuple[int, ...]) -> np.ndarray:
    """Parse one IDX file: magic `0 0 <type> <ndim>`, ndim big-endian uint32 sizes, then the data."""
    ndim = 1 + len(row_shape)
    try:
        with gzip.open(path, "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise DatasetError(
            f"{path}: file not found; reinstall it with `apt-get install dataset-fashion-mnist`"
        ) from None
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path}: not a readable gzip file: {exc}") from None
    magic = raw[:4]
    expected = bytes([0, 0, _UBYTE, ndim])
    if magic != expected:
        raise DatasetError(f"{path}: bad IDX magic {magic.hex()}; expected {expected.hex()}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if dims[1:] != row_shape:
        raise DatasetError(f"{path}: rows are shaped {dims[1:]}, expected {row_shape}")
    size = int(np.prod(dims))
    if len(raw) - header != size:
        raise DatasetError(f"{path}: header promises {dims} = {size} bytes of data, found {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)
