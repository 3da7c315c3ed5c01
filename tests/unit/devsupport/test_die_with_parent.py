"""A child started through ``DIE_WITH_PARENT`` (every process a benchmark starts) ends
when its parent is killed, even by SIGKILL, when no cleanup of the parent's runs: a
benchmark killed by a timeout leaves no ``serve`` behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from devsupport.servers import DIE_WITH_PARENT
from tests.support.waiting import wait_for

# The parent: starts the child, prints its pid, then waits to be killed.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def command_line(pid: int) -> str:
    """The process's command line ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline") as cmdline:
            return cmdline.read()
    except FileNotFoundError:
        return ""


def running_its_own_program(pid: int) -> bool:
    """Whether the child runs ``-c <its program>``, not the wrapper any more (a command
    line read while the process starts may be empty: that is not it)."""
    arguments = command_line(pid).split("\0")
    return len(arguments) > 2 and arguments[2].startswith("import time")


def alive(pid: int) -> bool:
    """Whether our child still runs: not gone, not a zombie (dead, not yet reaped by
    init), and not another process that was given its pid since."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ", 1)[1][0] == "Z":
                return False
    except FileNotFoundError:
        return False
    return running_its_own_program(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_ends_when_its_parent_is_killed() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, DIE_WITH_PARENT], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        try:
            # Past the wrapper (its prctl made, the child's own program running): killed
            # before that, the parent would leave nothing to be signalled about.
            wait_for(lambda: running_its_own_program(child), 10, "the child's exec")
            assert alive(child)
            parent.send_signal(signal.SIGKILL)
            parent.wait(10)
            wait_for(lambda: not alive(child), 10, "the child outlived its killed parent")
        finally:
            if alive(child):  # (ours: its pid, once freed, may be another process's)
                os.kill(child, signal.SIGKILL)
