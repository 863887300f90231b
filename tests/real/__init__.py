"""Tests against a real llama.cpp llama-server, built once per machine."""
