"""What the real process keeps resident (docs/performance.md#memory)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually, generates


def mapped_files(pid: int) -> set[str]:
    """The files process ``pid`` has mapped (shared libraries, extension modules)."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6}


@pytest.mark.parametrize("console_script", [False, True], ids=["twistd", "nvpair-proxy"])
@pytest_twisted.ensureDeferred
async def test_a_node_without_a_cluster_directory_never_loads_tls(
    tmp_path: Path, console_script: bool
) -> None:
    """Fleet mode without --cluster-dir serves without pyOpenSSL/cryptography in the process, and
    says nothing about it on stderr."""
    async with sims(("ollama", ["llama3:latest"], "a")) as (a,):
        port = free_port()
        fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url})
        args = ("--fleet", str(fleet))
        async with running_proxy(tmp_path, *args, console_script=console_script) as proxy:
            await eventually(lambda: generates(port, "hi"), proxy.logs)
            loaded = [f for f in mapped_files(proxy.pid) if "cryptography" in f or "OpenSSL" in f]
            problems = log_problems(proxy)
    assert loaded == []
    assert problems == []
