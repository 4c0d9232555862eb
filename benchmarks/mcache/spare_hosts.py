"""Spare hosts: how much of a model load a host process started ahead of it saves.

A model under mCache loads on demand, and a load used to start its host process first: a new Python interpreter
that imports torch (about 2.5 s of CPU on the 2-core machine) before it reads the model. `--spare-hosts 1` keeps one
host started ahead, waiting for a model. This benchmark loads the mCache benchmark's eight models one at a time
through the repository API of two servers that differ only in `--spare-hosts` (0, the baseline, and 1), in the same
order, interleaved side by side:

- paced: a load, a readiness check, an unload, then a pause of `--gap-s` before the next load (a server that loads on
  demand is idle between a model's last request and the next miss; the spare starts in that time);
- back to back: the same with no pause, all models on one server and then on the other (the worst case for a
  spare: it starts while the next model's load is already waiting for it).

Each load is timed by the client (the `load` call returns when the model is ready) and by the server
(`adaserve_model_loading_seconds_total`). The servers use a roomy memory budget so models load through the cache
as they do under mCache, and the repository API's unload makes the next load a cold one.

    .venv/bin/python -m benchmarks.mcache.spare_hosts              # ~8 minutes
    .venv/bin/python -m benchmarks.mcache.spare_hosts --rounds 1   # ~4 minutes
    .venv/bin/python -m benchmarks.mcache.spare_hosts --rounds 1 --models mlp_small --gap-s 0.1  # the smoke test's

Writes `benchmarks/results/mcache_spare_hosts.json` and `.png`.
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, SCRATCH, TreeCPU, command_line, figure, load_window, machine, write_json
from benchmarks.mcache.server import MODELS, model_metrics, serving_repository
from tests.server_utils import ServerHandle, running_server

ROOMY_BUDGET = "50GiB"
SIDES = (0, 1)  # --spare-hosts of the baseline and of the technique
#: The wait after the servers start: the spare's first start is not part of any load.
SETTLE_S = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="times each model is loaded per mode and side")
    parser.add_argument("--gap-s", type=float, default=4.0, help="paced mode: pause after an unload (default 4)")
    parser.add_argument(
        "--models", type=lambda s: tuple(s.split(",")), default=MODELS, help="comma-separated (default: all eight)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "mcache_spare_hosts.json")
    args = parser.parse_args()
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; known: {', '.join(MODELS)}")
    repository = serving_repository(SCRATCH / "mcache", args.models)
    report: dict[str, Any] = {
        "benchmark": "mcache_spare_hosts",
        "command": command_line(),
        "machine": machine(),
        "settings": {"models": list(args.models), "rounds": args.rounds, "gap_s": args.gap_s, "budget": ROOMY_BUDGET},
        "loads": [],
    }
    with ExitStack() as stack, load_window(report):
        servers = {
            spares: stack.enter_context(
                running_server(repository, "--model-memory-budget", ROOMY_BUDGET, "--spare-hosts", str(spares))
            )
            for spares in SIDES
        }
        cpu = {spares: TreeCPU(server.pid) for spares, server in servers.items()}
        time.sleep(SETTLE_S)
        for mode, gap_s in (("paced", args.gap_s), ("back_to_back", 0.0)):
            for round_ in range(args.rounds):
                for spares, model in _order(args.models, mode, round_):
                    load = _load_once(servers[spares], cpu[spares], model, gap_s)
                    load.update(mode=mode, round=round_, spare_hosts=spares)
                    report["loads"].append(load)
                    print(
                        f"{mode:12s} {model:14s} spares {spares}: load {load['client_s']:.2f} s "
                        f"(server {load['server_s']:.2f} s)",
                        flush=True,
                    )
        report["server_cpu_s"] = {str(spares): round(cpu[spares].sample(), 1) for spares in SIDES}
    report["summary"] = _summarize(report["loads"], args.models)
    write_json(report, args.output)
    _plot(report, args.output.with_suffix(".png"))
    print(f"wrote {args.output}")
    return 0


def _order(models: tuple[str, ...], mode: str, round_: int) -> list[tuple[int, str]]:
    """(side, model) in the order they load. Paced: model by model, the two sides in turn. Back to back: all models
    on one side, then on the other, so each server's loads follow one another with no time between them. The side
    that goes first alternates by round."""
    sides = SIDES if round_ % 2 == 0 else SIDES[::-1]
    if mode == "paced":
        return [(spares, model) for model in models for spares in sides]
    return [(spares, model) for spares in sides for model in models]


def _post(server: ServerHandle, path: str) -> None:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def _load_once(server: ServerHandle, cpu: TreeCPU, model: str, gap_s: float) -> dict[str, Any]:
    """Load `model` (timed), check it is ready, unload it, pause. `cpu` reads the host's CPU before it exits."""
    before = model_metrics(server).get("adaserve_model_loading_seconds_total", {}).get(model, 0.0)
    began = time.perf_counter()
    _post(server, f"/v2/repository/models/{model}/load")
    client_s = time.perf_counter() - began
    after = model_metrics(server)["adaserve_model_loading_seconds_total"][model]
    ready = urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10)
    assert ready.status == 200, f"{model} is not ready after its load"
    cpu.sample()
    _post(server, f"/v2/repository/models/{model}/unload")
    time.sleep(gap_s)
    return {"model": model, "client_s": round(client_s, 3), "server_s": round(after - before, 3)}


def _summarize(loads: list[dict[str, Any]], models: tuple[str, ...]) -> dict[str, Any]:
    """Per mode: mean and median load time per side, the ratio, and the per-model means."""
    summary: dict[str, Any] = {}
    for mode in dict.fromkeys(load["mode"] for load in loads):
        side = {s: [x for x in loads if x["mode"] == mode and x["spare_hosts"] == s] for s in SIDES}
        mean = {s: statistics.mean(x["client_s"] for x in side[s]) for s in SIDES}
        summary[mode] = {
            "mean_load_s": {str(s): round(mean[s], 3) for s in SIDES},
            "median_load_s": {str(s): round(statistics.median(x["client_s"] for x in side[s]), 3) for s in SIDES},
            "mean_server_load_s": {str(s): round(statistics.mean(x["server_s"] for x in side[s]), 3) for s in SIDES},
            "reduction": round(1 - mean[1] / mean[0], 3),
            "per_model_mean_s": {
                model: {
                    str(s): round(statistics.mean(x["client_s"] for x in side[s] if x["model"] == model), 3)
                    for s in SIDES
                }
                for model in models
            },
        }
        print(
            f"{mode}: mean load {mean[0]:.2f} s without a spare, {mean[1]:.2f} s with one "
            f"({summary[mode]['reduction']:.0%} lower)"
        )
    return summary


def _plot(report: dict[str, Any], path: Path) -> None:
    """Mean load time per model, both sides, one panel per mode."""
    modes = list(report["summary"])
    fig = figure(6 * len(modes), 4)
    axes = np.atleast_1d(fig.subplots(1, len(modes)))
    models = report["settings"]["models"]
    x = np.arange(len(models))
    for axis, mode in zip(axes, modes, strict=True):
        per_model = report["summary"][mode]["per_model_mean_s"]
        for offset, spares in ((-0.2, 0), (0.2, 1)):
            label = "no spare host (baseline)" if spares == 0 else "one spare host"
            axis.bar(x + offset, [per_model[m][str(spares)] for m in models], width=0.4, label=label)
        axis.set_xticks(x, models, rotation=40, ha="right", fontsize=8)
        reduction = report["summary"][mode]["reduction"]
        axis.set(ylabel="load time (s)", title=f"{mode.replace('_', ' ')}: mean {reduction:.0%} lower")
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
