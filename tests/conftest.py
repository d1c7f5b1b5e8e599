"""Fixtures live in modules under tests/support; this file registers them, and orders the collected tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.ordering import reorder

pytest_plugins = ["tests.support.fixtures"]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    reorder(items)


@pytest.fixture(autouse=True)
def _root_log_handlers() -> Iterator[None]:
    """CLI tests call `logging.basicConfig(force=True)` on pytest's captured stderr, which closes after the test;
    restoring the root handlers keeps a later test's background threads from logging into a closed file."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
