"""Unit tests of ``nvpair.facades``: each file here imports it most."""
