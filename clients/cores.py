"""How many cores this process may use: what ``--threads auto`` and the alignment's ``--workers``
default to."""

from __future__ import annotations

import math
import os
from pathlib import Path


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    (a container limited to 2 CPUs on a 64-core host gets 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)
