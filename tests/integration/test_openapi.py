"""The served OpenAPI document against real answers: every memory API route, answering
over a real socket with a real Redis, answers what the document's model says it does.

The document is generated from the models (``gateway/routes/schemas.py``), so a field
added to an answer without its model fails here; the routes' own request validation
uses the same models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from devsupport.servers import ServerThread
from gateway.routes import schemas
from gateway.routes.openapi import OPERATIONS, Operation
from tests.support.clients import Memory, say, sdk
from tests.support.fixtures import GatewayFactory

SESSION = "/memory/sessions/{sid}"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exports"


class Checked:
    """A memory API client that holds every answer to the document's operation."""

    def __init__(self, memory: Memory, session: str) -> None:
        self.http = memory.http
        self.session = session
        self.seen: set[tuple[str, str]] = set()

    def call(self, method: str, route: str, status: int = 200, ids: Any = None, **sent: Any) -> Any:
        operation = OPERATIONS[(route, method)]
        url = route.replace("{sid}", self.session)
        for name, value in (ids or {}).items():
            url = url.replace("{" + name + "}", value)
        reply = self.http.request(method.upper(), url, **sent)
        assert reply.status_code == status, reply.text
        self.seen.add((route, method))
        return check(operation, reply)


def check(operation: Operation, reply: httpx.Response) -> Any:
    """The answer, validated (strictly, no extra field) by the model the document names."""
    documented = {"204"} if operation.answer is None else {operation.status}
    documented |= set(operation.errors)
    assert str(reply.status_code) in documented, (reply.status_code, documented)
    if reply.status_code == 204:
        assert reply.content == b""
        return None
    model: type[BaseModel] = schemas.Error if reply.status_code >= 400 else operation.answer  # type: ignore[assignment]
    if reply.headers["content-type"].startswith("text/markdown"):
        assert operation.markdown
        return reply.text
    model.model_validate(reply.json(), strict=True)
    return reply.json()


@pytest.mark.parametrize(
    ("preset", "tiers"),
    [
        ("hybrid-recall", ("summaries", "facts", "pins")),
        ("rolling-summary", ("rolling_summary", "key_qa")),
    ],
)
def test_every_memory_api_answer_matches_its_model(
    make_gateway: GatewayFactory,
    memory_for: Callable[[ServerThread], Memory],
    api_key: str,
    session_id: str,
    preset: str,
    tiers: tuple[str, ...],
) -> None:
    gateway = make_gateway(memory={"preset": preset})
    memory = memory_for(gateway)
    api = Checked(memory, session_id)
    client = sdk(gateway, api_key, session_id, **{"X-User-Id": "user-1"})
    for i in range(6):
        say(client, f"My name is Ada and I live in Paris, question {i}")
    messages = [
        {"role": "user", "content": f"my fact{i} is value{i}", "timestamp": 1.7e9 + i}
        for i in range(30)
    ]
    messages += [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]  # fmt: skip
    api.call("post", SESSION + "/messages", json={"messages": messages})
    api.call("post", SESSION + "/flush")
    pin = api.call("post", SESSION + "/pins", 201, json={"content": "likes tea", "source_index": 1})
    api.call(
        "patch", SESSION + "/pins/{pin_id}", ids={"pin_id": pin["id"]}, json={"importance": 0.5}
    )
    api.call("get", SESSION + "/pins")
    state = api.call("get", SESSION)
    assert all(state[tier] for tier in tiers), {tier: state[tier] for tier in tiers}
    assert any(m.get("timestamp") for m in state["window"])
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "and now?"}]}
    api.call("post", SESSION + "/context", json=body)
    api.call("post", SESSION + "/context", json={"model": "fake-model", "input": "and now?"})
    assert api.call("get", SESSION + "/receipts")["receipts"]
    assert api.call("get", "/memory/sessions")["sessions"]
    api.call("get", SESSION + "/export")
    api.call("get", SESSION + "/export", params={"format": "markdown"})
    api.call("post", SESSION + "/end")
    api.call("get", "/memory/users/{uid}", ids={"uid": "user-1"})
    facts = [f for f in api.call("get", SESSION + "/facts")["facts"] if not f.get("superseded")]
    fact = {"fact_id": facts[-1]["id"] if facts else "fact_none"}
    status = 200 if facts else 404  # (a preset without facts: the 404 is documented)
    fixed = api.call("patch", SESSION + "/facts/{fact_id}", status, ids=fact, json={"text": "ok"})
    fact = {"fact_id": fixed["id"]} if facts else fact
    api.call("delete", SESSION + "/facts/{fact_id}", 204 if facts else 404, ids=fact)
    assert api.call("post", SESSION + "/search", json={"query": "where does Ada live?"})["results"]
    api.call("post", "/memory/users/{uid}/search", ids={"uid": "user-1"}, json={"query": "Paris"})
    api.call("post", SESSION + "/search", 400, json={"query": "Paris", "limit": 0})
    api.call("delete", SESSION + "/pins/{pin_id}", 204, ids={"pin_id": pin["id"]})
    # Errors answer the envelope, as documented.
    api.call("delete", SESSION + "/pins/{pin_id}", 404, ids={"pin_id": pin["id"]})
    api.call("post", SESSION + "/pins", 400, json={"content": ""})
    api.call("delete", SESSION, 204)
    api.call("get", SESSION, 404)
    api.call("delete", "/memory/users/{uid}", 404, ids={"uid": "user-1"})  # no session left
    export = (FIXTURES / "claude-conversations.json").read_bytes()
    imports = "/memory/users/{uid}/imports"
    api.call("post", imports, ids={"uid": "user-1"}, params={"format": "claude"}, content=export)
    api.call("post", imports, 400, ids={"uid": "user-1"}, params={"format": "x"}, content=export)
    assert api.seen == set(OPERATIONS)
