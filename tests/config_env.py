"""The environment a CLI test runs in (conftest's ``clean_config_env``), for fixtures of a wider
scope too: they patch it with a ``pytest.MonkeyPatch`` of their own."""

from __future__ import annotations

from pathlib import Path

import pytest


def clean_config(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """No API key, provider, model, archive or config file from the developer's environment, and
    an empty config home under ``folder``: a CLI test sees only what it sets itself. A wide
    terminal keeps the CLI's messages on one line, so tests can search them."""
    from kernforge.loop.config import KEY_ENV_VARS

    for name in KEY_ENV_VARS + ("KERNFORGE_PROVIDER", "KERNFORGE_BASE_URL", "KERNFORGE_MODEL", "KERNFORGE_DB",
                                "KERNFORGE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder / "config"))
    monkeypatch.setenv("COLUMNS", "250")
