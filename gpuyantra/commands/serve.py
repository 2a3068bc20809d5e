"""`gpuyantra serve`: serve a causal LM with the hot-swap admin API (docs/CONTRACTS.md sections 3 and 5)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.limits import RequestLimits


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a causal LM (OpenAI-compatible completions) with the kernel hot-swap admin API",
        description=(
            "Serve a transformers causal LM from a preset (tiny-qwen2, tiny-llama, tiny-gpt2, qwen2.5-1.5b; "
            "random weights, seeded), a local Hugging Face folder or a Hugging Face model id already in the local "
            "cache, with OpenAI-compatible /v1/completions and /v1/chat/completions, "
            "Prometheus /metrics and the bearer-token admin API that swaps verified Triton kernels in live."
        ),
    )
    p.add_argument(
        "--model",
        default="tiny-qwen2",
        metavar="PRESET_DIR_OR_ID",
        help="preset name, local model folder (config.json, weights optional with --random-weights) or "
        "Hugging Face model id resolved from the local cache only ($HF_HUB_CACHE; never "
        "downloaded); default: tiny-qwen2",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="for a folder or model id: build the model from its config.json with seeded random weights",
    )
    p.add_argument(
        "--byte-tokenizer",
        action="store_true",
        help="for a folder or model id: serve with the byte-level tokenizer (UTF-8 bytes as token ids) "
        "instead of its own; without it a missing or broken tokenizer stops serve (exit 2). "
        "Presets always use it",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the model runs (default: cuda when available)",
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="model dtype (default: bfloat16 on cuda, float32 on cpu)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default: 8000)")
    p.add_argument(
        "--admin-token",
        default=None,
        help="bearer token of the /admin routes; shown to every user by `ps`: prefer --admin-token-file or "
        "$GPUYANTRA_ADMIN_TOKEN (default: $GPUYANTRA_ADMIN_TOKEN; none: admin disabled)",
    )
    p.add_argument(
        "--admin-token-file",
        default=None,
        metavar="FILE",
        help="read the admin token from FILE (such as <state>/admin-token, which `gpuyantra up` writes)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        metavar="N",
        help="larger request bodies are refused (413) before they are read (default: 4 MiB)",
    )
    p.add_argument(
        "--max-choices",
        type=int,
        default=None,
        metavar="N",
        help="choices (prompts x n) one completions request may ask for (default: 128)",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="prompt tokens one request may hold, all its prompts together (default: 32768)",
    )
    p.add_argument(
        "--max-client-requests",
        type=int,
        default=None,
        metavar="N",
        help="completions requests one client address may have in flight; more are refused (429) "
        "(default: 32; 0: no limit, as behind a proxy whose address every client shares)",
    )
    p.add_argument(
        "--header-timeout",
        type=header_timeout,
        default=30.0,
        metavar="SECONDS",
        help="a connection's request headers must arrive within this time, else 408 and closed "
        "(slow-loris connections; default: 30; 0: no deadline)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="folder for the swap manifest and kept candidate files "
        "(default: $GPUYANTRA_STATE_DIR, else ~/.local/share/gpuyantra)",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="decode with CUDA graphs (static KV cache, one graph per batch-size bucket); needs cuda",
    )
    p.add_argument(
        "--decode-attention",
        choices=["auto", "triton", "sdpa"],
        default="auto",
        help="attention of decode steps: the Triton decode kernel over each row's positions, or "
        "transformers' SDPA (default auto: triton on cuda, sdpa on cpu)",
    )
    p.add_argument(
        "--fuse-projections",
        choices=["auto", "on", "off"],
        default="auto",
        help="run q/k/v and gate/up projections as one GEMM each (weights stay the modules' own, "
        "as views; default auto: on for cuda)",
    )
    p.add_argument(
        "--fuse-norms",
        choices=["auto", "on", "off"],
        default="auto",
        help="route each pre-norm decoder layer's first residual add and the norm after it through one "
        "module call, which one add_rms_norm kernel can take over (kept only where the logits stay "
        "bitwise equal; default auto: on for cuda)",
    )
    p.add_argument(
        "--no-run-ahead",
        action="store_true",
        help="with --cuda-graphs: wait for each decode step's tokens before queuing the next (default: "
        "greedy requests run one step ahead, the next step queued while the host hands out the last)",
    )
    p.add_argument(
        "--no-prefill-graphs",
        action="store_true",
        help="with --cuda-graphs: prefill eagerly (default: a one-row prefill replays a graph captured per "
        "prompt-length bucket, 16 to 512 tokens)",
    )
    p.add_argument(
        "--mixed-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="while requests decode, a new request whose prompt has at most N tokens joins the next "
        "decode step (its prompt tokens as rows of that step) instead of a prefill pass of its own that "
        "stalls every stream, when the step's measured extra cost is below a prefill pass's "
        "(default with --cuda-graphs on cuda: what fills the step's rows up to whole 64-row tiles of the "
        "projections beside --max-batch decode rows, 56 at batch 8; else 0: off)",
    )
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together at most (default: 8)")
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="tokens per request, prompt + generated (default: min(model limit, 2048))",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of random weights (default: 0)")
    p.add_argument(
        "--max-parity-shapes",
        type=int,
        default=4,
        help="live input shapes a swap checks parity on per module class (default: 4)",
    )
    p.add_argument(
        "--allow-unverified-swaps",
        action="store_true",
        help="let /admin/swap swap kernels without a valid verifier attestation (logged as a warning "
        "each time); for development only",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from gpuyantra.processes import port_taken

    taken = port_taken(args.host, args.port)  # before the model loads: a server that cannot bind must not start
    if taken:
        print(f"gpuyantra serve: {taken}", file=sys.stderr)
        return 2
    # Before anything imports triton: the interpreter on machines without CUDA.
    from gpuyantra.triton_env import prepare

    device = None if args.device == "auto" else args.device
    device = prepare(device)
    if args.cuda_graphs and device != "cuda":
        print("gpuyantra serve: --cuda-graphs needs --device cuda", file=sys.stderr)
        return 2
    if args.max_batch < 1:
        print("gpuyantra serve: --max-batch must be at least 1", file=sys.stderr)
        return 2
    if args.mixed_prompt_tokens is not None and args.mixed_prompt_tokens < 0:
        print("gpuyantra serve: --mixed-prompt-tokens must be 0 (off) or more", file=sys.stderr)
        return 2
    _ensure_serving_importable()
    from serving.models import model_problem

    problem = model_problem(args.model, args.random_weights, byte_tokenizer=args.byte_tokenizer)
    if problem is not None:  # before the port is bound: a server that can never be ready must not start
        print(f"gpuyantra serve: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn

    from serving.app import ServeConfig, create_app
    from serving.profiling import prepare_profiler_on_this_thread

    try:
        token = admin_token_of(args)
        limits = request_limits_of(args)
    except ValueError as exc:
        print(f"gpuyantra serve: {exc}", file=sys.stderr)
        return 2
    config = ServeConfig(
        model=args.model,
        random_weights=args.random_weights,
        byte_tokenizer=args.byte_tokenizer,
        device=device,
        dtype=None if args.dtype == "auto" else args.dtype,
        seed=args.seed,
        state_dir=args.state_dir,
        admin_token=token,
        cuda_graphs=args.cuda_graphs,
        decode_attention=args.decode_attention,
        fuse_projections=args.fuse_projections,
        fuse_norms=args.fuse_norms,
        run_ahead=not args.no_run_ahead,
        prefill_graphs=not args.no_prefill_graphs,
        mixed_prompt_tokens=args.mixed_prompt_tokens,
        max_batch=args.max_batch,
        max_seq_len=args.max_seq_len,
        max_parity_shapes=args.max_parity_shapes,
        allow_unverified_swaps=args.allow_unverified_swaps,
        max_body_bytes=limits.max_body_bytes,
        max_choices=limits.max_choices,
        max_prompt_tokens=limits.max_prompt_tokens,
        max_client_requests=limits.max_client_requests,
    )
    if token is None:
        print(
            "gpuyantra serve: no admin token (--admin-token-file or GPUYANTRA_ADMIN_TOKEN): admin routes are disabled",
            file=sys.stderr,
        )
    prepare_profiler_on_this_thread(device)
    app = create_app(config)
    print(
        f"gpuyantra serve: {args.model} on {device}, http://{args.host}:{args.port} "
        f"(ready when GET /readyz answers 200)",
        file=sys.stderr,
        flush=True,
    )
    registration = _register_with_workers(args, config.resolved_state_dir())
    if registration is not None:
        _forget_at_shutdown(app, registration)
    from serving.header_deadline import http_protocol

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,
            http=http_protocol(args.header_timeout),
        )
    )
    load_failure = stop_on_load_failure(config, server)
    server.run()
    if load_failure:
        print(f"gpuyantra serve: the model did not load, stopped: {load_failure[0]}", file=sys.stderr, flush=True)
        return 2
    return 0


def stop_on_load_failure(config: Any, server: Any) -> list[str]:
    """Make a model that fails to load (or to warm up) stop the server instead of leaving it answering
    503: the cause lands in the returned list and uvicorn shuts down (the app's lifespan runs)."""
    causes: list[str] = []

    def stop(cause: str) -> None:
        causes.append(cause)
        server.should_exit = True

    config.on_load_failure = stop
    return causes


def _forget_at_shutdown(app: Any, registration: Path) -> None:
    """Remove the registration when the app shuts down: uvicorn re-raises SIGTERM once it has stopped,
    so code after `uvicorn.run` never runs on a signal; the app's lifespan does."""
    from gpuyantra.trusted_servers import forget_server

    serving_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(the_app: Any) -> AsyncIterator[Any]:
        try:
            async with serving_lifespan(the_app) as state:
                yield state
        finally:
            forget_server(registration)

    app.router.lifespan_context = lifespan


ADMIN_TOKEN_ON_COMMAND_LINE = (
    "gpuyantra serve: warning: --admin-token shows the token to every user of this machine (ps); "
    "use --admin-token-file FILE or $GPUYANTRA_ADMIN_TOKEN"
)


def admin_token_of(args: argparse.Namespace) -> str | None:
    """The admin token: --admin-token-file, else --admin-token (with a warning), else the environment.
    ValueError with one line when the file cannot be read or is empty."""
    if args.admin_token_file:
        try:
            token = Path(args.admin_token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not text"
            raise ValueError(f"cannot read --admin-token-file {args.admin_token_file}: {why}") from None
        if not token:
            raise ValueError(f"--admin-token-file {args.admin_token_file} is empty")
        return token
    if args.admin_token:
        print(ADMIN_TOKEN_ON_COMMAND_LINE, file=sys.stderr)
        return str(args.admin_token)
    return os.environ.get("GPUYANTRA_ADMIN_TOKEN") or None


def header_timeout(text: str) -> float:
    """--header-timeout: seconds, 0 for no deadline."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError("must be 0 (no deadline) or a positive number of seconds")
    return seconds


def request_limits_of(args: argparse.Namespace) -> RequestLimits:
    """The limit flags, defaults for those not given; ValueError naming a flag below 1 (below 0 for
    --max-client-requests, where 0 is no limit)."""
    from serving.limits import RequestLimits

    given = {
        "max_body_bytes": args.max_body_bytes,
        "max_choices": args.max_choices,
        "max_prompt_tokens": args.max_prompt_tokens,
    }
    for name, value in given.items():
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    chosen = {name: value for name, value in given.items() if value is not None}
    clients = args.max_client_requests
    if clients is not None:
        if clients < 0:
            raise ValueError("--max-client-requests must be 0 (no limit) or more")
        chosen["max_client_requests"] = clients
    return RequestLimits(**chosen)


def _register_with_workers(args: argparse.Namespace, state: Path) -> Path | None:
    """Tell this state folder's workers about a server on another port than the default one they
    trust (gpuyantra/trusted_servers.py); removed again when serve stops."""
    from gpuyantra.trusted_servers import remember_server

    host = "127.0.0.1" if args.host in ("127.0.0.1", "localhost", "0.0.0.0", "::") else args.host
    host = f"[{host}]" if ":" in host else host
    if host == "127.0.0.1" and args.port == 8000:
        return None  # `local`: every worker trusts it
    token_file = Path(args.admin_token_file).resolve() if args.admin_token_file else None
    try:
        return remember_server(f"serve-{args.port}", f"http://{host}:{args.port}", token_file)
    except OSError as exc:
        print(f"gpuyantra serve: warning: cannot register with the workers: {exc}", file=sys.stderr)
        return None


def port_number(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return port


def _ensure_serving_importable() -> None:
    """`serving/` sits beside `gpuyantra/` in a source checkout; an editable install made before it
    existed does not map it, so fall back to the checkout root."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("serving") is None:
        root = Path(__file__).resolve().parents[2]
        if (root / "serving" / "__init__.py").exists():
            sys.path.insert(0, str(root))
