"""Unit tests of ``nvpair.engines``: each file here imports it most."""
