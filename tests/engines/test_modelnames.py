"""The names people use for a model (nvpair/engines/modelnames.py, nvpair/fleet/nodes.py;
docs/model-names.md): GGUF file names, ``[models]`` aliases, who owns each name and which name
each owner is sent. No reactor: values in, values out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.control.routing import Tier, tier
from nvpair.control.state import Discovery, Node
from nvpair.engines.loadstate import LoadState
from nvpair.engines.modelnames import NO_ALIASES, AliasError, Aliases, file_names, known_names
from nvpair.engines.table import LLAMACPP, LMSTUDIO, OLLAMA, Engine
from nvpair.fleet.nodes import discovery_nodes

# -- file names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "names"),
    [
        ("/models/qwen2.5-7b-q4.gguf", ("qwen2.5-7b-q4.gguf", "qwen2.5-7b-q4")),
        ("C:\\models\\qwen2.5-7b-q4.gguf", ("qwen2.5-7b-q4.gguf", "qwen2.5-7b-q4")),
        ("qwen2.5-7b-q4.gguf", ("qwen2.5-7b-q4",)),
        ("models/Q.GGUF", ("Q.GGUF", "Q")),
        ("lmstudio-community/Q-GGUF/q4.gguf", ("q4.gguf", "q4")),
        ("publisher/model", ("model",)),
        ("qwen2.5-7b-instruct", ()),
        ("models/", ()),
        (".gguf", ()),
        ("/m/.gguf", (".gguf",)),
        ("", ()),
    ],
)
def test_a_path_id_is_known_by_its_file_name_with_and_without_gguf(
    model_id: str, names: tuple[str, ...]
) -> None:
    """docs/model-names.md#file-names: the table there, and what is no name (empty, the id)."""
    assert file_names(model_id) == names


@given(st.text())
def test_file_names_are_never_empty_never_the_id_and_hold_no_separator(model_id: str) -> None:
    for name in file_names(model_id):
        assert name and name != model_id
        assert "/" not in name and "\\" not in name
    assert len(set(file_names(model_id))) == len(file_names(model_id))


# -- the [models] table ---------------------------------------------------------------------------


def test_an_alias_table_keeps_the_files_order() -> None:
    aliases = Aliases.parse({"b": ["x", "y"], "a": ["z"]})
    assert aliases.table == (("b", ("x", "y")), ("a", ("z",)))
    assert Aliases.parse({}) == Aliases()


ALSO = "is also a model name the table lists"
EITHER = "a name is either an alias or a model's own"


@pytest.mark.parametrize(
    ("table", "where", "why"),
    [
        (["x"], "", 'must be a table of "alias" = ["name", ...]'),
        ({"": ["x"]}, '.""', "an alias must not be empty"),
        ({"a": []}, '."a"', "must be a non-empty array of model names"),
        ({"a": "x"}, '."a"', "must be a non-empty array of model names"),
        ({"a": ["x", 3]}, '."a"', "every model name must be a non-empty string"),
        ({"a": ["x", ""]}, '."a"', "every model name must be a non-empty string"),
        ({"a": ["x", "x"]}, '."a"', "lists 'x' twice"),
        ({"a": ["a"]}, '."a"', f"'a' {ALSO}: {EITHER}"),
        ({"a": ["x"], "x": ["y"]}, '."x"', f"'x' {ALSO}: {EITHER}"),
        (
            {"qwen": ["/m/qwen.gguf"]},
            '."qwen"',
            f"'qwen' {ALSO} (the file name of '/m/qwen.gguf'): {EITHER}",
        ),
        (
            {"Llama3": ["x"], "llama3:latest": ["y"]},
            '."llama3:latest"',
            "'llama3:latest' and 'Llama3' are one name to Ollama",
        ),
        ({"llama3": ["Llama3:latest"]}, '."llama3"', f"'llama3' {ALSO}: {EITHER}"),
    ],
)
def test_an_unusable_table_says_which_alias_and_why(table: object, where: str, why: str) -> None:
    """docs/model-names.md#conflicts: a name is either an alias or a model's own."""
    with pytest.raises(AliasError) as refused:
        Aliases.parse(table)
    assert (refused.value.where, refused.value.why) == (where, why)
    assert str(refused.value) == f"models{where}: {why}"


# -- known names ----------------------------------------------------------------------------------


def names_of(
    engine: Engine, inventories: Sequence[Sequence[str]], aliases: Aliases
) -> list[dict[str, str]]:
    """Per node: other name -> the node's own name for it."""
    found = known_names(engine, inventories, aliases)
    return [{o.name: o.reported for o in node} for node in found.others]


def test_the_same_gguf_under_three_paths_is_one_model_on_three_nodes() -> None:
    inventories = [["/a/qwen.gguf"], ["/b/c/qwen.gguf"], ["qwen.gguf"]]
    assert names_of(LLAMACPP, inventories, Aliases()) == [
        {"qwen.gguf": "/a/qwen.gguf", "qwen": "/a/qwen.gguf"},
        {"qwen.gguf": "/b/c/qwen.gguf", "qwen": "/b/c/qwen.gguf"},
        # Its own name stays its own: only the name without .gguf is another.
        {"qwen": "qwen.gguf"},
    ]


def test_ollama_names_derive_nothing() -> None:
    """docs/model-names.md#file-names: Ollama names keep Ollama's rules; hf.co/x/y is a name."""
    assert names_of(OLLAMA, [["hf.co/bartowski/qwen-gguf:Q4_K_M"]], Aliases()) == [{}]


def test_lm_studio_path_ids_derive_file_names() -> None:
    assert names_of(LMSTUDIO, [["pub/Q-GGUF/q4.gguf", "plain"]], Aliases()) == [
        {"q4.gguf": "pub/Q-GGUF/q4.gguf", "q4": "pub/Q-GGUF/q4.gguf"}
    ]


def test_a_node_with_two_paths_of_one_file_name_is_known_by_it_for_the_first() -> None:
    assert names_of(LLAMACPP, [["/a/q.gguf", "/b/q.gguf"]], Aliases()) == [
        {"q.gguf": "/a/q.gguf", "q": "/a/q.gguf"}
    ]


LLAMA3 = Aliases.parse({"llama3": ["llama3.1:8b", "Meta-Llama-3.1-8B-Instruct-Q4_K_M"]})


def test_an_alias_names_whichever_of_its_models_each_node_has() -> None:
    """docs/model-names.md#aliases: one alias, an Ollama name and a llama.cpp file name."""
    assert names_of(OLLAMA, [["llama3.1:8B"], ["qwen2:7b"]], LLAMA3) == [
        {"llama3": "llama3.1:8B"},
        {},
    ]
    path = "/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"
    assert names_of(LLAMACPP, [[path]], LLAMA3) == [
        {
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf": path,
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M": path,
            "llama3": path,
        }
    ]


def test_a_node_with_several_of_an_aliases_models_gets_the_first_in_the_tables_order() -> None:
    aliases = Aliases.parse({"best": ["b", "a"]})
    assert names_of(LLAMACPP, [["a", "b"]], aliases) == [{"best": "b"}]


def test_an_alias_a_node_reports_is_shadowed_on_that_engine_only() -> None:
    """docs/model-names.md#conflicts: the reported name wins, on that engine."""
    aliases = Aliases.parse({"qwen": ["x"]})
    found = known_names(LLAMACPP, [["/m/qwen.gguf"], ["x"]], aliases)
    assert found.shadowed == ("qwen",)
    assert [o.name for o in found.others[1]] == []
    assert names_of(LMSTUDIO, [["x"]], aliases) == [{"qwen": "x"}]
    ollama = known_names(OLLAMA, [["Qwen:latest"], ["x"]], aliases)
    assert ollama.shadowed == ("qwen",)


def test_keys_are_every_name_a_node_answers_to() -> None:
    found = known_names(OLLAMA, [["llama3.1:8b"]], LLAMA3)
    assert found.keys == (
        frozenset(
            {"registry.ollama.ai/library/llama3.1:8b", "registry.ollama.ai/library/llama3:latest"}
        ),
    )


# -- owners and own names, through discovery -----------------------------------------------------


def discovery(
    engine: Engine, inventories: Mapping[str, Sequence[str]], aliases: Aliases = NO_ALIASES
) -> Discovery:
    answered = {node: tuple(models) for node, models in inventories.items()}
    urls = {node: f"http://{node}:1" for node in inventories}
    return Discovery(discovery_nodes(engine, answered, urls, aliases).nodes)


def owners(snapshot: Discovery, engine: Engine, requested: str) -> dict[str, str | None]:
    """Each owner of ``requested`` with the name it is sent (None: as the client wrote it)."""
    key = engine.model_key(requested)
    return {node.id: node.own_name(key) for node in snapshot.owners(key)}


def test_a_file_name_finds_every_node_serving_that_file_each_sent_its_own_path() -> None:
    snapshot = discovery(LLAMACPP, {"a": ["/a/q.gguf"], "b": ["/b/q.gguf"], "c": ["q.gguf"]})
    assert owners(snapshot, LLAMACPP, "q") == {"a": "/a/q.gguf", "b": "/b/q.gguf", "c": "q.gguf"}
    assert owners(snapshot, LLAMACPP, "q.gguf") == {"a": "/a/q.gguf", "b": "/b/q.gguf", "c": None}
    assert owners(snapshot, LLAMACPP, "/a/q.gguf") == {"a": None}
    assert owners(snapshot, LLAMACPP, "Q") == {}


def test_an_alias_finds_every_owner_of_any_of_its_models() -> None:
    aliases = Aliases.parse({"chat": ["small", "big.gguf"]})
    snapshot = discovery(LLAMACPP, {"a": ["small"], "b": ["/m/big.gguf"], "c": ["other"]}, aliases)
    assert owners(snapshot, LLAMACPP, "chat") == {"a": "small", "b": "/m/big.gguf"}


def test_an_ollama_alias_compares_by_ollamas_rules_and_is_sent_as_the_nodes_name() -> None:
    snapshot = discovery(OLLAMA, {"a": ["llama3.1:8b"]}, LLAMA3)
    for spelling in ("llama3", "Llama3", "llama3:latest", "library/llama3"):
        assert owners(snapshot, OLLAMA, spelling) == {"a": "llama3.1:8b"}
    # A reported name, however spelled, goes as written.
    assert owners(snapshot, OLLAMA, "LLAMA3.1:8b") == {"a": None}


def test_without_other_names_nothing_changes() -> None:
    """Broker mode's nodes (and a fleet with no path ids, no [models]): no node renames."""
    node = Node("a", False, "http://a:1", ("m",), frozenset({"m"}))
    assert node.own_name("m") is None and node.own_key("m") == "m"
    assert node.own_name(None) is None and node.own_key(None) is None


def test_warm_first_order_looks_an_other_name_up_under_the_nodes_own() -> None:
    """docs/model-names.md#load-state-and-order: Ollama lists /api/ps under its own names."""
    (node,) = discovery(OLLAMA, {"a": ["llama3.1:8b"]}, LLAMA3).nodes
    alias = OLLAMA.model_key("llama3")
    warm = LoadState(warm=frozenset({OLLAMA.model_key("llama3.1:8b")}))
    assert tier(node, alias, warm, 0) is Tier.WARM_FREE
    assert tier(node, alias, LoadState(warm=frozenset()), 0) is Tier.COLD
    assert node.own_key(alias) == OLLAMA.model_key("llama3.1:8b")


# -- properties -----------------------------------------------------------------------------------

_stems = st.sampled_from(["q", "qwen", "llama", "Q"])
_ids = st.one_of(
    st.builds(lambda d, s: f"/{d}/{s}.gguf", st.sampled_from(["a", "b", "a/b"]), _stems),
    st.builds(lambda s: f"{s}.gguf", _stems),
    _stems,
    st.sampled_from(["x", "other"]),
)
_inventories = st.dictionaries(
    st.sampled_from(["n1", "n2", "n3", "n4"]), st.lists(_ids, max_size=4), max_size=4
)
_tables = st.dictionaries(
    st.sampled_from(["chat", "code", "big"]),
    st.lists(
        st.one_of(_ids, st.sampled_from(["q.gguf", "qwen"])), min_size=1, max_size=3, unique=True
    ),
    max_size=3,
)


def _aliases(table: dict[str, list[str]]) -> Aliases | None:
    try:
        return Aliases.parse(table)
    except AliasError:
        return None


_valid_aliases = _tables.map(_aliases).filter(lambda aliases: aliases is not None)


@given(_inventories, _valid_aliases, st.one_of(_ids, st.sampled_from(["chat", "code", "big", "q"])))
def test_every_owner_is_sent_a_name_it_reports_and_reporters_always_own_their_names(
    inventories: dict[str, list[str]], aliases: Aliases, requested: str
) -> None:
    """For any fleet and any request: each owner gets one of its own reported names (or the
    client's, when it is one); every node reporting the name is an owner and gets it as
    written; a name no node has and no alias names has no owner."""
    snapshot = discovery(LLAMACPP, inventories, aliases)
    found = owners(snapshot, LLAMACPP, requested)
    for node_id, sent in found.items():
        reported = inventories[node_id]
        assert (sent is None and requested in reported) or sent in reported
    for node_id, reported in inventories.items():
        if requested in reported:
            assert found[node_id] is None
    named = {
        name
        for models in inventories.values()
        for model in models
        for name in (model, *file_names(model))
    }
    aliased = {alias for alias, _ in aliases.table}
    if requested not in named and requested not in aliased:
        assert found == {}


@given(_inventories, _valid_aliases)
def test_an_alias_owns_exactly_the_owners_of_its_models_unless_shadowed(
    inventories: dict[str, list[str]], aliases: Aliases
) -> None:
    snapshot = discovery(LLAMACPP, inventories, aliases)
    shadowed = known_names(LLAMACPP, list(inventories.values()), aliases).shadowed
    for alias, models in aliases.table:
        if alias in shadowed:
            continue
        expected = {node for model in models for node in owners(snapshot, LLAMACPP, model)}
        assert set(owners(snapshot, LLAMACPP, alias)) == expected


@given(_inventories, _valid_aliases)
def test_names_are_order_stable_and_deterministic(
    inventories: dict[str, list[str]], aliases: Aliases
) -> None:
    first = known_names(LLAMACPP, list(inventories.values()), aliases)
    assert first == known_names(LLAMACPP, list(inventories.values()), aliases)
    for others in first.others:
        assert len({o.key for o in others}) == len(others)


def test_a_routers_slots_are_read_under_the_nodes_own_name() -> None:
    """A llama.cpp router reports each loaded model's slots by its id: an alias of a model
    whose one slot is busy is busy, not free (docs/model-names.md#load-state-and-order)."""
    (node,) = discovery(
        LLAMACPP, {"r": ["alpha", "beta"]}, Aliases.parse({"chat": ["alpha"]})
    ).nodes
    busy = LoadState(warm=frozenset({"alpha"}), model_slots=(("alpha", 1, 1),))
    assert tier(node, "chat", busy, 0) is Tier.WARM_BUSY
    assert (
        tier(node, "chat", LoadState(warm=frozenset({"alpha"}), model_slots=(("alpha", 1, 0),)), 0)
        is Tier.WARM_FREE
    )
