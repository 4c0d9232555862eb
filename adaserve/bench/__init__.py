"""adaserve bench: measure a KServe V2 server under an open- or closed-loop workload, side by side.

Benchmarks call `run_bench` once per run and `write_report` to keep the JSON and plots; no benchmark writes its own
load loop.

    from adaserve.bench import BenchConfig, parse_workload, run_bench, write_report
    workload = parse_workload({"requests": [{"model": "mlp"}], "load": {"kind": "poisson", "rate": 50},
                               "duration_s": 10})
    result = run_bench(BenchConfig(url="127.0.0.1:8000", workload=workload))
    write_report(result, Path("results/mlp.json"))
"""

from adaserve.bench.compare import Row, compare, format_comparison, workload_differences
from adaserve.bench.plots import plot_all
from adaserve.bench.report import format_summary, write_report
from adaserve.bench.results import BenchResult, RequestRecord, Status, Summary, read_result
from adaserve.bench.runner import BenchConfig, run_bench
from adaserve.bench.schedules import (
    BurstSpec,
    ClosedSpec,
    ConstantSpec,
    DiurnalSpec,
    PoissonSpec,
    Schedule,
    ScheduleError,
    SequenceSpec,
    StepSpec,
    TraceSpec,
    create_schedule,
)
from adaserve.bench.summary import summarize
from adaserve.bench.traces import RequestSequence, TraceError, load_sequence, load_trace
from adaserve.bench.workload import RequestSpec, TensorInput, Workload, WorkloadError, load_workload, parse_workload

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BurstSpec",
    "ClosedSpec",
    "ConstantSpec",
    "DiurnalSpec",
    "PoissonSpec",
    "RequestRecord",
    "RequestSequence",
    "RequestSpec",
    "Row",
    "Schedule",
    "ScheduleError",
    "SequenceSpec",
    "Status",
    "StepSpec",
    "Summary",
    "TensorInput",
    "TraceError",
    "TraceSpec",
    "Workload",
    "WorkloadError",
    "compare",
    "create_schedule",
    "format_comparison",
    "format_summary",
    "load_sequence",
    "load_trace",
    "load_workload",
    "parse_workload",
    "plot_all",
    "read_result",
    "run_bench",
    "summarize",
    "workload_differences",
    "write_report",
]
