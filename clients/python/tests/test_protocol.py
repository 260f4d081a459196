"""The protocol's decisions and patterns, without a server."""

from __future__ import annotations

import json

import pytest

import litebase_streams as lbs
from litebase_streams._protocol import Follower, Verdict
from litebase_streams.patterns import matches, name_range


@pytest.mark.parametrize("pattern, stream, expected", [
    ("*", "anything", True),
    ("order.*", "order.eu.failed", True),
    ("order.*", "order", False),
    ("orders*", "orders2", True),
    ("order.*.failed", "order.eu.failed", True),
    ("order.*.failed", "order.eu.retry.failed", False),
    ("order.*.failed", "order.failed", False),
    ("*.failed", "x.failed", True),
    ("a.b", "a.b", True),
    ("a.b", "a.bc", False),
])
def test_patterns_match_like_the_extension(pattern: str, stream: str, expected: bool) -> None:
    assert matches(pattern, stream) is expected


def test_name_ranges() -> None:
    assert name_range("order.*.failed") == ("order.", "order/")
    assert name_range("*") == ("", "~")
    assert name_range("*.x") == ("", "~")


def note(position: int, prev: int, stream: str = "s", **extra: object) -> str:
    body = {"position": position, "stream": stream, "time": "2026-12-03T18:50:10.123456Z",
            "tx": 7, "prev": prev, **extra}
    return json.dumps(body)


def test_only_the_workers_notifications_are_trusted() -> None:
    f = Follower("s", None, types=None, filter=None, on_log_change="raise", page=100)
    f.saw_worker(42, "log-1")
    assert f.judge(43, note(1, 0, data={})).verdict is Verdict.RECHECK
    judged = f.judge(42, note(1, 0, data={"a": 1}))
    assert judged.verdict is Verdict.DELIVER and judged.event is not None
    assert judged.event.data == {"a": 1} and judged.event.time.tzinfo is not None
    f.accept(judged.event)
    assert f.judge(42, note(1, 0, data={})).verdict is Verdict.REPLAY  # went back
    assert f.judge(42, note(3, 2, data={})).verdict is Verdict.REPLAY  # a gap: 2 was missed
    assert f.judge(42, note(4, 1, truncated=True)).verdict is Verdict.FETCH
    assert f.judge(42, note(5, 1, private=True)).verdict is Verdict.FETCH
    assert f.judge(42, "not json").verdict is Verdict.REPLAY


def test_patterns_and_filters_always_replay() -> None:
    for f in (Follower("s.*", None, types=None, filter=None, on_log_change="raise", page=1),
              Follower("s", None, types=None, filter={"a": 1}, on_log_change="raise", page=1)):
        f.saw_worker(42, "log-1")
        assert f.judge(42, note(1, 0, data={})).verdict is Verdict.REPLAY


def test_another_log_raises_or_restarts() -> None:
    f = Follower("s", lbs.Cursor("log-1", 9), types=None, filter=None, on_log_change="raise", page=1)
    with pytest.raises(lbs.LogChanged) as raised:
        f.saw_worker(42, "log-2")
    assert (raised.value.old, raised.value.new) == ("log-1", "log-2")
    f = Follower("s", lbs.Cursor("log-1", 9), types=None, filter=None, on_log_change="restart", page=1)
    assert f.saw_worker(42, "log-2") and f.cursor() == lbs.Cursor("log-2", 0)
