"""Log lines: one JSON object per line (or plain text), for the webhook and gunicorn alike.

Owns the formatters and the logging configuration that ``serve`` installs in
the master and hands to gunicorn, so gunicorn's own lines come out in the
same shape as ours. Structured fields travel in ``extra={"fields": {...}}``;
nothing here ever logs a pod spec.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Any, Literal, TextIO

from webhook.decision import encoder

LogFormat = Literal["json", "text"]


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...fields}`` on one line.

    One line is written per admission, so the line costs what it must and
    no more: the encoder is built once, and the date and time to the second
    are formatted once a second.
    """

    _encode = staticmethod(encoder(ascii_only=False, separators=(", ", ": "), default=str))

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")  # one attribute: threads swap it whole

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return self._encode(line)

    def timestamp(self, created: float) -> str:
        """ISO 8601 in UTC to the millisecond: ``2026-12-02T21:51:21.115+00:00``."""
        whole = int(created)
        # Rounded to the microsecond first, as datetime.fromtimestamp does.
        micros = round((created - whole) * 1e6)
        if micros >= 1_000_000:
            whole, micros = whole + 1, micros - 1_000_000
        second, prefix = self._second
        if whole != second:
            prefix = dt.datetime.fromtimestamp(whole, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = (whole, prefix)
        return f"{prefix}.{micros // 1000:03d}+00:00"


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


class LineHandler(logging.Handler):
    """Each record as one ``write(2)`` of a whole line to standard error.

    Cheaper than a StreamHandler (no text layer, no flush per record), and a
    line up to the pipe's atomic size (4 KiB) never interleaves with the
    lines of another worker writing to the same pipe.
    """

    def __init__(self, fd: int = 2) -> None:
        super().__init__()
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            while data:
                data = data[os.write(self.fd, data) :]
        except Exception:
            self.handleError(record)


def skip_unused_record_fields() -> None:
    """Stop logging from looking up what no formatter here prints.

    The logging docs' own optimisations: no caller frame walk, no thread,
    process or multiprocessing names per record.
    """
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def chosen_format(choice: str, stream: TextIO) -> LogFormat:
    """``auto`` is text for a person at a terminal and JSON for a collector (a pipe, a file).

    As kubectl and most Go tooling do; a pod's stderr is never a terminal,
    so a deployed webhook writes JSON without being told to.
    """
    if choice == "auto":
        return "text" if stream.isatty() else "json"
    return "text" if choice == "text" else "json"


def config(level: str, fmt: LogFormat) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` document: everything goes to stderr in one format.

    Whether gunicorn writes access lines at all is ``serve --access-log``'s
    to say (webhook.serving.server.QuietAccessLogger); those it writes come here.
    """
    formatter = JsonFormatter if fmt == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {
            "stderr": {"()": f"{__name__}.{LineHandler.__name__}", "formatter": "default"}
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            # gunicorn's loggers hand their lines to the root handler.
            "gunicorn.error": {"level": level.upper(), "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": True},
        },
    }
