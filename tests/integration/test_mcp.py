"""The MCP server at /mcp (issue 36), driven end to end by the ``mcp`` client library over
a real socket, a real gateway and a real Redis: a memory found, corrected and erased; the
same bearer keys, tenants and user bindings as the memory API."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import ServerThread
from tests.support.clients import register_content
from tests.support.envelope import assert_envelope
from tests.support.fixtures import USED_KEYS, GatewayFactory

USER = "user-ada"
TOOLS = {
    "search_memory", "list_sessions", "get_session", "add_pin", "edit_pin", "delete_pin",
    "correct_fact", "delete_fact", "erase_session", "erase_user", "preview_context",
}  # fmt: skip
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
# What makes the facts' job run on the conversation (every few messages).
FILLER = [f"filler {i} about the weather" for i in range(4)]
JSON_RPC = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def new_key(prefix: str = "sk-mcp-") -> str:
    key = prefix + secrets.token_urlsafe(24)
    USED_KEYS.append(key)  # the end-of-suite scan looks for it in Redis and in the logs
    return key


def import_messages(gateway: ServerThread, key: str, sid: str, user: str, *texts: str) -> None:
    """The user's ``texts`` (each answered "noted") imported through the memory API, and
    the jobs they made run: the facts are there when this returns."""
    messages: list[dict[str, Any]] = []
    for text in texts:
        messages += [{"role": "user", "content": register_content(text)},
                     {"role": "assistant", "content": "noted"}]  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "X-User-Id": user}
    base = f"{gateway.url}/memory/sessions/{sid}"
    sent = httpx.post(base + "/messages", json={"messages": messages}, headers=headers)
    assert sent.status_code == 200, sent.text
    flushed = httpx.post(base + "/flush", headers=headers, timeout=30)
    assert flushed.json()["pending_jobs"] == 0


class Mcp:
    """One MCP client session on the gateway, as one bearer key."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """A tool's structured result (the call must succeed)."""
        result = await self.session.call_tool(tool, arguments)
        assert not result.is_error, result.content
        assert result.structured_content is not None
        # The text an LLM reads is the same JSON.
        (text,) = result.content
        assert json.loads(text.text) == result.structured_content  # type: ignore[union-attr]
        return result.structured_content

    async def fails(self, tool: str, **arguments: Any) -> str:
        """A tool error's message (the call must fail as a tool error, not a protocol one)."""
        result = await self.session.call_tool(tool, arguments)
        assert result.is_error, result.structured_content
        (text,) = result.content
        return str(text.text)  # type: ignore[union-attr]


@asynccontextmanager
async def mcp_client(gateway: ServerThread, key: str) -> AsyncIterator[Mcp]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(gateway.url + "/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield Mcp(session)


def memory_api(gateway: ServerThread, key: str, path: str) -> httpx.Response:
    return httpx.get(gateway.url + path, headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
def gateway(make_gateway: GatewayFactory) -> ServerThread:
    """A gateway whose preset extracts facts and keeps recall (what the tools show)."""
    return make_gateway(memory={"preset": "hybrid-recall"})


async def test_the_tools_are_listed_with_their_descriptions_and_arguments(
    gateway: ServerThread, api_key: str
) -> None:
    async with mcp_client(gateway, api_key) as mcp:
        tools = {tool.name: tool for tool in (await mcp.session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40, tool.name
        assert "ctx" not in tool.input_schema["properties"]
    search = tools["search_memory"].input_schema
    assert {"query", "user_id", "session_id", "limit"} <= set(search["properties"])
    assert search["required"] == ["query"]
    assert search["properties"]["limit"]["maximum"] == 50
    assert tools["correct_fact"].input_schema["required"] == ["session_id", "fact_id", "text"]
    assert tools["erase_user"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert tools["search_memory"].annotations.read_only_hint is True  # type: ignore[union-attr]


async def test_an_mcp_client_finds_corrects_and_erases_a_memory(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"preset": "hybrid-recall"})
    trip, dentist = f"{session_id}-trip", f"{session_id}-dentist"
    import_messages(
        gateway, api_key, trip, USER, "My seat is 42B on the night train to Vienna.", *FILLER
    )
    import_messages(gateway, api_key, dentist, USER, "My dentist appointment is on the 3rd of May.")
    async with mcp_client(gateway, api_key) as mcp:
        listed = await mcp.call("list_sessions")
        mine = {s["session_id"]: s for s in listed["sessions"]}
        assert {trip, dentist} <= set(mine) and mine[trip]["user_id"] == USER
        assert mine[trip]["last_active"].endswith("Z")

        # Found: with its id, its session, its date and its score.
        found = (await mcp.call("search_memory", user_id=USER, query="which seat?"))["results"]
        fact = next(r for r in found if r["kind"] == "fact")
        assert fact["session_id"] == trip and "42B" in fact["text"]
        assert fact["id"].startswith("fact_") and fact["date"].endswith("Z") and fact["score"] > 0
        assert any(r["kind"] == "excerpt" and "42B" in r["text"] for r in found)

        # Corrected with the id the search gave.
        corrected = await mcp.call(
            "correct_fact", session_id=trip, fact_id=fact["id"], text="My seat is 12C."
        )
        assert corrected["text"] == "My seat is 12C." and corrected["id"] != fact["id"]
        tiers = await mcp.call("get_session", session_id=trip)
        current = [f for f in tiers["facts"] if not f.get("superseded")]
        assert corrected["id"] in [f["id"] for f in current]
        assert not any("42B" in f["text"] for f in current)
        assert {"window", "summaries", "pins", "facts"} <= set(tiers)
        again = (await mcp.call("search_memory", session_id=trip, query="my seat"))["results"]
        facts = [r for r in again if r["kind"] == "fact"]
        assert facts[0]["id"] == corrected["id"] and "12C" in facts[0]["text"]
        # The memory API sees the same.
        api_facts = memory_api(gateway, api_key, f"/memory/sessions/{trip}/facts").json()
        assert corrected["id"] in [f["id"] for f in api_facts["facts"]]

        # Deleted: gone from the session's tiers and from the search.
        assert await mcp.call("delete_fact", session_id=trip, fact_id=corrected["id"]) == {
            "deleted": corrected["id"], "session_id": trip}  # fmt: skip
        tiers = await mcp.call("get_session", session_id=trip)
        assert not any("12C" in f["text"] for f in tiers["facts"])
        after = (await mcp.call("search_memory", user_id=USER, query="my seat"))["results"]
        assert not any(r["kind"] == "fact" and r["session_id"] == trip for r in after)
        gone = await mcp.fails("delete_fact", session_id=trip, fact_id=corrected["id"])
        assert "fact not found" in gone

        # Pins: added, found by the search under the same id, edited, deleted.
        pin = await mcp.call("add_pin", session_id=dentist, content="allergic to kiwi")
        assert pin["id"].startswith("pin_") and pin["date"].endswith("Z")
        hits = await mcp.call("search_memory", session_id=dentist, query="kiwi allergy")
        assert hits["results"][0]["kind"] == "pin" and hits["results"][0]["id"] == pin["id"]
        edited = await mcp.call(
            "edit_pin", session_id=dentist, pin_id=pin["id"], content="allergic to kiwi and mango"
        )
        assert edited["id"] == pin["id"] and edited["content"].endswith("mango")
        tiers = await mcp.call("get_session", session_id=dentist)
        assert [p["content"] for p in tiers["pins"]] == ["allergic to kiwi and mango"]
        await mcp.call("delete_pin", session_id=dentist, pin_id=pin["id"])
        assert (await mcp.call("get_session", session_id=dentist))["pins"] == []
        assert "pin not found" in await mcp.fails(
            "edit_pin", session_id=dentist, pin_id=pin["id"], content="x"
        )

        # The context a turn would forward, recording nothing.
        before = (await mcp.call("get_session", session_id=dentist))["message_count"]
        preview = await mcp.call(
            "preview_context", session_id=dentist, user_message="When is my appointment?"
        )
        assert preview["messages"][-1] == {"role": "user", "content": "When is my appointment?"}
        assert "3rd of May" in json.dumps(preview["messages"]) and "receipt" in preview
        assert (await mcp.call("get_session", session_id=dentist))["message_count"] == before

        # Erased: the session, then the user.
        assert await mcp.call("erase_session", session_id=trip) == {"erased": trip}
        left = (await mcp.call("search_memory", user_id=USER, query="seat train"))["results"]
        assert all(r["session_id"] != trip for r in left)
        assert "not found" in await mcp.fails("search_memory", session_id=trip, query="seat")
        assert memory_api(gateway, api_key, f"/memory/sessions/{trip}").status_code == 404
        assert await mcp.call("erase_user", user_id=USER) == {"erased_user": USER}
        assert memory_api(gateway, api_key, f"/memory/sessions/{dentist}").status_code == 404
        assert memory_api(gateway, api_key, f"/memory/users/{USER}").status_code == 404
        assert "not found" in await mcp.fails("erase_user", user_id=USER)


async def test_another_tenant_finds_nothing_and_erases_nothing(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"preset": "hybrid-recall"})
    import_messages(gateway, api_key, session_id, USER, "My seat is 42B on the train.", *FILLER)
    facts = memory_api(gateway, api_key, f"/memory/sessions/{session_id}/facts").json()["facts"]
    fact_id = facts[0]["id"]
    async with mcp_client(gateway, new_key()) as other:
        for tool, arguments in [
            ("get_session", {"session_id": session_id}),
            ("search_memory", {"session_id": session_id, "query": "seat"}),
            ("search_memory", {"user_id": USER, "query": "seat"}),
            ("correct_fact", {"session_id": session_id, "fact_id": fact_id, "text": "x y"}),
            ("delete_fact", {"session_id": session_id, "fact_id": fact_id}),
            ("add_pin", {"session_id": session_id, "content": "planted"}),
            ("preview_context", {"session_id": session_id, "user_message": "hi"}),
            ("erase_session", {"session_id": session_id}),
            ("erase_user", {"user_id": USER}),
        ]:
            assert "not found" in await other.fails(tool, **arguments), tool
        assert (await other.call("list_sessions"))["sessions"] == []
    # The first tenant's memory is as it was.
    async with mcp_client(gateway, api_key) as mcp:
        tiers = await mcp.call("get_session", session_id=session_id)
        assert fact_id in [f["id"] for f in tiers["facts"]] and tiers["pins"] == []


async def test_a_key_bound_to_users_touches_no_other_user(
    make_gateway: GatewayFactory, session_id: str
) -> None:
    alice, operator = new_key("mg-alice-"), new_key("mg-ops-")
    gateway = make_gateway(
        upstream={"api_key": "sk-upstream-operator", "passthrough": None},
        memory={"preset": "hybrid-recall"},
        auth={"mode": "keys", "keys": [
            {"key": alice, "tenant": "team-a", "users": ["alice"]},
            {"key": operator, "tenant": "team-a"},
        ]},
    )  # fmt: skip
    bobs, alices = f"{session_id}-bob", f"{session_id}-alice"
    import_messages(gateway, operator, bobs, "bob", "My seat is 42B on the train.", *FILLER)
    import_messages(gateway, operator, alices, "alice", "My seat is 7A on the plane.", *FILLER)
    async with mcp_client(gateway, alice) as mcp:
        listed = [s["session_id"] for s in (await mcp.call("list_sessions"))["sessions"]]
        assert listed == [alices]
        for tool, arguments in [
            ("get_session", {"session_id": bobs}),
            ("search_memory", {"session_id": bobs, "query": "seat"}),
            ("add_pin", {"session_id": bobs, "content": "planted"}),
            ("erase_session", {"session_id": bobs}),
        ]:
            assert "not found" in await mcp.fails(tool, **arguments), tool
        for tool, arguments in [
            ("search_memory", {"user_id": "bob", "query": "seat"}),
            ("erase_user", {"user_id": "bob"}),
        ]:
            assert "may not act for user 'bob'" in await mcp.fails(tool, **arguments), tool
        found = (await mcp.call("search_memory", user_id="alice", query="my seat"))["results"]
        assert found and {r["session_id"] for r in found} == {alices}
    assert memory_api(gateway, operator, f"/memory/sessions/{bobs}").status_code == 200


async def test_tool_errors_are_tool_results_never_a_server_error(
    gateway: ServerThread, api_key: str, session_id: str
) -> None:
    async with mcp_client(gateway, api_key) as mcp:
        assert "must not contain '/'" in await mcp.fails("get_session", session_id="a/b")
        assert "less than or equal to 50" in await mcp.fails(
            "search_memory", user_id=USER, query="x", limit=500
        )
        assert "exactly one of user_id or session_id" in await mcp.fails("search_memory", query="x")
        assert "not found" in await mcp.fails("get_session", session_id=session_id)
        assert "Unknown tool" in await mcp.fails("forget_everything")
        assert "user_message or messages" in await mcp.fails(
            "preview_context", session_id=session_id
        )


def test_no_key_a_refused_key_and_a_foreign_origin_are_refused_before_mcp(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str
) -> None:
    gateway = make_gateway(
        server={"max_body_bytes": 4096, "cors": {"allow_origins": ["https://app.example"]}}
    )
    url = gateway.url + "/mcp"
    refused = new_key()
    fake_upstream.rejected_keys.add(refused)
    for headers in [{}, {"Authorization": f"Bearer {refused}"}]:
        reply = httpx.post(url, json=INITIALIZE, headers={**JSON_RPC, **headers})
        assert reply.status_code == 401, reply.text
        assert_envelope(reply.json())
        assert reply.headers["www-authenticate"] == "Bearer"
    key = {**JSON_RPC, "Authorization": f"Bearer {api_key}"}
    # A browser page's request (DNS rebinding): refused unless server.cors names its origin.
    foreign = httpx.post(url, json=INITIALIZE, headers={**key, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
    named = httpx.post(url, json=INITIALIZE, headers={**key, "Origin": "https://app.example"})
    assert named.status_code == 200, named.text
    # The gateway's own body limit, in its own envelope.
    big = {**INITIALIZE, "params": {**INITIALIZE["params"], "pad": "x" * 5000}}
    too_large = httpx.post(url, json=big, headers=key)
    assert too_large.status_code == 413
    assert_envelope(too_large.json())
    # Stateless: no stream to GET; what is not JSON-RPC is the SDK's 400, never a 500.
    assert httpx.get(url, headers=key).status_code == 405
    assert httpx.post(url, content=b"{not json", headers=key).status_code == 400
    answered = httpx.post(url, json=INITIALIZE, headers=key)
    assert answered.status_code == 200, answered.text
    assert answered.json()["result"]["serverInfo"]["name"] == "memory-gateway"


def test_a_gateway_with_mcp_off_has_no_mcp_route(
    make_gateway: GatewayFactory, api_key: str
) -> None:
    gateway = make_gateway(server={"mcp": False})
    headers = {**JSON_RPC, "Authorization": f"Bearer {api_key}"}
    assert httpx.post(gateway.url + "/mcp", json=INITIALIZE, headers=headers).status_code == 404
