"""The memory block's exact count, added up from what its lines are known to count: the
very number the counter gives the whole block, without giving it the whole block."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.memory.assemble import rendered_block
from gateway.memory.block import (
    MEMORY_HEADER,
    SECTIONS,
    Item,
    block_tokens,
    counted_item,
    lines_add_up,
    memory_lines,
    recalled_line,
    render_memory,
)
from gateway.memory.counting import TOKENS_PER_MESSAGE
from gateway.memory.model import Message
from gateway.text.tokens import TokenCounter, encoding_for_model

SAT = 1_705_104_000.0  # Sat 2024-01-13 00:00 UTC
# What meets at the joints of lines: letters, punctuation (which may take the line breaks
# after it into its piece), spaces and tabs, "/", blank lines, carriage returns and the
# other line breaks, other scripts.
TEXT = st.text(alphabet="ab Z9 .,:;!?'\"-/()[]\t\r\n\n\u00e9\u4e2d\u2028\x0b\u3000", max_size=30)
TIER_SECTIONS = [name for name in SECTIONS if not name.startswith("recall")]


def counter() -> TokenCounter:
    return TokenCounter()


@st.composite
def chosen_items(draw: st.DrawFn) -> list[Item]:
    """Items of every section, counted as assemble counts them, some with their piece
    unknown (0: a cut item's), in any order."""
    count = counter().for_model("gpt-4o")
    items: list[Item] = []
    for section, text, known in draw(
        st.lists(st.tuples(st.sampled_from(TIER_SECTIONS), TEXT, st.booleans()), max_size=6)
    ):
        item = counted_item(section, text or "-", count)
        items.append(item if known else item._replace(piece=0))
    for index, text, session, day, known in draw(
        st.lists(
            st.tuples(
                st.integers(1, 40),
                TEXT,
                st.sampled_from([None, "s1", "s2"]),
                st.integers(0, 2),
                st.booleans(),
            ),
            max_size=12,
            unique_by=lambda drawn: (drawn[0], drawn[2]),
        )
    ):
        said = Message("user", text, index=index, tokens=5, ts=SAT + day * 86_400 + index)
        items.append(recalled_line(said, session, True, count if known else None))
    return draw(st.permutations(items))


@settings(max_examples=400, deadline=None)
@given(chosen_items(), st.sampled_from(["", "Today is Sat 2024-01-13 (UTC)."]), st.booleans())
def test_a_block_s_lines_add_up_to_the_count_of_its_text(
    chosen: list[Item], dates: str, always: bool
) -> None:
    count = counter().for_model("gpt-4o")
    lines, pieces = memory_lines(chosen, dates, always=always)
    text = render_memory(chosen, dates, always=always)
    assert "\n".join(lines) == text
    exact = len(encoding_for_model("gpt-4o").encode(text, disallowed_special=()))
    assert block_tokens(lines, pieces, count) == count(text) == exact


def test_only_the_gateway_s_counters_are_taken_to_add_up() -> None:
    tokens = TokenCounter()
    assert lines_add_up(tokens.for_model("gpt-4o"))
    assert not lines_add_up(tokens.count_text)  # (no word of its model: not one to trust)
    assert not lines_add_up(lambda text: len(text) // 4)


class CountingTexts(TokenCounter):
    """A counter that notes every text it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def count_text(self, text: str, model: str | None = None) -> int:
        self.texts.append(text)
        return super().count_text(text, model)


def recalled(n: int, count: object) -> list[Item]:
    lines = [Message("user", f"the trip to Lisbon, part {i}", index=i, ts=SAT) for i in range(n)]
    return [recalled_line(m, None, True, count) for m in lines]  # type: ignore[arg-type]


def test_the_block_is_not_counted_whole_but_by_what_its_lines_count() -> None:
    tokens = CountingTexts()
    count = tokens.for_model("gpt-4o")
    chosen = [counted_item("facts", '- the user said: "seat 14C"', count), *recalled(40, count)]
    tokens.texts.clear()
    block = rendered_block(list(chosen), count, 10_000, {}, role="system", dates="Today.")
    assert block is not None and isinstance(block.content, str)
    assert block.tokens == count(block.content) + TOKENS_PER_MESSAGE
    assert block.content not in tokens.texts[:-1]  # (the last: the check above)
    # Looked up (each a memo's, once counted): what no item knows it counts, the
    # header's, the titles', the dates', the day's lines, the last of a section (a blank
    # line follows it) and of the block (nothing does). Not one of the 40 lines between.
    assert tokens.texts[:-1] == [
        MEMORY_HEADER + "\n\n",
        "## Dates\n",
        "Today.\n\n",
        "## Key facts\n",
        '- the user said: "seat 14C"\n\n',
        SECTIONS["recall"] + "\n",
        "[Sat 2024-01-13]\n",
        "user: the trip to Lisbon, part 39",
    ]


def test_a_counter_that_does_not_add_up_counts_the_whole_block() -> None:
    """The tests' word counters, say: the block is theirs to count."""
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return len(text.split())

    block = rendered_block(recalled(3, count), count, 10_000, {}, role="system")
    assert block is not None and counted[-1] == block.content
    assert block.tokens == len(str(block.content).split()) + TOKENS_PER_MESSAGE
