"""Unit tests of ``nvpair.control``: each file here imports it most."""
