"""Unit tests of ``nvpair.fleet``: each file here imports it most."""
