"""``gpushare-webhook certs``: make a certificate pair, or publish one to the cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from webhook.cli.args import EXIT_OK, EXIT_REJECTED, service_names


def cmd_certs(args: argparse.Namespace) -> int:
    from webhook import tls

    if args.certs_command == "install":
        return cmd_certs_install(args)
    names = service_names(args.service, args.namespace) + list(args.dns)
    issued = tls.ensure_certificates(
        Path(args.out),
        dns_names=names,
        ips=args.ip,
        days=args.days,
        key_type=args.key_type,
        renew_before=args.renew_before,
    )
    what = []
    what.append("new CA" if issued.ca_created else "kept CA")
    what.append("new serving certificate" if issued.serving_created else "kept serving certificate")
    print(
        f"{issued.directory}: {', '.join(what)}; serving certificate valid until "
        f"{issued.not_after:%Y-%m-%d %H:%M} UTC"
    )
    return EXIT_OK


def cmd_certs_install(args: argparse.Namespace) -> int:
    from webhook.cluster import certs, kube
    from webhook.errors import KubeError

    try:
        api = kube.api_client(args.kubeconfig, args.context)
        report = certs.install_certificates(
            api,
            namespace=args.namespace,
            secret=args.secret,
            ca_secret=args.ca_secret,
            webhook_config=args.webhook_config,
            dns_names=service_names(args.service, args.namespace) + list(args.dns),
            ips=list(args.ip),
            days=args.days,
            renew_before=args.renew_before,
            key_type=args.key_type,
        )
    except KubeError as error:
        print(f"gpushare-webhook: {error}", file=sys.stderr)
        return EXIT_REJECTED
    print(
        f"{args.namespace}/{args.secret}: "
        f"{'renewed' if report.serving_renewed else 'kept'} serving certificate (valid until "
        f"{report.not_after:%Y-%m-%d} UTC); {'new' if report.ca_rotated else 'kept'} CA (valid "
        f"until {report.ca_not_after:%Y-%m-%d} UTC); caBundle updated in "
        f"{report.webhooks_patched} webhook(s) of {args.webhook_config}"
    )
    return EXIT_OK
