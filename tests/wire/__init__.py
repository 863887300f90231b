"""Unit tests of ``nvpair.wire``: each file here imports it most."""
