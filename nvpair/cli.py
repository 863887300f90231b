"""``nvpair-proxy``: the console script (docs/README.md#command-line).

It runs twistd's own machinery in this process — :class:`ServerOptions` and ``runApp``, with
the ``nvpair-proxy`` plugin — so it takes exactly the options of ``twistd -n nvpair-proxy`` and
is the same process: in the foreground, logs on stderr, stdout the broker's. What it adds is
what a program on the PATH owes its user and twistd cannot give: no pid file in the working
directory, and an exit status that says how the process ended (twistd's is 0 whatever ended
it; :func:`nvpair.tap.exit_with_status` makes up for that under plain twistd).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from twisted.python import usage

# twistd's own options class for this platform, the one its run() parses with (absent from
# the module's __all__, hence the ignore).
from twisted.scripts.twistd import ServerOptions, runApp  # type: ignore[attr-defined]

from nvpair.tap import PROG, Options, usage_exit

#: twistd's own options, ahead of the plugin's: foreground, and no pid file (twistd writes
#: ``twistd.pid`` into the working directory by default; a supervisor knows the pid).
TWISTD_ARGS = ("--nodaemon", "--pidfile=")


class ConsoleOptions(ServerOptions):
    """twistd's options, as the console script sets them: its help reads
    ``Usage: nvpair-proxy [options]``, not twistd's synopsis."""

    synopsis = "Usage:"


def twistd_argv(args: Sequence[str]) -> list[str]:
    """The twistd command line that runs the plugin with ``args``."""
    return [*TWISTD_ARGS, PROG, *args]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until it stops; the exit status.

    :param argv: the plugin's options (``sys.argv[1:]`` by default).
    """
    args = sys.argv[1:] if argv is None else argv
    config = ConsoleOptions()
    try:
        # The plugin's own usage errors end here already, as one line (Options.parseOptions).
        config.parseOptions(twistd_argv(args))
    except usage.UsageError as error:
        # twistd's, e.g. no nvpair-proxy plugin found: one line too, not twistd's help.
        usage_exit(error)
    options = config.subOptions
    assert isinstance(options, Options)
    options.returns_status = True
    runApp(config)
    return options.service.exit_status if options.service is not None else 1


if __name__ == "__main__":
    sys.exit(main())
