"""Unit tests of ``nvpair.broker``: each file here imports it most."""
