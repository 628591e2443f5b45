"""Log lines: one JSON object per line (or plain text), for the webhook and gunicorn alike.

Owns the formatters and the logging configuration that ``serve`` installs in
the master and hands to gunicorn, so gunicorn's own lines come out in the
same shape as ours. Structured fields travel in ``extra={"fields": {...}}``;
nothing here ever logs a pod spec.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any, Literal

LogFormat = Literal["json", "text"]


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``LEVEL logger message key=value ...`` for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return text


def config(level: str, fmt: LogFormat, *, access: bool = False) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` document: everything goes to stderr in one format.

    gunicorn writes access lines whenever it is given a logging config, so
    without ``access`` its access logger is silenced here: the admission
    line already says everything an access line would.
    """
    formatter = JsonFormatter if fmt == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            # gunicorn's loggers hand their lines to the root handler.
            "gunicorn.error": {"level": level.upper(), "handlers": [], "propagate": True},
            "gunicorn.access": {
                "level": "INFO" if access else "CRITICAL",
                "handlers": [],
                "propagate": access,
            },
        },
    }
