"""llama.cpp's own server tests run directly and through the proxy (docs/engine-suite.md)."""
