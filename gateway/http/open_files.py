"""The process's limit on open files, raised to what the system allows.

Every client connection, upstream connection and Redis connection is a descriptor. A
common soft limit is 1,024 (systemd's default, many containers') while the hard limit is
far higher: 750 streams held open from three addresses then left no descriptor for
another client's connection (its connect failed), though the process could have had
ten times as many. As Go's runtime and nginx's ``worker_rlimit_nofile`` do, a serving
process raises its soft limit to the hard one at start-up; it never lowers it.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

try:
    import resource
except ImportError:  # not on a POSIX system
    resource = None  # type: ignore[assignment]


def raise_to_hard_limit() -> int | None:
    """Raise the soft limit on open files to the hard one; the soft limit now (None
    where the platform has none)."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as error:  # a sandbox that refuses: keep what we have
        log.warning("open files limit left at %d (raising it to %d failed: %s)", soft, hard, error)
        return soft
    log.info("open files limit raised from %d to %d", soft, hard)
    return hard
