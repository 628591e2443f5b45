"""The ``gpushare-webhook`` command: serve, mutate, report, certs, policy, node.

Owns argument parsing (``args``), reading files and standard input, exit
codes and what is printed. Each sub-command is one entry of ``COMMANDS``
(its module, its function, the streams it takes), imported when it runs;
each is a thin shell over the packages below it; a deliberate error of the
project (``webhook.errors``) becomes one line on stderr, never a
traceback. ``args`` imports no command's module, so the modules of the
CLI import each other without a cycle (an import-linter contract).

May import every other package of the webhook; none imports it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NamedTuple

from webhook.cli import args as flags
from webhook.cli.args import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, OneLineParser
from webhook.errors import WebhookError

__all__ = ["build_parser", "kubectl_plugin", "main"]

METRICS = ["node", "metrics"]
# The init step of every GPU pod: its memory is the pod's, so it imports least of all.
INIT_REGIONS = ["node", "init-regions"]


class Command(NamedTuple):
    """A sub-command: the module of ``webhook.cli`` that runs it, its function, its streams."""

    module: str
    run: str
    streams: tuple[str, ...] = ()  # of sys, in the order the function takes them


# Each command's module is imported when it runs, not here: the node agent's
# metrics process (node metrics) then holds its own modules only.
COMMANDS = {
    "serve": Command("serve", "cmd_serve"),
    "mutate": Command("offline", "cmd_mutate", ("stdin", "stdout", "stderr")),
    "report": Command("report", "cmd_report", ("stdin", "stdout", "stderr")),
    "top": Command("top", "cmd_top", ("stdout", "stderr")),
    "certs": Command("certs", "cmd_certs"),
    "policy": Command("offline", "cmd_policy"),
}


def _command(module: str) -> ModuleType:
    return importlib.import_module(f"webhook.cli.{module}")


def build_parser(prog: str = "gpushare-webhook") -> argparse.ArgumentParser:
    """Every command's flags (``top`` and ``node`` own theirs)."""
    top, node = _command("top"), _command("node")
    return flags.build_parser(prog, top=top.add_arguments, node=node.add_parser)


def kubectl_plugin() -> int:
    """``kubectl gpushare ...``: kubectl runs ``kubectl-gpushare`` from the PATH (its plugins)."""
    return main(prog="kubectl gpushare")


def _parse(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:2] == METRICS and not {"-h", "--help"} & set(given):
        node_metrics = _command("node_metrics")
        parser = OneLineParser(prog=f"{prog} node metrics")
        node_metrics.add_arguments(parser)
        args = parser.parse_args(given[2:])
        args.command, args.node_run = "node", node_metrics.cmd_node_metrics
        return args
    if given[:2] == INIT_REGIONS and not {"-h", "--help"} & set(given):
        from webhook.cli import node_regions

        parser = OneLineParser(prog=f"{prog} node init-regions")
        node_regions.add_arguments(parser)
        args = parser.parse_args(given[2:])
        args.command, args.node_run = "node", node_regions.cmd_init_regions
        return args
    return build_parser(prog).parse_args(given)


def _run(args: argparse.Namespace) -> int:
    if args.command == "node":
        run: Callable[[argparse.Namespace], int] = args.node_run  # webhook.cli.node.ACTIONS
        return run(args)
    command = COMMANDS[args.command]
    function: Callable[..., int] = getattr(_command(command.module), command.run)
    return function(args, *(getattr(sys, stream) for stream in command.streams))


def main(argv: Sequence[str] | None = None, *, prog: str = "gpushare-webhook") -> int:
    args = _parse(argv, prog)
    try:
        return _run(args)
    except WebhookError as error:  # each names its file, key or field: one line is enough
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:  # the reader (head, less) went away: not an error of ours
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C: the user's choice, not a traceback
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
