"""Helpers of the serving tests: real `gpuyantra serve` processes on 127.0.0.1, completions, metrics."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from gpuyantra import attestation

REPO = Path(__file__).resolve().parents[2]

RMS_NORM_KERNEL = REPO / "gpuyantra" / "kernels" / "rms_norm.py"
TOKEN = "test-admin-token"
READY_TIMEOUT_S = 90
CHECK_PROMPT = torch.tensor([[5, 17, 300, 42, 7, 99]])


def logits(model) -> torch.Tensor:
    """The model's logits at every position of CHECK_PROMPT, no cache."""
    with torch.no_grad():
        return model(input_ids=CHECK_PROMPT, use_cache=False).logits


def attested(
    source: str | bytes, op: str = "rms_norm", reward: int = 1, device: str = "cpu", key: bytes | None = None
) -> dict:
    """The attestation the verifier would give these bytes (key: $GPUYANTRA_ATTESTATION_KEY, set by
    tests/conftest.py and inherited by the servers the tests start)."""
    return attestation.record(attestation.source_sha256(source), op, reward, device, key)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `python -m gpuyantra.cli serve` subprocess; stdout/stderr go to a log file."""

    def __init__(
        self, state_dir: Path, log_path: Path, *args: str, token: str = TOKEN, env: dict[str, str] | None = None
    ):
        self.state_dir = state_dir
        self.log_path = log_path
        self.token = token
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **(env or {})}
        env.update(
            {
                "TRITON_INTERPRET": "1",
                "PYTHONUNBUFFERED": "1",
                "GPUYANTRA_ADMIN_TOKEN": token,
                "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            }
        )
        cmd = [
            sys.executable,
            "-m",
            "gpuyantra.cli",
            "serve",
            "--model",
            "tiny-qwen2",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--state-dir",
            str(state_dir),
            "--log-level",
            "warning",
            *self.args,
        ]
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/readyz", timeout=2)
                if r.status_code == 200:
                    return r.json()
                last = r.text
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s ({last}):\n{self.log_tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()


def complete(client: httpx.Client, prompt, max_tokens: int = 4, stream: bool = False, **extra) -> dict:
    """POST /v1/completions; returns {"token_ids", "text", "finish_reason"} (streams joined)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream, **extra}
    if not stream:
        r = client.post("/v1/completions", json=body)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        return {"token_ids": choice["token_ids"], "text": choice["text"], "finish_reason": choice["finish_reason"]}
    ids: list[int] = []
    text = ""
    reason = None
    done = False
    with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            for choice in event["choices"]:
                ids.extend(choice.get("token_ids") or [])
                text += choice["text"]
                reason = choice["finish_reason"] or reason
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return {"token_ids": ids, "text": text, "finish_reason": reason}


def metric_value(text: str, name: str, labels: str = "") -> float:
    """Value of one Prometheus sample (`name{labels}`) in exposition text; 0 when absent."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


# Prompts of different lengths (5, 3, 7, 3, 4 tokens) for the in-process engine tests.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [3, 3, 3], [400, 401, 402, 403]]


def reference_greedy(model, prompt, steps):
    """Greedy tokens from full forwards without a cache: the oracle of every engine path."""
    ids = list(prompt)
    device = next(model.parameters()).device  # the model may live on a GPU
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


# A chat template in the ChatML style of Qwen2 (the cached test model's tokenizer carries it).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_hf_cache_model(
    cache: Path,
    repo_id: str = "gpuyantra-test/tiny-chat",
    *,
    chat_template: bool = True,
    tokenizer: str = "ok",
    commit: str = "0123456789abcdef0123456789abcdef01234567",
) -> Path:
    """A model in the Hugging Face hub cache layout under `cache` (what HF_HUB_CACHE points at):
    `models--org--name/refs/main` holding `commit`, `snapshots/<commit>/` holding the tiny-qwen2
    config.json (no weights: serve it with --random-weights) and, with tokenizer="ok", a byte-level
    BPE tokenizer (256 byte tokens + <|im_start|> + <|im_end|> as eos) with CHAT_TEMPLATE unless
    chat_template=False; tokenizer="broken": an unreadable tokenizer.json; "none": no tokenizer files.
    Returns the snapshot folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from serving.models import PRESETS

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    config = PRESETS["tiny-qwen2"]()
    if tokenizer == "ok":
        vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
        vocab.update({"<|im_start|>": 256, "<|im_end|>": 257})
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        tok = PreTrainedTokenizerFast(
            tokenizer_object=backend, eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"]
        )
        if chat_template:
            tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(snapshot)
        config.vocab_size = len(tok)
        config.eos_token_id = tok.eos_token_id
    elif tokenizer == "broken":
        (snapshot / "tokenizer.json").write_text("{not json")
        (snapshot / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    config.save_pretrained(snapshot)
    return snapshot


def cache_model_server(root: Path, model: str) -> ServerProcess:
    """`gpuyantra serve` of `model` written into a Hugging Face cache under `root` (offline, random
    weights, 256 positions); started, not yet ready: callers `wait_ready()` and `kill()` it."""
    write_hf_cache_model(root / "hub", model)
    return ServerProcess(
        root / "state",
        root / "server.log",
        "--model",
        model,
        "--random-weights",
        "--max-seq-len",
        "256",
        env={"HF_HUB_CACHE": str(root / "hub"), "HF_HUB_OFFLINE": "1"},
    )


def tiny_cpu_config(state_dir: Path | str, **overrides):
    """The in-process test server's settings: tiny-qwen2 in float32 on the CPU, this suite's admin
    token, four rows of 256 positions; `overrides` on top."""
    from serving.app import ServeConfig

    settings = {"admin_token": TOKEN, "max_batch": 4, "max_seq_len": 256, **overrides}
    return ServeConfig(model="tiny-qwen2", device="cpu", dtype="float32", state_dir=str(state_dir), **settings)
