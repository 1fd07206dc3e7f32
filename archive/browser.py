"""Headless Chromium for the report: the page's DOM after its scripts ran, and a PNG screenshot.

Chromium is found as ``$KERNFORGE_CHROMIUM``, else the first of ``CANDIDATES`` on the PATH
(Debian: ``apt-get install chromium``). Every launch gets a fresh profile folder, no GPU and no
sandbox (Chromium's own sandbox cannot start as root, which is how CI runs). The page is given a
virtual-time budget: Chromium fast-forwards its timers until the page is idle or the budget is
spent, so the dump sees the drawn plots without a wall-clock wait.

A screenshot is taken at the page's full height: a first launch reads the ``data-height`` the
page's script sets once the plots are drawn (html_report.py), a second shoots at that size.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import ReportError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
VIRTUAL_TIME_MS = 10_000
TIMEOUT_S = 120.0
WIDTH = 1280
#: when the page does not say its height; and the most Chromium renders in one capture
FALLBACK_HEIGHT = 4000
MAX_HEIGHT = 16_000


def find_chromium() -> str | None:
    configured = os.environ.get("KERNFORGE_CHROMIUM")
    if configured:
        return shutil.which(configured) or (configured if Path(configured).is_file() else None)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    binary = find_chromium()
    if binary is None:
        raise ReportError("no headless Chromium found (apt-get install chromium, or set KERNFORGE_CHROMIUM to the browser)")
    return binary


def _launch(page: Path, *args: str, timeout_s: float) -> str:
    binary = require_chromium()
    with tempfile.TemporaryDirectory(prefix="kernforge-chromium-") as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                   "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}",
                   f"--virtual-time-budget={VIRTUAL_TIME_MS}", *args, page.resolve().as_uri()]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ReportError(f"{binary} did not finish {page} within {timeout_s:g} s") from None
        except OSError as error:
            raise ReportError(f"cannot start {binary}: {error}") from None
    if done.returncode != 0:
        raise ReportError(f"{binary} failed on {page} (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def dump_dom(page: str | Path, *, timeout_s: float = TIMEOUT_S) -> str:
    """The page's DOM, serialised, after its scripts ran."""
    return _launch(Path(page), "--dump-dom", timeout_s=timeout_s)


def page_height(dom: str) -> int | None:
    """The height the page's script wrote on ``<body data-height=...>``, if it did."""
    found = re.search(r'<body[^>]*\sdata-height="(\d+)"', dom)
    return int(found.group(1)) if found else None


def screenshot(page: str | Path, png: str | Path, *, width: int = WIDTH, timeout_s: float = TIMEOUT_S) -> Path:
    """A PNG of the whole page (up to ``MAX_HEIGHT`` pixels tall), ``width`` pixels wide."""
    page, png = Path(page), Path(png)
    height = min(page_height(dump_dom(page, timeout_s=timeout_s)) or FALLBACK_HEIGHT, MAX_HEIGHT)
    _launch(page, f"--screenshot={png.resolve()}", f"--window-size={width},{height}", timeout_s=timeout_s)
    if not png.is_file() or png.stat().st_size == 0:
        raise ReportError(f"Chromium wrote no screenshot to {png}")
    return png
