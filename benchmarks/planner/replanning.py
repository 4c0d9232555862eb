"""GATI's incremental replanning (§5.2, §7.3, Fig. 11): a DAG query on Fashion-MNIST through `adaserve serve`, with
and without learned caches and replanning, on the same requests, over a range of latency SLOs.

The query: `classify` (the GATI benchmark's ResNet-style CNN with its learned caches) → `tops`, only on the rows
classify puts in a top class (T-shirt, pullover, coat, shirt: the classes it confuses most), by one of three
specialists trained on those rows alone (`benchmarks/planner/models.py`), each slower and more accurate than the
one before; the answer is the specialist's class where one ran, classify's elsewhere. The options' accuracies in
the query's `dag.yaml` are measured by the build on validation rows, as a service owner would declare them.

Methods, for each budget policy (equal, proportional) and SLO; every evaluate row is sent once per method, the
methods in a random order per row, one request at a time (tritonclient over HTTP, batch 1):
- `baseline`: models chosen at arrival (`replan: false`) and no early exit (`early_exit: false`): the paper's
  baseline, with neither learned caches nor replanning;
- `caches`: chosen at arrival, with early exit: the time the caches save goes unspent;
- `gati`: early exit and replanning: the time saved goes to the specialist.
Recorded per cell: accuracy against the labels, mean / p50 / p99 client latency, the share answered within the
SLO, and how often each specialist ran. The SLOs span the whole path's latency with the cheapest specialist to
that with the most accurate one, as measured through the server at the start of the run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import yaml

from adaserve.datasets import load_fashion_mnist
from adaserve.repository import ModelRepository, load_artifact
from benchmarks.common import RESULTS, SCRATCH, command_line, figure, machine, wait_for_quiet, write_json
from benchmarks.gati.models import predict
from benchmarks.gati.runs import cpu_window
from benchmarks.gati.server import infer_row
from benchmarks.planner.models import GENERALIST, SPECIALISTS, TOPS, Built, build_repository
from tests.server_utils import running_server

POLICIES = ("equal", "proportional")
METHODS = ("baseline", "caches", "gati")
SLO_POINTS = 6
CALIBRATION_CALLS = 60
WARM_UP = 20
QUIET_WAIT_S = 5.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick build, fewer rows; results under tmp/")
    parser.add_argument("--plot", type=Path, help="only draw the figure of this result file, beside it")
    parser.add_argument("--rows", type=int, default=None, help="evaluate rows per cell (default all, quick 100)")
    args = parser.parse_args(argv)
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        return
    rows = args.rows or (100 if args.quick else None)
    out = (SCRATCH if args.quick else RESULTS) / "planner_replanning.json"
    repository = SCRATCH / "planner" / ("repo-quick" if args.quick else "repo")
    repository.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"benchmark": "planner_replanning", "command": command_line(), "machine": machine()}
    built = build_repository(repository, args.quick)
    record["build"] = built.record
    write_queries(repository, built)
    test = load_fashion_mnist("test")
    chosen = built.evaluate_rows[:rows]
    images, labels = test[0][chosen], test[1][chosen]
    record["reference"] = reference(repository, images, labels)
    with running_server(repository) as server, httpclient.InferenceServerClient(server.http_url) as client:
        record["server_latency_ms"] = calibrate(client, images)
        record["slos_ms"] = slos(record["server_latency_ms"])
        record["settings"] = {"rows": len(labels), "policies": POLICIES, "methods": METHODS, "batch": 1}
        with cpu_window(window := {"quiet_wait": wait_for_quiet(QUIET_WAIT_S)}, server.pid):
            record["cells"] = measure(client, images, labels, record["slos_ms"])
        record["window"] = window
    record["summary"] = summarize(record["cells"])
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    print_summary(record)
    print("wrote", out, out.with_suffix(".png"))


def write_queries(repository: Path, built: Built) -> None:
    """One DAG query per budget policy and planning mode, over the same four models."""
    accuracy = built.record["models"]
    for policy in POLICIES:
        for replan in (False, True):
            name = f"{policy}_{'replan' if replan else 'static'}"
            document = {
                "max_batch_size": 1,
                "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
                "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
                "budget_policy": policy,
                "replan": replan,
                "nodes": [
                    {
                        "name": "classify",
                        "options": [
                            {"model": GENERALIST, "accuracy": _declared(accuracy[GENERALIST]["accuracy"]["validation"])}
                        ],
                        "inputs": {"image": "image"},
                    },
                    {
                        "name": "tops",
                        "when": {"source": "classify.logits", "argmax_in": list(TOPS)},
                        "options": [
                            {"model": s.name, "accuracy": _declared(accuracy[s.name]["accuracy"]["validation_tops"])}
                            for s in SPECIALISTS
                        ],
                        "inputs": {"image": "image"},
                    },
                ],
                "results": {"logits": ["tops.logits", "classify.logits"]},
            }
            (repository / name).mkdir(exist_ok=True)
            (repository / name / "dag.yaml").write_text(yaml.safe_dump(document, sort_keys=False))


def _declared(accuracy: float) -> float:
    """An option's accuracy as a DAG query declares it: above 0, which a model too small to learn anything (the
    smoke test's, on a few hundred rows) can measure."""
    return max(accuracy, 1e-4)


def reference(repository: Path, images: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """In-process, on the same rows, each model whole: the query's accuracy with every routed row sent to one
    specialist, and classify's alone; the range the planner's choices move within."""
    models = ModelRepository(repository)
    predicted = {}
    for name in (GENERALIST, *(s.name for s in SPECIALISTS)):
        spec = models.read(name)
        model = load_artifact(spec.artifact, spec.config.max_batch_size)
        predicted[name] = predict(model, images, batch_size=spec.config.max_batch_size)
    routed = np.isin(predicted[GENERALIST], TOPS)
    result: dict[str, Any] = {
        "routed_rows": int(routed.sum()),
        "classify_alone": round(float(np.mean(predicted[GENERALIST] == labels)), 5),
    }
    for option in SPECIALISTS:
        answer = np.where(routed, predicted[option.name], predicted[GENERALIST])
        result[f"always_{option.name}"] = round(float(np.mean(answer == labels)), 5)
        on_routed = (answer == labels)[routed]  # None where classify routed no row (a few rows, a weak classify)
        result[f"{option.name}_on_routed_rows"] = round(float(on_routed.mean()), 5) if on_routed.size else None
    return result


def calibrate(client: httpclient.InferenceServerClient, images: np.ndarray) -> dict[str, float]:
    """Each model's p95 latency through the server with early exit off: what the SLO range is built from."""
    latency = {}
    for model in (GENERALIST, *(s.name for s in SPECIALISTS)):
        times = [
            send(client, model, images[i % len(images)], {"early_exit": False})[0] for i in range(CALIBRATION_CALLS)
        ]
        latency[model] = round(float(np.percentile(times[WARM_UP:], 95)), 4)
    return latency


def slos(latency: dict[str, float]) -> list[float]:
    """From the whole path with the cheapest specialist to 1.1× the path with the most accurate one."""
    low = latency[GENERALIST] + latency[SPECIALISTS[0].name]
    high = 1.1 * (latency[GENERALIST] + latency[SPECIALISTS[-1].name])
    return [round(float(v), 3) for v in np.linspace(low, high, SLO_POINTS)]


def measure(
    client: httpclient.InferenceServerClient, images: np.ndarray, labels: np.ndarray, slos_ms: list[float]
) -> list[dict[str, Any]]:
    """Every (policy, SLO, method) cell on the same rows, the cells of one row in a random order."""
    shuffle = np.random.default_rng(0)
    cells = {
        (policy, slo, method): {
            "policy": policy,
            "slo_ms": slo,
            "method": method,
            "latency_ms": [],
            "correct": [],
            "plans": [],
            "exited": [],
        }
        for policy in POLICIES
        for slo in slos_ms
        for method in METHODS
    }
    for image in images[:WARM_UP]:
        for policy in POLICIES:
            send(client, f"{policy}_replan", image, {"latency_ms": slos_ms[-1]})
    for image, label in zip(images, labels, strict=True):
        for index in shuffle.permutation(len(cells)):
            policy, slo, method = list(cells)[index]
            query = f"{policy}_{'replan' if method == 'gati' else 'static'}"
            parameters: dict[str, Any] = {"latency_ms": slo}
            if method == "baseline":
                parameters["early_exit"] = False
            latency_ms, predicted, plan, exited = send(client, query, image, parameters)
            cell = cells[policy, slo, method]
            cell["latency_ms"].append(round(latency_ms, 4))
            cell["correct"].append(bool(predicted == label))
            cell["plans"].append(plan)
            cell["exited"].append(exited)
    return [summary(cell) for cell in cells.values()]


def send(
    client: httpclient.InferenceServerClient, model: str, image: np.ndarray, parameters: dict[str, Any]
) -> tuple[float, int, str, bool]:
    """One request of one row: (client latency ms, predicted class, the query's plan when it is one, whether a
    learned cache answered `classify`)."""
    latency_s, predicted, answer = infer_row(client, model, image, parameters)
    return latency_s * 1e3, predicted, answer.get("dag_plan", ""), bool(answer.get("classify.exited_rows"))


def summary(cell: dict[str, Any]) -> dict[str, Any]:
    latency = np.array(cell["latency_ms"])
    specialists = [plan.split("tops=")[1] for plan in cell["plans"]]
    after_exit = [name for name, exited in zip(specialists, cell["exited"], strict=True) if exited]
    return {
        "policy": cell["policy"],
        "slo_ms": cell["slo_ms"],
        "method": cell["method"],
        "rows": len(latency),
        "accuracy": round(float(np.mean(cell["correct"])), 5),
        "mean_ms": round(float(latency.mean()), 4),
        "p50_ms": round(float(np.percentile(latency, 50)), 4),
        "p99_ms": round(float(np.percentile(latency, 99)), 4),
        "within_slo": round(float(np.mean(latency <= cell["slo_ms"])), 5),
        "tops_runs": {name: specialists.count(name) for name in sorted(set(specialists))},
        "classify_exited": int(sum(cell["exited"])),
        "tops_runs_after_an_exit": {name: after_exit.count(name) for name in sorted(set(after_exit))},
        "latency_ms": cell["latency_ms"],
    }


def summarize(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy and SLO: GATI against the baseline (accuracy gained, mean latency ratio) and against caches
    without replanning (the accuracy replanning adds)."""
    by_key = {(c["policy"], c["slo_ms"], c["method"]): c for c in cells}
    rows = []
    for policy, slo, method in by_key:
        if method != "gati":
            continue
        gati, base, caches = (by_key[policy, slo, m] for m in ("gati", "baseline", "caches"))
        rows.append(
            {
                "policy": policy,
                "slo_ms": slo,
                "accuracy": {m: by_key[policy, slo, m]["accuracy"] for m in METHODS},
                "accuracy_gain_vs_baseline": round(gati["accuracy"] - base["accuracy"], 5),
                "accuracy_gain_vs_caches": round(gati["accuracy"] - caches["accuracy"], 5),
                "mean_ms": {m: by_key[policy, slo, m]["mean_ms"] for m in METHODS},
                "mean_latency_ratio_baseline_over_gati": round(base["mean_ms"] / gati["mean_ms"], 4),
                "within_slo": {m: by_key[policy, slo, m]["within_slo"] for m in METHODS},
            }
        )
    return rows


def print_summary(record: dict[str, Any]) -> None:
    print("in-process reference on the same rows:", record["reference"])
    print("server latency (ms, p95, early exit off):", record["server_latency_ms"])
    for row in record["summary"]:
        acc, mean, within = row["accuracy"], row["mean_ms"], row["within_slo"]
        print(
            f"{row['policy']:>12} SLO {row['slo_ms']:6.2f} ms | accuracy base {acc['baseline']:.4f} caches "
            f"{acc['caches']:.4f} gati {acc['gati']:.4f} | mean ms {mean['baseline']:.3f} {mean['caches']:.3f} "
            f"{mean['gati']:.3f} ({row['mean_latency_ratio_baseline_over_gati']:.2f}×) | within SLO "
            f"{within['baseline']:.3f} {within['caches']:.3f} {within['gati']:.3f}"
        )


def plot(record: dict[str, Any], path: Path) -> None:
    """Per budget policy: accuracy against the SLO (Fig. 11), with the in-process accuracy of the query with one
    specialist for every routed row; mean latency against the SLO; and the validation accuracy of the specialists
    that ran, averaged over their runs: how far up its options the planner went."""
    fig = figure(16, 4.4 * len(POLICIES))
    declared = {name: model["accuracy"]["validation_tops"] for name, model in record["build"]["models"].items()}
    for row, policy in enumerate(POLICIES):
        cells = [c for c in record["cells"] if c["policy"] == policy]
        panels = [fig.add_subplot(len(POLICIES), 3, 3 * row + k + 1) for k in range(3)]
        for method in METHODS:
            mine = sorted((c for c in cells if c["method"] == method), key=lambda c: c["slo_ms"])
            x = [c["slo_ms"] for c in mine]
            panels[0].plot(x, [c["accuracy"] for c in mine], "o-", label=method)
            panels[1].plot(x, [c["mean_ms"] for c in mine], "o-", label=method)
            panels[2].plot(x, [_mean_declared(c["tops_runs"], declared) for c in mine], "o-", label=method)
        for option in SPECIALISTS:
            level = record["reference"][f"always_{option.name}"]
            panels[0].axhline(level, color="grey", linewidth=0.8, linestyle=":")
            panels[0].annotate(f"always {option.name}", (x[0], level), fontsize=6, color="grey")
        panels[1].plot(x, x, "k:", linewidth=0.8, label="SLO")
        labels = ("end-to-end accuracy", "mean latency (ms)", "validation accuracy of the specialists run")
        for panel, label in zip(panels, labels, strict=True):
            panel.set_xlabel("latency SLO (ms)")
            panel.set_ylabel(label)
            panel.set_title(f"{policy} split: {label}", fontsize=9)
            panel.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _mean_declared(runs: dict[str, int], declared: dict[str, float]) -> float:
    ran = {name: count for name, count in runs.items() if name != "skipped"}
    return sum(declared[name] * count for name, count in ran.items()) / max(1, sum(ran.values()))


if __name__ == "__main__":
    main()
