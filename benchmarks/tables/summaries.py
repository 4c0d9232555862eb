"""Tables of the results whose benchmark prints none for its record, and the README's headline figures."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _verdict(passed: bool) -> str:
    return "pass" if passed else "**missed**"


def listed_bars(bars: list[dict[str, Any]]) -> str:
    """Bars kept as a list of {bar, target (some), measured, pass} (mCache's, GATI's)."""
    if any("target" in bar for bar in bars):
        rows = [[b["bar"], b.get("target", ""), b["measured"], _verdict(b["pass"])] for b in bars]
        return table(["bar", "target", "measured", "result"], rows)
    return table(["bar", "measured", "result"], [[b["bar"], b["measured"], _verdict(b["pass"])] for b in bars])


def gati_gpu(report: dict[str, Any]) -> str:
    methods = report["methods"]
    return f"Composition: {report['composition']}; speedup over {report['speedup_over']}.\n\n" + table(
        ["method", "mean (ms)", "p50 (ms)", "p99 (ms)", "agreement", "speedup"],
        [
            [
                name,
                _num(m["mean_ms"]),
                _num(m["p50_ms"]),
                _num(m["p99_ms"]),
                _num(m["agreement"], ".4f"),
                f"{m['speedup']:.2f}×",
            ]
            for name, m in methods.items()
        ],
    )


def generator_fidelity(report: dict[str, Any]) -> str:
    bars = report["bars"]
    rows = []
    for entry in report["summary"]:
        for side in ("open_loop", "coordinated_omission"):
            figures = entry.get(side)
            if figures:
                rows.append(
                    [
                        entry["case"],
                        entry["protocol"],
                        side.replace("_", " "),
                        _num(figures.get("lateness_p50_ms")),
                        _num(figures.get("lateness_p99_ms")),
                        _num(figures.get("gap_error_p95_ms")),
                    ]
                )
    return f"Bars: lateness p50 ≤ {bars['lateness_p50_ms']} ms and p99 ≤ {bars['lateness_p99_ms']} ms under " + (
        f"overload (open loop), trace gap error p95 < {bars['gap_error_p95_ms']} ms.\n\n"
        + table(["case", "protocol", "generator", "lateness p50 (ms)", "p99 (ms)", "gap error p95 (ms)"], rows)
    )


def priority(report: dict[str, Any]) -> str:
    rows = []
    for entry in report["comparisons"]:
        cells = [f"{entry['load']:.0%}", f"{entry['rate_rps']:g}"]
        for key in ("0: high mean_ms", "1: low mean_ms", "0: high p99_ms", "1: low p99_ms"):
            figures = entry[key]
            cells.append(
                f"{_num(figures['fifo'], '.1f')} → {figures['priority_ratio']:.2f}×, {figures['bounded_ratio']:.2f}×"
            )
        cells.append(", ".join(str(count) for count in entry["1: low refused"]["bounded"]))
        rows.append(cells)
    return (
        f"Capacity {report['capacity_rps']:.0f} req/s. Each cell: arrival order's figure (ms), then priority's and "
        "priority with the low level's timeout, as ratios to it.\n\n"
        + table(["load", "req/s", "high: mean", "low: mean", "high: p99", "low: p99", "low refused, per repeat"], rows)
    )


def mcache_spare_hosts(report: dict[str, Any]) -> str:
    rows = [
        [mode, _num(s["mean_load_s"]["0"]), _num(s["mean_load_s"]["1"]), f"{s['reduction']:.0%}"]
        for mode, s in report["summary"].items()
    ]
    return table(["loads", "mean load, no spare (s)", "with a spare (s)", "lower by"], rows)


def mcache_server(report: dict[str, Any]) -> str:
    rows = [
        [
            c["policy"],
            f"{c['share']:.0%}",
            _num(c["server"]["hit_ratio"]),
            _num(c["server"]["mean_load_wait_s"]),
            _num(c["server"]["throughput_rps"]),
            _num(c["simulator"]["throughput_rps"]),
        ]
        for c in report["cells"]
        if c.get("server")
    ]
    parts = [table(["policy", "budget", "hit ratio", "mean load wait (s)", "req/s", "simulator req/s"], rows)]
    for side, bars in (report.get("bars") or {}).items():
        parts.append(f"**Bars, {side}**\n\n" + listed_bars(bars))
    return "\n\n".join(parts)


def mcache_simulate(report: dict[str, Any]) -> str:
    rows = [
        [
            assign,
            share,
            policy,
            _num(e["hit_ratio"]),
            _num(e["mean_load_wait_s"] * 1e3, ".1f"),
            _num(e["throughput_rps"], ".2f"),
        ]
        for assign, shares in report["summary"].items()
        for share, policies in shares.items()
        for policy, e in policies.items()
    ]
    parts = [table(["workload", "budget", "policy", "hit ratio", "mean load wait (ms)", "req/s"], rows)]
    parts.append("**The paper's bars, against LFU**\n\n" + listed_bars(report["bars"]))
    for key, title in (("optimum_bars", "Issue 57's bars"), ("known_rate_bars", "The same bars, rates known")):
        if report.get(key):
            parts.append(f"**{title}**\n\n" + listed_bars(report[key]))
    return "\n\n".join(parts)


def _mean_side(side: dict[str, Any]) -> str:
    return f"{side['agreement']:.3f} / {side['hit_rate']:.3f}"


def gati_adaptation(report: dict[str, Any]) -> str:
    rows = [
        [
            c.get("chunk", i),
            c.get("corruption", ""),
            c.get("severity", ""),
            _mean_side(c["static"]),
            _mean_side(c["adapted"]),
        ]
        for i, c in enumerate(report["chunks"])
    ]
    warm = report["warm_vs_scratch"]
    return "\n\n".join(
        [
            table(["chunk", "corruption", "severity", "static: agreement / hit rate", "adapted"], rows),
            table(
                ["retraining", "agreement", "hit rate", "retrain (s)", "accepted"],
                [
                    [k, _num(v["agreement"], ".4f"), _num(v["hit_rate"]), _num(v["retrain_s"], ".1f"), v["accepted"]]
                    for k, v in warm.items()
                ],
            ),
            f"Adapted never below static: {report['bar']['adapted_never_below_static']}.",
        ]
    )


def gati_tally(report: dict[str, Any]) -> str:
    """The retraining and window-draw benchmarks: each side's means over its windows."""
    rows = []
    for side, t in report["tally"].items():
        if isinstance(t, dict):
            agreement = t.get("mean_fresh_agreement", t.get("agreement"))
            hits = t.get("mean_fresh_hit_rate", t.get("hit_rate"))
            seconds = t.get("mean_retrain_s", t.get("retrain_s"))
            rows.append([side, _num(agreement), _num(hits), _num(seconds, ".1f"), t.get("accepted", "-")])
    return table(["side", "agreement on fresh rows", "hit rate", "retraining (s)", "accepted"], rows)


def gati_trigger(report: dict[str, Any]) -> str:
    from benchmarks.gati.trigger import tally

    rows = []
    for stream, entry in report["streams"].items():
        for expect, side in entry["sides"].items():
            t = tally(side)
            rows.append(
                [
                    stream,
                    expect,
                    t["retrainings"],
                    t["accepted"],
                    t["retraining_s"],
                    _mean_side(t["adapted"]),
                    _mean_side(t["static"]),
                ]
            )
    header = ["stream", "expect", "retrainings", "accepted", "retraining (s)", "adapted: agreement / hit rate"]
    return table([*header, "static"], rows)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "gati_gpu": gati_gpu,
    "generator_fidelity": generator_fidelity,
    "priority": priority,
    "mcache_spare_hosts": mcache_spare_hosts,
    "mcache_server": mcache_server,
    "mcache_simulate": mcache_simulate,
    "gati_adaptation": gati_adaptation,
    "gati_retraining": gati_tally,
    "gati_window_draw": gati_tally,
    "gati_trigger": gati_trigger,
}


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}×"


def _lower(reduction: float) -> str:
    """A mean-latency reduction in words: "52.4% lower", or "143.1% higher" where it is negative."""
    return f"{reduction:.1%} lower" if reduction >= 0 else f"{-reduction:.1%} higher"


def mcache_row(simulated: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """The README's mCache row: IAM against issue 57's bars in the simulator (`optimum_bars`), each bar's shares in
    order: throughput over the exact optimum's, mean load time beside GDSF's, and the cut below LRU's."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for bar in simulated["optimum_bars"]:
        groups.setdefault(bar["bar"].rsplit(" at ", 1)[0], []).append(bar)
    optimum, gdsf, lru = groups.values()
    shares = " / ".join(bar["bar"].rsplit(" at ", 1)[1].rstrip("%") for bar in optimum)
    lru_shares = " / ".join(bar["bar"].rsplit(" at ", 1)[1].rstrip("%") for bar in lru)
    measured = (
        " / ".join(_times(bar["value"]) for bar in optimum)
        + "; "
        + " / ".join(bar["measured"].split(" ms")[0] for bar in gdsf)
        + " ms; "
        + " / ".join(f"{bar['value']:.1%}" for bar in lru)
        + " lower"
    )
    lru_targets = " / ".join(bar["target"].removeprefix(">= ").removesuffix(" lower") for bar in lru)
    passed = all(bar["pass"] for bar in simulated["optimum_bars"])
    return (
        "mCache",
        f"IAM in the simulator (Azure workload, random assignment, mean of {len(simulated['seeds'])} seeds) at "
        f"{shares}% of the models' memory: throughput over the exact optimum's (`milp`); mean load time against "
        f"GDSF's; its cut below LRU's (at {lru_shares}%); each against the better of the baseline's two forms, as "
        "defined or taking its victims as a set (`-cover`)",
        measured,
        f"{optimum[0]['target']}; {gdsf[0]['target']}; >= {lru_targets} lower: {_verdict(passed)}",
        "mcache_simulate.json",
    )


# -- the headline ---------------------------------------------------------------------------------------------------


def headline_rows(results: Path) -> Iterator[tuple[str, str, str, str, str]]:
    """(technique, what is compared, measured, bar and verdict, file) for the figures that matter most."""

    def read(name: str) -> dict[str, Any]:
        return json.loads((results / name).read_text())

    low, high = (read("elastic_batching.json")["bars"][f"{load}_load_mean_reduction"] for load in ("low", "high"))
    yield (
        "Ebird",
        "mean latency at low / high load, elastic against OPT Wait (fixed-timeout with its delay, instances and "
        "threads tuned per load)",
        f"{_lower(low['measured'])} / {_lower(high['measured'])}",
        f"{low['target']} / {high['target']}: {_verdict(low['pass'] and high['pass'])}",
        "elastic_batching.json",
    )
    packrat = read("packrat_speedup.json")["bars"]
    inside, served = packrat["resnet50_in_process"], packrat["resnet50_end_to_end"]
    yield (
        "Packrat",
        "ResNet-50-style worker set over one fat instance, mean over batches ≥ 8 (in process / served)",
        f"{inside['measured']:.2f}× / {served['measured']:.2f}×",
        f"{inside['target']}: {_verdict(inside['pass'] and served['pass'])}",
        "packrat_speedup.json",
    )
    if (results / "packrat_default.json").is_file():  # issue 53's second bar, once its result is committed
        default = read("packrat_default.json")["bars"]
        reaches, hog = default["reaches_best"], default["hog_never_slower"]
        at = reaches["switched_at_s"]
        switch = "no switch" if at is None else f"switched at {at:.0f} s"
        kept = _times(hog["measured"]) if hog["switched"] else "kept the default set"
        yield (
            "Packrat",
            "no `workers:` line, profiled in the background under load: requests a second against the best "
            "hand-written set; with a CPU hog, the set it switched to against the default set",
            f"{_times(reaches['measured'])} ({switch}); {kept}",
            f"{reaches['target']}; {hog['target']}: {_verdict(reaches['pass'] and hog['pass'])}",
            "packrat_default.json",
        )
    yield mcache_row(read("mcache_simulate.json"))
    gati = read("gati_early_exit.json")["bars"][0]
    yield "GATI", gati["bar"], gati["measured"], _verdict(gati["pass"]), "gati_early_exit.json"
    locality = read("gati_locality.json")["bars"][0]
    yield "GATI", locality["bar"], locality["measured"], _verdict(locality["pass"]), "gati_locality.json"
    slo_bars = read("slo_nns.json")["bars"]
    aclo, small = slo_bars["aclo_wide_speedup"], slo_bars["aclo_small_never_slower"]
    calibrated = aclo["calibrated"]
    served = slo_bars.get("aclo_small_never_slower_served")  # results before it have no such bar
    seeds = aclo.get("seeds")  # results before --seeds were one build
    yield (
        "SLO-NNs",
        "ACLO against the tuned dense kernel: per input at the target calibrated for 0.3% loss (784-2048-2048-10 "
        "MLP); mean latency at the slowest target (784-112-112-10)"
        + ("; the same through the server, against the model served plain" if served else "")
        + (f"; median of {seeds} seeds, the loss the largest of theirs" if seeds else ""),
        f"{calibrated['speedup_vs_dense_median']:.2f}× at {aclo.get('worst_loss', calibrated['loss']):.2%} loss; "
        f"{min(small['mean_latency_ratio'].values()):.2f}×"
        + (f"; {min(served['mean_latency_ratio'].values()):.2f}×" if served else ""),
        f"{aclo['target']}; {small['target']}: "
        + _verdict(aclo["pass"] and small["pass"])
        + (f"; {served['target']}: {_verdict(served['pass'])}" if served else ""),
        "slo_nns.json",
    )
    serving = read("serving_overhead.json")["bars"]
    yield (
        "serving",
        "REST requests a second at concurrency 8; p50 at concurrency 1 (REST, gRPC)",
        f"{serving['rest_c8_throughput']['measured']:,.0f}; {serving['rest_c1_p50']['measured']:.3f} ms, "
        f"{serving['grpc_c1_p50']['measured']:.3f} ms",
        f"{serving['rest_c8_throughput']['target']}; {serving['rest_c1_p50']['target']}: "
        + _verdict(all(bar["pass"] for bar in serving.values())),
        "serving_overhead.json",
    )
    profile = read("latency_profile.json")
    low, grpc = profile["bars"]["rest_poisson_p50"], profile["bars"]["grpc_c8_throughput"]
    yield (
        "serving",
        "REST p50 at 200 req/s (Poisson) over its c=1 p50 (a canned-answer server's own ratio); gRPC c=8 req/s "
        "over REST's",
        f"{low['measured']:.2f}× ({profile['floor_at_bar_rate']['rest_floor_p50_over_c1_p50']:.2f}×); "
        f"{grpc['measured']:.2f}×",
        f"{low['target']}; {grpc['target']}: " + _verdict(low["pass"] and grpc["pass"]),
        "latency_profile.json",
    )
    footprint = read("footprint.json")
    ready, pss = footprint["bars"]["ready_s"], footprint["bars"]["pss_mib"]
    yield (
        "serving",
        "`adaserve serve` on the example repository: seconds to ready; total PSS of its processes",
        f"{ready['measured']:.2f} s; {pss['measured']:.0f} MiB",
        f"{ready['target']} s; {pss['target']} MiB: " + _verdict(ready["pass"] and pss["pass"]),
        "footprint.json",
    )
    ratios = [
        read(f"versus_{name}.json")["cases"]["c8"]["throughput_ratio"] for name in ("ray", "kserve", "torchserve")
    ]
    yield (
        "serving",
        "requests a second against Ray Serve / KServe / TorchServe (MLP, concurrency 8)",
        " / ".join(f"{ratio:.2f}×" for ratio in ratios),
        "—",
        "versus_*.json",
    )
