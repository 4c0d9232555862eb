"""One exception hierarchy for everything a user can cause, each mapped once to its protocol status.

The REST and gRPC frontends both translate through `AdaserveError.http_status` / `grpc_code`; nothing else
decides a status. Each class names its gRPC status (`grpc_status`), and `grpc_code` looks it up in grpc when the
gRPC frontend asks: the zygote and the model hosts raise these errors too, and importing grpc there cost every
server 2 MiB in the pages they all share. Messages name the problem (the tensor, the field, the model) because
they reach the user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc


class AdaserveError(Exception):
    http_status = 500
    grpc_status = "INTERNAL"  # a `grpc.StatusCode` name

    @property
    def grpc_code(self) -> grpc.StatusCode:
        import grpc

        return grpc.StatusCode[self.grpc_status]


class InvalidInputError(AdaserveError, ValueError):
    """Malformed request: bad JSON, unknown or missing tensor, wrong datatype or shape."""

    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class ConfigError(AdaserveError, ValueError):
    """A model configuration or artifact that cannot be served; names file, field and problem."""

    http_status = 400
    grpc_status = "INVALID_ARGUMENT"


class ModelNotFoundError(AdaserveError, LookupError):
    http_status = 404
    grpc_status = "NOT_FOUND"


class ModelNotReadyError(AdaserveError):
    """The model exists but is loading, unloading or failed; retry later or load it."""

    http_status = 503
    grpc_status = "UNAVAILABLE"


class ModelControlError(AdaserveError):
    """A repository load or unload while the model control mode does not allow one (Triton's modes none and poll);
    the message starts with Triton's own words, which clients match."""

    http_status = 503
    grpc_status = "UNAVAILABLE"


class ClusterChangeError(AdaserveError):
    """A change made for a whole cluster (its trace settings) that its controller refused, did not answer for, or
    that some nodes did not confirm, or a question about the whole cluster (its trace count) it did not answer; the
    message names them."""

    http_status = 503
    grpc_status = "UNAVAILABLE"


class NotAllowedError(AdaserveError):
    """An operation the server was started without: e.g. client shared memory without --allow-client-shm."""

    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class OverloadedError(AdaserveError):
    """The model's queue bound is reached; the request was not accepted."""

    http_status = 503
    grpc_status = "UNAVAILABLE"


class RequestTooLargeError(AdaserveError):
    """A request body larger than its model can take, or than the server holds at once: refused before it is read
    further, decompressed or parsed."""

    http_status = 413
    grpc_status = "RESOURCE_EXHAUSTED"


class InferenceError(AdaserveError):
    """The model raised while computing, or its worker died running the request more than once."""

    http_status = 500
    grpc_status = "INTERNAL"


class ModelTooLargeError(AdaserveError):
    """A model larger than the whole model-memory budget: no eviction can make room, so it can never be served."""

    http_status = 507
    grpc_status = "RESOURCE_EXHAUSTED"


class CacheBusyError(AdaserveError):
    """No room for a model now: every resident model is in use or loading; the request may be retried."""

    http_status = 503
    grpc_status = "UNAVAILABLE"


class ModelLoadError(ModelNotReadyError):
    """Loading a model on demand failed; every request waiting on that load gets this, the cause chained."""
