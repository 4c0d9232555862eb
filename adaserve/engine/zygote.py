"""The zygote: one process that imports torch and adaserve's engine once, then forks every model host.

Started by the server (`processes.Zygote`) as `python -m adaserve.engine.zygote CONTROL_FD`. Importing torch takes
about 2.6 s of CPU on the 2-core VM and leaves some 150 MiB written in the process that did it; the first program
load pays another 1.2 s once (`host.prime_program_loading`). When each host did both itself, a server of three small
models started three interpreters that imported torch side by side, and held three copies of those pages: 22
processes, 900 MiB of PSS, 5 s to ready. A host forked from here starts in milliseconds and shares those pages
copy-on-write with the zygote and every other host, as a host's workers share its model.

On its control socket (SOCK_SEQPACKET) the server sends a `ForkHost` with one descriptor, the new host's control
socket; the zygote forks, the child leaves for a session of its own and runs `host.serve` on that socket, and the
zygote answers `HostForked(pid)`. The zygote is every host's parent, so it reaps them and reports each as
`HostExited(pid, returncode)`: the server can still say how a host ended. It never computes and never starts a
thread, so forking is safe. It exits when the server's end of its socket closes; the hosts it forked live on until
their own sockets close.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys

from adaserve.engine import host
from adaserve.engine.messages import HostExited, HostForked, decode_fork_host, encode
from adaserve.malloc import keep_freed_memory


def serve(control: socket.socket) -> int:
    """Fork a host per request, and report each host's exit, until the server hangs up."""
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
            data, fds, _, _ = socket.recv_fds(control, 1024, 1)
            if not data:
                return 0
            decode_fork_host(data)
            pid = os.fork()
            if pid == 0:
                _become_host(socket.socket(fileno=fds[0]), control, (wake_read, wake_write))
            os.close(fds[0])
            control.send(encode(HostForked(pid)))


def _become_host(host_control: socket.socket, control: socket.socket, wake: tuple[int, int]) -> None:
    """In the forked child: drop the zygote's descriptors and handlers, then live and exit as a model host. A session
    of its own, as a host always had: signals sent to the zygote's group are not its business."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.close()
        for fd in wake:
            os.close(fd)
        os.setsid()
        code = host.serve(host_control)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _report_exits(control: socket.socket) -> None:
    """Reap every host that has exited and tell the server how each ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if pid == 0:
            return
        control.send(encode(HostExited(pid, os.waitstatus_to_exitcode(status))))


def main() -> None:
    # Stop signals are the server's (see `host`'s workers, which inherit this): it ends the zygote by hanging up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    keep_freed_memory()  # every host and worker inherits it (`adaserve.malloc`)
    control = socket.socket(fileno=int(sys.argv[1]))
    host.prime_program_loading()
    try:
        code = serve(control)
    except (BrokenPipeError, ConnectionResetError):
        code = 0  # the server is gone
    sys.exit(code)


if __name__ == "__main__":
    main()
