"""An agent's metrics read back: what each container uses, from the exposition text.

What ``gpushare-webhook top`` takes from each node agent: the used bytes
and the tampered flag per container and device, under our names or HAMi's
(``--metric-names hami``), so a top reads either kind of agent. Pure: text
in, values out; text that is not Prometheus exposition is an InputError.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from webhook.errors import InputError
from webhook.node.exporter import NAMINGS, TAMPERED

USED = {naming.used for naming in NAMINGS.values()}
DEVICE_LABELS = tuple(naming.device_label for naming in NAMINGS.values())


@dataclass(frozen=True)
class Used:
    namespace: str
    pod: str
    container: str
    device: str
    used_bytes: int
    tampered: bool


def containers(text: str) -> list[Used]:
    """Every container device an agent reported, with its use and whether it was tampered."""
    used: dict[tuple[str, str, str, str], int] = {}
    tampered: set[tuple[str, str, str, str]] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in USED and sample.name != TAMPERED:
                    continue
                labels = sample.labels
                device = next((labels[d] for d in DEVICE_LABELS if d in labels), "")
                key = (
                    labels.get("namespace", ""),
                    labels.get("pod", ""),
                    labels.get("container", ""),
                    device,
                )
                if sample.name == TAMPERED:
                    if sample.value:
                        tampered.add(key)
                else:
                    used[key] = int(sample.value)
    except ValueError as error:
        raise InputError(f"not Prometheus metrics: {error}") from None
    return [
        Used(*key, used_bytes=value, tampered=key in tampered)
        for key, value in sorted(used.items())
    ]
