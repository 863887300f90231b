"""The test suite: unit tests, tests/integration (real processes), tests/real (llama-server)."""
