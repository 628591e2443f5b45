"""The commands that need no cluster: ``mutate`` (the offline preview) and ``policy``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any, TextIO

import yaml

from webhook.cli.args import EXIT_OK, EXIT_REJECTED
from webhook.decision import DEFAULT_POLICY, Policy, dump_policy, make_guard
from webhook.errors import InputError
from webhook.serving.runtime import read_policy


def _policy(path: str | None) -> Policy:
    return DEFAULT_POLICY if path is None else read_policy(Path(path))


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that holds one key twice.

    PyYAML keeps the last of two, the API server refuses both (strict
    field validation): a file a person wrote is read as the cluster would.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # the safe loader's own check refuses it, with its message
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_documents(
    path: str, stdin: TextIO, stderr: TextIO, *, what: str = "documents"
) -> list[Any]:
    """The YAML or JSON documents of ``path`` (``-``: standard input), a v1 List as its items."""
    name = "standard input" if path == "-" else path
    if path == "-" and stdin.isatty():
        # Not a hang: say what is awaited (kubectl apply -f - says nothing, and looks stuck).
        print("reading YAML from standard input; end it with Ctrl-D, or give a FILE", file=stderr)
    try:
        text = stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {path}: {error}") from None
    try:
        documents = [doc for doc in yaml.load_all(text, Loader=_UniqueKeys) if doc is not None]
    except yaml.YAMLError as error:
        raise InputError(f"{name} is not valid YAML or JSON: {_yaml_problem(error)}") from None
    if not documents:
        raise InputError(f"{name} holds no {what}")
    expanded: list[Any] = []
    for doc in documents:
        # A v1 List (what kubectl get -o yaml prints) is its items.
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            expanded.extend(doc["items"])
        else:
            expanded.append(doc)
    return expanded


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML reader's error in one line, where it is (line and column from 1) and what."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return str(error).replace("\n", " ")
    mark = error.problem_mark or error.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    context = f" ({error.context})" if error.context else ""
    return f"{where}{error.problem or 'cannot be read'}{context}"


def _no_claims(policy: Policy) -> str:
    """Why ``-o templates`` prints nothing."""
    if policy.placed_by.claims:
        return "no pod here is admitted with a claim"
    return f"the policy's scheduler {policy.scheduler} gives pods no claims (only dra does)"


def cmd_mutate(args: argparse.Namespace, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    from webhook.decision import Prepared
    from webhook.preview import claim_templates, preview

    prepared = Prepared(_policy(args.policy))
    documents = read_documents(args.file, stdin, stderr)
    results = [
        preview(doc, prepared, index=i, namespace=args.namespace)
        for i, doc in enumerate(documents, start=1)
    ]
    kept = []
    for result in results:
        for note in result.notes:
            print(f"warning: {note}", file=stderr)
        several = len(result.decisions) > 1
        for where, decision in result.decisions:
            label = f"{result.label} {where}" if several else result.label
            # One line each: every problem in one run. Under enforcement: warn the
            # webhook admits the pod and warns, as the webhook's own answer does.
            verdict = "rejected" if not decision.allowed else "warned"
            for problem in decision.problems:
                print(f"{verdict}: {label}: {problem.message}", file=stderr)
            for note in decision.notes:  # its problems are said just above
                print(f"warning: {label}: {note}", file=stderr)
        for where, claim, body in result.claims:
            label = f"{result.label} {where}" if several else result.label
            print(
                f"claim: {label}: {claim} from ResourceClaimTemplate {body['metadata']['name']}, "
                "made in the pod's namespace when the pod is created (-o templates shows it)",
                file=stderr,
            )
        if not result.rejected:
            kept.append(result)
    if args.output == "patch":
        # One entry per document, in order: null where it is refused, [] where
        # admission leaves it as it is; "no patch" must not read as "no change".
        patches = [None if r.rejected else r.patch for r in results]
        json.dump(patches[0] if len(patches) == 1 else patches, stdout, indent=2)
        stdout.write("\n")
    elif args.output == "templates":
        made = claim_templates(results)
        if not made:
            print(f"note: no ResourceClaimTemplate: {_no_claims(prepared.policy)}", file=stderr)
        yaml.safe_dump_all(made, stdout, sort_keys=False)
    elif args.output == "json":
        objects = [r.document for r in kept]
        out: Any = (
            objects[0]
            if len(objects) == 1
            else {"apiVersion": "v1", "kind": "List", "items": objects}
        )
        json.dump(out, stdout, indent=2)
        stdout.write("\n")
    else:
        yaml.safe_dump_all([r.document for r in kept], stdout, sort_keys=False)
    return EXIT_REJECTED if any(r.rejected for r in results) else EXIT_OK


def cmd_policy(args: argparse.Namespace) -> int:
    if args.policy_command == "check":
        read_policy(Path(args.file))
        print(f"{args.file}: policy is valid")
        return EXIT_OK
    if args.policy_command == "guard":
        sys.stdout.write(dump_guard(make_guard(_policy(args.file), namespace=args.namespace)))
        return EXIT_OK
    sys.stdout.write(dump_policy(_policy(args.file)))
    return EXIT_OK


class _GuardDumper(yaml.SafeDumper):
    """Long strings (the CEL expressions) folded, so a reviewer reads them."""


def _folded(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = ">" if len(text) > 60 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_GuardDumper.add_representer(str, _folded)

GUARD_HEADER = """\
# The guard (docs/security.md): a ValidatingAdmissionPolicy the API server runs
# after every mutating webhook. It refuses a GPU-memory pod that lacks what
# gpushare-webhook always sets, so a bypassed webhook cannot store an unconfined
# pod. Made by `gpushare-webhook policy guard FILE` from the policy it guards:
# make it again whenever the policy changes a key it reads (its params).
"""


def dump_guard(objects: list[dict[str, Any]]) -> str:
    """The guard's objects as one YAML stream, with a header saying where it comes from."""
    body = yaml.dump_all(objects, Dumper=_GuardDumper, sort_keys=False, width=96)
    return GUARD_HEADER + body
