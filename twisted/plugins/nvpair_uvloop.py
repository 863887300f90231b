"""twistd reactor plugin: ``twistd -r uvloop -n nvpair-proxy``. Imports nothing but Reactor."""

from twisted.application.reactors import Reactor

uvloop = Reactor(
    "uvloop",
    "nvpair.uvloopreactor",
    "Twisted's asyncio reactor on uvloop (measured faster for nvpair-proxy: bench/README.md)",
)
