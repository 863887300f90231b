"""Unit tests of ``nvpair.observe``: each file here imports it most."""
