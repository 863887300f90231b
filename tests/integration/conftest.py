"""Integration fixtures: the real proxy process and simulated engines on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import reactor

from nvpair.sim import SimEngine
from tests.directory_marks import mark_below
from tests.integration.harness import ProxyProcess, free_port, start_proxy


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test below this directory is an integration test (``-m "not integration"``)."""
    mark_below(Path(__file__).parent, pytest.mark.integration, items)


@contextlib.asynccontextmanager
async def running_proxy(
    state_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    twistd_reactor: str | None = None,
    console_script: bool = False,
    open_files: int | None = None,
    run_as: tuple[str, str] | None = None,
) -> AsyncIterator[ProxyProcess]:
    """The proxy process for the body of a ``with``; terminated (and reaped) afterwards."""
    state_dir.mkdir(parents=True, exist_ok=True)
    proxy = start_proxy(
        state_dir,
        *args,
        env=env,
        twistd_reactor=twistd_reactor,
        console_script=console_script,
        open_files=open_files,
        run_as=run_as,
    )
    try:
        yield proxy
    finally:
        await proxy.terminate()


@contextlib.asynccontextmanager
async def sims(*specs: tuple[str, Sequence[str], str]) -> AsyncIterator[list[SimEngine]]:
    """Simulated engines listening on loopback: ``(dialect, models, node)`` each."""
    engines = [
        SimEngine(reactor, dialect, models=models, node=node) for dialect, models, node in specs
    ]
    for engine in engines:
        engine.listen()
    try:
        yield engines
    finally:
        for engine in engines:
            await engine.stop()


async def enabled_proxy_for(
    proxy: ProxyProcess, engine: str, nodes: Sequence[dict[str, Any]]
) -> int:
    """Enable ``engine``'s facade on a free port and give it ``nodes``; returns the port."""
    proxy.answer_subscribes()
    port = free_port()
    await proxy.enable(engine, port)
    proxy.discovery(engine, nodes)
    await proxy.barrier()
    return port
