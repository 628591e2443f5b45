"""``python -m webhook`` runs the ``gpushare-webhook`` command."""

from __future__ import annotations

import sys

from webhook.cli import main

sys.exit(main())
