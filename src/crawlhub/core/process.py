"""Whether a process on this host is alive: the one check behind run leases, job runners,
orphans and build steps, with the zombie rule each caller needs said at the call."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int, *, zombie_is_alive: bool = False) -> bool:
    """Whether a process ``pid`` exists on this host (of any user).

    A zombie (ended, not yet reaped by its parent) is dead unless ``zombie_is_alive``:
    a supervisor waiting for a process to end wants the former; a lease that only asks
    whether its holder's pid is still taken (collect's run lease) the latter, which is
    also the only answer without ``/proc``. ``pid <= 0`` names no one process: False.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    if zombie_is_alive:
        return True
    try:  # "pid (comm) state ...": Linux's /proc; elsewhere the signal's answer
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return not Path("/proc/self/stat").exists()  # with /proc: gone since the signal
