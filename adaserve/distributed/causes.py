"""Why a node went, in words an operator can act on: the controller's "node lost" warning and the trace setting
answers that name a node say it.

Ray 2.60's `ActorDiedError` keeps its cause only in its message (`error_msg`): a first line that is always the same
("The actor died unexpectedly before finishing this task."), the actor's fields as tab-indented `key: value` lines
(class_name, actor_id, pid, name, namespace, ip), then the cause's own message from Ray's GCS (its
`ActorDiedErrorContext.error_message`); beside it only `preempted` and `actor_init_failed`. The cause's message is
one of a few fixed sentences, each worded here for what happened to the node.
"""

from __future__ import annotations

import re

#: The first line of every account Ray gives of an actor's death.
_DIED = "The actor died unexpectedly before finishing this task."
#: The GCS's messages for an actor's death (Ray 2.60, `gcs_actor_manager.cc`), each with what it means here.
_DEATHS = (
    (re.compile(r"because its node has died\. Node Id: (\w+)"), "its Ray node died (Ray node {0})"),
    (re.compile(r"killed by `ray\.kill`"), "it was killed (ray.kill)"),
    (
        re.compile(r"its worker process has died\. Worker exit type: (\w+)(?: Worker exit detail: (.*))?", re.S),
        "its process{pid} exited ({0}): {1}",
    ),
    (re.compile(r"because its owner has died"), "the process that created it died"),
    (re.compile(r"all references to the actor were removed"), "every handle to it was dropped"),
)


def actor_death(error: BaseException) -> str:
    """Why an actor died, from Ray's account of it (`ActorDiedError`'s fields); for another error, or a cause Ray
    did not give, the first line of its message (else its type's name)."""
    if getattr(error, "preempted", False):
        return "its Ray node was preempted (drained by the autoscaler)"
    lines = str(error).strip().splitlines()
    if getattr(error, "actor_init_failed", False):
        return f"it failed to start: {' '.join(line.strip() for line in lines)}"
    if not lines or lines[0] != _DIED:
        return (lines or [type(error).__name__])[0]
    fields = dict(line.strip().split(": ", 1) for line in lines[1:] if line.startswith("\t") and ": " in line)
    cause = " ".join(line.strip() for line in lines[1:] if not line.startswith("\t"))
    for pattern, words in _DEATHS:
        found = pattern.search(cause)
        if found is not None:
            pid = f" (pid {fields['pid']})" if "pid" in fields else ""
            return words.format(*(group or "no detail" for group in found.groups()), pid=pid).strip()
    return cause or _DIED
