"""A directory's marker on every test collected below it.

A ``pytestmark`` in a conftest.py marks nothing (pytest reads it from test modules only), so
tests/integration and tests/real mark their tests with a collection hook that calls this.
``make test-fast`` deselects both by marker; tests/test_directory_marks.py checks it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest


def mark_below(directory: Path, marker: pytest.MarkDecorator, items: Iterable[pytest.Item]) -> None:
    """Add ``marker`` to each of ``items`` whose file lies below ``directory``."""
    for item in items:
        if item.path.is_relative_to(directory):
            item.add_marker(marker)
