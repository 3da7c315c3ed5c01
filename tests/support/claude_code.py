"""Claude Code (the ``claude`` CLI of npm's @anthropic-ai/claude-code) run in print mode,
``claude -p PROMPT``, against a local Anthropic-compatible server: the fake upstream's
``/v1/messages`` or a gateway in front of it, never Anthropic's.

``ask_claude`` returns what it printed; ``run_claude`` the whole finished process (an
upstream error is exit status 1 with ``API Error: …`` on stdout). ``claude_binary`` finds
the CLI: ``CLAUDE_CODE_BIN``, else ``VERSION`` installed under ``CLAUDE_CODE_PREFIX``
(default ``~/.cache/memory-gateway/claude-code-VERSION``), installed there with npm on
first use (a ~400 MB native binary, ~15 s; a lock keeps two test processes from
installing it at once).

What it sends (2.1.332): ``POST {ANTHROPIC_BASE_URL}/v1/messages?beta=true``, streamed,
with ``x-api-key`` (``ANTHROPIC_API_KEY``), ``anthropic-version: 2023-06-01``,
``anthropic-beta``, ``X-Claude-Code-Session-Id`` (one per conversation: ``--continue``
keeps it) and the ``ANTHROPIC_CUSTOM_HEADERS`` (``X-Session-Id`` here). Its body: the
model (``--model``, any name: the fake's behaviours work), ``system`` as text blocks
(the first a per-prompt ``x-anthropic-billing-header`` line, the rest marked
``cache_control``), ~12 tools, ``thinking: adaptive``, ``metadata.user_id``, and the
messages: a user message (a ``<system-reminder>`` text block, then the prompt), then a
mid-conversation ``system`` message. ``--continue`` resends the earlier turns of the
newest conversation in the same working directory (``home``'s ``project``); a plain
second call sends only its own prompt.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

VERSION = "2.1.332"
PACKAGE = "@anthropic-ai/claude-code"
PREFIX = Path(
    os.environ.get("CLAUDE_CODE_PREFIX")
    or Path.home() / ".cache" / "memory-gateway" / f"claude-code-{VERSION}"
)
# Offline: no telemetry, error reports, update checks or other calls beside the model's
# (without them it looks up Anthropic's hosts), and no retries of a failed call, so that
# an error a test provokes is seen once and at once (CLAUDE_CODE_MAX_RETRIES in ``env``
# gives it its retries back).
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_MAX_RETRIES": "0",
}


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    PREFIX.mkdir(parents=True, exist_ok=True)
    with (PREFIX / ".install-lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _version_of(binary: str) -> str:
    done = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout.strip()


@functools.cache
def claude_binary() -> str:
    """The ``claude`` CLI: ``CLAUDE_CODE_BIN``, else ``VERSION`` under ``PREFIX``
    (installed there with npm when missing). Missing tools fail, never skip."""
    named = os.environ.get("CLAUDE_CODE_BIN")
    if named:
        assert Path(named).is_file(), f"CLAUDE_CODE_BIN={named} is no file"
        return named
    binary = PREFIX / "node_modules" / ".bin" / "claude"
    with _install_lock():
        if not binary.exists() or VERSION not in _version_of(str(binary)):
            npm = shutil.which("npm")
            assert npm, "no npm to install Claude Code: apt-get install nodejs npm"
            command = [npm, "install", "--prefix", str(PREFIX), f"{PACKAGE}@{VERSION}"]
            done = subprocess.run(
                [*command, "--no-audit", "--no-fund", "--silent"],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, f"npm install {PACKAGE}@{VERSION}: {done.stderr}"
    found = _version_of(str(binary))
    assert VERSION in found, f"{binary} --version says {found!r}, not {VERSION}"
    return str(binary)


def claude_env(
    base_url: str,
    api_key: str,
    home: Path,
    *,
    session_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of one call: nothing of the test process's beside PATH.

    ``base_url`` is the server's root (Claude Code adds ``/v1/messages``); ``home`` keeps
    its settings and conversations (``--continue`` reads them). ``session_id`` becomes
    an ``X-Session-Id`` header, ``headers`` more of them (ANTHROPIC_CUSTOM_HEADERS: one
    ``Name: value`` a line), ``env`` any other variable (it wins over these).
    """
    sent = {**({"X-Session-Id": session_id} if session_id else {}), **(headers or {})}
    custom = "\n".join(f"{name}: {value}" for name, value in sent.items())
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
        "ANTHROPIC_API_KEY": api_key,
        **QUIET,
        **({"ANTHROPIC_CUSTOM_HEADERS": custom} if custom else {}),
        **(env or {}),
    }


def run_claude(
    prompt: str,
    *,
    base_url: str,
    home: Path,
    api_key: str = "sk-ant-test",
    model: str | None = None,
    session_id: str | None = None,
    resume: bool = False,
    headers: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``claude -p prompt`` (``--continue`` when ``resume``: the newest conversation of
    ``home``), run in ``home/project``; its finished process, whatever its status."""
    cwd = home / "project"
    cwd.mkdir(parents=True, exist_ok=True)
    command = [claude_binary(), "-p", prompt]
    command += ["--model", model] if model else []
    command += ["--continue"] if resume else []
    return subprocess.run(
        command,
        env=claude_env(base_url, api_key, home, session_id=session_id, headers=headers, env=env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def ask_claude(prompt: str, **options: Any) -> str:
    """What ``claude -p prompt`` printed (``run_claude``'s options); a failed call
    fails the test with what it said."""
    done = run_claude(prompt, **options)
    assert done.returncode == 0, f"claude -p exited {done.returncode}: {done.stdout}{done.stderr}"
    return done.stdout.strip()
