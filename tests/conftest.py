"""Fixtures live in modules under tests/support; this file only registers them."""

pytest_plugins = ["tests.support.fixtures"]
