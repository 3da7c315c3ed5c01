"""``memory-gateway --help`` opens with what the program is for, not the module's docstring
(issue 34: it opened with ``memory-gateway serve | worker ...`` in reStructuredText)."""

from __future__ import annotations

import pytest

from gateway.cli import main


def test_help_opens_with_a_plain_description(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]
    assert description.startswith("An OpenAI-compatible proxy that gives chat applications")
    assert "``" not in out  # no reStructuredText left for the reader to decode
    assert "commands/" not in out  # nor the source tree's layout
