"""Pure: the cold-start mix's seeded workload, the fleet it runs on, and the summary of its answers.

Four simulated Ollama nodes hold six models, some on every node and some on two or three, and
room in memory for two at a time, so where a request goes decides whether it meets a model in
memory, and whether its load pushes another one out. Requests arrive as a Poisson
process; the model of each is drawn from a Zipf-like popularity (the first model most asked
for), then the route (``/api/generate`` or ``/api/chat``), streamed or not, and a generation
length (log-uniform, so short answers are common and long ones happen). The same seed gives the
same sequence, byte for byte, so both orders of a round meet exactly the same requests.

Nothing here does I/O: :mod:`bench.coldstart` sends the requests and measures the answers.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from bench.targets import percentile

NODES = ("n0", "n1", "n2", "n3")
#: Most asked for first, with the nodes that hold each: the default model everywhere, the
#: others where someone pulled them.
PLACEMENT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("llama3.1:8b", ("n0", "n1", "n2", "n3")),
    ("qwen2.5:7b", ("n0", "n1", "n2")),
    ("mistral:7b", ("n1", "n2", "n3")),
    ("gemma2:9b", ("n0", "n2")),
    ("phi3:mini", ("n2", "n3")),
    ("codellama:13b", ("n1", "n3")),
)
MODELS = tuple(model for model, _ in PLACEMENT)
LOAD_DELAY = 2.0
"""Seconds a simulated node takes to load a model that is not in memory."""
KEEP_ALIVE = 30.0
"""Seconds a model stays in memory after its last request ends."""
MAX_LOADED = 2
"""Models a node holds in memory at once; one more evicts one first, by Ollama's rules
(:mod:`nvpair.sim.memory`). The VRAM of a typical LAN GPU box: a 12-16 GB card holds two of
these 7-9B models (4-5.5 GB each at Q4, plus their context cache), not six."""
PROMPTS = (
    "Summarize the meeting notes below in three bullet points.",
    "Write a Python function that parses an ISO 8601 duration.",
    "Why does my Kubernetes pod restart every few minutes?",
    "Translate this paragraph into German, keeping the tone informal.",
    "Explain the difference between a mutex and a semaphore.",
)


def models_of(node: str) -> tuple[str, ...]:
    """The models ``node`` holds (its inventory)."""
    return tuple(model for model, nodes in PLACEMENT if node in nodes)


def zipf_weights(count: int, exponent: float) -> list[float]:
    """Popularity of ranks 1..count, proportional to ``1 / rank ** exponent``, summing to 1."""
    raw = [1 / rank**exponent for rank in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


@attrs.frozen
class Mix:
    """The shape of the workload.

    :param seconds: arrivals run from 0 to this.
    :param rate: mean arrivals per second (Poisson).
    :param zipf: popularity exponent over :data:`MODELS` in order.
    :param stream_share: the share of requests streamed.
    :param chat_share: the share sent to ``/api/chat`` (the rest to ``/api/generate``).
    :param tokens: the least and most tokens an answer has (log-uniform between).
    :param token_seconds: seconds per generated token (the nodes' chunk interval).
    """

    seconds: float = 80.0
    rate: float = 1.5
    zipf: float = 1.0
    stream_share: float = 0.7
    chat_share: float = 0.5
    tokens: tuple[int, int] = (16, 256)
    token_seconds: float = 0.02


@attrs.frozen
class Request:
    """One request of the workload: when it is sent (seconds from the start) and what it is."""

    at: float
    model: str
    chat: bool
    stream: bool
    tokens: int
    prompt: str

    @property
    def path(self) -> str:
        return "/api/chat" if self.chat else "/api/generate"

    def body(self) -> bytes:
        """The request body, as an Ollama client sends it."""
        payload: dict[str, object] = {"model": self.model}
        if self.chat:
            payload["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            payload["prompt"] = self.prompt
        payload["stream"] = self.stream
        payload["options"] = {"num_predict": self.tokens}
        return json.dumps(payload).encode()


def workload(seed: int, mix: Mix) -> tuple[Request, ...]:
    """The requests of one run, in arrival order; the same ``seed`` and ``mix``, the same run."""
    rng = random.Random(seed)
    weights = zipf_weights(len(MODELS), mix.zipf)
    low, high = mix.tokens
    out: list[Request] = []
    at = rng.expovariate(mix.rate)
    while at < mix.seconds:
        model = rng.choices(MODELS, weights)[0]
        chat = rng.random() < mix.chat_share
        stream = rng.random() < mix.stream_share
        tokens = round(math.exp(rng.uniform(math.log(low), math.log(high))))
        prompt = rng.choice(PROMPTS)
        out.append(Request(round(at, 6), model, chat, stream, tokens, prompt))
        at += rng.expovariate(mix.rate)
    return tuple(out)


def offered_concurrency(requests: Sequence[Request], mix: Mix) -> float:
    """Requests generating at once on average (Little's law over the run, no load waits
    counted): each answer streams its tokens and a final line, ``token_seconds`` apart."""
    busy = sum((r.tokens + 1) * mix.token_seconds for r in requests)
    return busy / mix.seconds


@attrs.frozen
class Outcome:
    """What the client saw of one request.

    :param stream: whether it was streamed.
    :param status: the HTTP status; None when no answer came (transport error, timeout).
    :param first_byte_ms: milliseconds from sending to the first body byte; None when none came.
    :param node: the node that answered (``X-Nvpair-Node``), or ``""``.
    :param error: why it failed, when it did.
    """

    stream: bool
    status: int | None
    first_byte_ms: float | None
    node: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.first_byte_ms is not None and not self.error


WAITED_MS = 250.0
"""A streamed first token later than this waited for a load (a warm one takes milliseconds)."""


@attrs.frozen
class Summary:
    """One run of the mix, from the client's side.

    :param ttft_p50_ms: time to first token of the streamed answers (for a non-streamed answer
        the first body byte is the whole answer: it measures the generation, not the order).
    :param answer_p50_ms: time to the (whole) answer of the non-streamed requests.
    :param waited: streamed answers whose first token came after :data:`WAITED_MS`.
    :param served: answers per node.
    """

    requests: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    answer_p50_ms: float | None
    waited: int
    served: Mapping[str, int]


def summarize(outcomes: Sequence[Outcome]) -> Summary:
    ok = [o for o in outcomes if o.ok]
    streamed = [o.first_byte_ms for o in ok if o.stream and o.first_byte_ms is not None]
    whole = [o.first_byte_ms for o in ok if not o.stream and o.first_byte_ms is not None]
    return Summary(
        requests=len(outcomes),
        failed=len(outcomes) - len(ok),
        ttft_p50_ms=percentile(streamed, 50) if streamed else None,
        ttft_p99_ms=percentile(streamed, 99) if streamed else None,
        answer_p50_ms=percentile(whole, 50) if whole else None,
        waited=sum(1 for ms in streamed if ms > WAITED_MS),
        served=dict(sorted(Counter(o.node for o in ok).items())),
    )
