"""Tests that start the proxy and simulated engines as real processes on loopback."""
