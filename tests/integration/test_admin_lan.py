"""The admin listener on a LAN address (``[admin] bind``, docs/lan.md#the-admin-view-from-the-lan),
driven from a second network namespace through real sockets: curl with and without keys, over
plaintext and TLS, and Debian's Prometheus scraping ``/metrics`` as the documented recipe says."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread

from nvpair.fleet.lanconfig import new_key
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import ProxyProcess, free_port
from tests.integration.netns import Namespace, lan_namespace
from tests.integration.test_lan import (
    curl,
    eventually,
    fleet_file,
    in_namespace,
    keys_file,
    listed,
    tls_access,
)

#: Debian's package (`make test` installs it: the Makefile's `prometheus` target).
PROMETHEUS = "/usr/bin/prometheus"


def with_admin(path: Path, admin_key: str, other: str) -> None:
    """The key file: ``laptop`` (a facade key) and ``scraper``, whose block says admin."""
    keys_file(path, ("laptop", other, ()), ("scraper", admin_key, ()))
    text = path.read_text().replace('name = "scraper"\n', 'name = "scraper"\nadmin = true\n')
    path.write_text(text)


async def proxy_with_admin(
    tmp_path: Path, lan: Namespace, url: str, access: str
) -> tuple[int, int, tuple[str, ...]]:
    port, admin = free_port(), free_port()
    fleet = fleet_file(
        tmp_path / "fleet.toml",
        "ollama",
        port,
        {"node-a": url},
        access + f'[admin]\nbind = "{lan.host_ip}"\n',
    )
    return port, admin, ("--fleet", str(fleet), "--admin-port", str(admin))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest_twisted.ensureDeferred
async def test_the_admin_listener_on_the_lan_asks_for_an_admin_key(tmp_path: Path) -> None:
    """Without a key, or with a facade's key, 401 with Basic; an admin key as Bearer or as
    Basic's password is served; /healthz is open; loopback is as before; ten wrong keys close
    the address (429) on the admin listener and the facades alike; SIGHUP re-reads the keys."""
    scraper, _ = new_key("scraper")
    laptop, _ = new_key("laptop")
    with_admin(tmp_path / "keys.toml", scraper, laptop)
    with lan_namespace() as lan:
        async with sims(("ollama", ["llama3:latest"], "node-a")) as (sim,):
            access = f'[access]\nnetworks = ["{lan.network}"]\nkeys = "keys.toml"\n'
            port, admin, args = await proxy_with_admin(tmp_path, lan, sim.url, access)
            async with running_proxy(tmp_path / "state", *args) as proxy:
                await listed(port, "/api/tags", "models", "name", "llama3:latest")
                base = f"http://{lan.host_ip}:{admin}"
                status, headers, body = await curl(lan, f"{base}/metrics")
                assert status == 401
                assert headers["www-authenticate"] == 'Basic realm="nvpair"'
                assert headers["x-nvpair-error"] == "unauthorized"
                assert json.loads(body)["error"] == "unauthorized"
                status, headers, _ = await curl(
                    lan, "-H", f"Authorization: Bearer {laptop}", f"{base}/status"
                )
                assert (status, headers["www-authenticate"]) == (401, 'Basic realm="nvpair"')
                status, _, body = await curl(
                    lan, "-H", f"Authorization: Bearer {scraper}", f"{base}/metrics"
                )
                assert status == 200
                assert 'nvpair_facade_up{engine="ollama"} 1.0' in body
                # A browser's prompt: any user name, the key as the password.
                status, _, body = await curl(lan, "-u", f"anyone:{scraper}", f"{base}/status")
                assert status == 200 and "facades" in json.loads(body)
                status, _, body = await curl(lan, f"{base}/healthz")
                assert (status, json.loads(body)) == (200, {"status": "ok"})
                # Loopback callers need no key, as before.
                local = await treq.get(f"http://127.0.0.1:{admin}/status", timeout=5)
                assert local.code == 200
                await demoted_at_sighup(proxy, tmp_path, lan, base, scraper, laptop)
                await throttled(lan, base, port, scraper)
                await removed_at_sighup(proxy, tmp_path, lan, base, admin)


async def demoted_at_sighup(
    proxy: ProxyProcess, tmp_path: Path, lan: Namespace, base: str, scraper: str, laptop: str
) -> None:
    """SIGHUP re-reads the key file: a key that lost ``admin = true`` is refused, one that
    gained it is served."""
    with_admin(tmp_path / "keys.toml", laptop, scraper)  # the roles swapped
    os.kill(proxy.pid, signal.SIGHUP)
    await proxy.wait_for_log(lambda r: "fleet file reloaded" in r.get("msg", ""))

    async def swapped() -> bool:
        ok, _, _ = await curl(lan, "-H", f"Authorization: Bearer {laptop}", f"{base}/metrics")
        return ok == 200

    await eventually(swapped, "the promoted key served after SIGHUP")
    status, _, _ = await curl(lan, "-H", f"Authorization: Bearer {scraper}", f"{base}/metrics")
    assert status == 401
    with_admin(tmp_path / "keys.toml", scraper, laptop)
    os.kill(proxy.pid, signal.SIGHUP)

    async def back() -> bool:
        ok, _, _ = await curl(lan, "-H", f"Authorization: Bearer {scraper}", f"{base}/metrics")
        return ok == 200

    await eventually(back, "the admin key served again after a second SIGHUP")


async def removed_at_sighup(
    proxy: ProxyProcess, tmp_path: Path, lan: Namespace, base: str, admin: int
) -> None:
    """An ``[admin]`` removed at SIGHUP closes the LAN address at once (403, before any key
    or throttle); loopback is served as ever."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet.read_text().partition("[admin]")[0])
    os.kill(proxy.pid, signal.SIGHUP)
    await proxy.wait_for_log(lambda r: "[admin] removed" in r.get("msg", ""))
    status, headers, _ = await curl(lan, f"{base}/healthz")
    assert (status, headers["x-nvpair-error"]) == (403, "forbidden")
    local = await treq.get(f"http://127.0.0.1:{admin}/metrics", timeout=5)
    assert local.code == 200


async def throttled(lan: Namespace, base: str, port: int, scraper: str) -> None:
    for _ in range(10):
        status, _, _ = await curl(lan, "-H", "Authorization: Bearer nvp_guess", f"{base}/status")
        assert status == 401
    status, headers, _ = await curl(
        lan, "-H", f"Authorization: Bearer {scraper}", f"{base}/metrics"
    )
    assert (status, headers["x-nvpair-error"]) == (429, "too-many-auth-failures")
    assert 50 <= int(headers["retry-after"]) <= 60
    # One throttle: the facades refuse the address too.
    facade = f"http://{lan.host_ip}:{port}/api/tags"
    status, _, _ = await curl(lan, "-H", f"Authorization: Bearer {scraper}", facade)
    assert status == 429
    status, _, _ = await curl(lan, f"{base}/healthz")
    assert status == 200


def prometheus_yml(directory: Path, target: str) -> Path:
    """The recipe of docs/lan.md#prometheus-on-another-box, at a test's pace."""
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: nvpair\n"
        "    scheme: https\n"
        "    tls_config:\n"
        f"      ca_file: {directory / 'ca.crt'}\n"
        "    authorization:\n"
        f"      credentials_file: {directory / 'nvpair.key'}\n"
        "    static_configs:\n"
        f'      - targets: ["{target}"]\n'
    )
    return config


async def query(lan: Namespace, api: str, promql: str) -> list[dict[str, object]]:
    done = await in_namespace(
        lan, ["curl", "-s", "--max-time", "5", f"{api}/api/v1/query?query={quote(promql)}"]
    )
    answer = json.loads(done.stdout)
    assert answer["status"] == "success", answer
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


@pytest_twisted.ensureDeferred
async def test_prometheus_on_another_box_scrapes_over_tls_with_a_bearer_key(
    tmp_path: Path,
) -> None:
    """Over TLS with [access]'s certificate: LAN plaintext is 403 tls-required, HTTPS with the
    admin key is served, and a real Prometheus in the namespace scrapes /metrics: ``up`` is 1
    and an nvpair metric is there to query."""
    if not os.access(PROMETHEUS, os.X_OK):
        # As the browser test does without Chromium: `make test` installs both first.
        pytest.skip(f"{PROMETHEUS} is not installed (`make prometheus` installs it)")
    scraper, _ = new_key("scraper")
    laptop, _ = new_key("laptop")
    with_admin(tmp_path / "keys.toml", scraper, laptop)
    (tmp_path / "nvpair.key").write_text(scraper + "\n")
    with lan_namespace() as lan:
        async with sims(("ollama", ["llama3:latest"], "node-a")) as (sim,):
            access = tls_access(tmp_path, lan, lan.network)
            port, admin, args = await proxy_with_admin(tmp_path, lan, sim.url, access)
            async with running_proxy(tmp_path / "state", *args):
                await listed(port, "/api/tags", "models", "name", "llama3:latest")
                target = f"{lan.host_ip}:{admin}"
                bearer = f"Authorization: Bearer {scraper}"
                status, headers, _ = await curl(lan, "-H", bearer, f"http://{target}/metrics")
                assert (status, headers["x-nvpair-error"]) == (403, "tls-required")
                cacert = str(tmp_path / "ca.crt")
                status, _, body = await curl(
                    lan, "--cacert", cacert, "-H", bearer, f"https://{target}/metrics"
                )
                assert status == 200 and "nvpair_facade_up" in body
                status, _, _ = await curl(lan, "--cacert", cacert, f"https://{target}/metrics")
                assert status == 401
                await scraped_by_prometheus(tmp_path, lan, target)


async def scraped_by_prometheus(tmp_path: Path, lan: Namespace, target: str) -> None:
    config = prometheus_yml(tmp_path, target)
    web = f"127.0.0.1:{free_port()}"  # the namespace's own loopback
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        lan.command(
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={web}",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://{web}"
    try:

        async def up() -> bool:
            result = await query(lan, api, 'up{job="nvpair"}')
            return bool(result) and result[0]["value"][1] == "1"  # type: ignore[index]

        await eventually(up, "Prometheus scraped the admin listener", timeout=60)
        result = await query(lan, api, 'nvpair_facade_up{job="nvpair"}')
        assert [(r["metric"]["engine"], r["value"][1]) for r in result] == [  # type: ignore[index]
            ("ollama", "1")
        ]
        targets = await in_namespace(lan, ["curl", "-s", f"{api}/api/v1/targets"])
        (active,) = json.loads(targets.stdout)["data"]["activeTargets"]
        assert (active["health"], active["lastError"]) == ("up", "")
    finally:
        server.terminate()
        try:
            await deferToThread(server.wait, 10)
        except subprocess.TimeoutExpired:
            server.kill()
            await deferToThread(server.wait, 5)
        log.close()
        shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)
