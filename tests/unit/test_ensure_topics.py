"""compactd's own topics created through a broker that stopped answering: the request is asked again through a new
client, and past the time allowed the job ends with one line (kafka/admin.py `ensure_topics`). The broker's side is
tests/integration/test_own_topics.py; this is the client's rule, with stand-in admin clients."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest

from compactd.errors import CompactdError
from compactd.kafka import admin as admin_mod
from compactd.kafka.config import KafkaConnection


class Stalled:
    """An admin client whose CreateTopics never answers (its broker stopped)."""

    def __init__(self) -> None:
        self.asked = 0

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={})

    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, Any]:
        self.asked += 1
        return {t.topic: concurrent.futures.Future() for t in topics}  # never resolved: result() times out


class Answering(Stalled):
    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, Any]:
        self.asked += 1
        out = {}
        for t in topics:
            out[t.topic] = concurrent.futures.Future()
            out[t.topic].set_result(None)
        return out


def test_a_create_with_no_answer_is_asked_again_through_a_new_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_mod, "ENSURE_ATTEMPT_S", 0.2)
    made: list[Any] = []

    def new_client(conn: Any, timeout_s: float = 10.0) -> Any:
        made.append(Answering())
        return made[-1]

    monkeypatch.setattr(admin_mod, "admin_client", new_client)
    stalled = Stalled()
    admin_mod.ensure_topics(KafkaConnection("127.0.0.1:1"), ["compactd.actions"], timeout_s=5, admin=stalled)
    assert stalled.asked == 1 and [c.asked for c in made] == [1]


def test_no_answer_within_the_time_allowed_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_mod, "ENSURE_ATTEMPT_S", 0.2)
    monkeypatch.setattr(admin_mod, "admin_client", lambda conn, timeout_s=10.0: Stalled())
    with pytest.raises(
        CompactdError, match=r"cannot create compactd's topics compactd.actions within 0.5 s: no answer"
    ):
        admin_mod.ensure_topics(KafkaConnection("127.0.0.1:1"), ["compactd.actions"], timeout_s=0.5)
