"""Read trace files (Triton's JSON form, as `adaserve/server/trace.py` writes them) and say where requests' time
went: `adaserve trace summary FILE...`, in the spirit of Triton's `trace_summary.py`.

A traced request's time is cut into spans, each from one of its timestamps to the next on its path: receive, decode
(to REQUEST_START), admission (to QUEUE_START), queue (into the input pool, scheduled, handed to a worker and begun
there), compute (in the worker), answer (back from the worker, the response built: to REQUEST_END), encode (to the
send) and send. Requests are grouped by model, version and frontend (HTTP, gRPC, or a DAG query's child).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.errors import InvalidInputError

SPANS = ("receive", "decode", "admission", "queue", "compute", "answer", "encode", "send")
#: Each frontend's first and last pairs of timestamps. gRPC's read and send are points (grpc.aio reads and writes the
#: messages itself), so its receive and send spans are zero by construction.
FRONTENDS = {
    "HTTP": (("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_SEND_START", "HTTP_SEND_END")),
    "GRPC": (("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"), ("GRPC_SEND_START", "GRPC_SEND_END")),
}
#: The spans inside the server, which every trace with timestamps has (a DAG query's children only these).
HANDLER = {
    "admission": ("REQUEST_START", "QUEUE_START"),
    "queue": ("QUEUE_START", "COMPUTE_START"),
    "compute": ("COMPUTE_START", "COMPUTE_END"),
    "answer": ("COMPUTE_END", "REQUEST_END"),
}


def span_ends(frontend: str) -> dict[str, tuple[str, str]]:
    """Span → the timestamps it runs between, for a trace of this frontend."""
    if frontend not in FRONTENDS:
        return HANDLER
    received, sent = FRONTENDS[frontend]
    return {
        "receive": received,
        "decode": (received[1], "REQUEST_START"),
        **HANDLER,
        "encode": ("REQUEST_END", sent[0]),
        "send": sent,
    }


@dataclass
class TracedRequest:
    """One trace of a file: what it was and its timestamps by name."""

    id: int
    model_name: str = ""
    model_version: int | None = None
    parent_id: int | None = None
    timestamps: dict[str, int] = field(default_factory=dict)

    @property
    def frontend(self) -> str:
        """HTTP or GRPC; a DAG query's model: "child"; stamped by neither (the TENSORS level alone): ""."""
        if self.parent_id is not None:
            return "child"
        return next((name for name, ((start, _), _) in FRONTENDS.items() if start in self.timestamps), "")

    def span_us(self, span: str) -> float | None:
        """The span's length in µs, or None when this trace lacks either end (a child has no frontend spans)."""
        ends = span_ends(self.frontend).get(span)
        if ends is None or ends[0] not in self.timestamps or ends[1] not in self.timestamps:
            return None
        return (self.timestamps[ends[1]] - self.timestamps[ends[0]]) / 1000


def read_traces(paths: Iterable[Path]) -> list[TracedRequest]:
    """Every trace in the files, its entries (head, timestamps, tensors) merged by id; a file that is not a trace
    file is an InvalidInputError naming it."""
    traces: dict[int, TracedRequest] = {}
    for path in paths:
        try:
            entries = json.loads(Path(path).read_text())
            if not isinstance(entries, list):
                raise ValueError("not a JSON array")
            for entry in entries:
                _merge(traces.setdefault(int(entry["id"]), TracedRequest(int(entry["id"]))), entry)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"{path}: not a trace file ({type(exc).__name__}: {exc})") from None
    return sorted(traces.values(), key=lambda t: t.id)


def _merge(trace: TracedRequest, entry: dict[str, Any]) -> None:
    if "model_name" in entry:
        trace.model_name = str(entry["model_name"])
        trace.model_version = entry.get("model_version")
        trace.parent_id = entry.get("parent_id")
    for stamp in entry.get("timestamps", []):
        trace.timestamps[str(stamp["name"])] = int(stamp["ns"])


def summarize(traces: Sequence[TracedRequest]) -> dict[str, dict[str, Any]]:
    """Per "model (version) frontend" group: how many traces, and each span's median, 90th percentile and mean in
    µs (None for a span no trace of the group has)."""
    groups: dict[str, list[TracedRequest]] = {}
    for trace in traces:
        if trace.timestamps:
            label = f"{trace.model_name} ({trace.model_version}) {trace.frontend or '-'}"
            groups.setdefault(label, []).append(trace)
    summary: dict[str, dict[str, Any]] = {}
    for label, members in sorted(groups.items()):
        spans: dict[str, Any] = {}
        for span in SPANS:
            values = [v for v in (t.span_us(span) for t in members) if v is not None]
            spans[span] = (
                {
                    "p50_us": float(np.percentile(values, 50)),
                    "p90_us": float(np.percentile(values, 90)),
                    "mean_us": float(np.mean(values)),
                }
                if values
                else None
            )
        summary[label] = {"traces": len(members), "spans": spans}
    return summary


def format_summary(summary: dict[str, dict[str, Any]]) -> str:
    """A table: a row per group, the median (and 90th percentile) of each span in µs."""
    lines = ["| model (version) frontend | traces | " + " | ".join(SPANS) + " |", "|---|---|" + "---|" * len(SPANS)]
    for label, group in summary.items():
        cells = [
            f"{s['p50_us']:.0f} ({s['p90_us']:.0f})" if s is not None else "–"
            for s in (group["spans"][span] for span in SPANS)
        ]
        lines.append(f"| {label} | {group['traces']} | " + " | ".join(cells) + " |")
    lines.append("median (90th percentile) µs of each span")
    return "\n".join(lines)
