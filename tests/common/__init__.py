"""Unit tests of ``nvpair.common``: each file here imports it most."""
