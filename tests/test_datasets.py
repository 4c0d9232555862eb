"""Fashion-MNIST loading: the installed files parse to the documented arrays; broken files fail by name."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from adaserve.datasets import DatasetError, load_fashion_mnist


def write_idx(path: Path, data: np.ndarray, *, magic: bytes | None = None, dims: tuple[int, ...] | None = None) -> None:
    """Write `data` (uint8) as a gzipped IDX file; `magic` and `dims` override the header to corrupt it."""
    dims = data.shape if dims is None else dims
    header = (magic or bytes([0, 0, 0x08, len(dims)])) + struct.pack(f">{len(dims)}I", *dims)
    path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))


def write_split(root: Path, images: np.ndarray, labels: np.ndarray) -> None:
    write_idx(root / "t10k-images-idx3-ubyte.gz", images)
    write_idx(root / "t10k-labels-idx1-ubyte.gz", labels)


@pytest.mark.parametrize(("split", "rows"), [("train", 60_000), ("test", 10_000)])
def test_installed_split_shapes_and_ranges(split: Literal["train", "test"], rows: int) -> None:
    images, labels = load_fashion_mnist(split)
    assert images.shape == (rows, 1, 28, 28) and images.dtype == np.float32
    assert labels.shape == (rows,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0
    assert set(np.unique(labels)) == set(range(10))


def test_parses_pixels_and_labels(tmp_path: Path) -> None:
    pixels = np.arange(2 * 28 * 28).reshape(2, 28, 28) % 256
    write_split(tmp_path, pixels, np.array([3, 9]))
    images, labels = load_fashion_mnist("test", root=tmp_path)
    np.testing.assert_array_equal(images[:, 0], (pixels / 255).astype(np.float32))
    np.testing.assert_array_equal(labels, [3, 9])


def test_missing_folder_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("test", root=tmp_path / "absent")


def test_missing_file_is_named(tmp_path: Path) -> None:
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((1, 28, 28)))
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte\.gz: file not found"):
        load_fashion_mnist("test", root=tmp_path)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        ({"magic": b"\x00\x00\x0d\x03"}, "bad IDX magic 00000d03; expected 00000803"),
        ({"dims": (3, 28, 28)}, r"header promises \(3, 28, 28\) = 2352 bytes of data, found 1568"),
        ({"dims": (2, 28, 27)}, r"rows are shaped \(28, 27\), expected \(28, 28\)"),
    ],
)
def test_corrupt_images_file_is_named(tmp_path: Path, corrupt: dict[str, Any], message: str) -> None:
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((2, 28, 28)), **corrupt)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(2))
    with pytest.raises(DatasetError, match=rf"t10k-images-idx3-ubyte\.gz: {message}"):
        load_fashion_mnist("test", root=tmp_path)


def test_not_gzip_is_named(tmp_path: Path) -> None:
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(DatasetError, match=r"t10k-images-idx3-ubyte\.gz: not a readable gzip file"):
        load_fashion_mnist("test", root=tmp_path)


def test_image_and_label_counts_must_agree(tmp_path: Path) -> None:
    write_split(tmp_path, np.zeros((2, 28, 28)), np.zeros(3))
    with pytest.raises(DatasetError, match="test split has 2 images but 3 labels"):
        load_fashion_mnist("test", root=tmp_path)
