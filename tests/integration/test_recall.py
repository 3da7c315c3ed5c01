"""Remembering what matters: recall from the archive, durable facts, cross-session memory."""

from __future__ import annotations

import datetime
import random
from typing import Any

import httpx
import pytest

from devsupport.fake_upstream import FakeUpstream
from tests.support.clients import Memory, import_all, say, sdk
from tests.support.clock import SteppedClock
from tests.support.fixtures import GatewayFactory
from tests.support.waiting import wait_for

FILLER = [
    "Could you suggest a good way to structure the weekly planning meeting?",
    "Let us go over the budget spreadsheet again and tidy the categories.",
    "I was reading about sourdough starters and hydration levels yesterday.",
    "What do you think about moving the standup to the afternoon slot?",
    "The garden needs watering twice a week when the weather is warm.",
    "Can you remind me how the quarterly report template is organised?",
]


def conversation(length: int, planted: dict[int, str], seed: int = 3) -> list[dict[str, str]]:
    """``length`` messages of filler, with ``planted`` user texts at given indexes."""
    rng = random.Random(seed)
    messages = []
    for index in range(1, length + 1):
        if index in planted:
            text = planted[index]
        elif index % 2:
            text = rng.choice(FILLER)
        else:
            text = "Sure, here is a thought: " + rng.choice(FILLER).lower()
        messages.append({"role": "user" if index % 2 else "assistant", "content": text})
    return messages


@pytest.fixture
def recall_gateway(make_gateway: GatewayFactory) -> Any:
    return make_gateway(memory={"preset": "hybrid-recall"})


def test_a_fact_said_at_message_5_is_recalled_verbatim_after_300_messages(
    recall_gateway: Any, api_key: str, session_id: str
) -> None:
    memory = Memory(recall_gateway, api_key, session_id)
    import_all(memory, conversation(300, {5: "My booking reference is QX-48213, keep it."}))
    context = memory.context("What was my booking reference again?")
    text = context["messages"][0]["content"]
    assert "## Earlier in this conversation: excerpts relevant to the new message" in text
    assert "\nuser: My booking reference is QX-48213, keep it." in text
    assert context["receipt"]["recalled"][0] == "5"  # the best match
    # What the other tiers leave of the budget is used: recall fills it.
    assert 2_700 <= context["receipt"]["total_tokens"] <= 3000
    # The same question with recall off in a plain hybrid session: the fact is gone.
    memory.http.close()


def test_recall_never_repeats_what_the_window_holds(
    recall_gateway: Any, api_key: str, session_id: str
) -> None:
    memory = Memory(recall_gateway, api_key, session_id)
    import_all(memory, conversation(40, {39: "My locker code is 7741."}))
    context = memory.context("What is my locker code?")
    assert context["receipt"]["recalled"]  # other messages fill the budget …
    assert "39" not in context["receipt"]["recalled"]  # … but not the window's
    assert 39 in context["receipt"]["window_indexes"]
    assert context["messages"][0]["content"].count("My locker code is 7741.") == 0
    memory.http.close()


def test_a_changed_fact_supersedes_the_old_one(
    recall_gateway: Any, api_key: str, session_id: str
) -> None:
    memory = Memory(recall_gateway, api_key, session_id)
    planted = {
        3: "My seat is 14C on the Lisbon flight.",
        7: "Never schedule anything before 10am.",
        41: "Change of plan: my seat is 22A now.",
        45: "Actually, from now on never schedule anything before 9am.",
    }
    import_all(memory, conversation(60, planted))
    facts = memory.state()["facts"]
    by_text = {f["text"]: f for f in facts}
    assert by_text["My seat is 14C on the Lisbon flight."]["superseded"] is True
    assert "superseded" not in by_text["Change of plan: my seat is 22A now."]
    assert by_text["Never schedule anything before 10am."]["superseded"] is True
    assert "superseded" not in by_text["Actually, from now on never schedule anything before 9am."]
    memory_message = memory.context("When can we meet?")["messages"][0]["content"]
    facts_section = memory_message.split("## Key facts\n", 1)[1].split("\n\n", 1)[0]
    assert "22A" in facts_section and "9am" in facts_section
    assert "14C" not in facts_section and "10am" not in facts_section
    memory.http.close()


def test_yesterday_is_the_imported_conversations_not_the_clocks(
    recall_gateway: Any, api_key: str, session_id: str
) -> None:
    """An imported conversation lies in the past: "yesterday" is the day before its
    newest message, whatever the day the question is asked."""
    memory = Memory(recall_gateway, api_key, session_id)
    first = datetime.datetime(2023, 3, 1, 19, tzinfo=datetime.UTC).timestamp()
    planted = {
        5: "For dinner I ate sushi, the best dinner in weeks.",  # 1 March
        25: "For dinner I ate pizza.",  # 4 March: the day before the last, 33 to 40
    }
    messages = [
        {"role": "user" if i % 2 else "assistant", "content": planted.get(i, f"Filler {i}."),
         "timestamp": first + (i - 1) // 8 * 86_400 + i * 60}
        for i in range(1, 41)
    ]  # fmt: skip
    import_all(memory, messages)
    context = memory.context("What did I eat for dinner yesterday?")
    assert context["receipt"]["recalled"][0] == "25"
    # Without a time named, the better match of words comes first.
    assert memory.context("What did I eat for dinner?")["receipt"]["recalled"][0] == "5"
    memory.http.close()


def test_a_new_session_of_the_same_user_starts_with_the_last_sessions(
    recall_gateway: Any, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    user = {"X-User-Id": "traveller-7"}
    first = Memory(recall_gateway, api_key, session_id)
    planted = {
        1: "My dog is Rex and I'm allergic to penicillin.",
        11: "I prefer aisle seats.",
    }
    import_all(first, conversation(30, planted), headers=user)
    ended = first.http.post(first.base + "/end")
    assert ended.status_code == 200 and ended.json()["ended"] is True
    assert first.http.get("/memory/users/traveller-7").json()["sessions"] == [session_id]

    client = sdk(recall_gateway, api_key, session_id + "-next", **user)
    answer = say(client, "What is my dog?")
    assert answer == "Your dog is Rex."
    forwarded = fake_upstream.last_messages()[0]["content"]
    assert "## From the user's earlier conversations\n" in forwarded  # the profile
    assert "I'm allergic to penicillin" in forwarded
    assert "## From the user's earlier conversations: relevant excerpts" in forwarded
    assert ", another conversation]\nuser: My dog is Rex and I'm allergic" in forwarded
    first.http.close()


def test_a_users_second_session_recalls_the_first_on_its_first_turn_without_an_end(
    recall_gateway: Any, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    """mem0's promise: what the user said is there at once in their next conversation,
    not only after the first one ends (``POST …/end`` or half an hour idle)."""
    user = {"X-User-Id": "commuter-3"}
    first = sdk(recall_gateway, api_key, session_id, **user)
    say(first, "Hello!")
    say(first, "My seat on the Lisbon flight is 14C, by the window.")
    say(first, "And what is the weather like there?")
    # Another user of the tenant, live too: never recalled for commuter-3.
    say(sdk(recall_gateway, api_key, session_id + "-other", **{"X-User-Id": "other-9"}),
        "My seat on the Lisbon flight is 31F.")  # fmt: skip

    say(
        sdk(recall_gateway, api_key, session_id + "-next", **user),
        "Which seat is mine on the Lisbon flight?",
    )
    forwarded = fake_upstream.last_messages()[0]["content"]
    assert "## From the user's earlier conversations: relevant excerpts" in forwarded
    assert "user: My seat on the Lisbon flight is 14C, by the window." in forwarded
    assert "31F" not in forwarded
    http = httpx.Client(base_url=recall_gateway.url, headers={"Authorization": f"Bearer {api_key}"})
    with http:  # nothing was ended to get there
        assert http.get(f"/memory/sessions/{session_id}").json()["ended"] is False


def test_an_idle_session_is_ended_when_the_user_starts_another(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    tiers = {
        "window": {"messages": 8, "keep_last": 3},
        "facts": {"extract_every": 2},
        "recall": {},
        "cross_session": {"idle_end_s": 60},
        "priority": ["window_keep", "recall", "facts", "profile", "window"],
    }
    clock = SteppedClock()
    gateway = make_gateway(memory={"tiers": tiers}, clock=clock)
    user = {"X-User-Id": "idle-user"}
    say(sdk(gateway, api_key, session_id, **user), "My favourite colour is teal.")
    clock.advance(61)
    say(sdk(gateway, api_key, session_id + "-b", **user), "Hello again.")
    http = httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {api_key}"})
    ended = lambda: http.get(f"/memory/sessions/{session_id}").json()["ended"]  # noqa: E731
    wait_for(ended, what="the idle session ended by the worker")
    later = Memory(gateway, api_key, session_id + "-c")
    later.http.headers["X-User-Id"] = "idle-user"
    profile = later.context("what is my favourite colour?")["messages"][0]["content"]
    assert "My favourite colour is teal." in profile
    http.close()
    later.http.close()


def test_embeddings_rerank_lexical_candidates_by_meaning(
    make_gateway: GatewayFactory, fake_upstream: FakeUpstream, api_key: str, session_id: str
) -> None:
    tiers = {
        "window": {"messages": 4, "keep_last": 2},
        "recall": {
            "hits": 1,
            "min_score": 0.1,
            "embeddings": {"model": "fake-embed", "weight": 0.8},
        },
        "priority": ["window_keep", "recall", "window"],
    }
    planted = {
        5: "The bicycle is parked by the front door, it is parked there daily.",
        9: "I parked my car on level 3 of the garage.",
    }
    messages = conversation(30, planted)
    lexical = {**tiers, "recall": {"hits": 1, "min_score": 0.1, "semantic": False}}
    plain_gateway = make_gateway(memory={"tiers": lexical})
    plain = Memory(plain_gateway, api_key, session_id)
    import_all(plain, messages)
    question = "Where is my automobile parked?"
    assert plain.context(question)["receipt"]["recalled"] == ["5"]  # lexical: "parked" twice
    # Gateways sharing a Redis share its job stream: they must share one configuration.
    plain_gateway.stop()

    tiers["recall"]["semantic"] = False  # the upstream model's meaning alone
    semantic = Memory(make_gateway(memory={"tiers": tiers}), api_key, session_id + "-e")
    import_all(semantic, messages)  # the flush runs the embedding jobs
    assert semantic.context(question)["receipt"]["recalled"] == ["9"]  # car ~ automobile
    assert any(r.path == "/v1/embeddings" for r in fake_upstream.requests)


def test_a_models_fact_leads_recall_to_the_message_it_was_read_from(
    make_gateway: GatewayFactory, api_key: str, session_id: str
) -> None:
    """The fact (as a model would write it: here, the summarizer's fact corrected through
    the memory API) names the sport; the message it was read from does not."""
    planted = {5: "My match went well today, we won 2-1 and I scored twice."}
    question = "What sport does Kevin play?"
    recalled = {}
    for fact_keys in (True, False):
        tiers = {
            "window": {"messages": 4, "keep_last": 2},
            "facts": {"extract_every": 2},
            "recall": {"hits": 1, "min_score": 0.1, "semantic": False, "fact_keys": fact_keys},
            "priority": ["window_keep", "facts", "recall", "window"],
        }
        gateway = make_gateway(memory={"tiers": tiers})
        memory = Memory(gateway, api_key, f"{session_id}-{fact_keys}")
        import_all(memory, conversation(30, planted))
        facts = memory.http.get(memory.base + "/facts").json()["facts"]
        read = next(f for f in facts if "scored twice" in f["text"])
        assert read["range"]["start"] <= 5 <= read["range"]["end"]
        written = "Kevin plays football; his match went well, they won 2-1."
        response = memory.http.patch(f"{memory.base}/facts/{read['id']}", json={"text": written})
        assert response.status_code == 200, response.text
        recalled[fact_keys] = memory.context(question)["receipt"]["recalled"]
        memory.http.close()
        gateway.stop()  # (gateways sharing a Redis must share one configuration)
    assert recalled == {True: ["5"], False: []}


def test_a_question_that_names_a_speaker_recalls_what_they_said_first(
    recall_gateway: Any, api_key: str
) -> None:
    """A group chat, its messages sent with the chat API's ``name``: Kate and Liam share
    the user's role. A question about Kate ranks her messages first, though "Kate" and
    "hobbies" are in none of them; not Liam's, nor the assistant's. The same conversation
    without names is ranked by meaning alone, every speaker mixed."""
    named = conversation(300, {5: "I spent the whole weekend skiing in Tahoe."})
    for index, message in enumerate(named, 1):
        if message["role"] == "assistant":
            message["name"] = "Elise"
        else:
            message["name"] = "Kate" if index % 4 == 1 else "liam_b"
    anonymous = [{"role": m["role"], "content": m["content"]} for m in named]
    first: dict[str, list[int]] = {}
    for session, messages in (("named", named), ("anonymous", anonymous)):
        memory = Memory(recall_gateway, api_key, session)
        import_all(memory, messages)
        recalled = memory.context("What are Kate's hobbies?")["receipt"]["recalled"]
        first[session] = [int(index) for index in recalled[:20]]
        memory.http.close()
    assert len(first["named"]) == 20
    assert all(index % 4 == 1 for index in first["named"]), first  # Kate's
    assert not all(index % 4 == 1 for index in first["anonymous"]), first


def test_the_sdks_named_turns_are_whose_recall_favours(
    recall_gateway: Any, api_key: str, session_id: str
) -> None:
    """A group chat through the OpenAI SDK, streamed and not: each turn's message carries
    its speaker's ``name`` (Kate or Liam), as recorded from chat, not imported. Asked
    about Kate, recall ranks her messages before any other."""
    client = sdk(recall_gateway, api_key, session_id)
    for turn in range(12):
        name = "Kate" if turn % 2 == 0 else "Liam"
        message = {"role": "user", "name": name, "content": f"{FILLER[turn % 6]} ({turn})"}
        if turn % 4 < 2:
            client.chat.completions.create(model="fake-model", messages=[message])
        else:
            stream = client.chat.completions.create(
                model="fake-model", messages=[message], stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    memory = Memory(recall_gateway, api_key, session_id)
    memory.flush()
    recalled = [int(i) for i in memory.context("What are Kate's hobbies?")["receipt"]["recalled"]]
    kates = {1, 5, 9, 13}  # her messages the window (the last 8) does not hold
    assert set(recalled[:4]) == kates, recalled
    memory.http.close()
