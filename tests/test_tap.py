"""The command line (docs/README.md#command-line): defaults, env vars, Go durations, usage
errors."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from twisted.logger import LogLevel
from twisted.python.usage import UsageError

from nvpair.tap import Options, leave_tls_unloaded


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Options:
    options = Options(environ or {"HOME": "/home/u"})
    options.parseOptions(argv)
    return options


def test_defaults_are_the_specs_values() -> None:
    config = parse([]).config
    assert config is not None
    assert config.state_dir == Path("/home/u/.local/state/nvpair")
    assert (config.broker, config.bind, config.fleet, config.cluster_dir) == (
        "stdio",
        "::",
        None,
        None,
    )
    assert config.response_header_timeout == 1800 and config.dial_timeout == 10
    assert config.job_deadline == 600 and config.max_dispatch_attempts == 5
    assert config.retry_backoff == 0.25 and config.client_write_timeout == 60
    assert config.max_request_body == 67108864 and config.log_level == LogLevel.info
    assert config.max_body_memory == 268435456
    assert config.admin_port is None
    assert (config.log_format, config.access_log) == ("auto", False)


def test_log_format_and_access_log() -> None:
    config = parse(["--log-format", "text", "--access-log"]).config
    assert config is not None and (config.log_format, config.access_log) == ("text", True)


def test_xdg_state_home() -> None:
    config = parse([], {"XDG_STATE_HOME": "/x"}).config
    assert config is not None and config.state_dir == Path("/x/nvpair")


def test_environment_fills_in_and_flags_win() -> None:
    env = {
        "NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT": "0",
        "NVPAIR_LOG_LEVEL": "debug",
        "NVPAIR_STATE_DIR": "/s",
        "HOME": "/h",
    }
    config = parse([], env).config
    assert config is not None
    assert config.response_header_timeout == 0 and config.log_level == LogLevel.debug
    assert config.state_dir == Path("/s")
    config = parse(["--log-level", "warn", "--state-dir", "/t"], env).config
    assert config is not None and config.log_level == LogLevel.warn
    assert config.state_dir == Path("/t")


def test_max_body_memory_in_bytes() -> None:
    config = parse(["--max-body-memory", "1048576"]).config
    assert config is not None and config.max_body_memory == 1 << 20


def test_go_durations() -> None:
    config = parse(["--job-deadline", "1h30m", "--retry-backoff", "10ms"]).config
    assert config is not None and config.job_deadline == 5400 and config.retry_backoff == 0.01


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--dial-timeout", "5"], "--dial-timeout"),
        (["--job-deadline", "-1s"], "--job-deadline"),
        (["--max-dispatch-attempts", "two"], "--max-dispatch-attempts"),
        (["--max-request-body", "0"], "--max-request-body"),
        (["--max-body-memory", "256MiB"], "--max-body-memory"),
        (["--log-level", "trace"], "--log-level"),
        (["--log-format", "yaml"], "--log-format"),
        (["--admin-port", "0"], "--admin-port"),
        (["--owner-wait", "30"], "--owner-wait"),
        (["--fail-threshold", "0"], "--fail-threshold"),
        (["--cooldown", "-5s"], "--cooldown"),
        (["--cooldown-max", "forever"], "--cooldown-max"),
        (["--cooldown", "10s", "--cooldown-max", "5s"], "--cooldown-max"),
    ],
)
def test_malformed_values_name_the_option(argv: list[str], names: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse(argv)
    assert str(refused.value).startswith(names)


def test_an_unresolvable_bind_host_is_a_usage_error_naming_it() -> None:
    with pytest.raises(UsageError) as refused:
        parse(["--bind", "nosuchhost.invalid"])
    assert str(refused.value) == (
        "--bind: cannot resolve host 'nosuchhost.invalid': Name or service not known"
    )
    assert parse(["--bind", "localhost"]).config.bind == "localhost"  # type: ignore[union-attr]


def test_malformed_environment_value_names_the_option() -> None:
    with pytest.raises(UsageError) as refused:
        parse([], {"NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT": "soon"})
    assert "--response-header-timeout" in str(refused.value)


def test_the_command_lines_defaults_are_configs_defaults(tmp_path: Path) -> None:
    """One source of truth: parsing no options at all gives Config's own defaults."""
    from nvpair.config import Config

    options = Options(environ={"HOME": str(tmp_path)})
    options.parseOptions([])
    assert options.config is not None
    assert attrs.evolve(options.config, state_dir=tmp_path) == Config(state_dir=tmp_path)


def test_fleet_scheduling_options() -> None:
    """Issue 13: ``--owner-wait`` 30s, ``--fail-threshold`` 3, ``--cooldown`` 5s doubling up to
    ``--cooldown-max`` 2m (docs/fleet-scheduling.md)."""
    config = parse([]).config
    assert config is not None
    assert (config.owner_wait, config.fail_threshold) == (30, 3)
    assert (config.cooldown, config.cooldown_max) == (5, 120)
    argv = ["--owner-wait", "0", "--fail-threshold", "1", "--cooldown", "250ms"]
    config = parse([*argv, "--cooldown-max", "1m30s"]).config
    assert config is not None
    assert (config.owner_wait, config.fail_threshold) == (0, 1)
    assert (config.cooldown, config.cooldown_max) == (0.25, 90)


# -- the command line as a program's (issue 12) -----------------------------------------------


def test_version_is_nvpair_proxys_from_the_package_metadata(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--version`` prints nvpair-proxy's version (not Twisted's) and exits 0."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        parse(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"nvpair-proxy {version('nvpair-proxy')}\n"


def test_usage_error_under_twistd_is_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Parsed as twistd's subcommand, a malformed value ends parsing with one line naming the
    option on stderr, not twistd's whole help on stdout (the broker's)."""
    from twisted.scripts.twistd import ServerOptions  # type: ignore[attr-defined]

    with pytest.raises(SystemExit) as exited:
        ServerOptions().parseOptions(["--nodaemon", "nvpair-proxy", "--dial-timeout", "abc"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "nvpair-proxy: --dial-timeout: invalid duration 'abc': expected a number\n"


class _Stdin(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize(
    ("argv", "tty", "hinted"),
    [
        ([], True, True),
        ([], False, False),
        (["--broker", "tcp:host=127.0.0.1:port=1"], True, False),
    ],
)
def test_terminal_hint_only_for_a_person_waiting_on_stdio(
    argv: list[str], tty: bool, hinted: bool
) -> None:
    """Broker mode on stdio with stdin a terminal says what it waits for and how to run
    standalone; a broker's pipe, or another broker link, gets nothing."""
    from nvpair.tap import terminal_hint

    config = parse(argv).config
    assert config is not None
    err = io.StringIO()
    assert terminal_hint(config, _Stdin(tty), err) is hinted
    text = err.getvalue()
    if hinted:
        assert "waiting for a broker on stdin" in text
        assert "nvpair-proxy --fleet FILE" in text and "make demo" in text
    else:
        assert text == ""


def test_no_terminal_hint_in_fleet_mode(tmp_path: Path) -> None:
    from nvpair.tap import terminal_hint

    fleet = tmp_path / "fleet.toml"
    fleet.write_text("[facades.ollama]\n")
    config = parse(["--fleet", str(fleet)]).config
    assert config is not None
    err = io.StringIO()
    assert terminal_hint(config, _Stdin(True), err) is False and err.getvalue() == ""


def test_exit_with_status_only_after_a_failure() -> None:
    """Under plain twistd, the process ends with the status a failure set, and only then."""
    from types import SimpleNamespace
    from typing import Any, cast

    from nvpair.tap import exit_with_status

    exits: list[int] = []
    root: Any = SimpleNamespace(exit_status=0)
    exit_with_status(cast(Any, root), exits.append)
    assert exits == []
    root.exit_status = 1
    exit_with_status(cast(Any, root), exits.append)
    assert exits == [1]


def test_tls_is_left_unloaded_only_without_a_cluster_directory_before_any_reactor() -> None:
    """docs/performance.md#memory: OpenSSL is made unimportable for a node without a cluster
    directory, and only in a process that imported neither OpenSSL nor a reactor yet."""
    plain = parse(["--state-dir", "/tmp/s"]).config
    member = parse(["--state-dir", "/tmp/s", "--cluster-dir", "/tmp/c"]).config
    assert plain is not None and member is not None
    fresh: dict[str, object] = {"sys": object()}
    assert leave_tls_unloaded(plain, fresh) is True
    assert "OpenSSL" in fresh and fresh["OpenSSL"] is None
    untouched: dict[str, object] = {}
    assert leave_tls_unloaded(member, untouched) is False and untouched == {}
    for already in ("OpenSSL", "twisted.internet.reactor"):
        loaded: dict[str, object] = {already: already}
        assert leave_tls_unloaded(plain, loaded) is False
        assert loaded == {already: already}


#: A process started as twistd starts one (the plugin's options, then makeService, which installs
#: the reactor), printing the startup's modules of interest that it loaded.
_STARTED = """
import sys
from nvpair import tap
options = tap.Options()
options.parseOptions(sys.argv[1:])
options.returns_status = True
tap.makeService(options)
wanted = ("OpenSSL", "cryptography", "twisted.internet.ssl", "twisted.web.server")
print(" ".join(sorted(m for m in wanted if sys.modules.get(m) is not None)))
"""


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        ([], ""),
        (["--admin-port", "1"], "twisted.web.server"),
        (["--cluster-dir", "{tmp}/cluster"], "OpenSSL cryptography twisted.internet.ssl"),
    ],
    ids=["plain", "admin", "member"],
)
def test_the_startup_loads_tls_and_twisted_web_only_for_what_uses_them(
    tmp_path: Path, argv: list[str], loaded: str
) -> None:
    """docs/performance.md#memory: pyOpenSSL/cryptography for a cluster directory only,
    twisted.web.server for an admin listener only."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[facades.llamacpp]\nport = 0\n[[nodes]]\nid = "n0"\n'
        '[nodes.engines]\nllamacpp = "http://127.0.0.1:9"\n'
    )
    args = ["--fleet", str(fleet), "--state-dir", str(tmp_path)]
    args += [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run(
        [sys.executable, "-c", _STARTED, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == loaded


@pytest.mark.parametrize(
    ("access", "loaded"),
    [
        ('[access]\nnetworks = ["10.0.0.0/8"]\n', ""),
        (
            '[access]\nnetworks = ["10.0.0.0/8"]\ntls-cert = "lan.crt"\ntls-key = "lan.key"\n',
            "OpenSSL",
        ),
    ],
    ids=["lan", "lan-tls"],
)
def test_access_tls_loads_tls_and_only_it(tmp_path: Path, access: str, loaded: str) -> None:
    """docs/lan.md#tls: a fleet whose [access] names a certificate loads pyOpenSSL (its TLS
    is served by it); [access] without one leaves it out, as before."""
    from tests.certs import issue, make_ca

    server = issue(make_ca(), ["gpu.lan"])
    (tmp_path / "lan.crt").write_bytes(server.cert_pem)
    (tmp_path / "lan.key").write_bytes(server.key_pem)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[facades.llamacpp]\nport = 0\n[[nodes]]\nid = "n0"\n'
        '[nodes.engines]\nllamacpp = "http://127.0.0.1:9"\n' + access
    )
    done = subprocess.run(
        [sys.executable, "-c", _STARTED, "--fleet", str(fleet), "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert ("OpenSSL" in done.stdout.split()) is (loaded == "OpenSSL")


def test_a_key_file_with_a_name_twice_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    """docs/lan.md#keys: names are unique; at start a duplicate is a usage error."""
    digest = "ab" * 32
    (tmp_path / "keys.toml").write_text(
        f'[[keys]]\nname = "tv"\nsha256 = "{digest}"\n'
        f'[[keys]]\nname = "tv"\nsha256 = "{"cd" * 32}"\n'
    )
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[facades.ollama]\n[access]\nnetworks = ["10.0.0.0/8"]\nkeys = "keys.toml"\n')
    with pytest.raises(UsageError) as raised:
        parse(["--fleet", str(fleet)])
    assert str(raised.value) == (
        f"--fleet: {fleet}: access.keys: {tmp_path / 'keys.toml'}: keys[1].name: "
        "'tv' is another key's name"
    )
