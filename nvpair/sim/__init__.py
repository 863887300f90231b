"""Simulated Ollama, LM Studio and llama.cpp engines with fault knobs, for tests and the demo."""
