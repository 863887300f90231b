"""``make test-engine-suite`` (docs/engine-suite.md): the target and its page are there, the two
runs are compared as the page says, and what the plugin hands the proxy is a fleet file it takes.

The suite itself is never run here: it takes minutes and a venv of its own.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvpair.fleet.file import load_fleet
from tools.engine_suite.compare import (
    BUG,
    MISSING,
    Difference,
    Run,
    cause,
    differences,
    summary,
    unaccepted,
)
from tools.engine_suite.design import DOCUMENTED
from tools.engine_suite.plugin import fleet_file, key_file, needs_download

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "engine-suite.md"


def test_the_target_runs_the_suite_and_make_test_does_not() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test-engine-suite:.*\n\t(.*)$", makefile, re.MULTILINE)
    assert recipe is not None
    assert "-m tools.engine_suite" in recipe[1]
    test_rule = re.search(r"^test:(.*)$", makefile, re.MULTILINE)
    assert test_rule is not None and "engine-suite" not in test_rule[1]


def test_the_page_is_indexed_and_gives_the_numbers() -> None:
    assert "(engine-suite.md)" in (ROOT / "docs" / "README.md").read_text()
    page = PAGE.read_text()
    for column in ("collected", "passed", "differing"):
        assert column in page


def test_every_documented_difference_is_on_the_page() -> None:
    page = PAGE.read_text()
    for test in DOCUMENTED:
        name = test.rstrip("[:").rsplit("::", 1)[-1]
        assert f"`{name}`" in page, test


DIRECT = Run(
    4,
    {"a.py::one": "passed", "a.py::two": "passed", "a.py::three": "failed", "b.py::x": "skipped"},
)


def test_equal_outcomes_differ_in_nothing() -> None:
    assert differences(DIRECT, DIRECT) == []


def test_a_test_whose_outcome_changed_is_listed_with_both_outcomes_and_why() -> None:
    proxied = Run(
        4,
        {**DIRECT.outcomes, "a.py::two": "failed", "a.py::three": "passed"},
        {"a.py::two": "assert 502 == 200"},
    )
    assert differences(DIRECT, proxied) == [
        Difference("a.py::three", "failed", "passed", "", None),
        Difference("a.py::two", "passed", "failed", "assert 502 == 200", None),
    ]


def test_a_test_only_one_run_has_differs() -> None:
    proxied = Run(3, {k: v for k, v in DIRECT.outcomes.items() if k != "a.py::one"})
    (only,) = differences(DIRECT, proxied)
    assert (only.test, only.direct, only.proxied) == ("a.py::one", "passed", MISSING)


def test_a_documented_difference_carries_its_cause() -> None:
    proxied = Run(4, {**DIRECT.outcomes, "a.py::one": "failed"})
    (found,) = differences(DIRECT, proxied, {"a.py::one": "by design"})
    assert found.cause == "by design"


def test_a_prefix_documents_every_parameter_or_file_but_no_longer_name() -> None:
    documented = {"a.py::cors[": "preflight", "b.py::": "file", "a.py::one": "exact"}
    assert cause("a.py::cors[x-y]", documented) == "preflight"
    assert cause("b.py::anything", documented) == "file"
    assert cause("a.py::one", documented) == "exact"
    assert cause("a.py::one_more", documented) is None
    assert cause("a.py::cors_other", documented) is None


def test_the_summary_counts_each_run_and_marks_what_is_not_documented() -> None:
    proxied = Run(4, {**DIRECT.outcomes, "a.py::one": "error"}, {"a.py::one": "boom"})
    lines = summary(DIRECT, proxied, differences(DIRECT, proxied))
    assert lines[1].split() == ["direct", "4", "3", "2", "1", "0", "1"]
    assert lines[2].split() == ["proxied", "4", "3", "1", "1", "1", "1"]
    assert lines[3] == "differing: 1 (0 by design, 0 known bugs, 1 not documented)"
    assert "NOT DOCUMENTED" in lines[5] and "boom" in lines[6]


def test_the_target_fails_on_a_known_bug_or_an_unexplained_difference() -> None:
    proxied = Run(4, {**DIRECT.outcomes, "a.py::one": "failed", "a.py::two": "failed"})
    proxied = Run(4, {**proxied.outcomes, "a.py::three": "passed"})
    documented = {"a.py::one": "design: the preflight", "a.py::two": f"{BUG}the key header"}
    found = differences(DIRECT, proxied, documented)
    assert [d.test for d in unaccepted(found)] == ["a.py::three", "a.py::two"]
    assert "(1 by design, 1 known bugs, 1 not documented)" in summary(DIRECT, proxied, found)[3]


def server(**fields: object) -> SimpleNamespace:
    """A stand-in for the suite's ``ServerProcess``: no model, no download."""
    defaults = dict.fromkeys(
        ("model_url", "model_draft", "mmproj_url", "lora_files", "models_preset", "model_file")
    )
    defaults.update(model_hf_repo=None, model_hf_file=None)
    return SimpleNamespace(**{**defaults, **fields})


def test_only_the_stories_model_is_stood_in_for() -> None:
    assert needs_download(server(model_hf_repo="ggml-org/test-model-stories260K")) is None
    assert needs_download(server()) is None  # a router with no model
    needed = needs_download(server(model_hf_repo="ggml-org/tinygemma3-GGUF:Q8_0"))
    assert needed is not None and "tinygemma3" in needed
    assert needs_download(server(model_draft="draft.gguf")) is not None
    assert needs_download(server(model_file="/nowhere/model.gguf")) is not None


def test_the_plugins_fleet_file_is_one_the_proxy_takes(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(key_file("sk-secret"))
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_file(18080, "http://127.0.0.1:18081", "tinyllama-2", True, keys))
    parsed = load_fleet(fleet, {"NVPAIR_SUITE_NODE_KEY": "sk-secret"})
    (node,) = parsed.nodes
    assert node.engines == {"llamacpp": "http://127.0.0.1:18081"}
    assert parsed.facades["llamacpp"].port == 18080
    assert parsed.authorizations() == {"http://127.0.0.1:18081": b"Bearer sk-secret"}
    assert parsed.access is not None


@pytest.mark.parametrize("served", [None, "tiny.gguf"])
def test_a_fleet_file_without_a_key_has_no_access_table(tmp_path: Path, served: str | None) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_file(18080, "http://127.0.0.1:18081", served, False, None))
    assert load_fleet(fleet, {}).access is None
