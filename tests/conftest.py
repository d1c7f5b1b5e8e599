"""Fixtures live in modules under tests/support; this file registers them, and orders the collected tests."""

from __future__ import annotations

import pytest

from tests.support.ordering import reorder

pytest_plugins = ["tests.support.fixtures"]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    reorder(items)
