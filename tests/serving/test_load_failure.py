"""A model that fails to load (or to warm up) stops `serve` with exit 2 and one line naming the cause,
never a server left answering 503."""

from __future__ import annotations

from pathlib import Path

from serving.app import load_failure_line
from tests.serving.helpers import ServerProcess


def unservable_folder(root: Path) -> Path:
    """tiny-qwen2 with 3 key/value heads for 4 query heads: the config loads and the model builds, the
    first forward pass (the engine's warm-up) fails."""
    from serving.models import PRESETS

    config = PRESETS["tiny-qwen2"]()
    config.num_key_value_heads = 3
    folder = root / "unservable"
    config.save_pretrained(folder)
    return folder


def test_a_model_that_fails_to_load_stops_serve_with_exit_2_and_the_cause(tmp_path: Path) -> None:
    folder = unservable_folder(tmp_path)
    server = ServerProcess(
        tmp_path / "state", tmp_path / "server.log", "--model", str(folder), "--random-weights", "--byte-tokenizer"
    )
    try:
        code = server.proc.wait(timeout=180)
    finally:
        server.kill()
    log = server.log_tail()
    assert code == 2, log
    stopped = [line for line in log.splitlines() if "the model did not load" in line]
    assert len(stopped) == 1 and stopped[0].startswith("gpuyantra serve: the model did not load, stopped: "), log
    assert "Error" in stopped[0], stopped[0]  # the exception's type names the cause
    assert not list((tmp_path / "state" / "servers").glob("*.json"))  # the registration went with it


def test_the_cause_is_one_line() -> None:
    assert load_failure_line(RuntimeError("size mismatch\n  at layer 3")) == "RuntimeError: size mismatch"
    assert load_failure_line(ValueError()) == "ValueError"
