"""A tiny W3C WebDriver client for Debian's headless Chromium, with no dependency beyond the
standard library.

:func:`chromium` starts ``/usr/bin/chromedriver`` on a free loopback port, opens a session
(headless Chromium from ``/usr/bin/chromium`` with a fresh profile) and tears both down on exit,
whatever happened. Every call blocks: from a test running on the Twisted reactor, call it through
``twisted.internet.threads.deferToThread`` so the reactor keeps serving the pages and engines the
browser talks to.

Chromium is kept on loopback: no background networking, no proxy, and every host name except
``localhost`` resolves to nothing (IP literals such as ``127.0.0.2`` are not looked up at all).
"""

from __future__ import annotations

import base64
import contextlib
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

#: The flags this machine's notes prescribe (headless, as root, nothing but loopback), and a few
#: more that keep Chromium from phoning anywhere.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-dev-shm-usage",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication",
    "--no-default-browser-check",
    "--no-proxy-server",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.*",
)


class BrowserUnavailable(Exception):
    """Chromium or ChromeDriver is not installed, or would not start (a reason to skip)."""


class WebDriverError(Exception):
    """The WebDriver server answered a command with an error."""


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Browser:
    """One WebDriver session. Made by :func:`chromium`; every method blocks."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        # The environment's proxy settings must never apply to loopback WebDriver traffic.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.session_id: str | None = None

    def command(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """Send one WebDriver command; returns its ``value``.

        :raises WebDriverError: the server answered with an error.
        """
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            self._endpoint + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as failed:
            body = failed.read()
            try:
                value = json.loads(body).get("value", {})
                message = f"{value.get('error')}: {value.get('message')}"
            except (ValueError, AttributeError):
                message = body.decode("utf-8", "replace")
            raise WebDriverError(f"{method} {path} -> HTTP {failed.code}: {message}") from None
        return answer.get("value") if isinstance(answer, dict) else answer

    def _session(self, path: str) -> str:
        if self.session_id is None:
            raise WebDriverError("no session")
        return f"/session/{self.session_id}{path}"

    def navigate(self, url: str) -> None:
        """Load ``url`` and wait for it to finish loading."""
        self.command("POST", self._session("/url"), {"url": url})

    def current_url(self) -> str:
        return str(self.command("GET", self._session("/url")))

    def execute_async(self, script: str, *args: Any) -> Any:
        """Run ``script`` in the page; it calls ``arguments[arguments.length - 1]`` with the
        result, which comes back JSON-decoded."""
        return self.command(
            "POST", self._session("/execute/async"), {"script": script, "args": list(args)}
        )

    def execute(self, script: str, *args: Any) -> Any:
        """Run ``script`` in the page and return what it returns."""
        return self.command(
            "POST", self._session("/execute/sync"), {"script": script, "args": list(args)}
        )

    def set_window_size(self, width: int, height: int) -> None:
        """Resize the (headless) window, which is the viewport a screenshot shows."""
        self.command("POST", self._session("/window/rect"), {"width": width, "height": height})

    def screenshot(self) -> bytes:
        """The current viewport as PNG bytes."""
        return base64.b64decode(str(self.command("GET", self._session("/screenshot"))))


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End ChromeDriver and everything it started (its own process group)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
    # Chromium's helpers may outlive ChromeDriver in the group: make sure none is left.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _wait_ready(browser: Browser, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrowserUnavailable(
                f"{CHROMEDRIVER} exited with {process.returncode}: {_tail(log)}"
            )
        with contextlib.suppress(OSError, WebDriverError, ValueError):
            status = browser.command("GET", "/status")
            if isinstance(status, dict) and status.get("ready"):
                return
        time.sleep(0.05)
    raise BrowserUnavailable(f"{CHROMEDRIVER} did not become ready in 15 s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:].strip() or "(no output)"
    except OSError:
        return "(no output)"


@contextlib.contextmanager
def chromium(*, script_timeout: float = 20.0, page_load_timeout: float = 15.0) -> Iterator[Browser]:
    """A headless Chromium session for the body of a ``with``; everything is shut down after.

    :raises BrowserUnavailable: the binaries are missing, or ChromeDriver or Chromium would not
        start.
    """
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            raise BrowserUnavailable(
                f"{binary} not found: install Debian's chromium and chromium-driver "
                "(`make test` does it)"
            )
    workdir = Path(tempfile.mkdtemp(prefix="nvpair-browser-"))
    log = workdir / "chromedriver.log"
    port = _free_loopback_port()
    try:
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [CHROMEDRIVER, f"--port={port}"],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group, so Chromium goes down with it
            )
    except OSError as failed:
        shutil.rmtree(workdir, ignore_errors=True)
        raise BrowserUnavailable(f"cannot run {CHROMEDRIVER}: {failed}") from failed
    browser = Browser(f"http://127.0.0.1:{port}", timeout=script_timeout + 15)
    try:
        _wait_ready(browser, process, log)
        profile = workdir / "profile"
        profile.mkdir()
        capabilities = {
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "timeouts": {
                "script": int(script_timeout * 1000),
                "pageLoad": int(page_load_timeout * 1000),
            },
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [*CHROMIUM_ARGS, f"--user-data-dir={profile}"],
            },
        }
        try:
            created = browser.command(
                "POST", "/session", {"capabilities": {"alwaysMatch": capabilities}}
            )
        except (WebDriverError, OSError) as failed:
            raise BrowserUnavailable(f"Chromium would not start: {failed}") from failed
        browser.session_id = str(created["sessionId"])
        try:
            yield browser
        finally:
            with contextlib.suppress(WebDriverError, OSError):
                browser.command("DELETE", f"/session/{browser.session_id}")
            browser.session_id = None
    finally:
        _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
