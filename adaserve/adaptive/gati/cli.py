"""`adaserve caches build MODEL --data DATA`, `compose MODEL` and `list MODEL`: GATI's deployment phase.

`build` explores (trains every predictor variant and its selector after every candidate block), composes for each
target, and saves the result as a new cache set version in the model's folder; a config without a `caches:` block
gets one whose default target is the strictest built target that deploys an exit (`choose_default`). `compose`
recomposes an existing set for other targets, a memory budget or α without retraining, rewriting that version's
manifest, and treats the config's block as `build` does. Both print the per-variant table and the compositions.
`list` shows every version, built or adapted, with what its default compositions expect, which one the config
serves, and what a request that sets no parameter gets.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from adaserve.adaptive.config_block import add_config_block, add_print_config, keep_config_block
from adaserve.arguments import add_model_repository, positive_integer, positive_number
from adaserve.config import ModelConfig
from adaserve.errors import AdaserveError
from adaserve.repository import ModelRepository

if TYPE_CHECKING:  # torch is imported only when a command runs, so `adaserve --help` stays fast
    from adaserve.adaptive.gati.cacheset import CompositionRecord, Manifest
    from adaserve.repository import ModelSpec

__all__ = [
    "DEFAULT_TARGETS",
    "caches_block",
    "choose_default",
    "default_request",
    "format_cache_set",
    "format_versions",
    "register",
]

#: The targets a build composes for when neither `--target` nor the config's `caches.targets` names them: from
#: strict to loose, so the strictest one that deploys an exit can be the default (on the example CNN 0.99 deploys
#: none).
DEFAULT_TARGETS = (0.99, 0.98, 0.97, 0.95)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction strictly between 0 and 1, got {value}")
    return value


def _variants(text: str) -> tuple[Any, ...]:
    from adaserve.adaptive.gati.predictors import VariantSpec

    try:
        return tuple(VariantSpec.parse(v) for v in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `caches build`, `caches compose` and `caches list` to the `adaserve` command line."""
    caches = subparsers.add_parser("caches", help="GATI learned caches: build, compose and list a model's cache sets")
    commands = caches.add_subparsers(dest="caches_command", required=True)

    build = commands.add_parser(
        "build",
        help="train learned caches for a model and save them as a new cache set version",
        description="Run the model over the validation data, train every predictor variant and its selector "
        "after every candidate block, measure hit rate, agreement, lookup latency and memory, compose for each "
        "target, and save <model dir>/caches/v<N>/.",
    )
    build.add_argument("model", help="a model of the repository")
    build.add_argument("--data", required=True, help="fashion-mnist (its test split) or an .npz with x (and y)")
    build.add_argument(
        "--fit-data",
        help="rows that only fit the predictors, e.g. fashion-mnist-train (the training split) or an .npz: "
        "--data's rows then all set and measure thresholds",
    )
    build.add_argument("--quick", action="store_true", help="3 variants, 4 epochs: about a minute, not ten")
    build.add_argument(
        "--variants", type=_variants, help="comma-separated variants, e.g. 'FC(512),Pool(4096),Conv(3,1)'"
    )
    build.add_argument("--max-samples", type=positive_integer, help="use at most this many validation rows")
    build.add_argument("--epochs", type=positive_integer, help="predictor training epochs (default 10; --quick 4)")
    build.add_argument(
        "--threads", type=positive_integer, default=1, help="torch threads for training and timing (default 1)"
    )
    build.add_argument("--seed", type=int, default=0, help="seed of the splits and the training (default 0)")
    build.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    add_print_config(build, "caches")
    _composition_arguments(build)
    build.set_defaults(func=build_command)

    recompose = commands.add_parser(
        "compose",
        help="recompose a built cache set for other targets, a memory budget or alpha",
        description="Choose caches and thresholds again from the per-row scores a build stored, and rewrite the "
        "set's manifest; nothing is retrained.",
    )
    recompose.add_argument("model", help="a model of the repository with a built cache set")
    recompose.add_argument("--version", type=positive_integer, help="cache set version (default: the newest)")
    add_print_config(recompose, "caches")
    _composition_arguments(recompose)
    recompose.set_defaults(func=compose_command)

    listing = commands.add_parser(
        "list",
        help="models' cache set versions, built or adapted, the one the config serves and what a request without "
        "parameters gets",
        description="Per model, what a request that sets no parameter gets (the config's first target's exits), "
        "then one entry per version: when and how it was made (a build, or adaptation from which version), "
        "its size on disk, and per target its default composition's exits, agreement and hit rate on held-out rows "
        "and expected speedup; a version built for another artifact is marked stale.",
    )
    listing.add_argument(
        "model", nargs="?", help="a model of the repository (default: every model with a caches block or cache set)"
    )
    listing.set_defaults(func=list_command)
    for parser in (build, recompose, listing):
        add_model_repository(parser)


def _composition_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        type=_fraction,
        action="append",
        help="agreement with the base model to compose for (repeatable; default: the config's caches.targets, "
        f"else {', '.join(map(str, DEFAULT_TARGETS))})",
    )
    parser.add_argument(
        "--memory-mb", type=positive_number, help="memory the chosen caches may hold (default: caches.memory_budget_mb)"
    )
    parser.add_argument("--alpha", type=float, help="the MILP's weight of hit rate (default 0.2)")
    parser.add_argument(
        "--risk",
        type=_fraction,
        help="the chance, at most, that the default composition's agreement is below its target: the level of the "
        "test on held-out calibrate rows (default 0.05)",
    )


def _composition_options(args: argparse.Namespace) -> dict[str, Any]:
    """`--alpha` and `--risk` where given; composition's own defaults otherwise."""
    return {name: value for name in ("alpha", "risk") if (value := getattr(args, name)) is not None}


def _targets_and_budget(args: argparse.Namespace, config: ModelConfig) -> tuple[list[float], int | None]:
    caches = config.caches
    targets = args.target or list(caches.targets if caches else DEFAULT_TARGETS)
    memory_mb = args.memory_mb or (caches.memory_budget_mb if caches else None)
    return targets, int(memory_mb * 1e6) if memory_mb else None


def build_command(args: argparse.Namespace) -> int:
    import torch

    from adaserve.adaptive.gati.explore import ExploreSettings, build_cache_set

    torch.set_num_threads(args.threads)
    spec = ModelRepository(args.model_repository).read(args.model)
    targets, budget = _targets_and_budget(args, spec.config)
    settings = ExploreSettings.for_run(quick=args.quick, seed=args.seed, max_samples=args.max_samples)
    if args.variants:
        settings = replace(settings, variants=args.variants)
    if args.epochs:
        settings = replace(settings, train=replace(settings.train, epochs=args.epochs))
    began = time.perf_counter()
    cache_set = build_cache_set(
        spec,
        args.data,
        settings,
        targets=targets,
        fit_source=args.fit_data,
        memory_budget_bytes=budget,
        progress=args.progress,
        **_composition_options(args),
    )
    print(f"wrote {cache_set.directory} in {time.perf_counter() - began:.0f} s")
    print(format_cache_set(cache_set.manifest))
    _say_config(spec, cache_set.manifest, targets, args.print_config)
    return 0


def _say_config(spec: ModelSpec, manifest: Manifest, targets: list[float], print_only: bool) -> None:
    """Serving the set takes a `caches:` block whose first target deploys an exit: add it (or print it), or say
    why none is added."""
    chosen = choose_default(manifest)
    if spec.config.caches is not None:
        keep_config_block("caches", f"a request that sets no parameter gets {default_request(spec)}")
        if chosen is not None and chosen.target != spec.config.caches.targets[0]:
            print(f"(the strictest target that deploys an exit is {chosen.target:g}: {_outcome(chosen)})")
        return
    if chosen is None:
        print(
            f"no target deploys an exit on {spec.name}, so no caches block was added: with one every request would "
            "run the model whole, block by block; try a lower --target, or more rows (--max-samples, --fit-data)"
        )
        return
    print(f"default target {chosen.target:g}, the strictest that deploys an exit: {_outcome(chosen)}")
    add_config_block(spec, "caches", caches_block(chosen.target, targets), print_only=print_only)


def choose_default(manifest: Manifest) -> CompositionRecord | None:
    """The default composition of the strictest target that deploys an exit, or None when none does: a request
    that sets no parameter should leave early where the certification allows it at all."""
    deploying = (c for c in manifest.compositions if c.default and c.exits)
    return max(deploying, key=lambda c: c.target, default=None)


def caches_block(default: float, targets: list[float]) -> str:
    """The `caches:` block (YAML flow text) serving `targets` with `default` first, the target of a request that sets
    none; the others stay, so a request asking for a stricter one gets its composition, not the default's."""
    ordered = [default, *(t for t in targets if t != default)]
    return f"{{targets: [{', '.join(f'{t:g}' for t in ordered)}]}}"


def default_request(spec: ModelSpec) -> str:
    """What a request that sets no parameter gets from the model's learned caches (its config has a `caches:`
    block), found as a worker finds it: the config's first target's composition in the cache set it names."""
    from adaserve.adaptive.gati.cacheset import load_cache_set

    caches = spec.config.caches
    assert caches is not None
    target = caches.targets[0]
    try:
        composition = load_cache_set(spec, caches.version).composition(target)
    except AdaserveError as exc:
        return f"target {target:g}: the model runs whole ({exc})"
    return f"target {target:g}: {_outcome(composition)}"


def _outcome(composition: CompositionRecord) -> str:
    """A composition's exits and what it measured on the held-out rows."""
    if not composition.exits:
        return _exits(composition)
    ev = composition.evaluate
    return f"{_exits(composition)}, hit rate {sum(ev.exit_rates):.3f} at agreement {ev.agreement:.4f} on held-out rows"


def _exits(composition: CompositionRecord) -> str:
    if not composition.exits:
        return "no exit: the model runs whole"
    return f"exits after {', '.join(e.block for e in composition.exits)}"


def compose_command(args: argparse.Namespace) -> int:
    from adaserve.adaptive.gati.cacheset import load_cache_set, rewrite_manifest
    from adaserve.adaptive.gati.compose import compose, lookup_cost

    spec = ModelRepository(args.model_repository).read(args.model)
    targets, budget = _targets_and_budget(args, spec.config)
    cache_set = load_cache_set(spec, args.version or "latest")
    manifest = compose(
        cache_set.manifest.model_copy(update={"lookups": lookup_cost(spec.config)}),  # as the config runs them now
        cache_set.scores(),
        targets,
        memory_budget_bytes=budget,
        **_composition_options(args),
    )
    rewrite_manifest(cache_set.directory, manifest)
    print(f"rewrote {cache_set.directory / 'manifest.json'}")
    print(format_cache_set(manifest))
    _say_config(spec, manifest, targets, args.print_config)
    return 0


def list_command(args: argparse.Namespace) -> int:
    from adaserve.adaptive.gati.cacheset import versions

    repository = ModelRepository(args.model_repository)
    if args.model:
        print(format_versions(repository.read(args.model)))
        return 0
    for name in repository.names():
        try:
            spec = repository.read(name)
        except AdaserveError as exc:
            print(f"{name}: cannot be read: {exc}")
            continue
        if spec.config.caches is not None or versions(spec.directory):
            print(format_versions(spec))
    return 0


def format_versions(spec: ModelSpec) -> str:
    """A model's cache set versions, oldest first, as `adaserve caches list` prints them."""
    from adaserve.adaptive.gati.cacheset import CacheSetError, artifact_sha256, read_manifest, versions

    found = versions(spec.directory)
    if not found:
        return f"{spec.name} has no cache set; build one with `adaserve caches build {spec.name}`"
    caches = spec.config.caches
    if caches is None:
        served, serving = None, "its config has no caches section, so none is served"
    else:
        served = found[-1] if caches.version == "latest" else caches.version
        serving = f"the config names v{served}" + (" (latest)" if caches.version == "latest" else "")
    count = f"{len(found)} cache set version" + ("s" if len(found) > 1 else "")
    lines = [f"{spec.name}: {count} in {spec.directory / 'caches'}; {serving}"]
    if caches is not None:
        lines.append(f"a request that sets no parameter gets {default_request(spec)}")
    digest = artifact_sha256(spec.artifact)
    for number in found:
        directory = spec.directory / "caches" / f"v{number}"
        size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
        mark = " [the config's]" if number == served else ""
        whole = "; the model is served whole" if number == served else ""
        try:
            manifest = read_manifest(directory)
        except CacheSetError as exc:
            lines.append(f"v{number}  {size / 1e6:.1f} MB{mark}  unreadable: {exc}{whole}")
            continue
        settings, data = manifest.settings, manifest.data
        if "adapted_from" in settings:
            took = settings.get("retrain_s")
            origin = f"adapted from {settings['adapted_from']}" + (
                f", retrained in {took:.1f} s" if isinstance(took, int | float) else ""
            )
        else:
            sources = data.source + (f" + {data.fit_source}" if data.fit_source else "")
            origin = f"built from {sources}, {data.rows} rows"
        lines.append(f"v{number}  {manifest.created}  {origin}  {size / 1e6:.1f} MB{mark}")
        if (manifest.model, manifest.model_version, manifest.artifact_sha256) != (spec.name, spec.version, digest):
            lines.append(
                f"    stale: built for {manifest.model} version {manifest.model_version} (artifact sha256 "
                f"{manifest.artifact_sha256[:12]}…), not what {spec.name} serves now{whole}"
            )
        base = sum(manifest.block_latency_s)
        for c in sorted((c for c in manifest.compositions if c.default), key=lambda c: -c.target):
            ev = c.evaluate
            lines.append(
                f"    target {c.target:g}: agreement {ev.agreement:.4f}, hit rate {sum(ev.exit_rates):.3f}, "
                f"{base / ev.mean_latency_s:.2f}× expected; {_exits(c)}"
            )
    return "\n".join(lines)


def format_cache_set(manifest: Manifest) -> str:
    """Per-variant measurements at each target and the compositions, as text tables."""
    base = sum(manifest.block_latency_s)
    blocks = ", ".join(f"{b} {t * 1e6:.0f} µs" for b, t in zip(manifest.blocks, manifest.block_latency_s, strict=True))
    data = manifest.data
    sources = data.source + (f" and {data.fit_source} (fit data)" if data.fit_source else "")
    lines = [
        f"{manifest.model} (model version {manifest.model_version}): {data.rows} rows of {sources} "
        f"({', '.join(f'{k} {v}' for k, v in data.splits.items())})",
        f"blocks (batch 1, 1 thread): {blocks}; all in one run {manifest.base_latency_s * 1e6:.0f} µs",
    ]
    for target in sorted({c.target for c in manifest.compositions}, reverse=True):
        key = f"{target:g}"
        lines += [
            "",
            f"target {key}: each cache alone on the evaluate split (threshold set on calibrate)",
            f"{'block':>10} {'variant':>11} {'hit':>6} {'agree':>7} {'softmax hit':>11} {'agree':>7} "
            f"{'lookup µs':>9} {'MB':>7}",
        ]
        for v in manifest.variants:
            if key not in v.targets:
                continue
            r = v.targets[key]
            lines.append(
                f"{v.block:>10} {v.variant:>11} {r.selector.hit_rate:>6.3f} {r.selector.agreement:>7.4f} "
                f"{r.softmax.hit_rate:>11.3f} {r.softmax.agreement:>7.4f} {v.lookup_latency_s * 1e6:>9.0f} "
                f"{v.memory_bytes / 1e6:>7.3f}"
            )
        for c in manifest.compositions:
            if c.target != target:
                continue
            exits = ", ".join(f"{e.key}@{e.threshold:.3f}" for e in c.exits) or "none"
            ev = c.evaluate
            checked = ""
            if c.check and c.risk:
                checked = f", certified at risk {c.risk:g} (check rows {c.check.agreement:.4f})"
            lines.append(
                f"{c.method:>8}{'*' if c.default else ' '} α={c.alpha:.1f} agreement {ev.agreement:.4f} "
                f"({'meets' if c.meets_target else 'BELOW'} target{checked}), expected "
                f"{ev.mean_latency_s * 1e6:.0f} µs = {base / ev.mean_latency_s:.2f}× faster, "
                f"{c.memory_bytes / 1e6:.2f} MB: {exits}"
            )
    return "\n".join(lines)
