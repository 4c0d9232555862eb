"""`adaserve activator build MODEL --data DATA`: build a node activator beside a model, no server needed.

DATA is `fashion-mnist` (Debian's dataset-fashion-mnist: the train split fills the tables, the first half of the
test split calibrates, since the model was trained on the train split) or an `.npz` with arrays `x` and `y` (a
seeded share is held out for calibration: give inputs the model was not trained on, or the calibrated accuracy is
its training accuracy). Errors a user can cause raise `AdaserveError` subclasses; `adaserve.cli.main` prints them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from adaserve.adaptive.config_block import add_config_block, add_print_config, keep_config_block
from adaserve.arguments import add_model_repository
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec

if TYPE_CHECKING:  # the build imports numba and torch; the command line imports them only when it builds
    from adaserve.adaptive.activator.build import BuildData

__all__ = ["load_data", "register"]

FASHION_MNIST = "fashion-mnist"
#: Test inputs of Fashion-MNIST used for calibration; the rest of the test split stays unseen for evaluation.
FASHION_MNIST_CALIBRATION = 5000


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `activator build` to the `adaserve` command line."""
    activator = subparsers.add_parser("activator", help="SLO-NNs node activators (per-request dynamic dropout)")
    commands = activator.add_subparsers(dest="activator_command", required=True)
    build = commands.add_parser(
        "build",
        help="build a model's node activator from data and store it as the next version in its directory",
        description="Train the Node Importance and confidence LSH tables of an MLP or a model's MLP head "
        "(Linear + ReLU layers), "
        "calibrate the confidence threshold on held-out data, and profile T(k, β) on this machine.",
    )
    build.add_argument("model", help="a model of the repository: an MLP, or a model ending in an MLP head")
    build.add_argument("--data", required=True, help=f"'{FASHION_MNIST}' or an .npz with arrays x and y")
    add_model_repository(build)
    build.add_argument("--bits", type=int, default=8, help="K: bits per LSH key (default 8)")
    build.add_argument("--tables", type=int, default=16, help="L: LSH tables per layer (default 16)")
    build.add_argument("--held-out", type=float, default=0.2, help=".npz data: share held out for calibration")
    build.add_argument("--busy-levels", type=int, help="profile β = 0..N busy processes (default: usable CPUs)")
    build.add_argument("--quick", action="store_true", help="fewer inputs and timings (seconds, for a try-out)")
    build.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_print_config(build, "activator")
    build.set_defaults(func=build_command)


def build_command(args: argparse.Namespace) -> int:
    from adaserve.adaptive.activator.build import BuildOptions, build_activator
    from adaserve.repository import ModelRepository

    spec = ModelRepository(args.model_repository).read(args.model)
    data = load_data(args.data, args.held_out)
    inputs = 2000 if args.quick else 10_000
    try:
        options = BuildOptions(
            bits=args.bits,
            tables=args.tables,
            busy_levels=args.busy_levels,
            max_confidence_inputs=inputs,
            max_calibration_inputs=inputs,
            latency_repeats=50 if args.quick else 300,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    folder, activator = build_activator(spec, data, options, progress=args.progress)
    calibration, latency = activator.calibration, activator.latency
    print(f"wrote {folder}")
    _say_config(spec, args.print_config)
    print(
        f"layers {'-'.join(map(str, activator.sizes))}, K={activator.nodes.bits} L={activator.nodes.tables}, "
        f"node tables {activator.nodes.nbytes() / 1e6:.1f} MB, held-out dense accuracy {calibration.dense_accuracy:.4f}"
    )
    print("k      " + " ".join(f"{k:>6.3f}" for k in activator.k_grid))
    plans = ("".join("d" if dense else "s" for dense in row) for row in activator.dense_at)
    print("plan   " + " ".join(f"{plan:>6}" for plan in plans) + "  (s sparse, d dense: faster as timed here)")
    if math.isinf(activator.aclo_from):
        print("ACLO was not faster than k = 100% at any accuracy target here: targets run at k = 100%")
    else:
        reach = calibration.accuracy[np.searchsorted(calibration.thresholds, activator.aclo_from)]
        print(f"ACLO serves accuracy targets up to {reach:.4f}; tighter ones run at k = 100%, which was faster")
    for beta, row in zip(latency.busy, latency.cpu_p99_ms, strict=True):
        print(f"β={beta} T ms " + " ".join(f"{t:>6.3f}" for t in row))
    return 0


def _say_config(spec: ModelSpec, print_only: bool) -> None:
    """Serving the activator takes an `activator:` block in the model's config: add it (or print it)."""
    served = spec.config.activator
    if served is None:
        add_config_block(spec, "activator", "{}", print_only=print_only)
    else:
        keep_config_block(
            "activator", f"it serves {f'version {served.version}' if served.version else 'the newest version'}"
        )


def load_data(name: str, held_out: float = 0.2, seed: int = 0) -> BuildData:
    """DATA as the build takes it: table inputs and labelled held-out inputs."""
    from adaserve.adaptive.activator.build import BuildData
    from adaserve.datasets import load_fashion_mnist

    if name.lower() in (FASHION_MNIST, "fashion_mnist"):
        train_x, _ = load_fashion_mnist("train")
        test_x, test_y = load_fashion_mnist("test")
        n = FASHION_MNIST_CALIBRATION
        return BuildData(train_x, test_x[:n], test_y[:n], f"{FASHION_MNIST}: train (tables), test[:{n}] (calibration)")
    path = Path(name)
    if path.suffix != ".npz":
        raise ConfigError(f"--data {name!r}: expected '{FASHION_MNIST}' or an .npz file with arrays x and y")
    if not 0 < held_out < 1:
        raise ConfigError(f"--held-out must be a share in (0, 1), got {held_out}")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            x, y = arrays["x"], arrays["y"]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except KeyError as exc:
        raise ConfigError(f"{path}: needs arrays 'x' and 'y' ({exc} is missing)") from None
    if len(x) != len(y) or len(x) < 2:
        raise ConfigError(f"{path}: x has {len(x)} rows and y {len(y)}; need the same number, at least 2")
    order = np.random.default_rng(seed).permutation(len(x))
    held = max(1, int(len(x) * held_out))
    return BuildData(
        x[order[held:]],
        x[order[:held]],
        y[order[:held]],
        f"{path}: {len(x) - held} inputs for the tables, {held} held out",
    )
