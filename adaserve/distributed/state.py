"""What the placement controller keeps in Ray's key-value store (its GCS, which outlives every actor), so that a
controller Ray restarts gets it back: the drained nodes and the cluster's trace settings.

They belong to one deployment: one `adaserve serve --ray` or `cluster up`, its controller from start to stop. The
launcher makes an id for it and passes it to the controller's constructor, which Ray calls again with the same
arguments when it restarts the actor; the keys are under that id. A controller that starts removes every other key
of adaserve's namespace: a later deployment on a long-lived Ray cluster starts from its own command line, not from
the drained nodes and trace settings an earlier one left (it was stopped, or its driver died), and the store does
not grow with each. None of those keys is in use: one deployment runs on a Ray cluster at a time (its controller is
one named actor; a later start is refused while it runs, or stops it first when its driver died: `launch.py`).
"""

from __future__ import annotations

import json
from typing import Protocol

import msgspec

from adaserve.distributed.messages import Tracing

#: Every deployment's keys start with this, then its id and a slash.
DEPLOYMENT_PREFIX = "deployment/"
#: A deployment's drained nodes (a JSON list of names), and its trace settings once changed (a `Tracing`, JSON).
DRAINED_KEY = "drained-nodes"
TRACING_KEY = "trace-settings"


class KeyValue(Protocol):
    """One namespace of a key-value store: Ray's (`RayKeyValue`), or a dict in tests."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def list_keys(self) -> list[str]: ...


class RayKeyValue:
    """Ray's internal key-value store, in `namespace` (the caller is connected to Ray: the controller actor is)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def get(self, key: str) -> bytes | None:
        from ray.experimental.internal_kv import _internal_kv_get

        value: bytes | None = _internal_kv_get(key, namespace=self.namespace)
        return value

    def put(self, key: str, value: bytes) -> None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, value, namespace=self.namespace)

    def delete(self, key: str) -> None:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(key, namespace=self.namespace)

    def list_keys(self) -> list[str]:
        from ray.experimental.internal_kv import _internal_kv_list

        return [key.decode() for key in _internal_kv_list("", namespace=self.namespace)]


class DeploymentState:
    """Deployment `deployment`'s drained nodes and trace settings in `store`."""

    def __init__(self, deployment: str, store: KeyValue) -> None:
        self.prefix = f"{DEPLOYMENT_PREFIX}{deployment}/"
        self.store = store

    def remove_others(self) -> list[str]:
        """Remove every key of the store that is not this deployment's (earlier deployments' state); those keys."""
        others = sorted(key for key in self.store.list_keys() if not key.startswith(self.prefix))
        for key in others:
            self.store.delete(key)
        return others

    def drained(self) -> set[str]:
        value = self.store.get(self.prefix + DRAINED_KEY)
        return set(json.loads(value)) if value else set()

    def save_drained(self, nodes: set[str]) -> None:
        self.store.put(self.prefix + DRAINED_KEY, json.dumps(sorted(nodes)).encode())

    def tracing(self) -> Tracing | None:
        value = self.store.get(self.prefix + TRACING_KEY)
        return msgspec.json.decode(value, type=Tracing) if value else None

    def save_tracing(self, tracing: Tracing) -> None:
        self.store.put(self.prefix + TRACING_KEY, msgspec.json.encode(tracing))
