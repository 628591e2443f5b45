"""The ``gpushare-webhook`` command: serve, mutate, report, certs, policy, node.

Owns argument parsing (``args``), reading files and standard input, exit
codes and what is printed. Each sub-command (``serve``, ``offline``,
``certs``) is a thin shell over the packages below it; a deliberate error
of the project (``webhook.errors``) becomes one line on stderr, never a
traceback.

May import every other package of the webhook; none imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from webhook.cli.args import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, build_parser
from webhook.cli.certs import cmd_certs
from webhook.cli.node import cmd_node
from webhook.cli.offline import cmd_mutate, cmd_policy
from webhook.cli.report import cmd_report
from webhook.cli.serve import cmd_serve
from webhook.cli.top import cmd_top
from webhook.errors import WebhookError

__all__ = ["build_parser", "cmd_mutate", "kubectl_plugin", "main"]


def kubectl_plugin() -> int:
    """``kubectl gpushare ...``: kubectl runs ``kubectl-gpushare`` from the PATH (its plugins)."""
    return main(prog="kubectl gpushare")


def main(argv: Sequence[str] | None = None, *, prog: str = "gpushare-webhook") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "mutate":
            return cmd_mutate(args, sys.stdin, sys.stdout, sys.stderr)
        if args.command == "report":
            return cmd_report(args, sys.stdin, sys.stdout, sys.stderr)
        if args.command == "certs":
            return cmd_certs(args)
        if args.command == "policy":
            return cmd_policy(args)
        if args.command == "node":
            return cmd_node(args)
        if args.command == "top":
            return cmd_top(args, sys.stdout)
    except WebhookError as error:  # each names its file, key or field: one line is enough
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:  # the reader (head, less) went away: not an error of ours
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C: the user's choice, not a traceback
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_INPUT  # pragma: no cover - argparse requires a command
