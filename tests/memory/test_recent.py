from gateway.memory.recent import Recent, RecentSet


def test_a_recent_mapping_forgets_the_least_recently_written_entry() -> None:
    recent: Recent[str, int] = Recent(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)  # written again: now the newest
    recent.put("c", 4)
    assert [recent.get(k, 0) for k in "abc"] == [3, 0, 4]


def test_a_recent_set_is_bounded() -> None:
    members: RecentSet[int] = RecentSet(3)
    for n in range(5):
        members.add(n)
    assert [n in members for n in range(5)] == [False, False, True, True, True]
