"""Developer tools run by the Makefile, outside the proxy and its tests."""
