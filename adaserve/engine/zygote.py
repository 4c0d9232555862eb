"""The zygote: one process that imports torch and adaserve's engine once, then forks every model host (and every
background profile's child).

Started by the server (`processes.Zygote`) as `python -m adaserve.engine.zygote CONTROL_FD`. Importing torch takes
about 2.6 s of CPU on the 2-core VM and leaves some 150 MiB written in the process that did it; the first program
load pays another 1.2 s once (`host.prime_program_loading`). When each host did both itself, a server of three small
models started three interpreters that imported torch side by side, and held three copies of those pages: 22
processes, 900 MiB of PSS, 5 s to ready. A host forked from here starts in milliseconds and shares those pages
copy-on-write with the zygote and every other host, as a host's workers share its model.

On its control socket (SOCK_SEQPACKET) the server sends a `ForkHost` with one descriptor, the new host's control
socket; the zygote forks, the child leaves for a session of its own and runs `host.serve` on that socket, and the
zygote answers `Forked(pid)`. A `ForkProfiler` is answered the same way, its child measuring a model's profile
(`adaserve.cpu.profiler.measure_beside_serving`) onto the pipe that came with it: started afresh, that child imported
torch again and held 160 MiB of its own; forked, it shares the zygote's pages as a host does. The zygote is its
children's parent, so it reaps them and reports each as `Exited(pid, returncode)`: the server can still say how
one ended. It never computes and never starts a thread, so forking is safe. It exits when the server's end of its
socket closes, and `adaserve serve` kills it as it exits (`Zygote.stop`); the processes it forked live on until their
own sockets (or pipes) close.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

from adaserve.engine.messages import Exited, Forked, ForkHost, ForkProfiler, decode_to_zygote, encode
from adaserve.malloc import keep_freed_memory


def serve(control: socket.socket) -> int:
    """Fork a process per request, and report each one's exit, until the server hangs up."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler of its own, so that SIGCHLD writes the wakeup pipe
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wake_read:
                os.read(wake_read, 4096)
                _report_exits(control)
                continue
            data, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
            if not data:
                return 0
            request = decode_to_zygote(data)
            pid = os.fork()
            if pid == 0:
                _become(request, fds[0], control, (wake_read, wake_write))
            os.close(fds[0])
            control.send(encode(Forked(pid)))


def _become(request: ForkHost | ForkProfiler, fd: int, control: socket.socket, wake: tuple[int, int]) -> None:
    """In the forked child: drop the zygote's descriptors and handlers, then live and exit as a model host or a
    profile's child. A session of its own, as a host always had: signals sent to the zygote's group are not its
    business, and the server ends a profile's child with its process group."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.close()
        for wake_fd in wake:
            os.close(wake_fd)
        os.setsid()
        if isinstance(request, ForkHost):
            from adaserve.engine.host import serve as serve_host  # imported by `prepare`

            code = serve_host(socket.socket(fileno=fd))
        else:
            from adaserve.cpu.profiler import measure_beside_serving

            code = measure_beside_serving(json.loads(request.job_json), fd)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _report_exits(control: socket.socket) -> None:
    """Reap every child that has exited and tell the server how each ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if pid == 0:
            return
        control.send(encode(Exited(pid, os.waitstatus_to_exitcode(status))))


#: The collector's third threshold while `prepare` runs: no full collection happens before priming's own.
_NO_FULL_COLLECTION = 1 << 30


def prepare(cache_dir: Path | None = None) -> None:
    """Import the engine (and torch) and prime program loading (`host.prime_program_loading`, `cache_dir` its
    program's folder), with no full collection of the garbage collector but priming's own, which freezes what
    survives for every child. Else the imports made six, each walking a heap growing to some 340,000 objects:
    0.45-0.5 CPU-s of the 4-5 the zygote spent before its first fork on the (loaded) 2-core VM, on every host's
    way to ready. The young generations are still collected, so the imports' short-lived garbage does not pile up
    (the zygote's memory is the same)."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, _NO_FULL_COLLECTION)
    try:
        from adaserve.engine import host

        host.prime_program_loading(cache_dir)
    finally:
        gc.set_threshold(young, middle, old)


def main() -> None:
    # Stop signals are the server's (see `host`'s workers, which inherit this): it ends the zygote by hanging up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    keep_freed_memory()  # every host and worker inherits it (`adaserve.malloc`)
    control = socket.socket(fileno=int(sys.argv[1]))
    prepare()
    try:
        code = serve(control)
    except (BrokenPipeError, ConnectionResetError):
        code = 0  # the server is gone
    sys.exit(code)


if __name__ == "__main__":
    main()
