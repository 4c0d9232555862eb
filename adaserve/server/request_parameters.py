"""Every request parameter adaserve knows, in one table, and the note a response carries about those it ignored.

A request's `parameters` used to be taken without a word: `latency_ms` sent to a model with no activator, a
misspelt `acuracy`, `accuracy` beside `latency_ms` (only one is used). Now the response's parameters say so under
`ignored_parameters`, one `name: reason` per ignored parameter, by name, `; `-separated:

    "foo: unknown parameter; latency_ms: model 'mlp' has no activator (SLO-NNs): see adaserve activator build"

A request whose parameters were all used gets no such key. The data plane logs each (model, parameter) once.
No torch here: the server imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adaserve.config import ModelConfig

__all__ = ["IGNORED_KEY", "KNOWN", "IgnoredParameters", "Target", "ignored", "note"]

#: The response parameter that names the request's ignored parameters and why.
IGNORED_KEY = "ignored_parameters"

#: Each request-level parameter some part of adaserve reads, and what reads it. A name here is never "unknown".
KNOWN = {
    "accuracy": "GATI's agreement target (adaptive/gati/requests.py), SLO-NNs' ACLO target (activator/select.py)",
    "latency_ms": "SLO-NNs' LCAO target (activator/select.py); a DAG query's SLO (planner/planner.py)",
    "early_exit": "GATI: false runs the whole model (adaptive/gati/requests.py)",
    "priority": "schedule policy: the queue level (engine/schedule_policy.py)",
    "timeout": "schedule policy: the queue timeout in microseconds (engine/schedule_policy.py)",
    "binary_data_output": "binary data extension: every output as binary data (server/rest_codec.py)",
}

#: Reserved by Triton's parameters extension, with its prefix: known, though nothing here reads them (the sequence
#: ones are refused with a 400 before this: `protocol.UNSUPPORTED`).
TRITON_RESERVED = frozenset({"sequence_id", "sequence_start", "sequence_end", "headers"})
TRITON_PREFIX = "triton_"

#: Parameters of an input or an output, sent on the request instead, where nothing reads them.
TENSOR_PARAMETERS = {
    "binary_data": "an output's parameter, not the request's",
    "classification": "an output's parameter, not the request's",
    "binary_data_size": "an input's parameter, not the request's",
}

log = logging.getLogger("adaserve.parameters")


@dataclass(frozen=True)
class Target:
    """What a request is sent to, as far as its parameters go: a model (with learned caches, an activator, or
    neither), or a DAG query (whose SLO is `latency_ms`; `caches`/`activator`: any of its nodes' models has them)."""

    name: str
    caches: bool = False
    activator: bool = False
    dag: bool = False

    @classmethod
    def of(cls, name: str, models: Iterable[ModelConfig], *, dag: bool = False) -> Target:
        """`name` served by these models (one for a model, its nodes' options for a DAG query)."""
        models = list(models)
        caches = any(model.caches is not None for model in models)
        return cls(name, caches=caches, activator=any(model.activator is not None for model in models), dag=dag)


def ignored(sent: Mapping[str, Any], defaults: Mapping[str, Any], target: Target) -> dict[str, str]:
    """Each parameter of `sent` (the request's) that `target` will not use, with why; `defaults`: the target's
    config parameters, which the request's override (a default can win a conflict, but is never reported)."""
    merged = {**defaults, **sent}
    reasons: dict[str, str] = {}
    for name in sent:
        reason = _reason(name, merged, target)
        if reason is not None:
            reasons[name] = reason
    return reasons


def _reason(name: str, merged: Mapping[str, Any], target: Target) -> str | None:
    if name in TENSOR_PARAMETERS:
        return TENSOR_PARAMETERS[name]
    if name not in KNOWN:
        known = name in TRITON_RESERVED or name.startswith(TRITON_PREFIX)
        return None if known else "unknown parameter"
    where = f"{'DAG query' if target.dag else 'model'} '{target.name}'"
    if name == "latency_ms" and not target.dag:
        if not target.activator:
            return f"{where} has no activator (SLO-NNs): see adaserve activator build"
        if "accuracy" in merged:
            return "conflicts with accuracy, which won (SLO-NNs serves an accuracy target first)"
    if name == "accuracy" and not (target.caches or target.activator):
        return f"{where} has neither learned caches (GATI) nor an activator (SLO-NNs)"
    if name == "accuracy" and target.caches and not target.activator and merged.get("early_exit") is False:
        return "conflicts with early_exit false, which won (the whole model ran)"
    if name == "early_exit" and not target.caches:
        return f"{where} has no learned caches (GATI): see adaserve caches build"
    return None


def note(reasons: Mapping[str, str]) -> str:
    """The `ignored_parameters` value: `name: reason` pairs, `; `-separated, by name (a gRPC request's parameters
    map has no order to keep)."""
    return "; ".join(f"{name}: {reasons[name]}" for name in sorted(reasons))


class IgnoredParameters:
    """Adds the note to a response's parameters, and logs each (target, parameter) the first time it is ignored.
    At most `remembered` pairs are kept: a client inventing names cannot grow the set without end (past it, the
    responses still say so; the log does not)."""

    def __init__(self, remembered: int = 4096) -> None:
        self.remembered = remembered
        self._logged: set[tuple[str, str]] = set()

    def annotate(
        self,
        parameters: dict[str, Any],
        sent: Mapping[str, Any],
        defaults: Mapping[str, Any],
        target: Callable[[], Target],
    ) -> dict[str, Any]:
        """`parameters` (a response's) with the note when the request sent parameters the target ignores
        (`target` is only made then: most requests send none)."""
        if not sent:
            return parameters
        served = target()
        reasons = ignored(sent, defaults, served)
        if not reasons:
            return parameters
        for name, reason in reasons.items():
            key = (served.name, name)
            if key not in self._logged and len(self._logged) < self.remembered:
                self._logged.add(key)
                log.warning(
                    "request parameter ignored (said in the response's %s; logged once per model and parameter)",
                    IGNORED_KEY,
                    extra={"model": served.name, "parameter": name, "reason": reason},
                )
        return {**parameters, IGNORED_KEY: note(reasons)}
