"""Triton's response cache: a repeated request is answered from the answer its first copy got, skipping the model.

The server holds one cache (`--cache-config local,size=BYTES`, Triton's flag); a model's answers go into it when its
config says `response_cache: {enable: true}`. Entries are kept least recently used first out, within the size.

An entry's key is a hash (BLAKE2b, 32 bytes) of everything that decides the answer:

* the model's name and version, and what that version's engine was started from (the files at the top of its
  folder, labels included, and its version folder, as the repository poller fingerprints them), so a model changed
  on disk and reloaded under the same version number never gets its old answers back, while one that mCache
  evicted and loaded again from the same files keeps them;
* each input's name, datatype, shape and bytes, in config order;
* the request's parameters, the config's defaults under them, except those that only schedule the request
  (`priority`, `timeout`). Triton's key leaves parameters out; here they change answers: `accuracy` picks an
  SLO-NNs activation or a GATI cache set, `early_exit: false` turns early exit off.

Outputs are kept whole (every output of the model), so requests asking for different outputs, or for them in
binary form or in shared memory, share an entry. A hit answers with the outputs and the response parameters the
first answer had (an early exit's block, say). The event loop is the cache's only user, so it takes no lock.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from adaserve.cache.budget import Budget
from adaserve.errors import ConfigError

#: Request parameters that say when or whether a request runs, not what it computes: left out of the key.
SCHEDULING_PARAMETERS = frozenset({"priority", "timeout"})
#: What an entry costs beyond its arrays' bytes: its key, the view, tuple, dict and table slot (tracemalloc: 444
#: bytes for a one-output entry, its 32-byte key 65 more; rounded up), so many tiny answers still fit the size.
ENTRY_OVERHEAD_BYTES = 512


def cache_size_from_config(options: Iterable[str]) -> int | None:
    """The response cache's size in bytes from Triton's `--cache-config local,size=BYTES` (units as in 500MB,
    2GiB); None when no option asks for a cache. ConfigError names a bad option."""
    size = None
    for option in options:
        cache, _, setting = option.partition(",")
        name, equals, value = setting.partition("=")
        if cache != "local":
            raise ConfigError(
                f"--cache-config '{option}': the only cache here is 'local' (an in-process LRU cache), "
                f"as in --cache-config local,size=100MB"
            )
        if name != "size" or not equals:
            raise ConfigError(f"--cache-config '{option}': the local cache's one setting is size=BYTES")
        try:
            budget = Budget.read(value)
        except ConfigError:
            budget = None
        if budget is None or budget.share:
            raise ConfigError(f"--cache-config '{option}': size is bytes above 0, with an optional unit (100MB, 1GiB)")
        size = budget.bytes_of(lambda: 0)
    return size


@dataclass(frozen=True)
class CachedAnswer:
    outputs: tuple[np.ndarray, ...]  # every output of the model, in config order, read-only
    parameters: dict[str, Any]  # the response parameters the answer had
    nbytes: int


class ResponseCache:
    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.used_bytes = 0
        self.evictions = 0
        self.too_large = 0  # answers not kept: larger than the whole cache
        self._entries: OrderedDict[bytes, CachedAnswer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(
        model: str,
        version: int,
        source: object,
        names: Sequence[str],
        datatypes: Sequence[str],
        arrays: Sequence[np.ndarray],
        parameters: dict[str, Any],
    ) -> bytes:
        """The hash of what decides a request's answer (module docstring). `source`: what the version's engine
        was started from."""
        digest = hashlib.blake2b(digest_size=32)
        digest.update(repr((model, version, source)).encode())
        for name, datatype, array in zip(names, datatypes, arrays, strict=True):
            digest.update(repr((name, datatype, array.shape)).encode())
            digest.update(np.ascontiguousarray(array).data)
        kept = {name: value for name, value in parameters.items() if name not in SCHEDULING_PARAMETERS}
        digest.update(json.dumps(kept, sort_keys=True, default=repr).encode())
        return digest.digest()

    def get(self, key: bytes) -> CachedAnswer | None:
        answer = self._entries.get(key)
        if answer is not None:
            self._entries.move_to_end(key)
        return answer

    def put(self, key: bytes, outputs: Sequence[np.ndarray], parameters: dict[str, Any]) -> bool:
        """Keep an answer, evicting the least recently used until it fits; False when it is larger than the whole
        cache (it is then not kept, and nothing is evicted for it)."""
        nbytes = sum(output.nbytes for output in outputs) + ENTRY_OVERHEAD_BYTES
        if nbytes > self.size_bytes:
            self.too_large += 1
            return False
        old = self._entries.pop(key, None)  # two misses on one key, both computed: the later answer stays
        if old is not None:
            self.used_bytes -= old.nbytes
        while self.used_bytes + nbytes > self.size_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.nbytes
            self.evictions += 1
        kept = []
        for output in outputs:
            output = output.view()
            output.flags.writeable = False  # a hit hands out the same arrays again: nothing may change them
            kept.append(output)
        self._entries[key] = CachedAnswer(tuple(kept), dict(parameters), nbytes)
        self.used_bytes += nbytes
        return True
