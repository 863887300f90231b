"""The systemd unit for standalone fleet mode, as ``nvpair-proxy --systemd-unit`` prints it
(shipped in the package: ``nvpair/examples/nvpair-proxy.service``).

Read as systemd reads it (repeated keys accumulate) and checked for what it must say: the
console script on the fleet file with the admin listener, reload by SIGHUP, no restart after a
usage error, room for thousands of connections, the state directory the proxy is told to use,
and the sandbox. Where ``systemd-analyze`` exists, systemd itself checks the file too.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nvpair.facades.ports import ascii_digits
from nvpair.tap import USAGE_STATUS

ROOT = Path(__file__).resolve().parents[1]

#: This venv's console script, which prints the unit.
CONSOLE_SCRIPT = Path(sys.executable).parent / "nvpair-proxy"

#: Where ``pip install`` as root puts the console script, which the unit runs.
INSTALLED = "/usr/local/bin/nvpair-proxy"

#: The admin listener's port under the service: the one docs/operations.md's commands use.
ADMIN_PORT = 21500

#: The streams ``make bench`` holds at once (bench/README.md), each a client's and a node's
#: descriptor.
HELD_STREAMS = 2000

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections of ``Key=value`` lines; every value of a repeated key, in order. Comments
    (``#``, ``;``) and blank lines are skipped, a trailing backslash continues a line."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"a line before any section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not Key=value: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


@pytest.fixture(scope="module")
def unit_text() -> str:
    """The unit as ``nvpair-proxy --systemd-unit`` prints it."""
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "--systemd-unit"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def service(unit_text: str) -> dict[str, list[str]]:
    return parse_unit(unit_text)["Service"]


def one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key)
    assert values is not None and len(values) == 1, (key, values)
    return values[0]


def test_parse_unit_reads_repeated_keys_and_continuations() -> None:
    unit = parse_unit("# c\n[A]\nK=1\nK=2\n; c\nL=a \\\n  b\nE=\n[B]\nK=x\n")
    assert unit == {"A": {"K": ["1", "2"], "L": ["a b"], "E": [""]}, "B": {"K": ["x"]}}


def test_it_runs_the_console_script_on_the_fleet_file(
    unit_text: str, service: dict[str, list[str]]
) -> None:
    """Standalone fleet mode (docs/broker-protocol.md#standalone-fleet-mode) with the admin
    listener, so that /metrics and the status page work under the service; in the foreground
    under the service manager, restarted when it fails and started at boot."""
    command = shlex.split(one(service, "ExecStart"))
    assert command == [
        INSTALLED,
        "--fleet",
        "/etc/nvpair/fleet.toml",
        "--admin-port",
        str(ADMIN_PORT),
    ]
    assert one(service, "Type") == "exec"
    assert one(service, "Restart") == "on-failure"
    assert parse_unit(unit_text)["Install"]["WantedBy"] == ["multi-user.target"]


def test_a_usage_error_is_not_restarted(service: dict[str, list[str]]) -> None:
    """A usage error exits 2 (a bad option, a fleet file that does not parse: the console
    script's tests hold that); restarting it every RestartSec would fail the same way."""
    assert one(service, "RestartPreventExitStatus").split() == [str(USAGE_STATUS)]
    assert USAGE_STATUS == 2


def test_a_usage_error_of_the_units_own_command_exits_with_that_status(tmp_path: Path) -> None:
    """The unit's command line with a fleet file that does not parse ends with the status the
    unit does not restart."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("[facades.nope]\n")
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "--fleet", str(fleet), "--admin-port", str(ADMIN_PORT)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert result.returncode == USAGE_STATUS, result.stderr
    assert result.stderr.startswith("nvpair-proxy: --fleet: ") and result.stdout == ""


def test_open_files_are_enough_for_the_held_streams(service: dict[str, list[str]]) -> None:
    """Every held stream is two descriptors (its client, its node); the usual soft limit of
    1024 would refuse connections long before 2,000 streams. Soft and hard are both set."""
    limit = one(service, "LimitNOFILE")
    assert ascii_digits(limit), limit
    assert int(limit) >= 2 * HELD_STREAMS + 1024


def test_exec_start_names_the_console_script_pyproject_declares() -> None:
    """``pip install`` puts ``nvpair-proxy`` on the PATH only if pyproject.toml declares it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("scripts", {})
    if "nvpair-proxy" not in scripts:
        pytest.skip("pyproject.toml declares no nvpair-proxy console script (yet)")
    assert Path(INSTALLED).name in scripts


def test_reload_is_sighup_to_the_main_process(service: dict[str, list[str]]) -> None:
    """SIGHUP re-reads the fleet file (docs/fleet-scheduling.md#the-fleet-file-re-read), so
    ``systemctl reload`` sends exactly that."""
    kill, *args = shlex.split(one(service, "ExecReload"))
    assert Path(kill).name == "kill" and Path(kill).is_absolute()
    assert args == ["-HUP", "$MAINPID"]


def test_the_state_dir_is_the_service_state_directory(service: dict[str, list[str]]) -> None:
    """The persisted ports go where systemd gives the dynamic user a writable directory
    (``%S`` is /var/lib for a system unit); the rest of the file system is read-only."""
    assert one(service, "StateDirectory") == "nvpair"
    environment = dict(
        word.split("=", 1) for value in service["Environment"] for word in shlex.split(value)
    )
    assert environment["NVPAIR_STATE_DIR"] == "%S/nvpair"


def test_it_is_sandboxed(service: dict[str, list[str]]) -> None:
    """No user of its own, no privileges, a read-only system, no home directories, a private
    /tmp, only IP and local sockets, no capabilities, only the system calls a service needs."""
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "LockPersonality": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert one(service, key) == value, key
    assert set(one(service, "RestrictAddressFamilies").split()) == {
        "AF_INET",
        "AF_INET6",
        "AF_UNIX",
    }
    assert "@system-service" in service["SystemCallFilter"]


def test_writable_executable_memory_stays_allowed(service: dict[str, list[str]]) -> None:
    """pyOpenSSL's certificate-verify callback is a cffi ``ffi.callback``, which needs memory
    both writable and executable: with ``MemoryDenyWriteExecute=yes`` every pinned TLS
    handshake (https:// nodes, cluster peers) fails with "Cannot allocate write+execute memory
    for ffi.callback()". Plain-HTTP fleets would run; the unit must not break the others."""
    assert "MemoryDenyWriteExecute" not in service


def _verifiable_copy(unit_text: str, tmp_path: Path) -> Path:
    """The unit as shipped, but naming an executable that exists here when the console script
    is not installed at :data:`INSTALLED` (``verify`` insists on an executable)."""
    text = unit_text
    if not Path(INSTALLED).exists():
        text = text.replace(INSTALLED, str(CONSOLE_SCRIPT))
    copy = tmp_path / "nvpair-proxy.service"
    copy.write_text(text)
    return copy


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip(
            "no systemd-analyze here (Debian's systemd package): the unit's directives are "
            "still checked by the other tests of this file"
        )
    return found


def test_systemd_analyze_verify_finds_nothing_wrong(unit_text: str, tmp_path: Path) -> None:
    """Every key known and every value parsed: systemd warns about an unknown key or a bad
    value and carries on (exit status 0), so its output must be empty too."""
    copy = _verifiable_copy(unit_text, tmp_path)
    result = subprocess.run(
        [_systemd_analyze(), "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    said = [line for line in (result.stdout + result.stderr).splitlines() if copy.name in line]
    assert result.returncode == 0 and said == [], result.stdout + result.stderr


def test_systemd_analyze_security_rates_the_sandbox_ok(unit_text: str, tmp_path: Path) -> None:
    """systemd's own exposure score (0 safest, 10 worst) stays at 1.4 or below ("OK"), what
    it is with this unit; network access and the allowed memory mappings are what remain.
    (``--threshold`` is on systemd's internal scale, ten times the printed one.)"""
    analyze = _systemd_analyze()
    copy = _verifiable_copy(unit_text, tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=14", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in result.stderr and result.returncode != 0 and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd before 250)")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_credentials_for_the_dynamic_user_are_offered_commented(unit_text: str) -> None:
    """docs/lan.md#as-a-service: the dynamic user cannot read a 0600 root ``lan.key`` nor has
    a node key in its environment; the unit carries the ``LoadCredential=`` lines that hand
    them over, commented (a fleet without TLS or node keys has no such files), and the docs'
    service section uses exactly those lines and names them ``credential:NAME``."""
    commented = [line[1:] for line in unit_text.splitlines() if line.startswith("#LoadCredential=")]
    uncommented = parse_unit("[Service]\n" + "\n".join(commented))["Service"]["LoadCredential"]
    names = [value.partition(":")[0] for value in uncommented]
    assert names == ["lan.crt", "lan.key", "gpu1-llama.key"]
    assert all(
        value == f"{name}:/etc/nvpair/{name}"
        for name, value in zip(names, uncommented, strict=True)
    )
    assert "LoadCredential" not in parse_unit(unit_text)["Service"]
    lan = (ROOT / "docs" / "lan.md").read_text()
    section = lan.split("### As a service", 1)[1].split("\n### ", 1)[0]
    for line in commented:
        assert f"\n{line}\n" in section
    for name in names:
        assert f'"credential:{name}"' in section
