"""What the processes of one ``cfmaps serve --workers N`` know of each other.

The N processes answer on one port, and a readiness probe reaches one of them. Each was
ready for itself: a probe could find the process that had loaded and put the pod in
service while the other still loaded and answered its share of the queries 409
``loading``. So each process, once loaded, leaves a file named by its pid in the run
directory's ``ready/`` (made by ``cfmaps serve``, :data:`SHARED_ENV`), and is ready only
when N live processes have. A process uvicorn starts in place of a dead one holds
readiness back until it has loaded too.

The same directory holds the rate limit's buckets (:mod:`app.ratelimit`) and, unless the
operator names another, the metrics (:mod:`app.metrics`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["PROCESSES_ENV", "SHARED_ENV", "Siblings", "pid_alive"]

#: The run directory shared by the processes of one ``cfmaps serve --workers N`` (a
#: leading underscore: no setting of the service).
SHARED_ENV = "_CFMAPS_SHARED_DIR"
#: How many processes ``cfmaps serve`` started (N).
PROCESSES_ENV = "_CFMAPS_PROCESSES"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Siblings:
    """The readiness of the ``n`` processes of one server, in ``run_dir/ready``."""

    def __init__(self, run_dir: str | os.PathLike[str], n: int) -> None:
        self.run_dir = Path(run_dir)  # the rate limit's buckets live there too
        self.dir = self.run_dir / "ready"
        self.dir.mkdir(exist_ok=True)
        self.n = n

    @classmethod
    def from_env(cls) -> Siblings | None:
        """The siblings of this process when ``cfmaps serve --workers N`` (N > 1) started
        it, else None."""
        run, n = os.environ.get(SHARED_ENV), os.environ.get(PROCESSES_ENV, "")
        if not run or not n.isdigit() or int(n) < 2:
            return None
        return cls(run, int(n))

    def mark_ready(self) -> None:
        """This process has loaded (its file stays until :meth:`unmark` or its death)."""
        (self.dir / str(os.getpid())).touch()

    def unmark(self) -> None:
        with contextlib.suppress(OSError):
            (self.dir / str(os.getpid())).unlink()

    def ready(self) -> int:
        """Live processes that have loaded. A dead one's file goes, so that its pid, once
        the system hands it to another process, is not taken for a loaded sibling."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return 0
        alive = 0
        for name in names:
            if not name.isdigit():
                continue
            if pid_alive(int(name)):
                alive += 1
            else:
                with contextlib.suppress(OSError):
                    (self.dir / name).unlink()
        return alive

    def all_ready(self) -> bool:
        return self.ready() >= self.n
