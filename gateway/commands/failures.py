"""What makes an operator command stop, and its exit status.

CommandError         1   the gateway answered with an error, or could not be reached
└── UsageError       2   bad arguments, a malformed input file, a refused resume
    (MalformedFile in transcript.py names the file and line)
"""

from __future__ import annotations


class CommandError(Exception):
    """A command failed; the message is shown to the operator as it is."""

    exit_code = 1


class UsageError(CommandError):
    """The command cannot run as given: the operator has to change something."""

    exit_code = 2
