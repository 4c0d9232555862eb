"""The site's MkDocs hook: pages say `{{ NAME ARGUMENT }}` where a table is read from the code or the committed
results at build time, so no generated Markdown is committed and none can drift.

    {{ config adaserve.config.ModelConfig }}   every field of a config schema and its sections
    {{ cli }}                                  every command and option of `adaserve`
    {{ metrics }}                              every metric of /metrics
    {{ result serving_overhead.json }}         a result under benchmarks/results/: its tables and plots
    {{ doc benchmarks.serving_overhead }}      a module's docstring (what a benchmark measures, and how)
    {{ figures }}                              the headline figures, as the README shows them

It also publishes the plots under benchmarks/results/ at the same path in the site, so pages link them as files.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks` and `docs` are not installed; the hooks import them from the checkout

from benchmarks import tables  # noqa: E402
from docs.hooks import reference  # noqa: E402

RESULTS = Path("benchmarks") / "results"
MARKER = re.compile(r"\{\{ *(\w+)(?: +([^}]*?))? *\}\}")


def module_docstring(module: str) -> str:
    """A module's docstring, read without importing it; a `Usage: COMMAND` line becomes a code block."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    text = ast.get_docstring(ast.parse(path.read_text())) or ""
    return re.sub(r"^Usage: (.+)$", lambda match: f"Usage:\n\n```sh\n{match.group(1)}\n```", text, flags=re.M)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """MkDocs puts sys.path back after loading the hooks; the renderers import benchmark modules (and those
    `tests.server_utils`) later, from the checkout too."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for plot in sorted((ROOT / RESULTS).glob("*.png")):
        files.append(File.generated(config, (RESULTS / plot.name).as_posix(), abs_src_path=str(plot)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    base = os.path.relpath(RESULTS, Path(page.file.src_uri).parent).replace(os.sep, "/")
    renderers: dict[str, Callable[[str], str]] = {
        "config": reference.config_reference,
        "cli": lambda _: reference.cli_reference(),
        "metrics": lambda _: reference.metrics_reference(),
        "result": lambda name: tables.render_result(ROOT / RESULTS / name, plots=base),
        "figures": lambda _: tables.headline(ROOT / RESULTS),
        "doc": module_docstring,
    }

    def render(match: re.Match[str]) -> str:
        name, argument = match.group(1), match.group(2) or ""
        if name not in renderers:
            raise ValueError(f"{page.file.src_uri}: unknown marker {match.group(0)!r}")
        return renderers[name](argument)

    return MARKER.sub(render, markdown)
