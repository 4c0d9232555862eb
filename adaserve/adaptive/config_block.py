"""The config block a build's result needs to serve (`activator:`, `caches:`), which the build adds itself.

A new user who built an activator or a cache set then had to find which block of config.yaml serves it (issue 53):
`activator build` and `caches build` now append the block (`--print-config` prints it instead), and leave a block
the config already has as written, saying what it serves.
"""

from __future__ import annotations

import argparse

from adaserve.repository import CONFIG_FILE, ModelSpec, append_config_block

__all__ = ["add_config_block", "add_print_config", "keep_config_block"]

RELOAD = "a running server serves it when it next loads the model (POST /v2/repository/models/NAME/load)"


def add_print_config(parser: argparse.ArgumentParser, key: str) -> None:
    """`--print-config`: print the `key:` block instead of adding it to config.yaml."""
    parser.add_argument(
        "--print-config",
        action="store_true",
        help=f"print the `{key}:` block the model's config needs instead of adding it to config.yaml",
    )


def add_config_block(spec: ModelSpec, key: str, block: str, *, print_only: bool) -> None:
    """Add `key: block` (YAML flow text) to the model's config.yaml, which has no `key:` block, or print it."""
    path = spec.directory / CONFIG_FILE
    if print_only:
        print(f"to serve it, add to {path}:\n  {key}: {block}")
    else:
        append_config_block(spec.directory, key, block)
        print(f"added `{key}: {block}` to {path}")
    print(RELOAD)


def keep_config_block(key: str, serving: str) -> None:
    """Say what the `key:` block the config already has serves; it is left as written."""
    print(f"{CONFIG_FILE} keeps its `{key}:` block: {serving}")
    print(RELOAD)
