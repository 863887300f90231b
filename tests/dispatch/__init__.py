"""Unit tests of ``nvpair.dispatch``: each file here imports it most."""
