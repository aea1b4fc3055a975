"""How long a worker process lives: it dies with the tuner, and its death is told apart.

A worker leads its own process group. On Linux the kernel SIGKILLs it when the thread that
started it ends (the tuner killed by any signal, SIGKILL included); a tuner stopped by SIGTERM,
SIGHUP or SIGINT kills every worker's group first (:func:`stop_workers_on_signals`), and one that
exits does so too (``atexit``). A worker that died is a ``crash`` of its point, unless a signal
from outside or the tuner itself killed it: then it is ``killed``, which says nothing of the
point, and a later run measures it again.
"""
from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
import weakref
from typing import Any

# Signals a process does not raise on its own fault: sent by a person, a job scheduler or the
# kernel's OOM killer. A worker they kill has said nothing about its point.
_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()  # workers with a process, for kill_all (opgen.run.worker.Worker)


def track(worker: Any) -> None:
    """Count ``worker`` (an ``opgen.run.worker.Worker`` with a process) among those :func:`kill_all` kills."""
    _register_exit()
    _LIVE.add(worker)


def untrack(worker: Any) -> None:
    _LIVE.discard(worker)


@functools.cache
def _register_exit() -> None:
    atexit.register(kill_all)


def die_with_parent(parent: int) -> None:
    """Lead a process group of its own (the tuner kills the group: compiler children too) and,
    on Linux, have the kernel SIGKILL this process when the thread that started it ends."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the tuner died before the request took effect
        os._exit(1)


def death(code: int | None, by_us: bool) -> tuple[str, str]:
    """The status and reason of a task whose worker process died: ``killed`` when a signal from
    outside (:data:`_OUTSIDE`) or the tuner itself stopped it, a state that says nothing of the
    point and is measured again by a later run; ``crash`` for any other death (a fault of the
    point, e.g. SIGSEGV or SIGABRT from its kernel or compiler)."""
    if by_us:
        return "killed", f"worker process stopped by the tuner (exit code {code})"
    if code is not None and code < 0 and -code in _OUTSIDE:
        name = signal.Signals(-code).name
        return "killed", (f"worker process killed by {name} from outside the tuner (exit code {code}); "
                          "measured again by a later run")
    return "crash", f"worker process died (exit code {code})"


def kill_all() -> None:
    """SIGKILL every worker process of this process and its group (idempotent)."""
    for worker in list(_LIVE):
        worker.kill()


def stop_workers_on_signals() -> None:
    """Install handlers (from the main thread) that kill every worker's group before the tuner
    dies of SIGTERM or SIGHUP, or raises KeyboardInterrupt on SIGINT."""
    def handler(signum: int, frame: Any) -> None:
        kill_all()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, handler)
