"""``twistd -r uvloop -n nvpair-proxy``: the same process on Twisted's asyncio reactor over uvloop.

The whole integration suite runs on it with ``NVPAIR_TEST_REACTOR=uvloop``; this test keeps one
streaming exchange and a failover on it in every ``make test``.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims
from tests.integration.harness import NVPAIR_PROXY, TWISTD, free_port
from tests.integration.test_fleet import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest_twisted.ensureDeferred
async def test_the_proxy_streams_and_fails_over_on_the_uvloop_reactor(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "node-a"), ("llamacpp", ["tiny"], "node-b")) as (a, b),
        running_proxy(tmp_path, twistd_reactor="uvloop") as proxy,
    ):
        a.faults.status = 503
        port = await enabled_proxy_for(
            proxy,
            "llamacpp",
            [
                {"id": "a", "url": a.url, "models": ["tiny"]},
                {"id": "b", "url": b.url, "models": ["tiny"]},
            ],
        )

        def chat() -> str:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            return "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )

        assert await deferToThread(chat) == "Hello from node-b."
        assert any(line.get("loop") == "asyncio on uvloop" for line in proxy.logs)


@pytest_twisted.ensureDeferred
async def test_the_console_script_runs_on_uvloop_with_its_reactor_option(tmp_path: Path) -> None:
    """``nvpair-proxy --reactor uvloop``: the console script takes twistd's reactor choice as
    an option of its own (docs/README.md#command-line)."""
    async with sims(("llamacpp", ["tiny"], "node-a")) as (a,):
        port = free_port()
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(
            f"[facades.llamacpp]\nport = {port}\n"
            f'[[nodes]]\nid = "a"\n[nodes.engines]\nllamacpp = "{a.url}"\n'
        )
        async with running_proxy(
            tmp_path / "run",
            "--fleet",
            str(fleet),
            twistd_reactor="uvloop",
            console_script=True,
        ) as proxy:
            url = f"http://127.0.0.1:{port}/v1/models"

            async def listed() -> bool:
                try:
                    response = await treq.get(url, timeout=5)
                    return b'"tiny"' in await response.content()
                except Exception:
                    return False

            await eventually(listed, proxy.logs)
    loops = [line["loop"] for line in proxy.logs if "loop" in line]
    assert loops == ["asyncio on uvloop"]


#: The extra that brings uvloop, as pyproject.toml names it.
EXTRA = "uvloop"


@pytest.mark.parametrize(
    "command",
    [
        [TWISTD, "--pidfile=", "-r", "uvloop", "-n", "nvpair-proxy"],
        [NVPAIR_PROXY, "--reactor", "uvloop"],
        [NVPAIR_PROXY, "-r", "uvloop"],
    ],
)
def test_without_uvloop_the_reactor_option_names_the_extra_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """Asked for the uvloop reactor with uvloop not installed, the process says in one line on
    stderr what to install and exits 2, a usage error: not twistd's 67 lines of help on
    stdout. uvloop is made missing by a package of that name that fails to import, first on
    the path, as an absent one does."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("uvloop") for r in extras["optional-dependencies"][EXTRA])
    missing = tmp_path / "without" / "uvloop"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'uvloop'\", name='uvloop')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PYTHONPATH"] = str(missing.parent)
    result = subprocess.run(
        [*command, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "nvpair-proxy: the uvloop reactor needs the uvloop package: "
        f"pip install 'nvpair-proxy[{EXTRA}]'\n"
    )
