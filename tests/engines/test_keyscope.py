"""A key is judged on the model a request resolves to, never on its spelling (issue 29 items
1-3; docs/lan.md#what-a-key-can-and-cannot-do): the pure judgement over discovery snapshots,
every model a request names, ambiguous bodies, the management routes, and a property test
over generated names that a keyed request reaches only models its key may use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvpair.control.keyscope import KeyScope
from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState
from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.requestpath import key_refusal
from nvpair.dispatch.seams import PriorityScheduling
from nvpair.engines.admission import BadBody, query_models, read_body, routing_path, wide_escape
from nvpair.engines.caller import Caller, permits
from nvpair.engines.modelnames import NO_ALIASES, Aliases
from nvpair.engines.names import parse_ollama_name
from nvpair.engines.table import (
    ENGINES,
    LLAMACPP,
    LMSTUDIO,
    OLLAMA,
    OPENAI,
    Dialect,
    Engine,
    RouteClass,
)
from nvpair.facades.facade import Admitted
from nvpair.fleet.nodes import discovery_nodes

INF, OTHER = RouteClass.INFERENCE, RouteClass.OTHER


def control(
    fleet: Mapping[str, Mapping[str, Sequence[str]]], aliases: Aliases = NO_ALIASES
) -> ControlState:
    """A control state whose engines' nodes report these models (engine id -> node id ->
    names)."""
    state = ControlState()
    for engine_id, nodes in fleet.items():
        engine = ENGINES[engine_id]
        answered = {node: tuple(models) for node, models in nodes.items()}
        urls = {node: f"http://{node}" for node in nodes}
        found = discovery_nodes(engine, answered, urls, aliases)
        state.set_discovery(engine.id, found.nodes, found.patterns)
    return state


def admitted(
    facade: Dialect,
    body: bytes,
    caller: Caller,
    path: str = "/api/chat",
    route: RouteClass = INF,
    method: bytes = b"POST",
    uri: bytes | None = None,
) -> Admitted:
    """A request as the facade admits it: its body read by admission itself."""
    uri = path.encode() if uri is None else uri
    path = routing_path(uri.partition(b"?")[0])
    model, _, member, others, opaque = read_body(facade, route, path, body)
    if b"?" in uri:
        others = (*others, *query_models(uri))
    named = facade.path_model(path)
    if named is not None:
        others = (*others, named)
    return Admitted(
        facade,
        route,
        method,
        path,
        uri,
        body,
        model,
        None if model is None else facade.model_key(model),
        caller=caller,
        member=member,
        others=others,
        opaque=opaque,
    )


def refused(state: ControlState, request: Admitted) -> str | None:
    found = key_refusal(request, state)
    return None if found is None else found.reason.value


def phone(*patterns: str, manage: bool = False) -> Caller:
    return Caller("phone", patterns, manage=manage, lan=True)


OLLAMA_FLEET = {"ollama": {"a": ["llama3:latest", "secret:latest", "llama3/secret:latest"]}}


@pytest.mark.parametrize(
    "name",
    [
        "llama3://registry.ollama.ai/library/secret",
        "llama3://registry.ollama.ai/library/secret:latest",
        "LLAMA3://REGISTRY.OLLAMA.AI/LIBRARY/SECRET",
        "llama3x://registry.ollama.ai/library/secret",
        "registry.ollama.ai/library/secret",
        "library/secret",
        "Secret",
        # Source suffixes: Ollama drops them before parsing.
        "llama3://registry.ollama.ai/library/secret:local",
        "llama3://registry.ollama.ai/library/secret:latest:local",
        # Invalid to our parser: no name a key may use.
        "llama3:",
        "llama3 ",
    ],
)
@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_a_spelling_cannot_reach_a_model_the_key_may_not_use(name: str, path: str) -> None:
    state = control(OLLAMA_FLEET)
    body = b'{"model":"%s","messages":[]}' % name.encode()
    assert refused(state, admitted(OLLAMA, body, phone("llama3*"), path)) == "forbidden-model"


@pytest.mark.parametrize(
    "name",
    ["llama3", "Llama3", "llama3:latest", "library/llama3", "registry.ollama.ai/library/llama3"],
)
def test_every_spelling_of_an_allowed_model_is_allowed(name: str) -> None:
    state = control(OLLAMA_FLEET)
    body = b'{"model":"%s"}' % name.encode()
    for patterns in (("llama3*",), ("llama3",), ("LLAMA3:latest",)):
        assert refused(state, admitted(OLLAMA, body, phone(*patterns))) is None


def test_a_pattern_without_a_slash_matches_short_names_only() -> None:
    """``llama3/secret`` (a namespace) and ``llama3.evil.com/x/y`` (a registry) are not what
    ``llama3*`` names; a pattern that says ``/`` may name them."""
    state = control(OLLAMA_FLEET)
    for name in (b"llama3/secret", b"llama3.evil.com/library/x"):
        body = b'{"model":"%s"}' % name
        assert refused(state, admitted(OLLAMA, body, phone("llama3*"))) == "forbidden-model"
    body = b'{"model":"llama3/secret"}'
    assert refused(state, admitted(OLLAMA, body, phone("llama3/*"))) is None


def test_the_openai_facade_judges_an_ollama_node_s_model_as_ollama_reads_it() -> None:
    state = control({**OLLAMA_FLEET, "llamacpp": {"c": ["/m/qwen-7b.gguf"]}})
    scheme = b'{"model":"llama3://registry.ollama.ai/library/secret"}'
    request = admitted(OPENAI, scheme, phone("llama3*"), "/v1/chat/completions")
    assert refused(state, request) == "forbidden-model"
    allowed = admitted(OPENAI, b'{"model":"llama3"}', phone("llama3*"), "/v1/chat/completions")
    assert refused(state, allowed) is None
    gguf = admitted(OPENAI, b'{"model":"qwen-7b"}', phone("qwen*"), "/v1/chat/completions")
    assert refused(state, gguf) is None


def test_an_alias_is_judged_node_by_node_and_the_request_goes_only_where_allowed() -> None:
    """``fast`` stands for llama3 on one node and for secret on the other: a key allowed
    ``llama3*`` asking for ``fast`` reaches only the llama3 node."""
    aliases = Aliases.parse({"fast": ["llama3:latest", "secret:latest"]})
    state = control({"ollama": {"a": ["llama3:latest"], "b": ["secret:latest"]}}, aliases)
    request = admitted(OLLAMA, b'{"model":"fast"}', phone("llama3*"))
    assert refused(state, request) is None
    candidates = Candidates(state, Reservations(), PriorityScheduling(state))
    assert [node.id for node in candidates.owners("ollama", request)] == ["a"]
    node_b = state.discovery("ollama").node("b")
    assert node_b is not None and candidates.live(request, node_b) is None
    # A key allowed "fast" may use both, by the alias and by their own names.
    for name in (b"fast", b"secret", b"llama3"):
        assert refused(state, admitted(OLLAMA, b'{"model":"%s"}' % name, phone("fast"))) is None
    only_b = control({"ollama": {"b": ["secret:latest"]}}, aliases)
    assert refused(only_b, admitted(OLLAMA, b'{"model":"fast"}', phone("llama3*"))) == (
        "forbidden-model"
    )


def test_file_names_judge_the_model_they_stand_for() -> None:
    state = control({"llamacpp": {"a": ["/models/qwen2.5-7b-q4.gguf", "/models/secret.gguf"]}})
    for name in (b"qwen2.5-7b-q4", b"qwen2.5-7b-q4.gguf", b"/models/qwen2.5-7b-q4.gguf"):
        body = b'{"model":"%s"}' % name
        request = admitted(LLAMACPP, body, phone("qwen*"), "/v1/chat/completions")
        assert refused(state, request) is None
    secret = admitted(LLAMACPP, b'{"model":"secret"}', phone("qwen*"), "/v1/chat/completions")
    assert refused(state, secret) == "forbidden-model"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/copy", b'{"source":"secret","destination":"llama3-copy"}'),
        ("/api/copy", b'{"source":"llama3","destination":"secret"}'),
        ("/api/create", b'{"model":"llama3-mine","from":"secret"}'),
        ("/api/show", b'{"model":"llama3","name":"secret"}'),
        ("/api/show", b'{"Model":"secret"}'),
        ("/api/show", b'{"NAME":"secret"}'),
        ("/api/delete", b'{"Name":"secret"}'),
    ],
)
def test_every_model_a_body_names_is_judged(path: str, body: bytes) -> None:
    state = control(OLLAMA_FLEET)
    request = admitted(OLLAMA, body, phone("llama3*", manage=True), path, OTHER)
    assert refused(state, request) == "forbidden-model"


def test_a_model_in_the_query_is_judged() -> None:
    state = control({"llamacpp": {"a": ["alpha", "beta"]}})
    for uri in (
        b"/props?model=beta",
        b"/props?autoload=true&mod%65l=beta",
        b"/props?model=alpha&model=beta",
    ):
        request = admitted(LLAMACPP, b"", phone("alpha"), "/props", OTHER, b"GET", uri)
        assert refused(state, request) == "forbidden-model", uri
    fine = admitted(LLAMACPP, b"", phone("alpha"), "/props", OTHER, b"GET", b"/props?model=alpha")
    assert refused(state, fine) is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"llama3","Model":"secret"}',
        b'{"model":"llama3","model":"secret"}',
        b'{"model":"llama3","\\u006dodel":"secret"}',
        b'{"model":"llama3","MODEL":"secret","messages":[]}',
        b'{"name":"a","NaMe":"b"}',
        '{"source":"a","\u017fource":"b"}'.encode(),  # Go folds the long s to "s"
    ],
)
def test_a_body_that_names_a_model_twice_is_refused(body: bytes) -> None:
    for route, path in ((INF, "/api/chat"), (OTHER, "/api/show"), (OTHER, "/api/copy")):
        with pytest.raises(BadBody) as error:
            read_body(OLLAMA, route, path, body)
        assert error.value.reason == "bad-json"


def test_exact_repeats_are_refused_on_every_engine_but_case_only_where_the_engine_folds() -> None:
    for engine in (LLAMACPP, LMSTUDIO, OPENAI):
        with pytest.raises(BadBody):
            read_body(engine, INF, "/v1/chat/completions", b'{"model":"a","model":"b"}')
    # llama.cpp reads "model" and nothing else.
    assert read_body(LLAMACPP, INF, "/v1/completions", b'{"model":"a","Model":"b"}').model == "a"
    with pytest.raises(BadBody):
        read_body(OPENAI, INF, "/v1/completions", b'{"model":"a","Model":"b"}')
    # A member repeated inside a message is no routing member.
    nested = b'{"model":"a","messages":[{"model":"x","model":"y"}],"x":"\\"model\\""}'
    assert read_body(OLLAMA, INF, "/api/chat", nested).model == "a"


def test_an_ollama_body_s_member_is_read_as_ollama_reads_it() -> None:
    read = read_body(OLLAMA, INF, "/api/chat", b'{"Model":"llama3"}')
    assert (read.model, read.member) == ("llama3", "Model")


@pytest.mark.parametrize(
    ("engine", "method", "path", "manages"),
    [
        (OLLAMA, b"POST", "/api/pull", True),
        (OLLAMA, b"DELETE", "/api/delete", True),
        (OLLAMA, b"POST", "/api/copy", True),
        (OLLAMA, b"POST", "/api/create", True),
        (OLLAMA, b"POST", "/api/push", True),
        (OLLAMA, b"HEAD", "/api/blobs/sha256:00", True),
        (OLLAMA, b"POST", "/api/show", False),
        (LLAMACPP, b"POST", "/models/load", True),
        (LLAMACPP, b"POST", "/models/unload", True),
        (LLAMACPP, b"POST", "/models", True),
        (LLAMACPP, b"GET", "/models", False),
        (LLAMACPP, b"POST", "/slots/0", True),
        (LLAMACPP, b"GET", "/slots", False),
        (LMSTUDIO, b"POST", "/api/v1/models/load", True),
        (LMSTUDIO, b"POST", "/api/v1/models/unload", True),
        (LMSTUDIO, b"POST", "/api/v1/models/download", True),
        (LMSTUDIO, b"POST", "/API/v1/Models/Load/", True),
    ],
)
def test_routes_that_change_what_an_engine_holds_need_manage(
    engine: Engine, method: bytes, path: str, manages: bool
) -> None:
    state = control({engine.id: {"a": ["llama3:latest"]}})
    request = admitted(engine, b"", phone(), path, engine.classify(method, path), method)
    assert refused(state, request) == ("forbidden-route" if manages else None)
    keyed = admitted(engine, b"", phone(manage=True), path, engine.classify(method, path), method)
    assert refused(state, keyed) is None
    loopback = admitted(engine, b"", Caller(), path, engine.classify(method, path), method)
    assert refused(state, loopback) is None


# -- the property ------------------------------------------------------------------------------

_PART = st.sampled_from(["llama3", "secret", "qwen2.5", "phi3", "Llama3", "SECRET", "mistral"])
_TAG = st.sampled_from(["latest", "8b", "Latest", "7b-q4", "local", "8b-cloud"])
_HOST = st.sampled_from(["registry.ollama.ai", "REGISTRY.ollama.ai", "hf.co", "llama3.local"])
_NS = st.sampled_from(["library", "Library", "llama3", "user"])


@st.composite
def ollama_names(draw: st.DrawFn) -> str:
    """Names as a client may write them: schemes, hosts, namespaces, tags, case, suffixes."""
    model = draw(_PART)
    shape = draw(st.integers(0, 3))
    name = model
    if shape >= 1:
        name = f"{draw(_NS)}/{name}"
    if shape >= 2:
        name = f"{draw(_HOST)}/{name}"
    if shape == 3:
        name = f"{draw(st.sampled_from(['llama3', 'https', 'x']))}://{name}"
    if draw(st.booleans()):
        name = f"{name}:{draw(_TAG)}"
    if draw(st.booleans()):
        name += draw(st.sampled_from([":local", ":cloud", ":", ".gguf"]))
    return name


_REPORTED = st.lists(
    st.sampled_from(
        [
            "llama3:latest",
            "llama3:8b",
            "secret:latest",
            "qwen2.5:7b-q4",
            "user/phi3:latest",
            "hf.co/user/mistral:latest",
            "llama3/secret:latest",
        ]
    ),
    min_size=1,
    max_size=4,
    unique=True,
)
_PATTERNS = st.lists(
    st.sampled_from(["llama3*", "llama3", "qwen*", "*:8b", "fast", "user/*", "LLAMA3:latest"]),
    min_size=1,
    max_size=2,
)


def _listed_names(state: ControlState, model_key: str) -> set[str]:
    """The oracle's names of a model: how a model list shows it (Ollama's shortest form), the
    same without its default tag, and every alias the fleet lists for it — lower-cased."""
    parsed = parse_ollama_name(model_key)
    assert parsed is not None
    shown = parsed.display().lower()
    names = {shown, parsed.key()}
    if shown.endswith(":latest"):
        names.add(shown[: -len(":latest")])
    for node in state.discovery("ollama").nodes:
        for other in node.other_names:
            if other.reported_key == model_key:
                names.add(other.name.lower())
                names.add(other.name.lower() + ":latest")
    return names


#: ``[models]`` pattern aliases (docs/model-names.md#pattern-aliases): none, one taking every
#: name nothing else matches, or ones whose text a key's patterns would match.
_PATTERN_ALIASES = st.sampled_from(
    [
        {},
        {"*": ["secret:latest"]},
        {"llama3*": ["secret:latest"], "*": ["llama3:latest"]},
        {"f*": ["secret:latest", "llama3:latest"], "qwen*": ["secret:latest"]},
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fleet=st.lists(_REPORTED, min_size=1, max_size=3),
    alias=st.sampled_from([None, ["llama3:latest", "secret:latest"], ["secret:latest"]]),
    caught=_PATTERN_ALIASES,
    patterns=_PATTERNS,
    name=st.one_of(ollama_names(), st.sampled_from(["fast", "Fast:latest", "llama3-x", "f"])),
    route=st.sampled_from([INF, OTHER]),
)
def test_a_keyed_request_reaches_only_models_its_key_may_use(
    fleet: list[list[str]],
    alias: list[str] | None,
    caught: dict[str, list[str]],
    patterns: list[str],
    name: str,
    route: RouteClass,
) -> None:
    """Admitted means every node it can be routed to holds a model one of the key's patterns
    matches under a name the fleet lists it by — a pattern alias being no such name, so a key
    allowed ``llama3*`` does not reach ``secret`` through ``"llama3*" = ["secret"]``; and a
    name no node holds and no pattern takes to a node is admitted only when Ollama would read
    it as such a name."""
    table = {**({"fast": alias} if alias else {}), **caught}
    aliases = Aliases.parse(table) if table else NO_ALIASES
    state = control({"ollama": {f"n{i}": models for i, models in enumerate(fleet)}}, aliases)
    body = b'{"model":%s}' % _json(name)
    path = "/api/chat" if route is INF else "/api/show"
    candidates = Candidates(state, Reservations(), PriorityScheduling(state))
    request = candidates.resolved(admitted(OLLAMA, body, phone(*patterns), path, route))
    if refused(state, request) is not None:
        return
    wanted = [p.lower() for p in patterns]

    def may_use(model_key: str) -> bool:
        # A pattern without "/" names models by their short names.
        return any(
            fnmatchcase(n, p) and ("/" in p or "/" not in n)
            for n in _listed_names(state, model_key)
            for p in wanted
        )

    key = request.model_key
    assert key is not None
    reached = candidates.owners("ollama", request)
    for node in reached:
        own = node.own_key(key)
        assert own is not None and may_use(own), (node.id, own)
    if not state.discovery("ollama").owners(key):
        # No node holds it: what Ollama reads the name as — with and without a source suffix
        # (Ollama drops it first) — must be a name the key may use.
        readings = [name] + [
            name[: -len(suffix)] for suffix in (":local", ":cloud") if name.lower().endswith(suffix)
        ]
        parsed = [parse_ollama_name(reading) for reading in readings]
        valid = [p for p in parsed if p is not None]
        assert valid
        assert all(may_use(p.key()) for p in valid)


def _json(text: str) -> bytes:
    import json

    return json.dumps(text).encode()


def test_permits_needs_every_reading_of_a_suffixed_name() -> None:
    assert permits(["llama3*"], OLLAMA, ["llama3:local"])
    assert not permits(["*:local"], OLLAMA, ["secret:local"])
    assert not permits(["llama3*"], OLLAMA, ["llama3://registry.ollama.ai/library/secret:local"])


# -- what the review found (issue 29, second reader) --------------------------------------------


@pytest.mark.parametrize(
    ("engine", "method", "target", "expected"),
    [
        (OLLAMA, b"POST", b"/api/p%75ll", "forbidden-route"),
        (OLLAMA, b"DELETE", b"/api/d%65lete", "forbidden-route"),
        (OLLAMA, b"POST", b"/api/%62lobs/sha256:0", "forbidden-route"),
        (OLLAMA, b"POST", b"/api/signout", "forbidden-route"),
        (LLAMACPP, b"POST", b"/models/lo%61d", "forbidden-route"),
        (LLAMACPP, b"POST", b"/slot%73/0?action=erase", "forbidden-route"),
        (LLAMACPP, b"POST", b"/props", "forbidden-route"),
        (LLAMACPP, b"POST", b"/lora-adapters", "forbidden-route"),
    ],
)
def test_a_route_is_judged_as_the_engine_routes_it_percent_decoded(
    engine: Engine, method: bytes, target: bytes, expected: str
) -> None:
    state = control({engine.id: {"a": ["llama3:latest"]}})
    path = routing_path(target.partition(b"?")[0])
    request = admitted(engine, b"", phone(), path, engine.classify(method, path), method, target)
    assert refused(state, request) == expected


def test_a_percent_encoded_inference_path_is_the_inference_route() -> None:
    path = routing_path(b"/v1/chat/c%6fmpletions")
    assert LLAMACPP.classify(b"POST", path) is INF
    request = admitted(LLAMACPP, b'{"messages":[]}', phone("alpha"), path, INF)
    assert refused(control({"llamacpp": {"a": ["alpha"]}}), request) == "forbidden-model"


def test_a_wide_escape_is_refused_wherever_it_is() -> None:
    assert wide_escape(b"/props?%u006dodel=beta")
    assert wide_escape(b"/models/lo%U0061d")
    assert not wide_escape(b"/api/tags?x=%75")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"secret","x":"\xff"}',  # invalid UTF-8: Go reads it, with U+FFFD
        b'{"model":"secret"} x',  # data after the object: Go's decoder reads the first value
        b'{"model":"secret","x":' + b"[" * 1500 + b"]" * 1500 + b"}",  # past Python's nesting
        b'{"model":"secret","x":' + b"9" * 5000 + b"}",  # past Python's digits
        b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nsecret\r\n--b--",
    ],
)
def test_a_body_whose_model_cannot_be_read_is_refused_to_a_restricted_key(body: bytes) -> None:
    state = control(OLLAMA_FLEET)
    for path in ("/api/show", "/v1/audio/transcriptions"):
        request = admitted(OLLAMA, body, phone("llama3*"), path, OTHER)
        assert request.opaque and refused(state, request) == "forbidden-model"
        # A key without patterns may send what it likes: nothing to judge.
        assert refused(state, admitted(OLLAMA, body, phone(), path, OTHER)) is None


def test_the_openai_facade_takes_its_model_from_model_only() -> None:
    """LM Studio and llama-server read ``model`` alone: a ``Model`` would serve whatever they
    hold, so the one facade over every engine refuses it."""
    with pytest.raises(BadBody):
        read_body(OPENAI, INF, "/v1/chat/completions", b'{"Model":"qwen","messages":[]}')
    assert read_body(OLLAMA, INF, "/v1/chat/completions", b'{"Model":"llama3"}').model == "llama3"


def test_a_model_a_path_names_is_judged() -> None:
    state = control(OLLAMA_FLEET)
    for path, expected in (("/v1/models/secret", "forbidden-model"), ("/v1/models/llama3", None)):
        request = admitted(OLLAMA, b"", phone("llama3*"), path, OTHER, b"GET")
        assert refused(state, request) == expected, path
    lm = admitted(LMSTUDIO, b"", phone("qwen*"), "/api/v0/models/secret", OTHER, b"GET")
    assert refused(control({"lmstudio": {"a": ["qwen", "secret"]}}), lm) == "forbidden-model"


def test_a_source_suffix_on_a_tagged_name_is_read_as_ollama_reads_it() -> None:
    state = control({"ollama": {"a": ["llama3:8b"]}})
    for name in (b"llama3:8b:cloud", b"llama3:8b:local"):
        body = b'{"model":"%s"}' % name
        assert refused(state, admitted(OLLAMA, body, phone("llama3*"))) is None
    body = b'{"model":"secret:latest:local"}'
    assert refused(state, admitted(OLLAMA, body, phone("llama3*"))) == "forbidden-model"


def test_a_pattern_without_a_tag_names_the_model_as_ollama_does() -> None:
    """Issue 31 item 2: ``models = ["llama3"]`` lists and serves ``llama3:latest`` (Ollama's
    default tag), whatever its case; an alias ``fast`` is ``fast:latest`` to Ollama too."""
    aliases = Aliases.parse({"fast": ["qwen:7b"]})
    state = control({"ollama": {"a": ["llama3:latest", "qwen:7b", "llama3:70b"]}}, aliases)
    scope = KeyScope(["llama3"], OLLAMA, state.discovery)
    assert scope.allows("llama3:latest") and scope.allows("Llama3") and scope.allows("llama3")
    assert not scope.allows("llama3:70b")
    fast = KeyScope(["fast"], OLLAMA, state.discovery)
    assert fast.allows("fast:latest") and fast.allows("Fast") and fast.allows("qwen:7b")
    for name in (b"llama3:latest", b"LLAMA3"):
        body = b'{"model":"%s"}' % name
        assert refused(state, admitted(OLLAMA, body, phone("llama3"))) is None


@pytest.mark.parametrize("facade", [LLAMACPP, OPENAI])
def test_a_pattern_alias_is_no_name_a_key_s_patterns_match(facade: Dialect) -> None:
    """``"gpt-*" = ["qwen"]``: a key allowed ``gpt-*`` does not reach qwen by asking for
    ``gpt-4`` (the pattern is no name of qwen; docs/model-names.md#pattern-aliases), one
    allowed ``qwen*`` does, and one allowed ``tiny`` reaches only tiny through ``"*"``."""
    aliases = Aliases.parse({"gpt-*": ["qwen"], "*": ["qwen", "tiny"]})
    state = control({"llamacpp": {"a": ["/m/qwen.gguf"], "b": ["/m/tiny.gguf"]}}, aliases)
    candidates = Candidates(state, Reservations(), PriorityScheduling(state))

    def reached(name: str, *patterns: str) -> list[str] | str:
        body = b'{"model":%s}' % _json(name)
        request = admitted(facade, body, phone(*patterns), "/v1/chat/completions")
        request = candidates.resolved(request)
        found = refused(state, request)
        return found or [node.id for node in candidates.owners("llamacpp", request)]

    assert reached("gpt-4", "gpt-*") == "forbidden-model"
    assert reached("gpt-*", "gpt-*") == "forbidden-model"
    assert reached("gpt-4", "qwen*") == ["a"]
    assert reached("test", "*") == ["a", "b"]
    assert reached("test", "tiny") == ["b"]
    assert reached("test", "qwen.gguf") == ["a"]
