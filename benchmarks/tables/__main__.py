"""`python -m benchmarks.tables RESULT.json ...` prints each result's tables as the site shows them;
`python -m benchmarks.tables --readme` rewrites the README's figures table from the committed results."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.tables import ROOT, render_result, with_headline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__)
    parser.add_argument("results", nargs="*", type=Path, help="result files to print")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's figures table")
    args = parser.parse_args(argv)
    for path in args.results:
        print(render_result(path.resolve(), plots="benchmarks/results"), end="\n\n")
    if args.readme:
        readme = ROOT / "README.md"
        readme.write_text(with_headline(readme.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
