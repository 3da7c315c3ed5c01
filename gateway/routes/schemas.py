"""The memory API's bodies and answers as pydantic models: one source for both.

Request models validate what the routes read; response models describe what they return
(a test validates real answers against them), and ``gateway/routes/openapi.py`` builds the
served document from both, so the description cannot drift from the code.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from gateway.dialects.chat.request import Content, MessageShape
from gateway.memory.durable import MAX_FACT_CHARS

# Redis list indexes are signed 64-bit: a larger message index is an error there, not a miss.
MAX_INDEX = 2**53

# Times a message may carry: from 1970 to 2100 (a typo'd year is refused, not stored).
_EARLIEST, _LATEST = 0.0, 4_102_444_800.0

# Seconds since the epoch; JSON does not tell 1.0 from 1.
Seconds = StrictFloat | StrictInt


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- what clients send ----------------------------------------------------------------


class ImportMessage(MessageShape):
    # The conversation only: a system prompt is the client's, never stored.
    role: Literal["user", "assistant", "tool"]
    # When it was said: Unix seconds, or an ISO 8601 date and time (UTC unless it says
    # otherwise). Without it, the time of the import.
    timestamp: StrictFloat | StrictInt | StrictStr | None = None

    @field_validator("timestamp")
    @classmethod
    def _check_timestamp(cls, value: float | str | None) -> float | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                when = datetime.datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError("must be Unix seconds or an ISO 8601 date and time") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.UTC)
            value = when.timestamp()
        if not _EARLIEST < value < _LATEST:
            raise ValueError("must be a time between 1970 and 2100")
        return float(value)


class ImportBody(_Closed):
    messages: list[ImportMessage] = Field(min_length=1)


class PinBody(_Closed):
    content: StrictStr = Field(min_length=1, max_length=4000)
    importance: float | None = Field(default=None, ge=0, le=1)
    source_index: int | None = Field(default=None, ge=1, le=MAX_INDEX)


class PinEditBody(_Closed):
    content: StrictStr | None = Field(default=None, min_length=1, max_length=4000)
    importance: float | None = Field(default=None, ge=0, le=1)


class FactEditBody(_Closed):
    """A correction: the fact's new wording (it replaces the old one, kept superseded)."""

    text: StrictStr = Field(min_length=1, max_length=MAX_FACT_CHARS)


class SearchBody(_Closed):
    query: StrictStr = Field(min_length=1, max_length=4000)
    limit: StrictInt = Field(default=10, ge=1, le=50)


# --- what the gateway answers -----------------------------------------------------------


class ErrorDetail(_Closed):
    message: StrictStr
    type: StrictStr
    param: StrictStr | None
    code: StrictStr | None


class Error(_Closed):
    """OpenAI's envelope, for every error the gateway itself answers."""

    error: ErrorDetail


class StoredMessage(_Closed):
    """A stored message: its place in the log, the message, and when it was said."""

    index: StrictInt = Field(ge=1)
    role: StrictStr
    content: Content
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_id: StrictStr = ""
    name: StrictStr = ""
    timestamp: StrictStr = Field("", json_schema_extra={"format": "date-time"})


class Range(_Closed):
    start: StrictInt
    end: StrictInt


class Span(_Closed):
    since: Seconds
    until: Seconds


class Summary(_Closed):
    range: Range
    text: StrictStr
    ts: Seconds
    fallback: StrictBool
    span: Span | None = None  # when its messages were said, if known


class RollingSummary(_Closed):
    text: StrictStr
    range: Range
    version: StrictInt
    turn: StrictInt
    ts: Seconds
    fallback: StrictBool


class KeyQA(_Closed):
    q: StrictStr
    a: StrictStr
    tags: list[StrictStr]
    turn: StrictInt


class Fact(_Closed):
    text: StrictStr
    range: Range
    key: StrictStr = ""
    superseded: StrictBool = False
    fallback: StrictBool = False
    ts: Seconds = 0.0
    corrected: StrictBool = False  # written through the memory API to replace a fact


class Pin(_Closed):
    id: StrictStr
    content: StrictStr
    importance: Seconds  # a number from 0 to 1
    source_index: StrictInt | None
    pin_type: StrictStr
    created: Seconds


class Session(_Closed):
    """A session's tiers, as ``GET /memory/sessions/{sid}`` shows them."""

    session_id: StrictStr
    user_id: StrictStr | None
    message_count: StrictInt = Field(ge=0)
    turns: StrictInt = Field(ge=0)
    ended: StrictBool
    preset: StrictStr | None
    tiers_version: StrictInt
    window: list[StoredMessage]
    summaries: list[Summary]
    rolling_summary: RollingSummary | None
    key_qa: list[KeyQA]
    facts: list[Fact]
    pins: list[Pin]
    pending_jobs: StrictInt = Field(ge=0)


class EndedSession(Session):
    flushed_jobs: StrictInt


class AbandonedBranch(_Closed):
    """What an edit or a regenerate took off the log (docs/edits.md)."""

    abandoned: StrictBool
    kind: Literal["edit", "regenerate"]
    branched_after: StrictInt
    timestamp: StrictStr
    messages: list[StoredMessage]


class SessionExport(Session):
    messages: list[StoredMessage]
    abandoned_branches: list[AbandonedBranch]
    meta: dict[str, Any]


class ListedSession(_Closed):
    session_id: StrictStr
    user_id: StrictStr | None
    message_count: StrictInt = Field(ge=0)
    turns: StrictInt = Field(ge=0)
    created: Seconds | None
    updated: Seconds
    ended: StrictBool
    bytes: StrictInt | None  # None where MEMORY USAGE is refused (some managed Redis)


class SessionList(_Closed):
    sessions: list[ListedSession]


class Imported(_Closed):
    message_count: StrictInt
    imported: StrictInt
    pending_jobs: StrictInt


class ImportedConversation(_Closed):
    session_id: StrictStr
    title: StrictStr
    # imported now, or left as it was: its session existed (an earlier import)
    status: Literal["imported", "existing"]
    messages: StrictInt  # the conversation's, as the export has them
    message_count: StrictInt  # the session's


class ExportImported(_Closed):
    user_id: StrictStr
    conversations: StrictInt  # in the export
    imported: StrictInt
    existing: StrictInt
    empty: StrictInt  # with nothing to import (no text between the user and the assistant)
    messages: StrictInt  # imported
    sessions: list[ImportedConversation]


class ContextPreview(_Closed):
    """What would be forwarded: ``messages`` for a chat body, ``input`` for a Responses
    API one."""

    messages: list[dict[str, Any]] | None = None
    input: list[dict[str, Any]] | None = None
    receipt: dict[str, Any]


class Flushed(_Closed):
    ran: StrictInt
    pending_jobs: StrictInt


class PinList(_Closed):
    pins: list[Pin]


class ReceiptUsage(_Closed):
    """What the upstream said the turn took (its ``usage``); null where it did not say:
    ``cached_tokens`` is the part of the prompt its prompt cache served."""

    prompt_tokens: StrictInt | None
    cached_tokens: StrictInt | None
    completion_tokens: StrictInt | None


class StoredReceipt(_Closed):
    request_id: StrictStr | None
    at: Seconds
    model: StrictStr
    client_tokens: StrictInt
    receipt: dict[str, Any]
    usage: ReceiptUsage | None = None  # absent from receipts stored by earlier versions


class ReceiptList(_Closed):
    receipts: list[StoredReceipt]


class StoredFact(Fact):
    """A fact as the memory API lists it: its id (for a correction or a deletion), its
    session, and when it was said (ISO 8601, UTC; absent when unknown)."""

    id: StrictStr
    session_id: StrictStr
    date: StrictStr = Field("", json_schema_extra={"format": "date-time"})


class FactList(_Closed):
    facts: list[StoredFact]


class Profile(_Closed):
    """What the user's last ended sessions made: a summary and the facts that held."""

    summary: StrictStr
    facts: list[StrictStr]


class User(_Closed):
    user_id: StrictStr
    sessions: list[StrictStr]
    profile: Profile | None  # None before the first of their sessions ended
    facts: list[StoredFact]  # the current facts of each of their sessions, newest first


class SearchResult(_Closed):
    kind: Literal["excerpt", "fact", "pin"]
    session_id: StrictStr
    id: StrictInt | StrictStr  # a message's index, a fact's id, a pin's id
    text: StrictStr
    ts: Seconds | None  # when it was said (a pin: made); None when unknown
    date: StrictStr | None = Field(json_schema_extra={"format": "date-time"})
    score: Seconds  # recall's fused score: higher is better


class SearchResults(_Closed):
    results: list[SearchResult]
