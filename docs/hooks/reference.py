"""The reference pages' tables, read from the code at build time: the config schema (pydantic field info), the
command line (the argparse parser) and the metrics (the Prometheus collectors). A field, option or metric without
its description stops the build, so the code stays the one complete source."""

from __future__ import annotations

import argparse
import importlib
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]


class MissingDescription(ValueError):
    """Something the reference lists has no description in the code."""


# -- the config schema ---------------------------------------------------------------------------------------------


@dataclass
class _Section:
    model: type[BaseModel]
    paths: list[str]


def config_reference(target: str) -> str:
    """Every field of the pydantic model `target` ("module.Class") and of the sections it nests: one table each."""
    module, _, name = target.rpartition(".")
    root: type[BaseModel] = getattr(importlib.import_module(module), name)
    sections: dict[type[BaseModel], _Section] = {}
    _collect(root, "", sections)
    return "\n\n".join(_section(section, sections) for section in sections.values()) + "\n"


def _collect(model: type[BaseModel], path: str, sections: dict[type[BaseModel], _Section]) -> None:
    if model in sections:
        sections[model].paths.append(path)
        return
    sections[model] = _Section(model, [path])
    for name, field in model.model_fields.items():
        for nested, suffix in _nested_models(field.annotation):
            _collect(nested, f"{path}.{name}{suffix}".lstrip("."), sections)


def _nested_models(annotation: Any, suffix: str = "") -> Iterator[tuple[type[BaseModel], str]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, suffix
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple:
        suffix += "[]"
    elif origin is dict:
        args, suffix = args[1:], suffix + ".<key>"
    for arg in args:
        yield from _nested_models(arg, suffix)


def _anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def _section(section: _Section, sections: dict[type[BaseModel], _Section]) -> str:
    title = " / ".join(f"`{path}`" for path in section.paths) if section.paths[0] else "The whole file"
    intro = " ".join((section.model.__doc__ or "").split("\n\n")[0].split())
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, field in section.model.model_fields.items():
        if not field.description:
            raise MissingDescription(f"{section.model.__name__}.{name} has no description")
        rows.append(
            f"| `{name}` | {_type(field.annotation, sections)}{_bounds(field)} | {_default(field, sections)} "
            f"| {_cell(field.description)} |"
        )
    return f"## {title} {{#{_anchor(section.model)}}}\n\n{intro}\n\n" + "\n".join(rows)


def _type(annotation: Any, sections: dict[type[BaseModel], _Section]) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{_anchor(annotation)})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(arg, sections) for arg in args)
    if origin is tuple:
        return f"list of {_type(args[0], sections)}"
    if origin is dict:
        return f"map of {_type(args[0], sections)} to {_type(args[1], sections)}"
    if annotation is Any:
        return "any"
    return f"`{getattr(annotation, '__name__', annotation)}`"


_BOUNDS: dict[type, tuple[str, str]] = {
    annotated_types.Ge: ("ge", "≥"),
    annotated_types.Gt: ("gt", ">"),
    annotated_types.Le: ("le", "≤"),
    annotated_types.Lt: ("lt", "<"),
    annotated_types.MinLen: ("min_length", "length ≥"),
}


def _bounds(field: FieldInfo) -> str:
    found = [
        f"{symbol} {getattr(item, attribute)}"
        for item in field.metadata
        for kind, (attribute, symbol) in _BOUNDS.items()
        if isinstance(item, kind)
    ]
    return f" ({', '.join(found)})" if found else ""


def _default(field: FieldInfo, sections: dict[type[BaseModel], _Section]) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return f"[its defaults](#{_anchor(type(value))})" if type(value) in sections else "`{}`"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


# -- the command line ----------------------------------------------------------------------------------------------


def cli_reference(target: str = "adaserve.cli.build_parser") -> str:
    """Every command of the parser that `target` ("module.function") builds, with its usage and options."""
    module, _, name = target.rpartition(".")
    build: Callable[[], argparse.ArgumentParser] = getattr(importlib.import_module(module), name)
    return "\n\n".join(_commands(build(), "")) + "\n"


def _commands(parser: argparse.ArgumentParser, summary: str) -> Iterator[str]:
    children = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    options = _options(parser)
    if options or not children:
        text = " ".join((parser.description or summary).split())
        usage = parser.format_usage().removeprefix("usage: ").strip()
        yield f"## `{parser.prog}`\n\n{text}\n\n```\n{usage}\n```\n\n{options}".rstrip()
    for action in children:
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, child in action.choices.items():
            yield from _commands(child, helps.get(name, ""))


def _options(parser: argparse.ArgumentParser) -> str:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if not action.help:
            raise MissingDescription(f"{parser.prog}: {'/'.join(action.option_strings) or action.dest} has no help")
        name = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.metavar or action.dest}`"
        rows.append(f"| {name} | {_value(action)} | {_flag_default(action)} | {_cell(_help(parser, action))} |")
    return "\n".join(["| option | value | default | meaning |", "|---|---|---|---|", *rows]) if rows else ""


def _value(action: argparse.Action) -> str:
    """The value an option takes, as its usage line names it."""
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{choice}`" for choice in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    text = " ".join(metavar) if isinstance(metavar, tuple) else metavar
    if action.nargs in ("+", "*"):
        text += " ..."
    repeatable = ", repeatable" if isinstance(action, argparse._AppendAction) else ""
    return f"`{text}`".replace("|", "\\|") + repeatable


def _flag_default(action: argparse.Action) -> str:
    default = action.default
    if default in (None, False, [], argparse.SUPPRESS) or action.required:
        return "required" if action.required and action.option_strings else ""
    if isinstance(default, Enum):
        default = default.value
    if isinstance(default, Path) and default.is_relative_to(ROOT):
        default = default.relative_to(ROOT)  # the checkout's paths, as a user's checkout has them
    return f"`{default}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as `--help` prints it: `%(default)s` and the like filled in, `%%` a percent sign."""
    text = action.help or ""
    return text % {**vars(action), "prog": parser.prog} if "%" in text else text


# -- the metrics ---------------------------------------------------------------------------------------------------


def _stand_ins() -> dict[str, tuple[Any, ...]]:
    """What each collector reads, as a server with nothing loaded would hold it: enough for every family."""
    from adaserve.server.dataplane import ClusterState
    from adaserve.server.metrics import Pauses
    from adaserve.server.response_cache import ResponseCache

    hosts = SimpleNamespace(waiting_pids=[], launches={})
    router = SimpleNamespace(all_engines=list, hosts=hosts)
    snapshot = SimpleNamespace(models={}, policy="iam", budget_bytes=0, resident_bytes=0, busy_timeouts=0)
    return {
        "EngineCollector": (router,),
        "CacheCollector": (SimpleNamespace(snapshot=lambda: snapshot),),
        "HostCollector": (hosts,),
        "DagCollector": (SimpleNamespace(planners={}),),
        "TraceCollector": (SimpleNamespace(finished=0, sink=SimpleNamespace(mode="triton", dropped=0)),),
        "ResponseCacheCollector": (ResponseCache(0), router),
        "GcCollector": (Pauses(),),
        "ClusterCollector": (SimpleNamespace(state=lambda: ClusterState({}, {}, {}, [], {}, 0)),),
        "ClusterScrapeCollector": ({},),
    }


def metrics_reference(module: str = "adaserve.server.metrics") -> str:
    """Every metric each collector of `module` exposes: a table per collector, its docstring above it."""
    metrics = importlib.import_module(module)
    collectors = {
        name: value
        for name, value in vars(metrics).items()
        if isinstance(value, type) and value.__module__ == module and hasattr(value, "collect") and name[0] != "_"
    }
    stand_ins = _stand_ins()
    unknown = sorted(set(collectors) - set(stand_ins))
    if unknown:
        raise MissingDescription(f"the metrics reference has no stand-in for {', '.join(unknown)} (docs/hooks)")
    parts = []
    for name, collector in collectors.items():
        rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
        for family in collector(*stand_ins[name]).collect():
            if not family.documentation:
                raise MissingDescription(f"{family.name} has no help text")
            shown = family.name + ("_total" if family.type == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in getattr(family, "_labelnames", ()))
            rows.append(f"| `{shown}` | {family.type} | {labels} | {_cell(family.documentation)} |")
        intro = " ".join((collector.__doc__ or "").split())
        parts.append(f"## {name.removesuffix('Collector')}\n\n{intro}\n\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"
