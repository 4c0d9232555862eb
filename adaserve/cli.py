"""The `adaserve` command line. Every subcommand is a function taking the parsed arguments and returning the exit
code; `build_parser` lists them in the order a user meets them, and says so in `adaserve --help`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from adaserve.arguments import (
    CLUSTER_TRACE_FILE,
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    InputFile,
    add_grpc_frontend,
    add_model_repository,
    add_trace_config,
    add_url_argument,
    input_file,
    positive_integer,
    positive_number,
    server_url,
)
from adaserve.errors import AdaserveError, ConfigError
from adaserve.extras import needs_extra

if TYPE_CHECKING:
    import numpy as np
    from tritonclient.http import InferenceServerClient

    from adaserve.cache.budget import Budget
    from adaserve.planner.spec import DagConfig
    from adaserve.repository import ModelSpec
    from adaserve.server.dataplane import ModelControlMode
    from adaserve.server.limits import ClientLimits
    from adaserve.server.tls import TlsSettings

Read = TypeVar("Read")

#: Triton's default `--repository-poll-secs` in poll mode.
DEFAULT_POLL_S = 15.0

DESCRIPTION = """\
adaserve serves PyTorch models (torch.export or TorchScript, in a Triton-style model repository) over the Open
Inference Protocol: REST and gRPC, so tritonclient, the KServe client and curl work unmodified. Start a server
with `adaserve serve`, send it a tensor with `adaserve infer`, measure it with `adaserve bench`; the other
commands prepare what the serving techniques use (profiles, learned caches, node activators)."""

EPILOG = """\
exit codes: 0 done; 1 a server or file that could not be reached; 2 bad input or configuration; 3 the server
answered with an error (its status and message are printed); 130 interrupted (Ctrl-C). `adaserve bench` has its
own: see `adaserve bench --help`. `adaserve COMMAND --help` tells more."""


class Unreachable(Exception):
    """A server that could not be reached (exit 1); the message names the address tried."""


class Refused(Exception):
    """A server that answered a client command's request with an error status, 4xx or 5xx (exit 3): it was
    reached, so a script can tell "not there, try again" from "said no"; the message has the status and why."""


#: The exit code of each error a command ends with, the first kind it is of (the epilog documents them).
EXIT_CODES: dict[type[Exception], int] = {AdaserveError: 2, Refused: 3, Unreachable: 1, OSError: 1}


def _serve(args: argparse.Namespace) -> int:
    if args.cpus is not None:  # first: every thread and process the server starts inherits the cores
        from adaserve.cpu.groups import restrict_to

        restrict_to(args.cpus)
    if args.ray is None:
        from adaserve.engine.processes import ZYGOTE

        ZYGOTE.start()  # next: its imports of torch (seconds) overlap the server's own start
        atexit.register(ZYGOTE.stop)
    import uvloop

    from adaserve.logs import configure_logging
    from adaserve.server.app import ServeOptions, serve

    configure_logging(args.log_level)
    if args.ray is not None:
        from adaserve.distributed.cli import cluster_settings
        from adaserve.distributed.launch import run

        return run(cluster_settings(args, port_stride=0, host_from_ray=args.host == DEFAULT_HOST), address=args.ray)
    cache = None
    if args.model_memory_budget is not None:
        from adaserve.engine.router import CacheSettings

        budget = _budget_bytes(args.model_memory_budget, args.model_repository)
        cache = CacheSettings(budget, args.cache_policy)
    mode: ModelControlMode = args.model_control_mode or (
        "poll" if args.repository_poll_secs is not None else "explicit"
    )
    if mode != "poll" and args.repository_poll_secs is not None:
        raise ConfigError(
            f"--repository-poll-secs follows the repository on disk: it needs --model-control-mode poll, not {mode}"
        )
    options = ServeOptions(
        model_repository=args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        limits=_limits(args),
        models=args.model or None,
        cache=cache,
        spare_hosts=args.spare_hosts if args.spare_hosts is not None else int(cache is not None),
        repository_poll_s=(args.repository_poll_secs or DEFAULT_POLL_S) if mode == "poll" else None,
        model_control_mode=mode,
        allow_client_shm=args.allow_client_shm,
        trace_config=tuple(args.trace_config),
        cache_config=tuple(args.cache_config),
        restricted_api=tuple(args.restricted_api),
        http_restricted_api=tuple(args.http_restricted_api),
        grpc_restricted_protocol=tuple(args.grpc_restricted_protocol),
        http_tls=_tls("http", args),
        grpc_tls=_tls("grpc", args),
        grpc_compression_level=args.grpc_infer_response_compression_level,
        cluster_control=args.cluster_control,
        cluster_node=args.cluster_node,
        reuse_port=args.reuse_port,
        grpc_frontend=args.grpc_frontend,
    )
    uvloop.run(serve(options))
    return 0


def _limits(args: argparse.Namespace) -> ClientLimits:
    from adaserve.server.limits import ClientLimits

    largest = args.max_request_bytes or ClientLimits.max_body_bytes
    try:
        return ClientLimits(
            max_body_bytes=largest,
            body_budget_bytes=args.max_request_bytes_held or 2 * largest,
            grpc_message_bytes=args.max_request_bytes,
            max_connections=args.max_connections,
            idle_timeout_s=args.http_idle_timeout,
            header_timeout_s=args.http_header_timeout,
            body_timeout_s=args.http_body_timeout,
        )
    except ValueError as exc:
        raise ConfigError(f"--max-request-bytes, --max-request-bytes-held: {exc}") from None


def _tls(protocol: str, args: argparse.Namespace) -> TlsSettings | None:
    from adaserve.server.tls import TlsSettings

    flags = [f"{protocol}_{name}" for name in ("use_ssl", "use_ssl_mutual", "server_cert", "server_key", "root_cert")]
    return TlsSettings.from_flags(protocol, *(getattr(args, flag) for flag in flags))


def _add_switch(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A switch in Triton's spelling: `--flag`, `--flag=true` or `--flag=false` (default off)."""
    parser.add_argument(flag, type=_switch, nargs="?", const=True, default=False, metavar="true|false", help=help)


def _switch(text: str) -> bool:
    """A switch's value: true or false (also 1/0, yes/no)."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")
    return value


def memory_budget(text: str) -> Budget:
    """`--model-memory-budget`: bytes with a unit, or a percentage, resolved by `_budget_bytes` once the repository
    says which device's memory a percentage is of."""

    from adaserve.cache.budget import Budget

    try:
        return Budget.read(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _budget_bytes(budget: Budget, repository: Path) -> int:
    """The budget in bytes: a percentage is of host RAM when the repository's models run on the CPU, of the GPU's
    memory when they run on CUDA (`device` in their configs; a model whose config is broken counts for nothing)."""
    from adaserve.cache.budget import device_memory_bytes
    from adaserve.repository import ModelRepository

    def devices() -> set[str]:
        repo = ModelRepository(repository)
        found: set[str] = set()
        for name in repo.names():
            try:
                found.add(repo.read(name).config.device)
            except AdaserveError:
                continue
        return found

    return budget.bytes_of(lambda: device_memory_bytes(devices()))


def spare_hosts(text: str) -> int:
    """`--spare-hosts`: a count, 0 or more."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"expected a whole number of host processes, 0 or more; got {text!r}")
    return int(text)


def cpu_list(text: str) -> list[int]:
    """`--cpus`: CPU ids and ranges, as `taskset -c` takes them."""
    from adaserve.cpu.groups import parse_cpus

    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def json_object(text: str) -> dict[str, object]:
    """`--parameters`: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"latency_ms\": 5}}'; got {text!r}")
    return value


def _read_npy(path: Path) -> np.ndarray:
    """An `--input` file's array (never pickled objects)."""
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--input: cannot read {path} as a .npy array: {exc}") from None


def _trace_summary(args: argparse.Namespace) -> int:
    from adaserve.server.trace_summary import format_summary, read_traces, summarize

    summary = summarize(read_traces(args.files))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _models_list(args: argparse.Namespace) -> int:
    from adaserve.repository import ModelRepository

    if args.cluster is not None:
        return _cluster_list(args.cluster)

    repository = ModelRepository(args.model_repository)
    _list(repository.names(), repository.read, _model_line)
    _list(repository.dag_names(), repository.read_dag, _dag_line)
    return 0


def _cluster_list(url: str) -> int:
    """What a cluster serves, as one of its nodes (at `url`) tells it: each model's state and where it is held, then
    the node's cluster metrics (replicas, models per node, forwards, placement decisions)."""
    import urllib.error
    import urllib.request

    base = f"http://{server_url(url)}"
    try:
        request = urllib.request.Request(f"{base}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            index = json.load(answer)
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as answer:
            metrics = answer.read().decode()
    except urllib.error.HTTPError as exc:
        raise Refused(
            f"the server at {url} refused the request: {exc.code} {exc.read().decode(errors='replace')}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(f"cannot reach a server at {url}: {exc}") from None
    for row in index:
        where = row.get("reason") or ("held here" if row.get("state") == "READY" else "")
        print(f"{row['name']}\t{row.get('state', '')}\t{where}")
    for line in metrics.splitlines():
        if line.startswith("adaserve_cluster_"):
            print(line)
    return 0


def _list(names: list[str], read: Callable[[str], Read], line: Callable[[Read], str]) -> None:
    """A line per name: what `line` says of it once read, or why it could not be read."""
    for name in names:
        try:
            print(f"{name}\t{line(read(name))}")
        except AdaserveError as exc:
            print(f"{name}\tINVALID\t{exc}")


def _model_line(spec: ModelSpec) -> str:
    from adaserve.engine.footprint import describe_footprint

    config = spec.config
    inputs = ", ".join(f"{t.name}:{t.datatype}{list(t.shape)}" for t in config.inputs)
    return (
        f"v{','.join(map(str, spec.served))}\t{spec.platform}\tmax_batch={config.max_batch_size}\t"
        f"policy={config.batching.policy}\tinputs={inputs}{_default_field(spec)}\t"
        f"{describe_footprint(spec.directory, spec.artifact)}"
    )


def _default_field(spec: ModelSpec) -> str:
    """What a request that sets no parameter gets from the model's adaptive technique, if it has one."""
    if spec.config.caches is not None:
        from adaserve.adaptive.gati.cli import default_request  # imports torch: only for a model with caches

        return f"\tdefault=early exit {default_request(spec)}"
    if spec.config.activator is not None:
        return "\tdefault=dense (the activator serves requests that set accuracy or latency_ms)"
    return ""


def _dag_line(dag: DagConfig) -> str:
    nodes = ",".join(f"{node.name}[{'|'.join(o.model for o in node.options)}]" for node in dag.nodes)
    return f"dag\tmax_batch={dag.max_batch_size}\tbudget_policy={dag.budget_policy}\tnodes={nodes}"


def _http_client(url: str, args: argparse.Namespace) -> InferenceServerClient:
    """tritonclient's HTTP client for `url`: over TLS for an https:// URL or a TLS file (checked first)."""
    import gevent.ssl
    import tritonclient.http as httpclient
    from pydantic import ValidationError

    from adaserve.bench.client import client_tls

    _ctrl_c_reaches_gevent()
    url = url.removeprefix("http://")
    try:
        tls = client_tls(url.startswith("https://"), args.ca_cert, args.client_cert, args.client_key)
    except ValidationError as exc:
        raise ConfigError(f"TLS: {exc.errors()[0]['msg']}") from None
    if tls is None:
        return httpclient.InferenceServerClient(url)
    return httpclient.InferenceServerClient(
        url.removeprefix("https://"),
        ssl=True,
        ssl_context_factory=lambda: tls.ssl_context(gevent.ssl.create_default_context),  # its client runs on gevent
    )


def _ctrl_c_reaches_gevent() -> None:
    """Let Ctrl-C interrupt a command waiting in tritonclient's HTTP client, which runs on gevent. The kernel may hand
    the process's SIGINT to one of gevent's resolver threads; CPython then only flags it for the main thread, asleep
    in gevent's hub on a socket that may never answer (a test of `infer` against a silent server hung for its 60 s).
    libev's signal watcher wakes the hub whichever thread took the signal, and the hub raises KeyboardInterrupt in
    the main greenlet."""
    import gevent

    gevent.signal_handler(signal.SIGINT, gevent.kill, gevent.getcurrent(), KeyboardInterrupt)


def _infer(args: argparse.Namespace) -> int:
    inputs = [(item, _read_npy(item.path)) for item in args.input]  # a bad file is bad input, before any connection
    url = server_url(args.url)
    with needs_extra("client", "adaserve infer"):
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException
    try:
        with _http_client(url, args) as client:
            metadata = client.get_model_metadata(args.model)
            tensors = []
            for spec, array in _match_inputs(args.model, metadata["inputs"], inputs):
                if array.ndim == len(spec["shape"]) - 1:
                    array = array[None]
                tensor = httpclient.InferInput(spec["name"], list(array.shape), spec["datatype"])
                tensor.set_data_from_numpy(array.astype(httpclient.triton_to_np_dtype(spec["datatype"])))
                tensors.append(tensor)
            outputs = None
            if args.classes:
                outputs = [
                    httpclient.InferRequestedOutput(output["name"], binary_data=False, class_count=args.classes)
                    for output in metadata["outputs"]
                ]
            result = client.infer(
                args.model,
                tensors,
                parameters=args.parameters,
                outputs=outputs,
                request_compression_algorithm=args.compression,
                response_compression_algorithm=args.compression,
            )
    except InferenceServerException as exc:
        raise Refused(f"the server at {url} refused the request: {exc}") from None
    except OSError as exc:
        raise Unreachable(f"cannot reach a server at {url} (is `adaserve serve` running there?): {exc}") from None
    response = result.get_response()
    for output in response["outputs"]:
        values = result.as_numpy(output["name"])
        print(json.dumps({"name": output["name"], "shape": list(values.shape), "data": values.tolist()}))
        if values.ndim == 2 and values.shape[1] > 1 and values.dtype != object:
            print(json.dumps({"argmax": values.argmax(axis=1).tolist()}))
    if response.get("parameters"):
        print(json.dumps({"parameters": response["parameters"]}))
    return 0


def _match_inputs(
    model: str, specs: list[dict[str, Any]], inputs: list[tuple[InputFile, np.ndarray]]
) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Each `--input` with the model input it is for: by name, or the model's only input for a file without one."""
    by_name = {spec["name"]: spec for spec in specs}
    names = ", ".join(by_name)
    if any(item.name is None for item, _ in inputs):
        if len(inputs) > 1 or len(specs) != 1:
            raise ConfigError(
                f"an --input without a name is for a model with one input; model '{model}' takes {names}: "
                "give each as --input NAME=FILE.npy"
            )
        return [(specs[0], inputs[0][1])]
    given = [item.name for item, _ in inputs]
    for name in given:
        if name not in by_name:
            raise ConfigError(f"model '{model}' has no input '{name}'; its inputs are {names}")
        if given.count(name) > 1:
            raise ConfigError(f"--input {name}=... is given {given.count(name)} times")
    missing = [name for name in by_name if name not in given]
    if missing:
        raise ConfigError(f"model '{model}' also takes {', '.join(missing)}: add --input NAME=FILE.npy for each")
    return [(by_name[item.name], array) for item, array in inputs if item.name is not None]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; with the name of a `command` (`main` passes the first argument), that command's parser
    alone, so that the other commands' modules are not imported: `adaserve serve` started its zygote after 0.6-0.9
    s of CPU spent importing every command's module (numpy, pydantic, the load generator), the zygote's torch import
    waiting behind them. Anything else (`--help`, a misspelt command) gets every command."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="adaserve", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    known = any(command in names for names, _ in COMMANDS)
    for names, adder in COMMANDS:
        if known and command not in names:
            continue
        if isinstance(adder, str):
            importlib.import_module(adder).register(commands)
        else:
            adder(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from adaserve.cache.policies import POLICIES
    from adaserve.distributed.cli import add_cluster_arguments
    from adaserve.server.content_coding import GRPC_COMPRESSION_LEVELS
    from adaserve.server.limits import ClientLimits
    from adaserve.server.restrictions import CATEGORIES

    serve = commands.add_parser(
        "serve", help="serve a model repository over REST and gRPC (the example repository unless told another)"
    )
    add_model_repository(serve)
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default: loopback only)")
    serve.add_argument(
        "--http-port", type=int, default=DEFAULT_HTTP_PORT, help="port of the REST frontend (default %(default)s)"
    )
    serve.add_argument(
        "--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="port of the gRPC frontend (default %(default)s)"
    )
    add_grpc_frontend(serve, "the server's (with --ray, each node server's)")
    _add_switch(
        serve,
        "--reuse-port",
        "let several servers on one machine share the HTTP and gRPC ports (SO_REUSEPORT), each started with this "
        "and usually --cpus: the kernel gives each new connection to one of them, so clients see one server "
        "(every server should serve the same models; a connection stays with its server). Without it a taken port "
        "is an error",
    )
    serve.add_argument(
        "--cpus",
        type=cpu_list,
        metavar="LIST",
        help="run the server and its workers on these CPUs only, e.g. 0-3 or 0,2,4-7 (as taskset -c): Packrat and "
        "the worker sets plan these cores alone; with --reuse-port, one server per group of cores (default: every "
        "CPU this process may use)",
    )
    limits = ClientLimits()
    serve.add_argument(
        "--max-request-bytes",
        type=positive_integer,
        help="largest request accepted, once decompressed (413 / RESOURCE_EXHAUSTED beyond); an inference request "
        "is also held to what its model can take (max_batch_size rows of its inputs as JSON). Default: "
        f"{limits.max_body_bytes} over HTTP; over gRPC the largest request the repository's models take at start "
        "(at least gRPC's own 4 MiB), so a larger message is refused before it is received",
    )
    serve.add_argument(
        "--max-request-bytes-held",
        type=positive_integer,
        help="request bodies all HTTP connections may hold in memory at once, arriving, waiting or being answered; "
        "past it a new body is refused with a 503, and a body over 64 KiB may take 3/4 of it (default: twice "
        "--max-request-bytes)",
    )
    serve.add_argument(
        "--max-connections",
        type=positive_integer,
        default=limits.max_connections,
        help="open connections each frontend (HTTP, gRPC) takes; past it, HTTP closes the connection quiet longest "
        "to make room, and refuses the new one (503) when all are busy (default: %(default)s, held to a quarter of "
        "the open-file limit)",
    )
    serve.add_argument(
        "--http-idle-timeout",
        type=positive_number,
        default=limits.idle_timeout_s,
        help="seconds an HTTP connection may stay quiet between requests, or not read its answers, before it is "
        "closed; gRPC closes a connection with no call for this long (default: %(default)g)",
    )
    serve.add_argument(
        "--http-header-timeout",
        type=positive_number,
        default=limits.header_timeout_s,
        help="seconds a request's URL and headers have to arrive, from its first byte (or the connection's start): "
        "bytes trickling in do not extend it; a 408 after; gRPC's handshake has as long (default: %(default)g)",
    )
    serve.add_argument(
        "--http-body-timeout",
        type=positive_number,
        default=limits.body_timeout_s,
        help="seconds a request body has to arrive after its headers, plus one more per 64 KiB received: a body "
        f"slower than {limits.body_min_rate / 1024:.0f} KiB/s past them gets a 408 (default: %(default)g)",
    )
    serve.add_argument("--model", action="append", help="load only this model or DAG query (repeatable; default: all)")
    serve.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="join the Ray cluster at ADDRESS (host:port of its head, or auto): a node server on each of its nodes, "
        "every one answering for every model, which a placement controller places across them under "
        "--node-memory-budget (on its nodes' addresses unless --host names one)",
    )
    add_cluster_arguments(serve, memory_budget)
    serve.add_argument(
        "--cluster-control",
        type=int,
        metavar="FD",
        help="on a cluster, set by adaserve's node actor (not for direct use): the inherited socket on which the "
        "node actor sends the routing table and load orders; requests for models held elsewhere are forwarded",
    )
    serve.add_argument(
        "--cluster-node", default="", help="on a cluster, set by adaserve's node actor: this node's name there"
    )
    serve.add_argument(
        "--model-memory-budget",
        type=memory_budget,
        help="mCache: bytes (2GiB, 500MB) or a percentage of memory the models may hold together; models load on "
        "demand and are evicted by --cache-policy (default: no budget, every model loaded at start)",
    )
    serve.add_argument(
        "--cache-policy",
        default="iam",
        choices=[name for name, policy in POLICIES.items() if not policy.needs_future],  # the server has no future
        help="eviction policy under a memory budget (default: iam, mCache's importance-aware policy)",
    )
    serve.add_argument(
        "--spare-hosts",
        type=spare_hosts,
        help="model host processes kept forked ahead of loads, so a load skips the fork (milliseconds: every host is "
        "forked from one process that imported torch) (default: 1 with --model-memory-budget, where models load on "
        "demand; else 0)",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=positive_number,
        help="Triton's poll mode: every so many seconds, load models and DAG queries added to the repository, reload "
        "those whose config, versions or dag.yaml changed (no downtime), unload those removed (default: never; "
        f"{DEFAULT_POLL_S:g} with --model-control-mode poll)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["explicit", "poll", "none"],
        help="Triton's: explicit (the default; poll when --repository-poll-secs is given) lets the repository API "
        "load and unload; poll follows the repository on disk and refuses the API; none serves what loaded at start "
        "and refuses the API",
    )
    _add_switch(
        serve,
        "--allow-client-shm",
        "Triton's: let clients register POSIX shared memory (/dev/shm) or GPU memory (by its CUDA IPC handle) and "
        "send and receive tensors through it (the system and CUDA shared-memory extensions); off by default, since "
        "the server then reads and writes any shared-memory object a client names that the server may open",
    )
    add_trace_config(serve, CLUSTER_TRACE_FILE)
    serve.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="Triton's: a response cache of this size (bytes, or 100MB, 1GiB), least recently used answers evicted "
        "first; models whose config says response_cache: {enable: true} answer repeated requests (the same "
        "inputs and parameters) from it without running",
    )
    serve.add_argument(
        "--grpc-infer-response-compression-level",
        choices=GRPC_COMPRESSION_LEVELS,
        default="none",
        help="Triton's: compress gRPC responses at this level for clients that accept it (gRPC picks the "
        "algorithm; a message that compression would not shrink is sent as is); HTTP answers are compressed for "
        "clients that ask with Accept-Encoding, whatever this says",
    )
    for flag, whose, header in (
        ("--restricted-api", "on both frontends", "header (gRPC: metadata key) KEY"),
        ("--http-restricted-api", "Triton's, on REST", "header KEY"),
        ("--grpc-restricted-protocol", "Triton's, on gRPC", "metadata key triton-grpc-protocol-KEY"),
    ):
        serve.add_argument(
            flag,
            action="append",
            default=[],
            metavar="CATEGORY[,CATEGORY...]:KEY=VALUE",
            help=f"{whose}: these API categories answer only requests whose {header} is VALUE (categories: "
            f"{', '.join(CATEGORIES)}; metrics is REST's /metrics); repeat for groups with other keys",
        )
    for protocol, whose in (("grpc", "Triton's"), ("http", "as Triton's gRPC flags")):
        _add_switch(
            serve,
            f"--{protocol}-use-ssl",
            f"{whose}: serve {protocol.upper()} over TLS (--{protocol}-server-cert, --{protocol}-server-key)",
        )
        _add_switch(
            serve,
            f"--{protocol}-use-ssl-mutual",
            f"{whose}: TLS, and every client must show a certificate signed by --{protocol}-root-cert",
        )
        for name, what in (
            ("server-cert", "the server's certificate (chain)"),
            ("server-key", "its private key"),
            ("root-cert", "the CA that signs clients' certificates"),
        ):
            serve.add_argument(f"--{protocol}-{name}", type=Path, metavar="PEM", help=f"{whose}: {what}, a PEM file")
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least level logged (default info); the logging extension changes it at run time",
    )
    serve.set_defaults(func=_serve)


def _add_infer(commands: argparse._SubParsersAction) -> None:
    from adaserve.bench.cli import add_client_tls_arguments

    infer = commands.add_parser(
        "infer", help="send tensors from .npy files to a running server and print the outputs it answers"
    )
    infer.add_argument("model", help="the model (or DAG query) to ask")
    infer.add_argument(
        "--input",
        type=input_file,
        action="append",
        required=True,
        metavar="[NAME=]FILE.npy",
        help="an input's tensor, with or without the batch dimension (repeat for each input; a model with one input "
        "takes the file alone)",
    )
    add_url_argument(infer, "the server's HTTP port, host:port, or https://host:port for TLS")
    add_client_tls_arguments(infer)
    infer.add_argument("--parameters", type=json_object, help="request parameters as JSON, e.g. '{\"latency_ms\": 5}'")
    infer.add_argument(
        "--classes",
        type=positive_integer,
        metavar="K",
        help="ask for each output's top K classes (the classification extension: value:index:label) instead of it",
    )
    infer.add_argument(
        "--compression",
        choices=["gzip", "deflate"],
        help="compress the request (Content-Encoding) and ask for the answer compressed (Accept-Encoding)",
    )
    infer.set_defaults(func=_infer)


def _add_models(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="list a model repository's models and say which configs are invalid")
    models_commands = models.add_subparsers(dest="models_command", required=True)
    listing = models_commands.add_parser(
        "list", help="list the models (versions, configs) and DAG queries (nodes, options) of a repository"
    )
    add_model_repository(listing)
    listing.add_argument(
        "--cluster",
        metavar="URL",
        help="list what a running cluster serves instead, as its node at URL (host:port) tells it: each model's state "
        "and the nodes holding it, then the cluster's metrics",
    )
    listing.set_defaults(func=_models_list)


def _add_trace(commands: argparse._SubParsersAction) -> None:
    trace = commands.add_parser("trace", help="summarize where traced requests' time went (serve --trace-config)")
    trace_commands = trace.add_subparsers(dest="trace_command", required=True)
    summary = trace_commands.add_parser(
        "summary", help="where traced requests' time went: each span's median and 90th percentile, per model"
    )
    summary.add_argument("files", nargs="+", type=Path, help="trace files (the file, and its numbered parts)")
    summary.add_argument("--json", action="store_true", help="print the summary as JSON")
    summary.set_defaults(func=_trace_summary)


#: Each command the parser has, in the order `adaserve --help` lists them, and the function that adds it (or the
#: module whose `register` does).
COMMANDS: tuple[tuple[tuple[str, ...], Callable[[argparse._SubParsersAction], None] | str], ...] = (
    (("serve",), _add_serve),
    (("infer",), _add_infer),
    (("models",), _add_models),
    (("bench",), "adaserve.bench.cli"),
    (("trace",), _add_trace),
    (("profile", "plan"), "adaserve.cpu.cli"),
    (("caches",), "adaserve.adaptive.gati.cli"),
    (("activator",), "adaserve.adaptive.activator.cli"),
    (("model-cache",), "adaserve.cache.cli"),
    (("cluster",), "adaserve.distributed.cli"),
)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        code = args.func(args)
    except (AdaserveError, Refused, Unreachable, OSError) as exc:  # e.g. a refused connection: say it plainly
        print(f"adaserve: error: {exc}", file=sys.stderr)
        code = next(code for kind, code in EXIT_CODES.items() if isinstance(exc, kind))
    except KeyboardInterrupt:  # Ctrl-C in a command that does not handle it itself (serve and bench do)
        print("adaserve: interrupted", file=sys.stderr)
        code = 130  # 128 + SIGINT, as shells report it
    sys.exit(code)
