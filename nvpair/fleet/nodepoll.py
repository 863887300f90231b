"""Asking one node in a poll: its model list and its load routes, each GET bounded as a whole
in time and bytes (docs/inventories.md#polled-inventories).
"""

from __future__ import annotations

import json

from attrs import frozen
from twisted.internet.interfaces import IReactorTime

from nvpair.engines.loadstate import Answer, LoadState
from nvpair.engines.table import ENGINES
from nvpair.fleet.file import base_url_hint
from nvpair.fleet.loadpoll import read_load
from nvpair.wire.client.fanout import ask
from nvpair.wire.message import Fields
from nvpair.wire.web import UpstreamClient

#: Bound on one inventory poll beyond the dial timeout (docs/inventories.md#polled-inventories).
POLL_GRACE = 30.0

#: A model list is small; a bigger answer is not one (and is not kept in memory).
MAX_INVENTORY_BODY = 16 * 1024 * 1024


@frozen
class NodePoll:
    """How a poll asks a node: through ``upstream``, each request (dial, headers and body
    together) bounded by ``timeout`` on ``clock`` and by :data:`MAX_INVENTORY_BODY`.

    :param timeout: the dial timeout plus :data:`POLL_GRACE`.
    """

    upstream: UpstreamClient
    clock: IReactorTime
    timeout: float

    async def get(self, url: str, path: str) -> Answer:
        """One GET of a poll, bounded as a whole (time and bytes)."""
        reply = await ask(
            self.upstream,
            self.clock,
            self.timeout,
            url,
            b"GET",
            path.encode(),
            Fields(),
            MAX_INVENTORY_BODY,
        )
        return Answer(reply.status, reply.body)

    async def models(self, engine: str, url: str) -> list[str]:
        """The model list of ``engine`` at ``url``; a ``ValueError`` says why it is not one."""
        spec = ENGINES[engine]
        reply = await self.get(url, spec.poll_path)
        if not 200 <= reply.status < 300:
            hint = base_url_hint(url) if reply.status == 404 else ""
            raise ValueError(f"status {reply.status}{hint}")
        models = spec.inventory_models(json.loads(reply.body))
        if models is None:
            raise ValueError("not the engine's model-list envelope")
        return models

    async def load(self, engine: str, url: str) -> LoadState:
        """The load state of ``engine`` at ``url``."""
        spec = ENGINES[engine]
        # Each route bounded like the model list; one failing says nothing.
        return await read_load(spec.load_probe, spec.model_key, lambda path: self.get(url, path))
