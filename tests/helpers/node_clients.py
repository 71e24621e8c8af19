"""The official Node.js clients — the ``mongodb`` driver and ``mongosh`` — for the tests.

:func:`ensure_node_clients` installs the pinned versions with ``npm`` once into
``.node-clients/`` at the repository root (git-ignored) and reuses them afterwards: a stamp file
names the installed versions, so changing a pin reinstalls, and an ``fcntl`` lock makes parallel
test processes wait for one install instead of racing. A fresh machine needs only ``node`` and
``npm`` (and the npm registry): the first test run installs, about 25 s and 155 MB; the second run
of ``scripts/test.sh`` finds the cache.

Without ``node``/``npm``, or when ``npm install`` fails, the tests are skipped — or fail, under
``MIGRONAUT_TEST_REQUIRE_TOOLS=1`` (:mod:`helpers.tools`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from helpers.tools import require_tool, tool_unavailable

#: Exact versions: the driver's current major (7 runs on Node.js >= 20.19) and mongosh's.
MONGODB_DRIVER_VERSION = "7.9.1"
MONGOSH_VERSION = "2.12.0"
PACKAGES = {"mongodb": MONGODB_DRIVER_VERSION, "mongosh": MONGOSH_VERSION}

#: The cache, beside ``src/`` and ``tests/``; listed in ``.gitignore``.
CACHE = Path(__file__).resolve().parents[2] / ".node-clients"
NODE_HINT = "install Node.js 20.19+ and npm"
#: An install is a few hundred packages (25 s here); beyond this the registry is not answering.
INSTALL_TIMEOUT = 240.0
#: Stack-trace lines of npm's own error output, left out of the failure message.
_STACK_FRAME = re.compile(r"^(npm error)?\s+at ")


@dataclass(frozen=True)
class NodeClients:
    """An installed cache: ``node`` to run driver scripts, ``mongosh`` to run shell sessions."""

    node: str
    root: Path

    @property
    def node_modules(self) -> Path:
        return self.root / "node_modules"

    @property
    def mongosh(self) -> Path:
        return self.node_modules / ".bin" / "mongosh"

    def environment(self, home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a Node process: ``require`` finds the cache's packages, ``HOME``
        is ``home`` (mongosh writes its config and logs there, not in the user's home) and
        mongosh's telemetry is off."""
        env = dict(os.environ)
        env.update(
            HOME=str(home),
            NODE_PATH=str(self.node_modules),
            # mongosh's switch for test runs: no telemetry, whatever its config says.
            MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING="1",
            NO_COLOR="1",
        )
        env.update(extra or {})
        return env


def ensure_node_clients(cache: Path = CACHE) -> NodeClients:
    """The pinned clients in ``cache``, installed first if the stamp does not name them."""
    node = require_tool("node", NODE_HINT)
    npm = require_tool("npm", NODE_HINT)
    cache.mkdir(parents=True, exist_ok=True)
    clients = NodeClients(node=node, root=cache)
    stamp = cache / "installed.json"
    wanted = json.dumps(PACKAGES, sort_keys=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _read(stamp) == wanted and _complete(clients):
            return clients
        stamp.unlink(missing_ok=True)
        for stale in ("node_modules", "package.json", "package-lock.json"):
            path = cache / stale
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        _npm_install(npm, cache)
        if not _complete(clients):
            tool_unavailable(f"npm install into {cache} left no mongosh or mongodb package")
        stamp.write_text(wanted, encoding="utf-8")
    return clients


def _npm_install(npm: str, cache: Path) -> None:
    specs = [f"{name}@{version}" for name, version in PACKAGES.items()]
    argv = [npm, "install", "--no-audit", "--no-fund", "--save-exact", "--prefix", str(cache),
            *specs]
    env = dict(os.environ, npm_config_update_notifier="false")
    try:
        result = subprocess.run(argv, cwd=cache, env=env, stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        tool_unavailable(f"npm install {' '.join(specs)} did not finish within "
                         f"{INSTALL_TIMEOUT:g} s (is the npm registry reachable?)")
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip()).splitlines()
        said = [line for line in output if not _STACK_FRAME.match(line)]
        tool_unavailable(f"npm install {' '.join(specs)} failed (exit {result.returncode}):\n"
                         + "\n".join(said[-20:]))


def _complete(clients: NodeClients) -> bool:
    return (clients.mongosh.exists()
            and (clients.node_modules / "mongodb" / "package.json").is_file())


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None
