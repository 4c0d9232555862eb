"""Which committed results are older than the code they measure: `python -m benchmarks.stale [--all]`.

The rule. A result file names its benchmark in its command (`python -m benchmarks.slo_nns.run ...`). The code it
measures is

- its subject: the adaserve packages its modules import, each the deepest package at most two levels below
  `adaserve` (`adaserve/adaptive/activator/`, `adaserve/cache/`), the load generator `adaserve/bench/` aside;
- its harness: the benchmark's module, the `benchmarks` modules it imports and theirs (not `benchmarks.common`,
  which only records the machine and writes the file), and the load generator.

adaserve's top-level modules (`config.py`, `zoo.py`, `export.py`, ...) describe models for every benchmark and do
not count, nor does code a benchmark reaches only through a server it starts (the frontend and engine): counting
them would mark every result stale at each change. Nor does a package's command line (its `cli.py`), which no
benchmark runs in its process.

A result is *stale* when its subject changed in a commit after the one it ran at (`machine.commit`, recorded since
results carry it) or, for a result without one (or with one this clone does not have), after the last commit of the
result file itself; *harness changed* when only its harness did (the figures may still hold: read it as stale for
`generator_fidelity`, whose subject is the load generator). A change counts when it changes code: comments,
docstrings and formatting do not (Python files are compared as syntax trees without their strings-as-statements);
any change to another file does.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Imported by every benchmark to record and write; not what any of them measures.
RECORDING = "benchmarks.common"
#: The load generator: part of every serving benchmark's harness rather than its subject.
GENERATOR = "adaserve/bench/"
_MODULE = re.compile(r"-m\s+(benchmarks(?:\.\w+)+)")


@dataclass(frozen=True)
class Verdict:
    result: str  # the file's path in the repository
    benchmark: str | None  # its module, None when its command names none
    since: str | None  # the commit the check counts from, None when the file is not committed
    recorded: bool  # whether `since` is the commit the result recorded (else the file's last commit)
    changed: tuple[str, ...]  # measured paths whose code changed after `since`, subject first
    dirty: bool | None  # the result's own record of uncommitted changes (None: not recorded)

    @property
    def stale(self) -> bool:
        """Whether the adaserve code under test changed since."""
        return any(_subject(path) for path in self.changed)


def _subject(path: str) -> bool:
    return path.startswith("adaserve/") and path != GENERATOR


def check(root: Path) -> list[Verdict]:
    """A verdict for each result file under `root`'s benchmarks/results/, by name."""
    return [verdict(root, path) for path in sorted((root / "benchmarks" / "results").glob("*.json"))]


def verdict(root: Path, path: Path) -> Verdict:
    """The verdict on one result file under `root`."""
    record = json.loads(path.read_text())
    name = path.relative_to(root).as_posix()
    found = _MODULE.search(str(record.get("command", "")))
    machine = record.get("machine") or {}
    recorded = machine.get("commit")
    if recorded and not _git(root, "rev-parse", "--verify", "-q", f"{recorded}^{{commit}}", check=False):
        recorded = None  # a commit this clone does not have (rebased away): count from the file's own
    since = recorded or _git(root, "log", "-1", "--format=%H", "--", name) or None
    if found is None or since is None:
        return Verdict(name, found and found.group(1), since, recorded is not None, (), machine.get("dirty"))
    measured = measured_paths(root, found.group(1))
    return Verdict(
        name, found.group(1), since, recorded is not None, _changed(root, since, measured), machine.get("dirty")
    )


def measured_paths(root: Path, module: str) -> list[str]:
    """The files and package folders (ending in /) the rule counts for a benchmark module, sorted."""
    seen: set[str] = set()
    packages: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        file = _module_file(root, name)
        if name in seen or file is None:
            continue
        seen.add(name)
        for imported in _imports(file):
            if imported.startswith("benchmarks.") and imported != RECORDING:
                pending.append(imported)
            elif imported.startswith("adaserve."):
                package = _package(root, imported)
                if package is not None:
                    packages.add(package)
    files = {_module_file(root, name).relative_to(root).as_posix() for name in seen}  # type: ignore[union-attr]
    return sorted(files | packages, key=lambda path: (not _subject(path), path))


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        if file.is_file():
            return file
    return None


def _imports(file: Path) -> set[str]:
    """Every module a file imports by absolute name, `from package import module` resolved to the module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _package(root: Path, module: str) -> str | None:
    """The deepest package at most two levels below adaserve that holds `module`; None for a top-level module."""
    parts = module.split(".")
    for depth in (3, 2):
        folder = root.joinpath(*parts[:depth])
        if len(parts) >= depth and (folder / "__init__.py").is_file():
            return folder.relative_to(root).as_posix() + "/"
    return None


def _changed(root: Path, since: str, measured: list[str]) -> tuple[str, ...]:
    """The measured paths with a file whose code differs between `since` and HEAD."""
    files = [
        file
        for file in _git(root, "diff", "--name-only", since, "HEAD", "--", *measured).splitlines()
        if not (file.startswith("adaserve/") and file.endswith("/cli.py"))
    ]
    return tuple(
        path
        for path in measured
        if any(_code_changed(root, since, file) for file in files if file == path or file.startswith(path))
    )


def _code_changed(root: Path, since: str, file: str) -> bool:
    before, after = (
        _git(root, "rev-parse", "--verify", "-q", f"{commit}:{file}", check=False) for commit in (since, "HEAD")
    )
    if before == after:
        return False
    if not (file.endswith(".py") and before and after):
        return True
    return _code(root, before) != _code(root, after)


@functools.cache
def _code(root: Path, blob: str) -> str:
    """A Python file's syntax tree without strings standing as statements (docstrings), by its blob's id; its text if
    it does not parse."""
    source = _git(root, "cat-file", "-p", blob)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            node.body = kept or [ast.Pass()]  # type: ignore[attr-defined]
    return ast.dump(tree)


def _git(root: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip() if done.returncode == 0 else ""


def describe(verdict: Verdict) -> str:
    """One line: the file, whether it is stale, and why."""
    name = Path(verdict.result).name
    if verdict.benchmark is None:
        return f"{name}: no benchmark module in its command"
    if verdict.since is None:
        return f"{name}: not committed yet"
    origin = f"{'ran at' if verdict.recorded else 'committed at'} {verdict.since[:7]}"
    if verdict.dirty:
        origin += " with uncommitted changes"
    if not verdict.changed:
        return f"{name}: current ({origin})"
    state = "STALE" if verdict.stale else "harness changed"
    return f"{name}: {state} ({origin}); changed since: {', '.join(verdict.changed)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="list current results too")
    args = parser.parse_args(argv)
    verdicts = check(ROOT)
    for verdict in verdicts:
        if args.all or verdict.changed:
            print(describe(verdict))
    stale, harness = sum(v.stale for v in verdicts), sum(bool(v.changed) and not v.stale for v in verdicts)
    print(f"{len(verdicts)} results: {stale} stale, {harness} with only their harness changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
