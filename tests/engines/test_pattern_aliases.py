"""Pattern aliases in ``[models]`` (issue 32 item 2; docs/model-names.md#pattern-aliases): the
names clients hard-code find a model when no name the fleet knows is theirs, the longest
pattern first, and a pattern is never a name — not listed, not reachable by spelling it."""

from __future__ import annotations

import json
import operator

import pytest

from nvpair.control.naming import pattern_taking
from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState
from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.seams import PriorityScheduling
from nvpair.engines.inventory import merge_inventories
from nvpair.engines.modelnames import AliasError, Aliases
from nvpair.engines.patternnames import PatternKey, choose, ordered
from nvpair.engines.table import ENGINES, LLAMACPP, OPENAI, Dialect, RouteClass
from nvpair.facades.facade import Admitted
from nvpair.fleet.nodes import discovery_nodes

TABLE = {
    "fast": ["/m/qwen.gguf"],
    "gpt-*": ["qwen"],
    "claude-*": ["tiny"],
    "*": ["tiny"],
}


def fleet(table: dict[str, list[str]] = TABLE) -> ControlState:
    """Node a serves ``/m/qwen.gguf``, node b ``/x/tiny.gguf``, on llama.cpp."""
    state = ControlState()
    answered = {"a": ("/m/qwen.gguf",), "b": ("/x/tiny.gguf",)}
    found = discovery_nodes(
        LLAMACPP, answered, {"a": "http://a", "b": "http://b"}, Aliases.parse(table)
    )
    state.set_discovery("llamacpp", found.nodes, found.patterns)
    return state


def never_down(engine: str, key: str) -> bool:
    return False


def taken(state: ControlState, name: str, facade: Dialect = LLAMACPP) -> str | None:
    return pattern_taking(facade, name, state.discovery, never_down)


def test_parse_keeps_patterns_apart_longest_first_then_code_points() -> None:
    aliases = Aliases.parse({"*": ["a"], "gpt-?o": ["b"], "fast": ["c"], "gpt-4*": ["d"]})
    assert aliases.table == (("fast", ("c",)),)
    assert [pattern for pattern, _ in aliases.patterns] == ["gpt-4*", "gpt-?o", "*"]
    assert ordered(["a*", "A*", "bb*", "a*"]) == ("bb*", "A*", "a*")


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ({"gpt-[45": ["x"]}, "is no shell-style pattern: the [ at 4 is never closed"),
        ({"gpt-*": []}, "must be a non-empty array of model names"),
        ({"gpt-*": ["x", "x"]}, "lists 'x' twice"),
        ({"gpt-*": [""]}, "every model name must be a non-empty string"),
        # A plain alias that a pattern names as a model: a name is one or the other.
        ({"x": ["y"], "*": ["x"]}, "'x' is also a model name the table lists"),
    ],
)
def test_a_bad_pattern_is_a_usage_error_naming_it(table: dict[str, list[str]], why: str) -> None:
    with pytest.raises(AliasError) as error:
        Aliases.parse(table)
    assert why in str(error.value)


def test_closed_brackets_and_a_pattern_that_matches_its_own_model_are_fine() -> None:
    aliases = Aliases.parse({"gpt-[]4]*": ["x"], "[!a]*": ["y"], "*": ["tiny"]})
    assert len(aliases.patterns) == 3


def test_a_pattern_key_equals_no_name() -> None:
    """No spelling reaches a pattern's owners: its key is equal to no string, hashed apart."""
    key = PatternKey("*")
    # Either side of the comparison: a subclass's own __eq__ answers for both.
    assert key != "*" and operator.eq("*", key) is False
    assert key == PatternKey("*") and hash(key) == hash(PatternKey("*"))
    index: dict[str, int] = {key: 1}
    assert index.get("*") is None and "*" not in index and key in {PatternKey("*")}
    state = fleet()
    assert state.discovery("llamacpp").owners("*") == ()
    assert [n.id for n in state.discovery("llamacpp").owners(PatternKey("*"))] == ["b"]


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("gpt-3.5-turbo", "gpt-*"),
        ("davinci-002", "*"),
        ("test", "*"),
        ("claude-3-5-sonnet", "claude-*"),
        ("*", "*"),
        ("gpt-*", "gpt-*"),
        # Names the fleet knows: reported, file names, plain aliases.
        ("/m/qwen.gguf", None),
        ("qwen", None),
        ("tiny.gguf", None),
        ("fast", None),
    ],
)
def test_a_pattern_takes_only_a_name_nothing_else_matches(name: str, pattern: str | None) -> None:
    assert taken(fleet(), name) == pattern
    assert taken(fleet(), name, OPENAI) == pattern


def test_the_longest_pattern_decides_even_with_no_owner() -> None:
    """``gpt-*`` names a model no node has: it still takes ``gpt-4``, which then finds no
    owner, rather than falling through to ``*``."""
    state = fleet({"gpt-*": ["nowhere"], "*": ["tiny"]})
    assert taken(state, "gpt-4") == "gpt-*"
    assert state.discovery("llamacpp").owners(PatternKey("gpt-*")) == ()


def test_a_name_whose_owners_are_down_is_no_name_for_a_pattern() -> None:
    state = fleet()

    def down(engine: str, key: str) -> bool:
        return key == "llama3"

    assert pattern_taking(LLAMACPP, "llama3", state.discovery, down) is None
    assert pattern_taking(LLAMACPP, "mistral", state.discovery, down) == "*"


def test_no_pattern_anywhere_takes_nothing() -> None:
    assert taken(fleet({"fast": ["/m/qwen.gguf"]}), "gpt-4") is None


def test_ollama_compares_patterns_as_it_compares_names() -> None:
    assert choose(("gpt-*",), "GPT-4", folds=True) == "gpt-*"
    assert choose(("gpt-*",), "GPT-4", folds=False) is None


def admitted(name: str, route: RouteClass = RouteClass.INFERENCE) -> Admitted:
    body = json.dumps({"model": name}).encode()
    return Admitted(LLAMACPP, route, b"POST", "/v1/chat/completions", b"/", body, name, name)


def test_a_taken_request_goes_to_the_pattern_s_owners_each_with_its_own_name() -> None:
    state = fleet()
    candidates = Candidates(state, Reservations(), PriorityScheduling(state))
    request = candidates.resolved(admitted("gpt-3.5-turbo"))
    assert request.pattern == "gpt-*" and request.model == "gpt-3.5-turbo"
    (node,) = candidates.owners("llamacpp", request)
    assert node.id == "a" and node.own_name(request.model_key) == "/m/qwen.gguf"
    # Only inference: a route that acts on the model it names never acts on another.
    other = candidates.resolved(admitted("gpt-3.5-turbo", RouteClass.OTHER))
    assert other.pattern is None and candidates.owners("llamacpp", other) == []


def test_a_pattern_is_no_name_of_its_model() -> None:
    """Neither a name a key's patterns match (``names_of``) nor one a model list shows."""
    state = fleet()
    discovery = state.discovery("llamacpp")
    assert "*" not in discovery.names_of("/x/tiny.gguf")
    assert "gpt-*" not in discovery.names_of("/m/qwen.gguf")
    lists = [
        json.dumps({"object": "list", "data": [{"id": m, "object": "model"}]}).encode()
        for m in ("/m/qwen.gguf", "/x/tiny.gguf")
    ]
    others = [other for node in discovery.nodes for other in node.other_names]
    merged = json.loads(merge_inventories(LLAMACPP, "/v1/models", lists, others))
    ids = [entry["id"] for entry in merged["data"]]
    assert ids == ["/m/qwen.gguf", "qwen.gguf", "qwen", "fast", "/x/tiny.gguf", "tiny.gguf", "tiny"]


def test_reload_replaces_the_patterns() -> None:
    state = fleet()
    assert taken(state, "gpt-4") == "gpt-*"
    found = discovery_nodes(
        ENGINES["llamacpp"],
        {"b": ("/x/tiny.gguf",)},
        {"b": "http://b"},
        Aliases.parse({"gpt-4*": ["tiny"]}),
    )
    state.set_discovery("llamacpp", found.nodes, found.patterns)
    assert taken(state, "gpt-4") == "gpt-4*" and taken(state, "test") is None
