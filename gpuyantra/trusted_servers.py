"""The serving processes a worker talks to: only those configured on the worker, each with its own token.

A campaign's `server_url` comes from workflow input, which anyone who can reach Temporal writes. The
admin token must never follow that URL: a worker sends its requests (and a token) only to a server it
was told to trust, looked up by URL or name here:

- `local`: `$GPUYANTRA_SERVER_URL`, else `http://127.0.0.1:8000` (what `gpuyantra serve` binds by default);
- `$GPUYANTRA_SERVERS`: `NAME=URL[,NAME=URL...]` (`gpuyantra worker --server NAME=URL` adds to it);
- one file per server in `<state>/servers/NAME.json`: `{"url": URL, "token_file": PATH}` (`token_file`
  optional), read at every call so a server registered after the worker started is found.

A server's token: `$GPUYANTRA_ADMIN_TOKEN_<NAME>` (the name upper-cased, other characters `_`), else
its `token_file`, else the worker's admin token (`$GPUYANTRA_ADMIN_TOKEN`, else `<state>/admin-token`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpuyantra import config
from gpuyantra.campaign.inputs import server_key

SERVERS_ENV = "GPUYANTRA_SERVERS"
LOCAL_NAME = "local"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class UntrustedServer(ValueError):
    """A campaign named a server this worker was not configured to trust."""


@dataclass(frozen=True)
class TrustedServer:
    name: str
    url: str
    token_file: str | None = None

    def token(self) -> str | None:
        """The admin token this server takes (see the module's docstring for the order)."""
        own = os.environ.get(token_env(self.name))
        if own:
            return own
        if self.token_file:
            try:
                return Path(self.token_file).expanduser().read_text().strip() or None
            except OSError:
                return None
        return config.find_admin_token()


def token_env(name: str) -> str:
    """`GPUYANTRA_ADMIN_TOKEN_<NAME>`: the per-server token variable of server `name`."""
    return "GPUYANTRA_ADMIN_TOKEN_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def servers_dir() -> Path:
    return config.state_dir() / "servers"


def parse_server_spec(spec: str) -> TrustedServer:
    """`NAME=URL` as a TrustedServer; ValueError with one line saying what is wrong."""
    name, sep, url = spec.partition("=")
    name, url = name.strip(), url.strip()
    if not sep or not NAME_PATTERN.match(name) or not url.startswith(("http://", "https://")):
        raise ValueError(f"--server takes NAME=URL (like gpu2=http://10.0.0.5:8000), got {spec!r}")
    return TrustedServer(name, url.rstrip("/"))


def _from_environment() -> list[TrustedServer]:
    raw = os.environ.get(SERVERS_ENV, "")
    return [parse_server_spec(spec) for spec in raw.split(",") if spec.strip()]


def _from_state_folder() -> list[TrustedServer]:
    folder = servers_dir()
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            url, token_file = entry["url"], entry.get("token_file")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a broken entry trusts nothing; the others still count
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            found.append(TrustedServer(path.stem, url.rstrip("/"), token_file if isinstance(token_file, str) else None))
    return found


def trusted_servers() -> list[TrustedServer]:
    """Every server this worker may talk to, `local` first."""
    return [TrustedServer(LOCAL_NAME, config.server_url().rstrip("/")), *_from_environment(), *_from_state_folder()]


def resolve(server: str) -> TrustedServer:
    """The trusted server `server` (a URL or a name) is, or UntrustedServer naming the fix."""
    servers = trusted_servers()
    key = server_key(server) if "://" in server else None
    for trusted in servers:
        if trusted.name == server or (key is not None and server_key(trusted.url) == key):
            return trusted
    known = ", ".join(f"{s.name}={s.url}" for s in servers)
    raise UntrustedServer(
        f"server {server} is not one this worker trusts ({known}): start the worker with "
        f"`gpuyantra worker --server NAME={server}` (or add it to ${SERVERS_ENV})"
    )


def remember_server(name: str, url: str, token_file: Path | None = None) -> Path:
    """Register a server in `<state>/servers/NAME.json` (what `serve` does for itself)."""
    from gpuyantra.files import write_whole

    folder = servers_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    entry: dict[str, str] = {"url": url}
    if token_file is not None:
        entry["token_file"] = str(token_file)
    write_whole(path, json.dumps(entry))
    return path


def forget_server(path: Path) -> None:
    """Remove a registration `remember_server` made: a stopped server's port is anyone's to bind."""
    path.unlink(missing_ok=True)
