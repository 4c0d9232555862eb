"""Packrat on CPU: profile a model, plan the worker set ⟨instances, threads, batch⟩, pin workers to cores.

- `optimizer`: the 2-D knapsack DP over a `Profile` → `Plan` (pure).
- `topology`: the machine's sockets, NUMA nodes and cores, and `allocate` → disjoint `WorkerSpec` CPU sets.
- `groups`: `core_groups` cuts the cores into one group per node server, for `serve --cpus` (`restrict_to`).
- `estimator`: the batch-size estimator that decides when to ask for a new plan (pure, clock passed in).
- `profiler`: measure and store `profile.json`; `AutoPlanner` joins profile, optimizer and allocator.
- `cli`: `adaserve profile` and `adaserve plan`.
"""

from adaserve.cpu.estimator import BatchSizeEstimator, EstimatorSettings, Reconfigurator, power_of_two_floor
from adaserve.cpu.groups import core_groups, restrict_to
from adaserve.cpu.optimizer import InfeasiblePlanError, Instance, Optimizer, Plan, Profile, fat_instance_plan
from adaserve.cpu.profiler import (
    AutoPlanner,
    Fingerprint,
    ProfileError,
    ProfileRecord,
    ProfileSettings,
    StaleProfile,
    WorkerPlan,
    fingerprint,
    idle_runner,
    load_profile,
    packrat_threads,
    profile_model,
    save_profile,
    unstable_reason,
)
from adaserve.cpu.topology import AllocationError, Topology, allocate, machine_topology, read_topology

__all__ = [
    "AllocationError",
    "AutoPlanner",
    "BatchSizeEstimator",
    "EstimatorSettings",
    "Fingerprint",
    "InfeasiblePlanError",
    "Instance",
    "Optimizer",
    "Plan",
    "Profile",
    "ProfileError",
    "ProfileRecord",
    "ProfileSettings",
    "Reconfigurator",
    "StaleProfile",
    "Topology",
    "WorkerPlan",
    "allocate",
    "core_groups",
    "fat_instance_plan",
    "fingerprint",
    "idle_runner",
    "load_profile",
    "machine_topology",
    "packrat_threads",
    "power_of_two_floor",
    "profile_model",
    "read_topology",
    "restrict_to",
    "save_profile",
    "unstable_reason",
]
