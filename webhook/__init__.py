"""gpushare-webhook: a mutating admission webhook that makes GPU sharing safe."""

from __future__ import annotations

__version__ = "0.1.0"
