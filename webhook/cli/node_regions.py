"""``gpushare-webhook node init-regions``: each GPU container's region, before the pod starts.

The init step the webhook adds to a GPU pod (``shim.initRegions``) runs
this with one ``NAME=MEMORYm[,sm=PERCENT]`` per GPU container. Every
argument is read before any file is written, so a bad one writes none.
It imports the standard library and ``webhook.node.regioninit`` only: the
step runs with a few MiB of memory.
"""

from __future__ import annotations

import argparse
import time

from webhook.cli.args import EXIT_OK
from webhook.decision import REGION_DIR
from webhook.node.regioninit import initialise, parse_limits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "regions",
        nargs="+",
        metavar="NAME=MEMORYm[,sm=PERCENT]",
        help="a GPU container and the limits the webhook pinned in its env, such as main=4096m",
    )
    parser.add_argument(
        "--dir",
        default=REGION_DIR,
        metavar="DIR",
        help="the accounting volume, where region NAME.cache is written (default: %(default)s)",
    )


def cmd_init_regions(args: argparse.Namespace) -> int:
    wanted = [parse_limits(text) for text in args.regions]
    now = int(time.time())
    for limits in wanted:
        path = f"{args.dir.rstrip('/')}/{limits.file_name}"
        if initialise(args.dir, limits, now) == "kept":
            print(f"{path}: kept (initialised before: the first writer's limits stand)")
        else:
            print(f"{path}: written ({limits.memory_mib} MiB, SM {limits.sm}% on every device)")
    return EXIT_OK
