"""The inspector at /ui, end to end in headless Chromium (Debian's, driven by Playwright):
a seeded session's tiers and numbers as the page shows them against the memory API, a
pin added through the page reaching the next forwarded context, and every action.
Screenshots go to ``test-artifacts/`` (``TEST_ARTIFACTS_DIR``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from devsupport.fake_upstream import FakeUpstream
from devsupport.servers import RedisProcess, ServerThread
from gateway.auth.identity import tenant_id
from gateway.config import ConfigError, parse_settings
from gateway.store.keys import TENANT_SECRET_KEY
from tests.support.clients import Memory, register_content, say, sdk
from tests.support.fixtures import GatewayFactory

ADMIN_KEY = "admin-" + "k" * 24
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", Path(__file__).parents[2] / "test-artifacts"))


def chromium_path() -> str:
    """Debian's chromium (scripts/test installs it); a missing browser fails, not skips."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(path).exists(), "no chromium: apt-get install chromium (scripts/test does)"
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    yield context.new_page()
    context.close()


@pytest.fixture
def inspected(make_gateway: GatewayFactory) -> ServerThread:
    return make_gateway(memory={"preset": "hybrid-recall"},
                        ui={"enabled": True, "admin_key": ADMIN_KEY})  # fmt: skip


CONVERSATION = [
    "Hi! My dog is called Biscuit and she is a beagle.",
    "I'm planning a trip to Lisbon in March.",
    "My budget for the hotel is 120 euros a night.",
    "I prefer window seats on flights.",
    "Can you suggest neighbourhoods to stay in?",
    "I don't eat meat, by the way.",
    "What's the weather like there in spring?",
    "My sister Ana will join me for the weekend.",
    "Which museums open on Mondays?",
    "Remind me to book the airport transfer.",
    "How long is the train to Sintra?",
    "Is the Lisboa Card worth it?",
]


def tenant_of(redis_server: RedisProcess, key: str) -> str:
    client = redis_server.client()
    try:
        return tenant_id(client.get(TENANT_SECRET_KEY), key)
    finally:
        client.close()


def log_in(page: Page, gateway: ServerThread) -> None:
    page.goto(gateway.url + "/ui")
    expect(page).to_have_url(f"{gateway.url}/ui/login?next=%2Fui")
    page.fill("input[name=key]", ADMIN_KEY)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Tenants")


def texts(page: Page, selector: str, attribute: str) -> list[str]:
    return [page.locator(selector).nth(i).get_attribute(attribute) or ""
            for i in range(page.locator(selector).count())]  # fmt: skip


def test_a_seeded_session_as_the_page_shows_it_and_a_pin_added_through_it(
    inspected: ServerThread,
    page: Page,
    fake_upstream: FakeUpstream,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    client = sdk(inspected, api_key, session_id)
    for line in CONVERSATION:
        say(client, line)
    memory = Memory(inspected, api_key, session_id)
    memory.flush()
    say(client, "What was the name of my dog again?")  # recalls message 1
    memory.flush()  # the jobs this turn made due run now, not while the page is read
    state = memory.state()
    receipts = memory.http.get(memory.base + "/receipts").json()["receipts"]
    tenant = tenant_of(redis_server, api_key)

    log_in(page, inspected)
    page.click(f"a[href='/ui/sessions?tenant={tenant}']")
    row = page.locator("#sessions tr", has_text=session_id)
    expect(row.locator("td").nth(2)).to_have_text(str(state["message_count"]))
    row.locator("a").click()

    expect(page.locator("#message-count")).to_have_text(str(state["message_count"]))
    assert texts(page, "#tier-window li[data-index]", "data-index") == [
        str(m["index"]) for m in state["window"]
    ]
    ranges = texts(page, "#tier-summaries li[data-range]", "data-range")
    assert ranges == [f"{s['range']['start']}-{s['range']['end']}" for s in state["summaries"]]
    assert ranges and len(state["facts"]) == page.locator("#tier-facts li.fact").count() > 0
    last = receipts[0]["receipt"]
    assert "1" in last["recalled"]  # the dog's name, outside the window
    assert texts(page, "#tier-recall li[data-recalled]", "data-recalled") == last["recalled"]
    expect(page.locator("#tier-recall li[data-recalled='1']")).to_contain_text("Biscuit")
    expect(page.locator("#total-tokens")).to_have_text(str(last["total_tokens"]))
    expect(page.locator("#budget-tokens")).to_have_text(str(last["budget_tokens"]))
    expect(page.locator("#client-tokens")).to_have_text(str(receipts[0]["client_tokens"]))
    shown = {t: page.locator(f".legend [data-tier='{t}'] b").inner_text() for t in last["tiers"]
             if last["tiers"][t] and t != "memory"}  # fmt: skip
    assert shown == {t: str(n) for t, n in last["tiers"].items() if n and t != "memory"}
    memory_parts = page.locator(".legend [data-tier^='memory'] b").all_inner_texts()
    assert sum(int(n) for n in memory_parts) == last["tiers"]["memory"]
    sent = {f"{r['start']}-{r['end']}" for r in last["summaries"]}
    assert set(texts(page, "#tier-summaries li:has(.tag.sent)", "data-range")) == sent
    expect(page.locator("#receipts tbody tr")).to_have_count(len(receipts))

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inspector-recall.png"), full_page=True)

    pin = "The user's locker code is 4417"
    page.fill("#add-pin textarea[name=content]", pin)
    page.fill("#add-pin input[name=importance]", "0.95")
    page.click("#add-pin button[type=submit]")
    expect(page.locator("#flash")).to_contain_text("pinned pin_")
    expect(page.locator("#tier-pins .pin-content")).to_have_text([pin])

    say(client, "remind me of my locker code")
    assert f'- pinned: "{pin}"' in fake_upstream.last_messages()[0]["content"]
    page.reload()
    expect(page.locator("#tier-pins li[data-pin] .tag.sent")).to_have_count(1)
    page.screenshot(path=str(ARTIFACTS / "inspector-pinned.png"), full_page=True)
    page.goto(f"{inspected.url}/ui/sessions?tenant={tenant}")
    page.screenshot(path=str(ARTIFACTS / "inspector-sessions.png"))


def test_pins_edited_deleted_session_ended_exported_and_erased_through_the_page(
    inspected: ServerThread, page: Page, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    memory = Memory(inspected, api_key, session_id)
    memory.add(4)
    memory.http.post(memory.base + "/pins", json={"content": "likes tea", "importance": 0.5})
    tenant = tenant_of(redis_server, api_key)
    log_in(page, inspected)
    page.goto(f"{inspected.url}/ui/session?tenant={tenant}&id={quote(session_id)}")
    expect(page.locator("#no-receipt")).to_be_visible()  # imports leave no receipt

    edit = page.locator("#tier-pins form[action='/ui/session/pins/edit']")
    edit.locator("input[name=content]").fill("likes green tea")
    edit.locator("button").click()
    expect(page.locator("#flash")).to_contain_text("edited")
    assert [p["content"] for p in memory.http.get(memory.base + "/pins").json()["pins"]] == [
        "likes green tea"
    ]
    page.locator("#tier-pins form[action='/ui/session/pins/delete'] button").click()
    expect(page.locator("#flash")).to_contain_text("deleted")
    assert memory.http.get(memory.base + "/pins").json()["pins"] == []

    page.click("#end-session")
    expect(page.locator("#flash")).to_contain_text("session ended")
    assert memory.state()["ended"] is True

    with page.expect_download() as download:
        page.click("text=Export JSON")
    exported: Any = Path(download.value.path()).read_text()
    assert f'"session_id": "{session_id}"' in exported

    page.click("#erase")
    page.fill("input[name=confirm]", "not-the-id")
    page.click("button.danger")
    expect(page.locator("#mismatch")).to_be_visible()
    assert memory.http.get(memory.base).status_code == 200  # nothing erased
    page.fill("input[name=confirm]", session_id)
    page.click("button.danger")
    expect(page.locator("#flash")).to_have_text(f"erased session {session_id}")
    assert memory.http.get(memory.base).status_code == 404


def seed_facts(memory: Memory) -> list[dict[str, Any]]:
    """Import a user's lines (each answered "noted"), run the jobs; the facts they made."""
    lines = ["My seat is 42B on the night train.", "I live in Lyon.",
             *[f"filler {i} about the weather" for i in range(6)]]  # fmt: skip
    messages = [{"role": role, "content": register_content(line if role == "user" else "noted")}
                for line in lines for role in ("user", "assistant")]  # fmt: skip
    assert (
        memory.http.post(memory.base + "/messages", json={"messages": messages}).status_code == 200
    )
    memory.flush()
    return facts_of(memory)


def facts_of(memory: Memory) -> list[dict[str, Any]]:
    reply = memory.http.get(memory.base + "/facts")
    assert reply.status_code == 200, reply.text
    return list(reply.json()["facts"])


def test_facts_corrected_and_deleted_through_the_page(
    inspected: ServerThread, page: Page, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    memory = Memory(inspected, api_key, session_id)
    seat = next(f for f in seed_facts(memory) if f["key"] == "seat")
    log_in(page, inspected)
    page.goto(f"{inspected.url}/ui/session?tenant={tenant_of(redis_server, api_key)}"
              f"&id={quote(session_id)}")  # fmt: skip
    shown = page.locator(f"#tier-facts li[data-fact='{seat['id']}']")
    expect(shown.locator("code")).to_have_text(seat["id"])

    edit = shown.locator("form[action='/ui/session/facts/edit']")
    edit.locator("input[name=text]").fill("My seat is 17C.")
    edit.locator("button").click()
    expect(page.locator("#flash")).to_contain_text(f"corrected {seat['id']}")
    listed = {f["id"]: f for f in facts_of(memory)}
    assert listed[seat["id"]]["superseded"] is True
    (new,) = [f for f in listed.values() if f.get("corrected")]
    assert new["text"] == "My seat is 17C." and not new.get("superseded")
    # The old fact stays on the page, tagged, with nothing left to change on it.
    expect(shown.locator(".tag.unsent")).to_have_text("superseded")
    expect(shown.locator("form")).to_have_count(0)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#tier-facts").screenshot(path=str(ARTIFACTS / "inspector-facts.png"))

    deleting = f"#tier-facts li[data-fact='{new['id']}'] form[action='/ui/session/facts/delete']"
    page.locator(deleting + " button").click()
    expect(page.locator("#flash")).to_contain_text(f"deleted {new['id']}")
    assert new["id"] not in {f["id"] for f in facts_of(memory)}
    expect(page.locator(f"#tier-facts li[data-fact='{new['id']}']")).to_have_count(0)


def test_the_fact_forms_refuse_other_sites_unknown_or_superseded_facts_and_bad_text(
    inspected: ServerThread, redis_server: RedisProcess, api_key: str, session_id: str
) -> None:
    memory = Memory(inspected, api_key, session_id)
    before = seed_facts(memory)
    seat = next(f for f in before if f["key"] == "seat")
    session = {"tenant": tenant_of(redis_server, api_key), "id": session_id}
    edit = {**session, "fact": seat["id"], "text": "My seat is 17C."}
    with httpx.Client(base_url=inspected.url, headers={"Origin": inspected.url}) as http:
        assert http.post("/ui/login", data={"key": ADMIN_KEY, "next": "/ui"}).status_code == 303
        # Another site's form, or one hiding where it comes from, changes nothing.
        cookies = dict(http.cookies)
        for origin in ({"Origin": "https://evil.example"}, {}):
            with httpx.Client(base_url=inspected.url, headers=origin, cookies=cookies) as other:
                assert other.post("/ui/session/facts/edit", data=edit).status_code == 403
                deleted = other.post(
                    "/ui/session/facts/delete", data={**session, "fact": seat["id"]}
                )
                assert deleted.status_code == 403
        assert facts_of(memory) == before

        def refused(path: str, data: dict[str, str], status: int, says: str) -> None:
            reply = http.post(path, data=data)
            assert reply.status_code == status and says in reply.text, reply.text
            assert reply.headers["content-type"].startswith("text/html")

        refused("/ui/session/facts/edit", {**edit, "fact": "fact_nope"}, 404, "fact not found")
        refused("/ui/session/facts/delete", {**session, "fact": "fact_nope"}, 404, "fact not found")
        refused("/ui/session/facts/edit", {**edit, "text": "  "}, 400, "text")
        refused("/ui/session/facts/edit", {**edit, "text": "x" * 241}, 400, "240")
        assert facts_of(memory) == before
        # At the limit the API takes, the page takes it too.
        assert (
            http.post("/ui/session/facts/edit", data={**edit, "text": "x" * 240}).status_code == 303
        )
        refused("/ui/session/facts/edit", edit, 400, "superseded")  # history, not current


GATEWAY_KEY = "gw-key-alice-0123456789"


def test_tenants_go_by_their_names_and_the_last_requests_message_was_sent(
    make_gateway: GatewayFactory,
    page: Page,
    redis_server: RedisProcess,
    api_key: str,
    session_id: str,
) -> None:
    """Issue 34: tenants were listed as bare hashes, and the newest user message was tagged
    "not sent last time" (it had no index when its request was assembled)."""
    keys = [{"key": GATEWAY_KEY, "tenant": "team-inspected", "name": "alice laptop"}]
    keyed = make_gateway(
        auth={"mode": "keys", "keys": keys}, ui={"enabled": True, "admin_key": ADMIN_KEY}
    )
    client = sdk(keyed, GATEWAY_KEY, session_id)
    for line in CONVERSATION[:3]:
        say(client, line)

    log_in(page, keyed)
    row = page.locator("#tenants tr[data-tenant]", has_text="team-inspected")
    expect(row.locator("td").nth(0)).to_have_text("team-inspected")
    expect(row.locator("td").nth(1)).to_have_text("alice laptop")
    assert GATEWAY_KEY not in page.content()  # names, never the key
    row.locator("a").click()
    expect(page.locator("h1")).to_have_text("Sessions of team-inspected")
    page.locator("#sessions a", has_text=session_id).click()
    window = "#tier-window li[data-index]"
    tags = page.locator(f"{window} .tag.sent, {window} .tag.unsent")
    assert tags.all_inner_texts() == [
        "sent", "sent", "sent", "sent", "sent: new in the last request",
        "the last request's answer",
    ]  # fmt: skip

    # A client's own key (forward mode): its hash's first digits, never the key.
    forward = make_gateway(ui={"enabled": True, "admin_key": ADMIN_KEY})
    say(sdk(forward, api_key, session_id), "hello")
    tenant = tenant_of(redis_server, api_key)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    listed = httpx.get(forward.url + "/ui", headers=admin).text
    assert f'<a href="/ui/sessions?tenant={tenant}">client key {tenant[:12]}…</a>' in listed
    assert api_key not in listed


def test_the_inspector_is_off_unless_enabled_and_needs_the_admin_key(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    off = make_gateway()
    with httpx.Client(base_url=off.url) as http:
        assert http.get("/ui").status_code == 404
    on = make_gateway(ui={"enabled": True, "admin_key": ADMIN_KEY})
    Memory(on, api_key, session_id).add(2)
    # As a browser's forms say where they come from.
    here = {"Origin": on.url}
    with httpx.Client(base_url=on.url, headers=here) as http:
        first = http.get("/ui")
        assert first.status_code == 303 and first.headers["location"].startswith("/ui/login")
        # A tenant's API key is not the admin key.
        assert http.get("/ui", headers={"Authorization": f"Bearer {api_key}"}).status_code == 303
        wrong = http.post("/ui/login", data={"key": api_key, "next": "/ui"})
        assert wrong.status_code == 401 and "not the admin key" in wrong.text
        denied = http.post("/ui/session/end", data={"tenant": "0" * 32, "id": session_id})
        assert denied.status_code == 401
        # An open redirect is not: "next" stays under /ui.
        ok = http.post("/ui/login", data={"key": ADMIN_KEY, "next": "//evil.example/"})
        assert ok.status_code == 303 and ok.headers["location"] == "/ui"
        cookie = ok.headers["set-cookie"]
        assert ADMIN_KEY not in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert http.get("/ui").status_code == 200  # the cookie is kept by the client
        cross = http.post(
            "/ui/session/end",
            data={"tenant": "0" * 32, "id": session_id},
            headers={"Origin": "https://evil.example"},
        )
        assert cross.status_code == 403
        bad = http.get("/ui/sessions", params={"tenant": "../etc"})
        assert bad.status_code == 400 and "tenant" in bad.text
        missing = http.get("/ui/session", params={"tenant": "0" * 32, "id": session_id})
        assert missing.status_code == 404
        logged_out = http.post("/ui/logout")
        assert logged_out.status_code == 303
        assert http.get("/ui").status_code == 303
    bearer = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=on.url, headers=bearer) as http:
        assert http.get("/ui").status_code == 200


def test_inspector_logins_are_random_expire_end_server_side_and_are_rate_limited(
    make_gateway: GatewayFactory, redis_server: RedisProcess
) -> None:
    with redis_server.client() as client:  # earlier tests' failed logins, from this address
        for key in client.scan_iter("mg:{ui}:login:*"):
            client.delete(key)
    form = {"key": ADMIN_KEY, "next": "/ui"}
    ui = {"enabled": True, "admin_key": ADMIN_KEY, "secure_cookies": True}
    tls = make_gateway(ui=ui)  # as behind a proxy that ends TLS
    secure = httpx.post(tls.url + "/ui/login", data=form, headers={"Origin": tls.url})
    assert "Secure" in secure.headers["set-cookie"]
    gateway = make_gateway(ui={"enabled": True, "admin_key": ADMIN_KEY, "login_attempts": 3})
    here = {"Origin": gateway.url}
    with (
        httpx.Client(base_url=gateway.url, headers=here) as first,
        httpx.Client(base_url=gateway.url, headers=here) as second,
    ):
        a = first.post("/ui/login", data=form).headers["set-cookie"]
        b = second.post("/ui/login", data=form).headers["set-cookie"]
        assert a.split(";")[0] != b.split(";")[0]  # a new random token per login
        assert "Max-Age=28800" in a and "Secure" not in a  # plain http here
        page = first.get("/ui")
        assert page.status_code == 200
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert "script-src" not in page.headers["content-security-policy"]  # none at all
        stolen = dict(first.cookies)
        assert first.post("/ui/logout").status_code == 303
        with httpx.Client(base_url=gateway.url, cookies=stolen) as replay:
            assert replay.get("/ui").status_code == 303  # gone on the server too
        assert second.get("/ui").status_code == 200  # the other login lives on
        # Logging out, like every form, needs the request to say it comes from here.
        no_origin = httpx.post(gateway.url + "/ui/logout", cookies=dict(second.cookies))
        assert no_origin.status_code == 403
        assert second.get("/ui").status_code == 200
    # Login attempts: a form without an Origin is refused; failures are limited.
    assert httpx.post(gateway.url + "/ui/login", data=form).status_code == 403
    with httpx.Client(base_url=gateway.url, headers=here) as guesser:
        for _ in range(3):
            assert guesser.post("/ui/login", data={"key": "wrong-" * 4}).status_code == 401
        assert guesser.post("/ui/login", data={"key": "wrong-" * 4}).status_code == 429
        assert guesser.post("/ui/login", data=form).status_code == 303  # never the right key


def test_enabling_the_inspector_needs_a_long_enough_admin_key() -> None:
    with pytest.raises(ConfigError, match=r"ui\.admin_key"):
        parse_settings({"ui": {"enabled": True}}, environ={})
    with pytest.raises(ConfigError, match=r"ui\.admin_key"):
        parse_settings({"ui": {"enabled": True, "admin_key": "short"}}, environ={})
    assert parse_settings({"ui": {"enabled": False}}, environ={}).ui.admin_key is None
