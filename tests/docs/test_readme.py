"""The README is the front door: short, its two commands real, its tour the tested one, its figures the results'."""

from __future__ import annotations

import re

from benchmarks.tables import with_headline
from tests.server_utils import ROOT

README = (ROOT / "README.md").read_text()


def test_the_readme_stays_short() -> None:
    assert len(README.splitlines()) <= 150


def test_its_two_commands_are_the_makefiles() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^make serve ", README, re.M) and re.search(r"^make test ", README, re.M)
    assert re.search(r"^serve: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)


def test_its_tour_is_the_tested_first_request() -> None:
    """tests/docs/test_examples.py runs docs/examples/first_request.sh against a server; the tour is that file."""
    tour = (ROOT / "docs" / "examples" / "first_request.sh").read_text()
    assert f"```sh\n{tour}```" in README


def test_its_figures_are_what_the_committed_results_say() -> None:
    assert with_headline(README) == README, "run: python -m benchmarks.tables --readme"
