"""Everything engine-specific, as pure values: the engine table (ports, route classes, model keys,
envelopes, error shapes), Ollama's model names, load answers, model-list merging, CORS
intersection, the admission checks at a request's head, and token counts read from a body.

No reactor and no sockets: values in, values out. May import :mod:`nvpair.common` only
(docs/architecture.md#layers).
"""
