"""Tests of the bench itself (run with ``pytest bench/tests``; not part of ``make test``)."""
