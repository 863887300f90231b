"""A pytest plugin for llama.cpp's own server tests: offline, and optionally through the proxy.

Loaded by ``python -m tools.engine_suite`` (docs/engine-suite.md) into llama.cpp's
``tools/server/tests`` run, in the suite's own venv, with ``-p tools.engine_suite.plugin``. It
changes the suite only through its seam, ``utils.ServerProcess``:

- **Offline.** Every server the suite starts on the tiny test model llama.cpp downloads
  (stories260K) is started on our tiny GGUF instead (``NVPAIR_SUITE_MODEL``); a server that
  needs any other model, a draft model, a projector, a LoRA or a downloaded file skips its test.
  The suite's preset download at session start does nothing, and it finds no container
  engine (Docker or Podman would pull an image); a test whose server fetches a page from
  outside is skipped by id (:data:`REACHES_OUT`).
- **Proxied** (``NVPAIR_SUITE_MODE=proxied``). ``start`` runs the real server on a free
  loopback port, then ``twistd -n nvpair-proxy --fleet`` (``NVPAIR_SUITE_TWISTD``) with a
  one-node fleet file over it, its llama.cpp facade on the port the tests talk to; ``stop``
  ends both. A server started with ``--api-key`` becomes the node's credential and the proxy
  asks loopback callers for the same key (docs/lan.md#a-shared-machine).

Every test's outcome is written as JSON to ``NVPAIR_SUITE_RESULTS`` at the end of the session.
This runs in the suite's venv: it imports nothing of nvpair's, only pytest and the standard
library.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

#: The models the suite downloads that the tiny GGUF stands in for: (hf repo, hf file).
TINY_STANDINS = frozenset(
    {
        ("ggml-org/test-model-stories260K", None),
        ("ggml-org/models", "tinyllamas/stories260K.gguf"),
    }
)

#: Programs the suite would start that reach outside this machine: a container engine pulls
#: its image from a registry. The suite asks ``shutil.which`` for them and skips without one.
HIDDEN_PROGRAMS = frozenset({"docker", "podman"})

#: Tests whose server would fetch from outside this machine, skipped by id.
REACHES_OUT = {
    "unit/test_proxy.py::test_mcp_proxy": "its server fetches http://example.com (/cors-proxy)",
}

#: How long the proxy may take to start and see its node.
PROXY_READY_WITHIN = 30.0

#: The environment a proxied server's node credential is read from (the fleet file's env:).
NODE_KEY_VARIABLE = "NVPAIR_SUITE_NODE_KEY"


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 and nobody holds now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def needs_download(server: Any) -> str | None:
    """What ``server`` would download that the tiny GGUF cannot stand in for, or None."""
    for field in ("model_url", "model_draft", "mmproj_url", "lora_files", "models_preset"):
        if getattr(server, field, None):
            return f"{field}={getattr(server, field)!r}"
    repo, file = server.model_hf_repo, server.model_hf_file
    if repo is None and file is None:
        model = server.model_file
        if model is not None and not Path(model).exists():
            return f"model_file={model!r}"
        return None
    if (repo, file) in TINY_STANDINS:
        return None
    return f"hf {repo}" + (f" {file}" if file else "")


def offline(server: Any, model: str) -> None:
    """Point ``server`` at ``model`` in place of the stories260K download, or skip the test."""
    missing = needs_download(server)
    if missing is not None:
        pytest.skip(f"needs a model that is not offline: {missing}")
    if server.model_hf_repo is not None:
        server.model_hf_repo = None
        server.model_hf_file = None
        server.model_file = model
    server.offline = True


def fleet_file(
    facade_port: int, engine_url: str, served: str | None, credential: bool, keys: Path | None
) -> str:
    """A one-node fleet file: the llama.cpp facade on ``facade_port`` over ``engine_url``; every
    name nothing else matches goes to ``served``, the one model a single-model server serves
    whatever it is asked for (docs/model-names.md#pattern-aliases)."""
    lines = [
        'inventory-interval = "100ms"',
        "[facades.llamacpp]",
        f"port = {facade_port}",
        "[[nodes]]",
        'id = "engine"',
        "[nodes.engines]",
        f'llamacpp = "{engine_url}"',
    ]
    if served is not None:
        lines += ["[models]", f'"*" = ["{served}"]']
    if credential:
        lines += ["[nodes.credentials]", f'llamacpp = "env:{NODE_KEY_VARIABLE}"']
    if keys is not None:
        lines += ["[access]", f'keys = "{keys}"', "loopback-keys = true", "networks = []"]
    return "\n".join(lines) + "\n"


def key_file(key: str) -> str:
    """A key file holding ``key`` (docs/lan.md#keys)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f'[[keys]]\nname = "suite"\nsha256 = "{digest}"\nmanage = true\n'


class Proxy:
    """``twistd -n nvpair-proxy --fleet`` in front of one real server, for one test."""

    def __init__(self, twistd: str, facade: tuple[str, int], engine: Any) -> None:
        """The proxy's llama.cpp facade on ``facade`` over ``engine``, a started
        ``ServerProcess``."""
        host, port = facade
        key: str | None = engine.api_key
        self.directory = Path(tempfile.mkdtemp(prefix="nvpair-suite-"))
        keys = None
        if key is not None:
            keys = self.directory / "keys.toml"
            keys.write_text(key_file(key))
        fleet = self.directory / "fleet.toml"
        url = f"http://127.0.0.1:{engine.server_port}"
        served = engine.model_alias or (Path(engine.model_file).name if engine.model_file else None)
        fleet.write_text(fleet_file(port, url, served, key is not None, keys))
        environ = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
        if key is not None:
            environ[NODE_KEY_VARIABLE] = key
        self.log = self.directory / "proxy.log"
        command = [twistd, "--pidfile=", "-n", "nvpair-proxy", "--state-dir", str(self.directory)]
        command += ["--fleet", str(fleet), "--bind", host, "--log-format", "json"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=environ,
                cwd=self.directory,
            )
        self.url = f"http://{host}:{port}"
        self.key = key

    def wait_ready(self, within: float = PROXY_READY_WITHIN) -> None:
        """Until the node joined discovery and ``/health`` through the facade answers 200."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited with {self.process.returncode}: {self.tail()}")
            joined = "joined llamacpp discovery" in self.log.read_text(errors="replace")
            if joined and self._healthy():
                return
            time.sleep(0.05)
        raise TimeoutError(f"proxy not ready in {within:g} s: {self.tail()}")

    def _healthy(self) -> bool:
        request = urllib.request.Request(self.url + "/health")
        if self.key is not None:
            request.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.HTTPError):
            return False

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for path in sorted(self.directory.rglob("*"), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink()
        with contextlib.suppress(OSError):
            self.directory.rmdir()


def patch_suite(utils: Any, model: str, twistd: str | None) -> None:
    """Patch llama.cpp's ``utils`` module: offline servers, and the proxy when ``twistd``."""
    server_class = utils.ServerProcess
    original_start = server_class.start
    original_stop = server_class.stop
    proxies: dict[int, Proxy] = {}

    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        offline(self, model)
        if twistd is None or getattr(self, "external_server", False):
            original_start(self, *args, **kwargs)
            return
        facing = self.server_port
        self.server_port = free_loopback_port()
        try:
            original_start(self, *args, **kwargs)
            proxy = Proxy(twistd, (self.server_host.split(",")[0].strip(), facing), self)
        finally:
            self.server_port = facing
        proxies[id(self)] = proxy
        proxy.wait_ready()

    def stop(self: Any) -> None:
        proxy = proxies.pop(id(self), None)
        if proxy is not None:
            proxy.stop()
        original_stop(self)

    def no_download(url: str, output_file_path: str | None = None) -> str:
        pytest.skip(f"downloads {url}: not offline")

    visible = shutil.which

    def which(command: str, *args: Any, **kwargs: Any) -> str | None:
        return None if Path(command).name in HIDDEN_PROGRAMS else visible(command, *args, **kwargs)

    shutil.which = which  # type: ignore[assignment]
    server_class.start = start
    server_class.stop = stop
    utils.ServerPreset.load_all = staticmethod(lambda: None)
    utils.download_file = no_download


class Outcomes:
    """Each test's outcome (passed, failed, skipped, error, xfailed, xpassed) and, when it did
    not pass, the first line of why."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.collected = 0

    def record(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when == "call":
            outcome = report.outcome
        elif report.failed:
            outcome = "error"
        elif report.skipped:
            outcome = "skipped"
        else:
            return  # a passed setup or teardown says nothing new
        if self.outcomes.get(nodeid) in ("failed", "error") and outcome != "error":
            return  # a passed teardown does not undo a failed call
        self.outcomes[nodeid] = outcome
        if outcome not in ("passed", "xfailed"):
            self.reasons[nodeid] = first_line(report)

    def document(self) -> dict[str, Any]:
        return {"collected": self.collected, "outcomes": self.outcomes, "reasons": self.reasons}


def first_line(report: pytest.TestReport) -> str:
    """The gist of a report that did not pass: a skip's reason, else the failure's last line."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2])[:300]
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300] if crash.message else ""
    return str(longrepr).strip().splitlines()[-1][:300] if longrepr else ""


OUTCOMES = Outcomes()


def pytest_sessionstart(session: pytest.Session) -> None:
    model = os.environ["NVPAIR_SUITE_MODEL"]
    proxied = os.environ.get("NVPAIR_SUITE_MODE") == "proxied"
    twistd = os.environ["NVPAIR_SUITE_TWISTD"] if proxied else None
    patch_suite(importlib.import_module("utils"), model, twistd)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid in REACHES_OUT:
            reason = f"not offline: {REACHES_OUT[item.nodeid]}"
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    OUTCOMES.collected = len(session.items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    OUTCOMES.record(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    results = os.environ.get("NVPAIR_SUITE_RESULTS")
    if results:
        Path(results).write_text(json.dumps(OUTCOMES.document(), indent=1, sort_keys=True))
