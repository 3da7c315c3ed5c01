"""How the integration tests talk to a gateway: the real OpenAI SDK, the memory API as
an operator's script uses it, and plain chat requests over httpx.

Every content sent through here is registered (``SENT_CONTENTS``): the suite's end
checks that no log record at INFO or above repeats one. Clients opened here are closed
after each test by the integration conftest (``close_clients``), even when it fails.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai

from devsupport.servers import ServerThread

SENT_CONTENTS: set[str] = set()

_OPEN_CLIENTS: list[openai.OpenAI] = []
_OPEN_HTTP: list[httpx.Client] = []


def register_content(text: str) -> str:
    """Remember a message content a test sends: no log record may repeat it."""
    SENT_CONTENTS.add(text)
    return text


def close_clients() -> None:
    """Close every client opened since the last call (no leaked sockets)."""
    while _OPEN_CLIENTS:
        _OPEN_CLIENTS.pop().close()
    while _OPEN_HTTP:
        _OPEN_HTTP.pop().close()


def sdk(gateway: ServerThread, key: str, session: str | None, **headers: str) -> openai.OpenAI:
    """The real OpenAI SDK pointed at the gateway, as a user's app would be."""
    default_headers = dict(headers)
    if session is not None:
        default_headers["X-Session-Id"] = session
    client = openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=key, default_headers=default_headers, max_retries=0
    )
    _OPEN_CLIENTS.append(client)
    return client


def say(client: openai.OpenAI, text: str, model: str = "fake-model") -> str:
    """Send one user message, as a single-message client does; return the answer's text."""
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": register_content(text)}]
    )
    return answer.choices[0].message.content or ""


def send(
    http: httpx.Client,
    key: str,
    session: str,
    messages: list[dict[str, Any]],
    *,
    stream: bool = False,
) -> httpx.Response:
    """One chat-completions request of ``messages`` to the fake upstream's model."""
    body = {"model": "fake-model", "stream": stream, "messages": messages}
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session}
    return http.post("/v1/chat/completions", json=body, headers=headers)


class Memory:
    """The memory API of one session, as an operator's script would use it."""

    def __init__(self, gateway: ServerThread, key: str, session: str) -> None:
        self.http = httpx.Client(
            base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        _OPEN_HTTP.append(self.http)
        self.base = f"/memory/sessions/{session}"
        self.count = 0

    def add(self, n: int, text: str = "message {i} about topic {t}") -> None:
        """Append n messages, alternating user/assistant, continuing the numbering."""
        messages = []
        for _ in range(n):
            self.count += 1
            role = "user" if self.count % 2 else "assistant"
            content = register_content(text.format(i=self.count, t=self.count % 5))
            messages.append({"role": role, "content": content})
        response = self.http.post(self.base + "/messages", json={"messages": messages})
        assert response.status_code == 200, response.text
        assert response.json()["message_count"] == self.count

    def flush(self) -> dict[str, Any]:
        response = self.http.post(self.base + "/flush")
        assert response.status_code == 200, response.text
        assert response.json()["pending_jobs"] == 0
        return self.state()

    def state(self) -> dict[str, Any]:
        response = self.http.get(self.base)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def context(self, text: str = "next question?") -> dict[str, Any]:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
        response = self.http.post(self.base + "/context", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())


def import_all(memory: Memory, messages: list[dict[str, str]], headers: Any = None) -> None:
    """Import ``messages`` 60 at a time, running the jobs each batch makes due."""
    for start in range(0, len(messages), 60):
        batch = messages[start : start + 60]
        response = memory.http.post(
            memory.base + "/messages", json={"messages": batch}, headers=headers or {}
        )
        assert response.status_code == 200, response.text
        memory.flush()


def ranges(state: dict[str, Any]) -> list[tuple[int, int]]:
    """The message ranges of a session's summaries, as ``GET /memory/sessions/{sid}`` shows."""
    return [(s["range"]["start"], s["range"]["end"]) for s in state["summaries"]]


# A long message (about 200 tokens) for ``Memory.add``: a few hundred outgrow a small model.
LONG = "my note {i}: " + "the quick brown fox jumps over the lazy dog near the river bank " * 16
