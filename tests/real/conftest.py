"""The real-engine tests' marker: ``-m "not real"`` leaves out every test below this directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.directory_marks import mark_below


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test below this directory runs a real llama-server (``-m "not real"``)."""
    mark_below(Path(__file__).parent, pytest.mark.real, items)
