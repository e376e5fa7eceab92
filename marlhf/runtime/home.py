"""Where marlhf keeps what it builds once and reuses: the tiny model, generated task data
(``$MARLHF_HOME``, default ``~/.cache/marlhf``)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """``$MARLHF_HOME``, or ``~/.cache/marlhf``."""
    return Path(os.environ.get("MARLHF_HOME", Path.home() / ".cache" / "marlhf"))
