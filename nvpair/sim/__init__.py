"""Simulated Ollama, LM Studio and llama.cpp engines with fault knobs, for tests and the demo."""

from nvpair.sim.engine import DIALECTS, CorsSetting, Faults, RecordedRequest, SimEngine

__all__ = ["DIALECTS", "CorsSetting", "Faults", "RecordedRequest", "SimEngine"]
