"""The one memo helper: bounded, keyed by values."""

from __future__ import annotations

from gateway.caching import BoundedMap, BoundedSet, memo, memo_when_short


def test_a_bounded_map_forgets_the_least_recently_written_entry() -> None:
    recent: BoundedMap[str, int] = BoundedMap(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)  # written again: now the newest
    recent.put("c", 4)
    assert [recent.get(k, 0) for k in "abc"] == [3, 0, 4]
    assert len(recent) == 2


def test_a_bounded_set_is_bounded() -> None:
    members: BoundedSet[int] = BoundedSet(3)
    for n in range(5):
        members.add(n)
    assert [n in members for n in range(5)] == [False, False, True, True, True]
    assert len(members) == 3


def test_a_memo_computes_once_per_arguments_and_is_bounded() -> None:
    calls: list[tuple[str, int]] = []

    @memo(maxsize=2)
    def length(text: str, times: int) -> int:
        calls.append((text, times))
        return len(text) * times

    assert [length("ab", 1), length("ab", 1), length("ab", 2), length("abc", 1)] == [2, 2, 4, 3]
    assert calls == [("ab", 1), ("ab", 2), ("abc", 1)]
    length("ab", 1)  # forgotten: two newer entries since
    assert calls[-1] == ("ab", 1) and len(calls) == 4
    length.cache_clear()  # type: ignore[attr-defined]
    length("abc", 1)
    assert len(calls) == 5


def test_a_memo_when_short_keeps_short_values_only() -> None:
    calls: list[str] = []

    @memo_when_short(limit=3, maxsize=8)
    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    assert [upper("abc"), upper("abc"), upper("abcd"), upper("abcd")] == ["ABC", "ABC"] + [
        "ABCD"
    ] * 2
    assert calls == ["abc", "abcd", "abcd"]  # the long one computed every time
    assert upper.cache_info().currsize == 1  # type: ignore[attr-defined]
    upper.cache_clear()  # type: ignore[attr-defined]
    assert upper.cache_info().currsize == 0  # type: ignore[attr-defined]
