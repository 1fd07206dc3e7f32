"""sandbox/confine.py: one command over untrusted code (``export --check``'s tests) without the
user's secrets, network or home."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernforge.sandbox.confine import confined
from kernforge.sandbox.isolation import mechanism

PROBE = """
import json, os, socket, sys
seen = {"key": os.environ.get("MINIMAX_API_KEY"), "home": os.environ.get("HOME")}
try:
    seen["config"] = open(sys.argv[1]).read()
except OSError as err:
    seen["config"] = f"error: {err.strerror}"
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=3).close()
    seen["net"] = "connected"
except OSError as err:
    seen["net"] = f"refused: {err}"
open(os.path.join(os.environ["HOME"], "wrote.txt"), "w").write("ok")
print(json.dumps(seen))
"""


def test_the_command_gets_no_secret_network_or_home(tmp_path, monkeypatch):
    """What a kernel's import-time code would look for while the exported package's tests run:
    the API key in the environment, the user's config file in the home folder, the network."""
    home = Path(os.path.expanduser("~"))
    config = home / f".kernforge-confine-test-{os.getpid()}"
    config.write_text("api_key = sk-secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    monkeypatch.setenv("MINIMAX_API_KEY", "sk-secret")
    try:
        work = tmp_path / "work"
        work.mkdir()
        done = confined([sys.executable, "-c", PROBE, str(config), str(listener.getsockname()[1])], workdir=work)
        ran = subprocess.run(done.argv, env=done.env, cwd=work, capture_output=True, text=True, timeout=120)
    finally:
        config.unlink()
        listener.close()
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["key"] is None and seen["home"] == str(work.resolve())
    assert (work / "wrote.txt").read_text() == "ok"  # its own folder is writable
    if "network" in done.note and "NOT" not in done.note.split("network")[0][-12:]:
        assert seen["net"].startswith("refused"), seen
    if mechanism("strict").name == "bwrap":
        assert "home hidden" in done.note and seen["config"].startswith("error"), seen
    else:
        pytest.skip(f"no bubblewrap here: {done.note}")
