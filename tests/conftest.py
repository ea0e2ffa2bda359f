"""Shared pytest setup. Fixture modules live in tests/fixtures/, one per real part."""

from __future__ import annotations

pytest_plugins = [
    "tests.fixtures.otlp_receiver",
    "tests.fixtures.jaeger",
    "tests.fixtures.prometheus",
    "tests.fixtures.chromium",
    "tests.fixtures.anchors",
    "tests.fixtures.hot_path",
]
