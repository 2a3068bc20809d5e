"""What a campaign needs from its server, checked in a second before it spends any time verifying.

Each check answers None (fine) or one line that names the fix:
- `reward_problem`: a server on the CPU swaps only CPU verdicts, and a CPU verdict scores at most
  +1 (speed is judged on a GPU only), so `min_reward` above that deploys nothing;
- `attestation_problem`: the server checks swaps against its attestation key; a worker signing with
  another key (another state folder, another `GPUYANTRA_ATTESTATION_KEY`) gets 403 at every swap.
  A signed nonce goes to `POST /admin/attestation-check` and the answer names both keys' fingerprints.

The campaign's `preflight_campaign` activity runs both on a worker, whose key and token are the ones
its swaps will use; `gpuyantra optimize` checks the reward before it starts the workflow and waits for
the preflight's answer before it returns.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from gpuyantra import attestation
from gpuyantra.rewards import ceiling

CHECK_PATH = "/admin/attestation-check"
CHECK_TIMEOUT_S = 5.0
SAME_KEY_FIX = (
    "start `gpuyantra serve` with the same --state-dir as `gpuyantra up` (or the workers), "
    f"or set {attestation.KEY_ENV} to the same value for both"
)


class PreflightFailed(RuntimeError):
    """A campaign would fail or deploy nothing; the message is one line naming the fix."""


def served_device(server_url: str) -> str | None:
    """`cpu` or `cuda` as the server's /readyz says, or None while it loads or does not say."""
    try:
        answer = httpx.get(f"{server_url.rstrip('/')}/readyz", timeout=CHECK_TIMEOUT_S).json()
    except (httpx.HTTPError, ValueError):
        return None
    device = answer.get("device") if isinstance(answer, dict) else None
    return device.split(":")[0] if isinstance(device, str) and device else None


def reward_problem(server_device: str | None, verify_device: str | None, min_reward: int) -> str | None:
    """Why no kernel could reach `min_reward`: verdicts on the CPU score at most +1."""
    device = verify_device or server_device
    if device != "cpu" or min_reward <= ceiling("cpu"):
        return None
    where = "verification runs" if verify_device else "the server runs"
    return (
        f"min_reward {min_reward} deploys nothing here: {where} on the CPU, where speed is not judged and a "
        f"correct kernel scores +{ceiling('cpu')}; use --min-reward {ceiling('cpu')} or serve on a GPU"
    )


def attestation_problem(server_url: str, token: str | None, key: bytes, key_source: str) -> str | None:
    """Why the server would refuse this key's attestations (None: it accepts them, or it predates the check)."""
    nonce = secrets.token_hex(16)
    body = {"nonce": nonce, "signature": attestation.sign_nonce(nonce, key), "key": attestation.fingerprint(key)}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(
            f"{server_url.rstrip('/')}{CHECK_PATH}", json=body, headers=headers, timeout=CHECK_TIMEOUT_S
        )
    except httpx.TransportError:
        return None  # reachability is checked apart (`optimize`), or by the campaign's first call to the server
    if response.status_code == 401:
        return (
            f"{server_url} refused the admin token (401): set GPUYANTRA_ADMIN_TOKEN (or --admin-token) "
            "to the token the server was started with"
        )
    if response.status_code != 403:
        return None  # 200, or a server without the check (404): its swaps will tell
    answer = _json(response)
    return (
        f"{server_url} would refuse every swap (403 attestation signature invalid): it checks attestations "
        f"with key {answer.get('key', '?')} ({answer.get('key_source', '?')}), this side signs with key "
        f"{attestation.fingerprint(key)} ({key_source}); {SAME_KEY_FIX}"
    )


def campaign_problems(server_url: str, min_reward: int, verify_device: str | None) -> list[str]:
    """Every reason a campaign would deploy nothing, each one line ([] when it may start), as a
    worker sees it: the server as it trusts it, with that server's admin token
    (gpuyantra/trusted_servers.py; UntrustedServer for one it does not trust), and its attestation key."""
    from gpuyantra.trusted_servers import resolve

    server = resolve(server_url)
    problems = [
        reward_problem(served_device(server.url), verify_device, min_reward),
        attestation_problem(server.url, server.token(), attestation.load_key(), attestation.key_source()),
    ]
    return [problem for problem in problems if problem]


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}
