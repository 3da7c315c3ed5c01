"""A serving process raises its soft limit on open files to the hard one
(``http.open_files``), in a child process so the test's own limit is left alone."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import resource, sys
from gateway.http.open_files import raise_to_hard_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
now = raise_to_hard_limit()
after = resource.getrlimit(resource.RLIMIT_NOFILE)
print(now, after[0], after[1], hard)
"""


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout.split()
    now, soft, hard, hard_before = (int(v) for v in out)
    assert hard == hard_before  # never lowered, never raised past what is allowed
    assert soft == hard and now == hard
    assert soft > 256
