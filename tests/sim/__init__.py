"""Unit tests of ``nvpair.sim``: each file here imports it most."""
