"""The ``gpushare-webhook`` command: serve, mutate, report, certs, policy, node.

Owns argument parsing (``args``), reading files and standard input, exit
codes and what is printed. Each sub-command (``serve``, ``offline``,
``certs``) is a thin shell over the packages below it; a deliberate error
of the project (``webhook.errors``) becomes one line on stderr, never a
traceback.

May import every other package of the webhook; none imports it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from webhook.cli.args import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, OneLineParser, build_parser
from webhook.errors import WebhookError

__all__ = ["build_parser", "kubectl_plugin", "main"]

# NB: each command's module is imported when it runs, not here: the node agent's
# metrics process (node metrics) then holds its own modules only, about 4 MiB less
# than all of the CLI's (bench/run.py --node).
METRICS = ["node", "metrics"]
# The init step of every GPU pod: its memory is the pod's, so it imports least of all.
INIT_REGIONS = ["node", "init-regions"]


def kubectl_plugin() -> int:
    """``kubectl gpushare ...``: kubectl runs ``kubectl-gpushare`` from the PATH (its plugins)."""
    return main(prog="kubectl gpushare")


def _parse(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:2] == METRICS and not {"-h", "--help"} & set(given):
        from webhook.cli import node_metrics

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
    if args.command == "serve":
        from webhook.cli.serve import cmd_serve

        return cmd_serve(args)
    if args.command == "mutate":
        from webhook.cli.offline import cmd_mutate

        return cmd_mutate(args, sys.stdin, sys.stdout, sys.stderr)
    if args.command == "report":
        from webhook.cli.report import cmd_report

        return cmd_report(args, sys.stdin, sys.stdout, sys.stderr)
    if args.command == "certs":
        from webhook.cli.certs import cmd_certs

        return cmd_certs(args)
    if args.command == "policy":
        from webhook.cli.offline import cmd_policy

        return cmd_policy(args)
    if args.command == "top":
        from webhook.cli.top import cmd_top

        return cmd_top(args, sys.stdout)
    if args.command == "node":
        run: Callable[[argparse.Namespace], int] = args.node_run  # webhook.cli.node.ACTIONS
        return run(args)
    return EXIT_INPUT  # pragma: no cover - argparse requires a command


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
