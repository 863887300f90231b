"""The fleet file's worst cases (nvpair/fleet/file.py): each is a FleetFileError naming what
is wrong, which the process reports in one line at start and on SIGHUP keeps its fleet for;
never another exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvpair import examples
from nvpair.control.affinity import AffinityOptions
from nvpair.control.fairqueue import QueueOptions
from nvpair.engines.table import served_engines
from nvpair.fleet.file import FacadeSpec, FleetFileError, base_url_hint, load_fleet, unserved

HEAD = '[facades.ollama]\nport = 11434\n[[nodes]]\nid = "a"\n[nodes.engines]\n'


def refusal(path: Path, text: str) -> str:
    """The one line a fleet file ``text`` is refused with, without the file's name."""
    path.write_text(text)
    with pytest.raises(FleetFileError) as refused:
        load_fleet(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message.removeprefix(f"{path}: ")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[abc", "not a URL: Invalid IPv6 URL"),
        ("https://a", "must be an http:// URL such as http://127.0.0.1:11434"),
        ("http://", "names no host"),
        (7, "must be an http:// URL such as http://127.0.0.1:11434"),
        ("http://a:99999", "port 99999 is out of range (1-65535)"),
        ("http://a:0", "port 0 is out of range (1-65535)"),
        ("http://user:secret@[::1]:70000/v1", "port 70000 is out of range (1-65535)"),
        ("http://a:port", "port 'port' is not a number"),
    ],
)
def test_a_url_that_is_no_http_url_says_why_naming_its_key(
    tmp_path: Path, url: object, why: str
) -> None:
    """Issue 20 item 2: a port out of range is said as such, not as "must be an http:// URL";
    a URL's credentials are never repeated."""
    value = f'"{url}"' if isinstance(url, str) else str(url)
    assert refusal(tmp_path / "f.toml", HEAD + f"ollama = {value}\n") == (
        f"nodes[0].engines.ollama: {why}"
    )


def test_an_unknown_engine_lists_the_valid_ones(tmp_path: Path) -> None:
    valid = "expected one of ollama, lmstudio, llamacpp"
    node = HEAD + 'llama = "http://a:1"\n'
    assert refusal(tmp_path / "f.toml", node) == (
        f"nodes[0].engines.llama: unknown engine 'llama'; {valid}"
    )
    assert refusal(tmp_path / "g.toml", "[facades.olama]\n") == (
        "facades.olama: unknown facade 'olama'; expected one of ollama, lmstudio, llamacpp, openai"
    )


@pytest.mark.parametrize(
    ("facades", "why"),
    [
        (
            "[facades.ollama]\nport = 9000\n[facades.llamacpp]\nport = 9000\n",
            "facades.llamacpp.port: port 9000 is also facades.ollama's: each facade needs its own",
        ),
        (
            "[facades.llamacpp]\n[facades.lmstudio]\nport = 8080\n",
            "facades.lmstudio.port: port 8080 is also facades.llamacpp's: each facade needs "
            "its own",
        ),
        (
            "[facades.lmstudio]\nport = 8080\n[facades.llamacpp]\n",
            "facades.llamacpp.port: port 8080 (its default) is also facades.lmstudio's: each "
            "facade needs its own",
        ),
    ],
)
def test_two_facades_on_one_port_name_both(tmp_path: Path, facades: str, why: str) -> None:
    assert refusal(tmp_path / "f.toml", facades) == why


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        (
            "http://10.0.0.5:8080/v1",
            " (the URL should be the engine's base URL, http://10.0.0.5:8080, without /v1)",
        ),
        (
            "http://u:p@h:1/api/",
            " (the URL should be the engine's base URL, http://h:1, without /api)",
        ),
        ("http://h:1/", ""),
        ("http://h:1", ""),
    ],
)
def test_a_node_url_with_a_path_is_hinted_at_as_not_the_base_url(url: str, hint: str) -> None:
    assert base_url_hint(url) == hint


def test_nesting_too_deep_for_the_parser_is_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(FleetFileError, match="not valid TOML"):
        load_fleet(path)


def test_a_good_url_with_a_port_loads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(HEAD + 'ollama = "http://[::1]:11435"\n')
    assert load_fleet(path).nodes[0].engines == {"ollama": "http://[::1]:11435"}


def test_a_node_engine_no_facade_serves_is_named_with_why(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        "[facades.ollama]\n[facades.llamacpp]\n"
        '[[nodes]]\nid = "a"\n[nodes.engines]\nollama = "http://a:1"\nlmstudio = "http://a:2"\n'
        '[[nodes]]\nid = "b"\n[nodes.engines]\nllamacpp = "http://b:1"\n'
    )
    fleet = load_fleet(path)
    assert unserved(fleet, {"ollama", "lmstudio", "llamacpp"}) == []
    assert unserved(fleet, {"ollama"}) == [
        ("a", "lmstudio", "the fleet file has no [facades.lmstudio] table"),
        ("b", "llamacpp", "its facade was added to the fleet file and starts with a restart"),
    ]


def test_the_openai_facade_is_a_facade_of_its_own_on_port_4000(tmp_path: Path) -> None:
    """``[facades.openai]`` alone names no engine facade; its default port is 4000, which no
    other facade may take (docs/openai-facade.md#the-fleet-file)."""
    path = tmp_path / "f.toml"
    path.write_text(
        '[facades.openai]\n[[nodes]]\nid = "a"\n[nodes.engines]\nollama = "http://a:1"\n'
    )
    fleet = load_fleet(path)
    assert fleet.facades == {"openai": FacadeSpec(0, ())}
    # Every engine is the openai facade's: no node engine goes unserved.
    assert unserved(fleet, served_engines(fleet.facades)) == []
    assert refusal(tmp_path / "g.toml", "[facades.openai]\n[facades.lmstudio]\nport = 4000\n") == (
        "facades.lmstudio.port: port 4000 is also facades.openai's: each facade needs its own"
    )


def test_the_example_s_openai_facade_uncommented_is_a_fleet_file(tmp_path: Path) -> None:
    """The example fleet file shows ``[facades.openai]`` commented; uncommented, as a reader
    would, it is the facade on its default port beside the others."""
    text = examples.text(examples.FLEET)
    for line in ("[facades.openai]", "port = 4000"):
        assert f"# {line}" in text
        text = text.replace(f"# {line}", line, 1)
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    assert load_fleet(path).facades["openai"] == FacadeSpec(4000, ())


def test_a_models_table_is_read_in_the_files_order(tmp_path: Path) -> None:
    """docs/model-names.md#aliases."""
    path = tmp_path / "f.toml"
    path.write_text(
        HEAD
        + 'ollama = "http://a:1"\n[models]\n"llama3" = ["llama3.1:8b", "M-Q4_K_M"]\nb = ["x"]\n'
    )
    assert load_fleet(path).models.table == (
        ("llama3", ("llama3.1:8b", "M-Q4_K_M")),
        ("b", ("x",)),
    )
    path.write_text(HEAD + 'ollama = "http://a:1"\n')
    assert load_fleet(path).models.table == ()


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ('[models]\n"" = ["x"]\n', 'models."": an alias must not be empty'),
        ('[models]\n"qwen" = []\n', 'models."qwen": must be a non-empty array of model names'),
        (
            '[models]\nqwen = ["/m/qwen.gguf"]\n',
            "models.\"qwen\": 'qwen' is also a model name the table lists (the file name of "
            "'/m/qwen.gguf'): a name is either an alias or a model's own",
        ),
    ],
)
def test_an_unusable_models_table_is_refused_naming_the_alias(
    tmp_path: Path, table: str, why: str
) -> None:
    """docs/model-names.md#conflicts: a usage error at start, the running fleet kept at SIGHUP
    (both are what a FleetFileError does)."""
    assert refusal(tmp_path / "f.toml", HEAD + 'ollama = "http://a:1"\n' + table) == why


def test_the_examples_commented_models_table_is_a_usable_one(tmp_path: Path) -> None:
    """What nvpair-proxy --example-fleet shows for [models] works once uncommented."""
    text = (Path(__file__).parents[2] / "nvpair" / "examples" / "fleet.example.toml").read_text()
    start = text.index("# [models]")
    uncommented = "\n".join(line.removeprefix("# ") for line in text[start:].splitlines())
    path = tmp_path / "f.toml"
    path.write_text(text[:start] + uncommented + "\n")
    assert load_fleet(path).models.table == (
        ("llama3", ("llama3.1:8b", "Meta-Llama-3.1-8B-Instruct-Q4_K_M")),
    )


# -- [scheduling] (docs/fleet-scheduling.md#conversations-go-where-their-cache-is) --------------


def test_scheduling_defaults_to_affinity_with_a_slack_of_two(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(HEAD)
    assert load_fleet(path).affinity == AffinityOptions(True, 2)
    path.write_text("[scheduling]\naffinity = false\naffinity-slack = 0\n" + HEAD)
    assert load_fleet(path).affinity == AffinityOptions(False, 0)


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ("scheduling = 3", "scheduling: must be a table"),
        ('[scheduling]\naffinity = "yes"', "scheduling.affinity: must be true or false"),
        ("[scheduling]\naffinity = 1", "scheduling.affinity: must be true or false"),
        ("[scheduling]\naffinity-slack = -1", "scheduling.affinity-slack: must be an integer"),
        ("[scheduling]\naffinity-slack = 2.5", "scheduling.affinity-slack: must be an integer"),
        ("[scheduling]\naffinity-slack = true", "scheduling.affinity-slack: must be an integer"),
        (
            "[scheduling]\naffinity-slack = 99999999999999999",
            "scheduling.affinity-slack: must be an integer",
        ),
        ("[scheduling]\nslack = 2", "scheduling: unknown key"),
    ],
)
def test_a_bad_scheduling_table_says_what_is_wrong(tmp_path: Path, table: str, why: str) -> None:
    assert why in refusal(tmp_path / "fleet.toml", table + "\n" + HEAD)


# -- [queue] and [nodes.parallel] (docs/fleet-scheduling.md#the-queue) ---------------------------

NODE = HEAD + 'ollama = "http://127.0.0.1:11434"\n'


def test_the_queue_is_on_by_default_with_its_documented_bounds(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(NODE)
    fleet = load_fleet(path)
    assert fleet.queue == QueueOptions(True, 120.0, 256, 10.0)
    assert fleet.nodes[0].parallel == {}
    path.write_text(
        '[queue]\nenabled = false\nmax-wait = "30s"\nmax-depth = 8\ncollate = "2s"\n'
        + NODE
        + "[nodes.parallel]\nollama = 4\n"
    )
    fleet = load_fleet(path)
    assert fleet.queue == QueueOptions(False, 30.0, 8, 2.0)
    assert fleet.nodes[0].parallel == {"ollama": 4}


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ("queue = 1\n" + NODE, "queue: must be a table"),
        ('[queue]\nenabled = "no"\n' + NODE, "queue.enabled: must be true or false"),
        ("[queue]\nmax-depth = 0\n" + NODE, "queue.max-depth: must be an integer in 1-"),
        ("[queue]\nmax-depth = true\n" + NODE, "queue.max-depth: must be an integer"),
        ('[queue]\nmax-wait = "0s"\n' + NODE, "queue.max-wait: must be a positive duration"),
        ('[queue]\ncollate = "soon"\n' + NODE, "queue.collate: must be a positive duration"),
        ("[queue]\ndepth = 3\n" + NODE, "queue: unknown key"),
        (NODE + "[nodes.parallel]\nollama = 0\n", "nodes[0].parallel.ollama: must be an integer"),
        (NODE + "[nodes.parallel]\nollama = 2.5\n", "nodes[0].parallel.ollama: must be an integer"),
        (NODE + "[nodes.parallel]\nvllm = 2\n", "nodes[0].parallel.vllm: unknown engine"),
        (NODE + "[nodes.parallel]\nllamacpp = 2\n", "the node has no engines.llamacpp URL"),
        (
            '[facades.ollama]\n[[nodes]]\nid = "a"\nparallel = 2\n'
            '[nodes.engines]\nollama = "http://127.0.0.1:11434"\n',
            "nodes[0].parallel: must be a table",
        ),
    ],
)
def test_a_bad_queue_table_says_what_is_wrong(tmp_path: Path, table: str, why: str) -> None:
    assert why in refusal(tmp_path / "fleet.toml", table)
