"""A user's memory at once through the memory API (issue 34): their profile and facts,
a search over their memories, and facts corrected and deleted one by one — over real
sockets and a real Redis."""

from __future__ import annotations

from typing import Any

import httpx

from devsupport.servers import ServerThread
from tests.support.clients import register_content
from tests.support.fixtures import GatewayFactory, on_one_redis_and_a_cluster

# Every read of several sessions (a user's) runs on a cluster too, where they sit on
# different slots.
redis_server = on_one_redis_and_a_cluster()

USER = "user-ada"


class Api:
    """The memory API as one tenant (one bearer key) uses it."""

    def __init__(self, gateway: ServerThread, key: str) -> None:
        self.http = httpx.Client(
            base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def add(self, sid: str, *texts: str, user: str = USER) -> None:
        """Import the user's ``texts``, each answered "noted", and run the jobs they made."""
        messages: list[dict[str, Any]] = []
        for text in texts:
            messages.append({"role": "user", "content": register_content(text)})
            messages.append({"role": "assistant", "content": "noted"})
        path = f"/memory/sessions/{sid}"
        sent = self.http.post(path + "/messages", json={"messages": messages},
                              headers={"X-User-Id": user})  # fmt: skip
        assert sent.status_code == 200, sent.text
        assert self.http.post(path + "/flush").json()["pending_jobs"] == 0

    def facts(self, sid: str) -> list[dict[str, Any]]:
        reply = self.http.get(f"/memory/sessions/{sid}/facts")
        assert reply.status_code == 200, reply.text
        return list(reply.json()["facts"])

    def current(self, sid: str, word: str) -> dict[str, Any]:
        (found,) = [f for f in self.facts(sid) if word in f["text"] and not f.get("superseded")]
        return found

    def user(self, uid: str = USER) -> httpx.Response:
        return self.http.get(f"/memory/users/{uid}")

    def search(self, path: str, query: str, **more: Any) -> httpx.Response:
        return self.http.post(path + "/search", json={"query": query, **more})


def error(reply: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    """The OpenAI envelope of an error answer."""
    assert reply.status_code == status, reply.text
    detail = dict(reply.json()["error"])
    assert set(detail) == {"message", "type", "param", "code"}
    if param is not None:
        assert detail["param"] == param
    return detail


def test_a_users_search_past_its_session_bound_reads_the_last_active_sessions(
    make_gateway: GatewayFactory, api_key: str, session_id: str, monkeypatch: Any
) -> None:
    # The user's index is a set: its order (by id) once chose which sessions were read.
    monkeypatch.setattr("gateway.routes.memory_api.MOST_SESSIONS", 2)
    api = Api(make_gateway(memory={"preset": "hybrid-recall"}), api_key)
    newest = f"z-{session_id}"  # last by id, last in time
    for sid, text in ((f"a-{session_id}", "My seat was 11A last year."),
                      (f"m-{session_id}", "I take the night train to Vienna."),
                      (newest, "My seat is 42B now.")):  # fmt: skip
        api.add(sid, text)
    found = api.search(f"/memory/users/{USER}", "my seat").json()["results"]
    assert {r["session_id"] for r in found} <= {newest, f"m-{session_id}"}
    assert any("42B" in r["text"] for r in found)
    assert not any("11A" in r["text"] for r in found)
    api.http.close()


def test_a_users_profile_facts_and_memories_are_found_at_once(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    api = Api(make_gateway(memory={"preset": "hybrid-recall"}), api_key)
    first, second = f"{session_id}-a", f"{session_id}-b"
    api.add(first, "My seat is 42B on the night train to Vienna.", "I live in Lyon.",
            *[f"filler {i} about the weather" for i in range(6)])  # fmt: skip
    assert api.http.post(f"/memory/sessions/{first}/end").status_code == 200
    api.add(second, "My dentist appointment is on the 3rd of March.",
            *[f"more filler {i} about lunch" for i in range(6)])  # fmt: skip
    pin = api.http.post(f"/memory/sessions/{second}/pins", json={"content": "allergic to kiwi"})
    assert pin.status_code == 201

    user = api.user().json()
    assert user["sessions"] == [first, second]
    profile = user["profile"]  # what the ended session left the user
    assert any("42B" in fact for fact in profile["facts"]) and isinstance(profile["summary"], str)
    by_session = {(f["session_id"], f["key"]) for f in user["facts"]}
    assert {(first, "seat"), (second, "dentist appointment")} <= by_session
    seat = next(f for f in user["facts"] if f["key"] == "seat")
    assert seat["id"].startswith("fact_") and seat["ts"] > 0 and seat["date"].endswith("Z")

    # The user's search reads every session of theirs; each kind says where it came from.
    found = api.search(f"/memory/users/{USER}", "which seat do I have on the train?").json()
    results = found["results"]
    assert results and all(set(r) == {"kind", "session_id", "id", "text", "ts", "date", "score"}
                           for r in results)  # fmt: skip
    assert results == sorted(results, key=lambda r: -r["score"])
    fact = next(r for r in results if r["kind"] == "fact")
    assert (fact["session_id"], fact["id"]) == (first, seat["id"]) and "42B" in fact["text"]
    excerpt = next(r for r in results if r["kind"] == "excerpt")
    assert excerpt["session_id"] == first and "42B" in excerpt["text"]
    assert isinstance(excerpt["id"], int) and excerpt["id"] >= 1
    pins = api.search(f"/memory/users/{USER}", "kiwi allergy", limit=3).json()["results"]
    assert len(pins) <= 3 and pins[0]["kind"] == "pin" and pins[0]["id"] == pin.json()["id"]

    # A session's search stays in the session.
    mine = api.search(f"/memory/sessions/{second}", "which seat on the train?").json()["results"]
    assert all(r["session_id"] == second for r in mine)
    assert not any("42B" in r["text"] for r in mine)
    api.http.close()


def test_a_corrected_fact_wins_and_a_deleted_fact_is_gone(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    api = Api(make_gateway(memory={"preset": "hybrid-recall"}), api_key)
    path = f"/memory/sessions/{session_id}"
    api.add(session_id, "My seat is 42B on the night train.", "I live in Lyon.",
            *[f"filler {i} about the weather" for i in range(6)])  # fmt: skip
    assert api.http.post(path + "/end").status_code == 200
    old = api.current(session_id, "42B")

    corrected = api.http.patch(f"{path}/facts/{old['id']}", json={"text": "My seat is 17C."})
    assert corrected.status_code == 200, corrected.text
    new = corrected.json()
    assert new["corrected"] is True and new["key"] == "seat" and new["id"] != old["id"]
    listed = {f["id"]: f for f in api.facts(session_id)}
    assert listed[old["id"]]["superseded"] is True and not listed[new["id"]].get("superseded")
    # The old fact is history: no second correction of it.
    again = api.http.patch(f"{path}/facts/{old['id']}", json={"text": "My seat is 1A."})
    assert error(again, 400, "fact_id")["code"] == "fact_superseded"

    # The correction wins: in the memory block, in the user's profile, and over the old
    # wording found again in the messages.
    api.add(session_id, "My seat is 42B on the night train.")
    assert api.current(session_id, "seat")["id"] == new["id"]
    probe = {"model": "fake-model", "messages": [{"role": "user", "content": "what is my seat?"}]}
    block = api.http.post(path + "/context", json=probe).json()["messages"][0]["content"]
    facts = block.split("## Key facts")[1].split("\n## ")[0]
    assert "My seat is 17C." in facts and "42B" not in facts
    profile = api.user().json()["profile"]["facts"]
    assert "My seat is 17C." in profile and not any("42B" in fact for fact in profile)

    gone = api.current(session_id, "filler 0")
    assert api.http.delete(f"{path}/facts/{gone['id']}").status_code == 204
    assert not any("filler 0" in f["text"] for f in api.facts(session_id))
    assert not any("filler 0" in fact for fact in api.user().json()["profile"]["facts"])
    error(api.http.delete(f"{path}/facts/{gone['id']}"), 404, "fact_id")
    api.http.close()


def test_another_tenants_user_and_bad_input_answer_the_envelope(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    gateway = make_gateway(memory={"preset": "hybrid-recall"})
    owner, stranger = Api(gateway, api_key), Api(gateway, api_key + "-other")
    fillers = [f"filler {i} about the weather" for i in range(6)]
    owner.add(session_id, "My seat is 42B.", *fillers, user="user-owned")
    fact = owner.current(session_id, "42B")
    path = f"/memory/sessions/{session_id}"
    # Another tenant's user or session is not there, as one that does not exist.
    for uid in ("user-owned", "user-nobody"):
        assert error(stranger.user(uid), 404)["type"] == "not_found"
        error(stranger.search(f"/memory/users/{uid}", "seat"), 404)
    for sid in (session_id, session_id + "-missing"):
        other = f"/memory/sessions/{sid}"
        error(stranger.http.get(other + "/facts"), 404)
        error(stranger.search(other, "seat"), 404)
        patched = stranger.http.patch(f"{other}/facts/{fact['id']}", json={"text": "x"})
        error(patched, 404)
        error(stranger.http.delete(f"{other}/facts/{fact['id']}"), 404)
    assert owner.current(session_id, "42B") == fact  # untouched
    # Bad input: 400 in OpenAI's envelope, naming the field.
    error(owner.search(path, ""), 400, "query")
    error(owner.search(path, "seat", limit=51), 400, "limit")
    error(owner.search(path, "seat", limit="3"), 400, "limit")
    error(owner.http.post(path + "/search", json={"query": "seat", "extra": 1}), 400)
    error(owner.http.patch(f"{path}/facts/{fact['id']}", json={"text": ""}), 400, "text")
    error(owner.http.patch(f"{path}/facts/{fact['id']}", json={"text": "x" * 241}), 400, "text")
    error(owner.http.patch(f"{path}/facts/fact_nope", json={"text": "ok"}), 404, "fact_id")
    error(owner.http.get("/memory/users/bad%00id"), 400)
    owner.http.close()
    stranger.http.close()


def test_a_key_limited_to_its_users_reaches_only_their_memory(
    make_gateway: GatewayFactory, session_id: str
) -> None:
    keys = [
        {"key": "gw-key-alice-0123456789", "tenant": "team-a", "users": ["alice"]},
        {"key": "gw-key-bob-01234567890", "tenant": "team-a", "users": ["bob"]},
    ]
    gateway = make_gateway(
        memory={"preset": "hybrid-recall"},
        upstream={"api_key": "sk-operator-upstream-key", "passthrough": None},
        auth={"mode": "keys", "keys": keys},
    )
    alice, bob = Api(gateway, keys[0]["key"]), Api(gateway, keys[1]["key"])
    alice.http.headers["X-User-Id"] = "alice"
    bob.http.headers["X-User-Id"] = "bob"
    alice.add(session_id, "My seat is 42B.", *[f"filler {i}" for i in range(6)], user="alice")
    fact = alice.current(session_id, "42B")
    assert alice.user("alice").json()["facts"][0]["session_id"] == session_id
    # Bob's key may not name alice (403, as the other user routes), nor reach her session.
    assert error(bob.user("alice"), 403)["code"] == "user_not_allowed"
    error(bob.search("/memory/users/alice", "seat"), 403)
    path = f"/memory/sessions/{session_id}"
    error(bob.http.get(path + "/facts"), 404)
    error(bob.search(path, "seat"), 404)
    error(bob.http.delete(f"{path}/facts/{fact['id']}"), 404)
    assert alice.current(session_id, "42B") == fact
    alice.http.close()
    bob.http.close()
