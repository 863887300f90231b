"""nvpair-proxy: carries LLM inference to the machine that should serve it."""
