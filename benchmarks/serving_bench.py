# Over 600 lines: a self-contained serving benchmark with many sections, one script for a GPU host.
"""Served decode speed of the serving engine at batch 1 and 8: eager (transformers' SDPA), eager with
the engine's Triton decode attention, the same plus the campaign's swaps (rms_norm, rope, silu_mul),
CUDA graphs (SDPA), graphs + rms_norm, graphs with the Triton decode attention, adding the swaps
one at a time, then with q/k/v and gate/up fused into one GEMM each (`serving/fusion.py`; every
other section runs the projections as the modeling code wrote them), and torch.compile
(reduce-overhead) on the same static KV cache. The last engine is measured again with its decode
waiting for each step's tokens before queuing the next (run-ahead off), then with run-ahead again.

    python benchmarks/serving_bench.py --out serving_bench.json          # H200: qwen2.5-1.5b bf16, < 8 min
    python benchmarks/serving_bench.py --smoke --out /tmp/s.json         # CPU smoke test (tiny-qwen2, interpreter)

It drives `serving.engine.Engine` in-process (no HTTP): the same prefill/decode code the server runs,
`Engine.benchmark` for the timings (prefill each row, then `--tokens - 1` timed decode steps, a
host round trip per step as in serving). The swapped kernels are the real templates in
`gpuyantra/kernels/`, bound through the swap engine (parity on live weights, and with graphs:
re-capture + graph-path parity before commit).

Checks that the swapped kernel really runs inside the captured graphs:
1. a counting candidate (correct rms_norm plus one `atomic_add` on a device counter per launch) is
   swapped in; K raw graph replays must advance the counter by exactly K x (number of norms), and
   after its rollback (which re-captures) K more replays must not move it;
2. with the template swapped in, the norm weights are perturbed in place (valid, different values):
   the graph replay, captured before the perturbation, must equal the eager step with the swapped
   kernel and differ from the logits before the perturbation (the graph reads the live weights).

Writes one JSON object to --out (also after every section, so a timeout still leaves results).
Runs on torch 2.11/triton 3.6/transformers 5.17 and torch 2.13/triton 3.9/transformers 5.24.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

COUNTING_KERNEL = """import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]

_COUNTERS = {}


def counter(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(1, dtype=torch.int64, device=device)
    return _COUNTERS[key]


@triton.jit
def _rms_norm_counting(X, W, Y, C, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)
    if row == 0:
        tl.atomic_add(C, 1)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2, dtype=torch.promote_types(x.dtype, weight.dtype))
    _rms_norm_counting[(x2.shape[0],)](x2, weight, y, counter(x.device), hidden, eps,
                                       BLOCK=triton.next_power_of_2(hidden))
    return y.reshape(*x.shape[:-1], hidden)
"""


def staggered_streams(engine, clients: int, max_tokens: int, prompt_tokens: int, per_client: int = 4) -> dict:
    """`clients` threads, each generating `per_client` greedy requests in turn on a running engine."""
    import concurrent.futures
    import statistics

    from serving.engine import GenRequest

    def client(c: int) -> list[float]:
        # Client c's first request (untimed) ends after (c + 1) / clients of a full one, so the clients'
        # requests end, and the next ones arrive, spread over a request's lifetime as HTTP clients drift.
        warm = GenRequest([c + 1] * prompt_tokens, max(2, max_tokens * (c + 1) // clients))
        engine.submit(warm)
        if not warm.done.wait(120):
            raise RuntimeError("a staggering request did not finish")
        rates = []
        for i in range(per_client):
            prompt = [(31 * c + 7 * i + j) % 500 + 1 for j in range(prompt_tokens)]
            arrivals: list[float] = []
            stamp = arrivals.append
            req = GenRequest(prompt, max_tokens, on_token=lambda _t, stamp=stamp: stamp(time.perf_counter()))
            engine.submit(req)
            if not req.done.wait(120) or req.finish_reason != "length":
                raise RuntimeError(f"a streamed request ended {req.finish_reason}: {req.error}")
            rates.append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
        return rates

    mixed_before = engine.mixed_admissions
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        rates = [r for rates in pool.map(client, range(clients)) for r in rates]
    return {
        "tokens_per_s": clients * statistics.median(rates),
        "per_request_tokens_per_s": [round(r, 1) for r in rates],
        "mixed_admissions": engine.mixed_admissions - mixed_before,
        "mixed_prompt_tokens": engine.mixed_prompt_tokens,
        "clients": clients,
        "max_tokens": max_tokens,
        "prompt_tokens": prompt_tokens,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--model", default="qwen2.5-1.5b")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per row (timed: tokens - 1 steps)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument(
        "--mixed-prompt-tokens", type=int, default=None, help="the engines' mixed-step prompt budget (default: theirs)"
    )
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--skip-eager", action="store_true", help="skip the eager and eager+swap sections")
    p.add_argument(
        "--only-compile",
        action="store_true",
        help="run only the torch.compile section (benchmarks/campaign_bench.py's compile figure)",
    )
    p.add_argument(
        "--compile-budget-s",
        type=float,
        default=240.0,
        help="skip torch.compile for the remaining batches once this much time was spent on it",
    )
    p.add_argument(
        "--sections",
        default="",
        help="comma-separated name prefixes: run only the sections whose names start with one "
        "(e.g. 'graphs+attn+fused+swaps,profile_graph_step'); default all",
    )
    p.add_argument(
        "--skip-sections",
        default="",
        help="comma-separated name prefixes: leave out the sections whose names start with one",
    )
    p.add_argument("--smoke", action="store_true", help="tiny-qwen2 on the CPU (interpreter), few tokens")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.model, args.device, args.tokens, args.prompt_tokens, args.repeats = "tiny-qwen2", "cpu", 6, 4, 1
        args.max_seq_len = min(args.max_seq_len, 64)
        args.batches = "1,2"
        if args.mixed_prompt_tokens is None:  # off by default off the GPU; the smoke runs them, one prompt a step
            args.mixed_prompt_tokens = args.prompt_tokens
    from gpuyantra.triton_env import prepare

    device = prepare(args.device)
    import torch

    from gpuyantra.swap.records import SwapRejected
    from serving.cache import decode_mask
    from serving.engine import Engine
    from serving.models import describe, load_model

    out_path = Path(args.out)
    batches = [int(b) for b in args.batches.split(",")]
    max_batch = max(batches)
    results: dict = {
        "config": vars(args),
        "versions": {},
        "results": {},
        "checks": {},
        "errors": {},
        "started": time.time(),
    }
    import transformers
    import triton

    results["versions"] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }

    def save():
        results["elapsed_s"] = round(time.time() - results["started"], 1)
        out_path.write_text(json.dumps(results, indent=1, default=str))

    def section(name, fn):
        if args.only_compile and name != "torch.compile":
            return
        wanted = [s for s in args.sections.split(",") if s]
        if wanted and not any(name.startswith(s) for s in wanted):
            return
        if any(name.startswith(s) for s in args.skip_sections.split(",") if s):
            return
        t0 = time.perf_counter()
        try:
            value = fn()
            if value is not None:
                results["results" if not name.startswith("check") else "checks"][name] = value
        except Exception as exc:  # noqa: BLE001 - record and go on
            results["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
            print(f"[{name}] FAILED: {exc}", flush=True)
        print(f"[{name}] {time.perf_counter() - t0:.1f}s", flush=True)
        save()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    loaded = load_model(args.model, device=device, dtype=args.dtype, seed=0)
    sync()
    results["model"] = describe(loaded)
    results["load_s"] = round(time.perf_counter() - t0, 1)
    print(f"loaded {args.model} on {device} in {results['load_s']}s", flush=True)
    template = REPO / "gpuyantra" / "kernels" / "rms_norm.py"
    state = Path(tempfile.mkdtemp(prefix="gy-bench-"))

    def bench(engine, label):
        out = {}
        for b in batches:
            r = engine.benchmark(
                max_tokens=args.tokens, prompt_tokens=args.prompt_tokens, batch=b, repeats=args.repeats
            )
            out[f"batch{b}"] = {
                k: r[k]
                for k in (
                    "tokens_per_s",
                    "e2e_tokens_per_s",
                    "ms_per_step",
                    "prefill_s",
                    "path",
                    "run_ahead",
                    "output_ids",
                )
            }
            print(f"  {label} batch {b}: {r['tokens_per_s']:.1f} tok/s ({r['ms_per_step']:.2f} ms/step)", flush=True)
        return out

    kernels = REPO / "gpuyantra" / "kernels"
    campaign_swaps = [
        ("rms_norm", template),
        ("rope", kernels / "rope.py"),
        ("silu_mul", kernels / "silu_mul.py"),
        ("add_rms_norm", kernels / "add_rms_norm.py"),  # binds only where norms are fused (fuse_norms)
    ]

    def projection_shapes(engine):
        """Each projection shape of the served model (weight and bias shapes), the vocabulary head
        apart: a campaign targets each shape on its own, as `linear` swaps below do."""
        shapes = {}
        for name, module in engine.model.named_modules():
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
                bias = None if module.bias is None else list(module.bias.shape)
                shapes[(tuple(module.weight.shape), None if bias is None else tuple(bias))] = {
                    "weight": list(module.weight.shape),
                    "bias": bias,
                }
        return list(shapes.values())

    def projection(engine, weight_shape):
        """The projection shape of weight shape "NxK" (`linear:NxK` in a list of swaps)."""
        for shapes in projection_shapes(engine):
            if "x".join(map(str, shapes["weight"])) == weight_shape:
                return shapes
        raise ValueError(f"no projection of weight shape {weight_shape}")

    def apply_swaps(engine, names):
        """Swap in the named template kernels (parity on live weights; with graphs: re-capture and
        graph-path parity before each commit); returns what each swap recorded. `linear`: the
        template at its defaults, one swap per projection shape."""
        done = []
        todo = [(name, path, None) for name, path in campaign_swaps if name in names]
        if "linear" in names:
            shapes_to_swap = projection_shapes(engine)
            if args.smoke:  # the interpreter: the smallest projection that swaps shows the path
                shapes_to_swap.sort(key=lambda shapes: math.prod(shapes["weight"]))
            todo += [("linear", kernels / "linear.py", shapes) for shapes in shapes_to_swap]
        todo += [
            ("linear", kernels / "linear.py", projection(engine, n[len("linear:") :]))
            for n in names
            if n.startswith("linear:")
        ]
        for name, path, param_shapes in todo:
            if args.smoke and param_shapes is not None and any("binding" in d and d["op"] == "linear" for d in done):
                done.append({"op": name, "param_shapes": param_shapes, "skipped": "smoke: one projection shape"})
                continue
            t = time.perf_counter()
            try:
                record = engine.swaps.swap(path, param_shapes=param_shapes)
            except SwapRejected as exc:  # a projection fused into another is not computed by itself
                if param_shapes is None:
                    raise
                done.append({"op": name, "param_shapes": param_shapes, "skipped": str(exc)})
                continue
            done.append(
                {
                    "op": name,
                    "binding": record.binding,
                    "modules": record.modules,
                    "functions": record.functions,
                    "parity": record.parity,
                    "swap_s": round(time.perf_counter() - t, 2),
                }
            )
        return done

    def agreement(out):
        # Greedy agreement with the eager SDPA path (bf16: reported, not asserted).
        for b in batches:
            e = results["results"].get("eager", {}).get(f"batch{b}", {}).get("output_ids")
            g = out.get(f"batch{b}", {}).get("output_ids")
            if e is not None and g is not None:
                out[f"batch{b}"]["agrees_with_eager_first_tokens"] = next(
                    (i for i, (x, y) in enumerate(zip(e, g)) if x != y), len(g)
                )
        return out

    holder = {}

    def new_engine(name, **kw):
        old = holder.pop("engine", None)
        if old is not None:
            old.swaps.rollback(all=True)
            old.shapes.remove()  # the next engine hooks the same model
            del old
            if device == "cuda":
                torch.cuda.empty_cache()
        t = time.perf_counter()
        engine = Engine(loaded, state_dir=state / name, max_batch=max_batch, max_seq_len=args.max_seq_len, **kw)
        holder["engine"] = engine
        return engine, round(time.perf_counter() - t, 2)

    def measure(label, names=(), full_only=False, **kw):
        """A fresh engine with `kw`, the campaign swaps in `names` applied, benchmarked at every batch.
        `full_only`: a step between two other sections, left out of the smoke (it adds no code path)."""
        if full_only and args.smoke:
            return
        kw.setdefault("fuse_projections", "off")
        kw.setdefault("fuse_norms", "off")
        kw.setdefault("mixed_prompt_tokens", args.mixed_prompt_tokens)

        def run():
            engine, init_s = new_engine(label.replace("+", "_"), **kw)
            out = {
                "init_s": init_s,
                "decode_attention": "triton" if engine.decode_attention else "sdpa",
                "fused_projection_groups": engine.fused_projections,
                "fused_residual_norms": engine.fused_residual_norms,
            }
            if label == "eager":
                results["self_check"] = engine.self_check_report
            if engine.graphs is not None:
                out["buckets"] = engine.graphs.buckets
            out["swaps"] = apply_swaps(engine, names)
            if engine.decode_attention is not None:  # calls run eagerly (graph replays do not count)
                out["attention_calls_before_bench"] = {
                    "kernel": engine.decode_attention.calls,
                    "sdpa_fallbacks": engine.decode_attention.fallbacks,
                }
            out.update(bench(engine, label))
            return agreement(out)

        section(label, run)

    # eager SDPA (transformers' attention over the cache), then the engine's Triton decode attention
    if not args.skip_eager:
        measure("eager", decode_attention="sdpa")
        measure("eager+attn", decode_attention="triton")
        measure("eager+attn+swaps", ("rms_norm", "rope", "silu_mul"), decode_attention="triton")
    measure("graphs", cuda_graphs=True, decode_attention="sdpa")
    measure("graphs+swap", ("rms_norm",), full_only=True, cuda_graphs=True, decode_attention="sdpa")
    measure("graphs+attn", cuda_graphs=True, decode_attention="triton")
    measure("graphs+attn+rms_norm", ("rms_norm",), full_only=True, cuda_graphs=True, decode_attention="triton")
    measure(
        "graphs+attn+rms_norm+rope", ("rms_norm", "rope"), full_only=True, cuda_graphs=True, decode_attention="triton"
    )
    measure("graphs+attn+swaps", ("rms_norm", "rope", "silu_mul"), cuda_graphs=True, decode_attention="triton")
    # q/k/v and gate/up as one GEMM each (serving/fusion.py); the checks below run on the last engine
    measure("graphs+attn+fused", full_only=True, cuda_graphs=True, decode_attention="triton", fuse_projections="on")
    measure(
        "graphs+attn+fused+swaps",
        ("rms_norm", "rope", "silu_mul"),
        cuda_graphs=True,
        decode_attention="triton",
        fuse_projections="on",
    )

    def last_engine_again(label, run_ahead, full_only=False):
        """The last engine benchmarked again with run-ahead on or off (graph decode waiting for each
        step's tokens before queuing the next), so the two are compared on one engine and loan."""
        if full_only and args.smoke:
            return

        def run():
            engine = holder["engine"]
            engine.run_ahead = run_ahead
            try:
                return agreement(bench(engine, label))
            finally:
                engine.run_ahead = True

        section(label, run)

    last_engine_again("graphs+attn+fused+swaps waiting", False)
    last_engine_again("graphs+attn+fused+swaps again", True)
    # ... and the linear template on every projection shape (the decode GEMVs), as a campaign deploys it
    # (the smoke takes the linear template's path in the section after this one)
    measure(
        "graphs+attn+fused+swaps+linear",
        ("rms_norm", "rope", "silu_mul", "linear"),
        full_only=True,
        cuda_graphs=True,
        decode_attention="triton",
        fuse_projections="on",
    )
    last_engine_again("graphs+attn+fused+swaps+linear waiting", False, full_only=True)
    # ... and each layer's first residual add with the norm after it as one add_rms_norm kernel
    measure(
        "graphs+attn+fused+swaps+linear+add_norm",
        ("rms_norm", "rope", "silu_mul", "linear", "add_rms_norm"),
        cuda_graphs=True,
        decode_attention="triton",
        fuse_projections="on",
        fuse_norms="on",
    )

    def arrivals(label, mixed, forced=False):
        """The last engine serving staggered streams on its model thread: `max_batch` clients, each
        sending its requests one after another, so requests arrive while the others decode. Each
        request's decode rate is its tokens after the first over the time from its first token to its
        last; the figure is clients x the median (what benchmarks/campaign_bench.py's HTTP decode
        measures, here without HTTP). `mixed`: arriving prompts may join a decode step (mixed steps), when
        measured cheaper than a prefill pass, or always (`forced`)."""

        def run():
            engine = holder["engine"]
            kept = engine.mixed_prompt_tokens
            engine.mixed_prompt_tokens = kept if mixed else 0
            measured = engine.graphs.mixed_extra_ms if engine.graphs is not None else None
            if forced and engine.graphs is not None:
                engine.graphs.mixed_extra_ms = None  # no cost to weigh: every arrival that fits joins
            step_ms = {"mixed_extra_ms": measured}
            if engine.graphs is not None and device == "cuda":
                step_ms["decode_step_ms"] = replay_only_ms(engine, max_batch)
                for rows, st in engine.graphs.mixed_static.items():
                    step_ms[f"mixed_step_{rows}_rows_ms"] = graph_replay_ms(st["graph"])
            fed_before = engine.graphs.mixed_fed_steps if engine.graphs is not None else 0
            engine.start(reapply=False)
            try:
                per_client = 1 if args.smoke else 4
                streams = staggered_streams(engine, max_batch, args.tokens, args.prompt_tokens, per_client)
                prefills = sorted(engine.scheduler._interrupting_prefill_ms)
                if engine.graphs is not None:  # of the mixed steps, those queued ahead of the host
                    streams["mixed_fed_steps"] = engine.graphs.mixed_fed_steps - fed_before
                return {**step_ms, **streams, "interrupting_prefill_ms": [round(p, 3) for p in prefills]}
            finally:
                if engine.graphs is not None:
                    engine.graphs.mixed_extra_ms = measured
                engine.stop()
                engine.scheduler._stop = False  # later sections call the engine inline again
                engine.mixed_prompt_tokens = kept

        section(label, run)

    # ------------------------------------------------------------------ where the graph step's time goes
    def replay_only_ms(engine, batch=1, replays=100):
        """GPU milliseconds per decode step of `batch` rows: back-to-back replays, no host work between."""
        engine.graphs.decode([5] * batch, [args.prompt_tokens] * batch)
        return graph_replay_ms(engine.graphs.static[engine.graphs.bucket_for(batch)]["graph"], replays)

    def graph_replay_ms(graph, replays=100):
        sync()
        t = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        sync()
        return round((time.perf_counter() - t) * 1e3 / replays, 3)

    arrivals("arrivals one pass each", False)
    arrivals("arrivals mixed when measured cheaper", True)
    arrivals("arrivals mixed always", True, forced=True)

    def profile_graph_step():
        """The last engine (graphs + decode attention + the swaps) at batch 1, and at each further
        batch measured under `batches`: a replay-only loop (GPU time per step, no host round trip)
        and the kernels of 10 replays by total GPU time."""
        engine = holder["engine"]
        if engine.graphs is None or not engine.graphs.capture_enabled:
            return {"skipped": "no captured graphs"}
        out = profile_step(engine, 1)
        out["batches"] = {f"batch{b}": profile_step(engine, b) for b in batches if b != 1}
        return out

    def profile_step(engine, batch):
        replay_ms = replay_only_ms(engine, batch)
        graph = engine.graphs.static[engine.graphs.bucket_for(batch)]["graph"]
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            sync()
        rows = []
        for ev in prof.key_averages():
            total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if total:
                rows.append({"kernel": ev.key[:90], "calls_per_step": ev.count / 10, "us_per_step": total / 10})
        rows.sort(key=lambda r: -r["us_per_step"])
        return {
            "replay_only_ms_per_step": round(replay_ms, 3),
            "kernels_per_step": sum(r["calls_per_step"] for r in rows),
            "gpu_us_per_step": round(sum(r["us_per_step"] for r in rows), 1),
            "top": rows[:30],
        }

    section("profile_graph_step", profile_graph_step)

    # ------------------------------------------------------------------ checks: the kernel is in the graph
    def check_weights_live_in_graph():
        engine = holder["engine"]
        if not engine.swaps.active_ids():
            engine.swaps.swap(template)
        norms = [m for m in engine.model.modules() if type(m).__name__.endswith("RMSNorm")]
        tokens = [11 + r for r in range(max_batch)]
        positions = [engine.cache.scratch_position] * max_batch
        before = engine.graphs.decode(tokens, positions).float().clone()
        saved = [m.weight.detach().clone() for m in norms]
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for m in norms:
                m.weight.mul_((1 + 0.3 * torch.randn(m.weight.shape, generator=gen)).to(m.weight))
        try:
            graph = engine.graphs.decode(tokens, positions).float().clone()
            sync()
            eager_out = engine.runner.decode_rows_eager(tokens, positions, kv_len=engine.cache.max_len).float()
            diff_eager = float((graph - eager_out).abs().max())
            moved = float((graph - before).abs().max())
        finally:
            with torch.no_grad():
                for m, w in zip(norms, saved):
                    m.weight.copy_(w)
        scale = float(eager_out.abs().max())
        ok = diff_eager <= 2e-2 * max(1.0, scale) and moved > 10 * max(diff_eager, 1e-6)
        return {
            "ok": ok,
            "graph_vs_eager_swapped_max_abs": diff_eager,
            "graph_moved_with_weights_max_abs": moved,
            "logit_scale": scale,
        }

    section("check_weights_live_in_graph", check_weights_live_in_graph)

    def check_counter():
        engine = holder["engine"]
        engine.swaps.rollback(all=True)
        path = state / "counting_rms_norm.py"
        path.write_text(COUNTING_KERNEL)
        record = engine.swaps.swap(path)
        module = engine.swaps._live[record.swap_id].candidate.module
        counter = module.counter(engine.device)
        norms = record.modules
        tokens = [7] * max_batch
        positions = [engine.cache.scratch_position] * max_batch
        k = 20
        sync()
        start = int(counter.item())
        for _ in range(k):
            engine.graphs.decode(tokens, positions)
        sync()
        with_kernel = int(counter.item()) - start
        engine.swaps.rollback(record.swap_id)  # re-captures without it
        start = int(counter.item())
        for _ in range(k):
            engine.graphs.decode(tokens, positions)
        sync()
        after_rollback = int(counter.item()) - start
        captured = engine.graphs.capture_enabled
        return {
            "ok": (with_kernel == k * norms and after_rollback == 0) if captured else with_kernel == k * norms,
            "replays": k,
            "norm_modules": norms,
            "counter_delta_swapped": with_kernel,
            "counter_delta_after_rollback": after_rollback,
            "captured": captured,
            "graph_parity": record.parity.get("graph"),
        }

    section("check_counter_in_graph", check_counter)

    # ------------------------------------------------------------------ torch.compile on the same static cache
    def compiled():
        if args.skip_compile or device != "cuda":
            return {"skipped": True}
        engine, _ = new_engine("compile", cuda_graphs=False, decode_attention="sdpa", fuse_projections="off")
        engine.swaps.rollback(all=True)
        engine.shapes.remove()  # no Python hooks inside the compiled region (they would break the graph)
        cache, dtype = engine.cache, engine.dtype
        for t in cache.keys + cache.values:
            if t is not None:
                torch._dynamo.mark_static_address(t)
        out, spent = {}, 0.0
        kw = {engine.runner._cache_kw: cache, "use_cache": True}  # the same for every batch size
        for b in batches:
            if spent > args.compile_budget_s:
                out[f"batch{b}"] = {"skipped": f"compile budget ({args.compile_budget_s}s) spent"}
                continue
            ids = torch.zeros((b, 1), dtype=torch.long, device=device)
            pos = torch.zeros((b,), dtype=torch.long, device=device)
            torch._dynamo.mark_static_address(ids)
            torch._dynamo.mark_static_address(pos)

            def fwd(ids, pos):
                mask = decode_mask(pos, cache.max_len, engine.runner._arange, dtype)
                return engine.model(input_ids=ids, position_ids=pos[:, None], attention_mask=mask, **kw).logits[:, -1]

            torch._dynamo.reset()
            cfwd = torch.compile(fwd, mode="reduce-overhead", dynamic=False)
            prompts = [[(31 * i + 17 * r + 5) % engine.vocab_size for i in range(args.prompt_tokens)] for r in range(b)]
            t = time.perf_counter()
            last = [int(engine.runner.prefill_row(r, p)[0].argmax()) for r, p in enumerate(prompts)]
            cache.set_decode(b, pos, cache.max_len)
            with torch.no_grad():
                for step in range(3):  # compile + cudagraph warm-up
                    ids.copy_(torch.tensor(last, device=device).view(b, 1))
                    pos.fill_(args.prompt_tokens + step)
                    cfwd(ids, pos)
            sync()
            compile_s = time.perf_counter() - t
            spent += compile_s
            times = []
            for _ in range(args.repeats):
                for r, p in enumerate(prompts):
                    engine.runner.prefill_row(r, p)
                cache.set_decode(b, pos, cache.max_len)
                cur = list(last)
                sync()
                t = time.perf_counter()
                with torch.no_grad():
                    for step in range(args.tokens - 1):
                        ids.copy_(torch.tensor(cur, device=device).view(b, 1))
                        pos.fill_(args.prompt_tokens + step)
                        cur = cfwd(ids, pos).argmax(-1).tolist()
                sync()
                times.append(time.perf_counter() - t)
            best = sorted(times)[len(times) // 2]
            out[f"batch{b}"] = {
                "tokens_per_s": b * (args.tokens - 1) / best,
                "ms_per_step": 1000 * best / (args.tokens - 1),
                "compile_s": round(compile_s, 1),
            }
            print(
                f"  compile batch {b}: {out[f'batch{b}']['tokens_per_s']:.1f} tok/s (compile {compile_s:.0f}s)",
                flush=True,
            )
        return out

    section("torch.compile", compiled)

    # ------------------------------------------------------------------ summary
    # ------------------------------------------------------------------ a campaign's swaps, in its orders
    def campaign_order(label, arrange):
        """The server's engine (graphs, decode attention, fused projections, prefill graphs, run-ahead)
        with a campaign's swaps applied one at a time in the order `arrange` makes of the decode
        projections and the other families (batch 1 after each, as the campaign's
        served checks read it), then every batch with prefill graphs and without, and the GPU's
        replay-only step: does the order, or prefill graphs, change what decode reaches?"""

        def run():
            engine, _ = new_engine(label, cuda_graphs=True, decode_attention="triton", fuse_projections="on")
            # The projections a campaign deploys at decode: all but the long-K one (down_proj stays cuBLAS).
            kept = [s for s in projection_shapes(engine) if s["weight"][1] <= s["weight"][0]]
            kept = kept[:1] if args.smoke else kept  # the interpreter: one projection shows the path
            order = arrange(["linear:" + "x".join(map(str, s["weight"])) for s in kept])
            steps = []
            for name in order:
                apply_swaps(engine, [name])
                r = engine.benchmark(max_tokens=args.tokens, prompt_tokens=args.prompt_tokens, batch=1, repeats=2)
                steps.append({"swap": name, "batch1_tokens_per_s": round(r["tokens_per_s"], 1)})
                print(f"  {label} + {name}: {r['tokens_per_s']:.1f} tok/s", flush=True)
            fed_before = engine.graphs.fed_steps if engine.graphs else None
            out = {"order": order, "steps": steps, "with_prefill_graphs": bench(engine, f"{label} prefill graphs")}
            with engine.eager_prefill():
                out["eager_prefill"] = bench(engine, f"{label} eager prefill")
            # A campaign's paired check switches graph sets; the speed after it, with the set it keeps.
            paired = engine.compare_swap(engine.swaps.active_ids()[-1], [1], rounds=2)
            out["paired"] = {"batches": paired["batches"], "seconds": round(paired["seconds"], 1)}
            out["after_paired"] = bench(engine, f"{label} after a paired check")
            if engine.graphs is not None:
                out["fed_steps"] = engine.graphs.fed_steps - fed_before
                out["replays"] = engine.graphs.replays
                if engine.graphs.capture_enabled:
                    out["replay_only_ms_per_step"] = replay_only_ms(engine)
                    print(f"  {label} replay-only: {out['replay_only_ms_per_step']} ms/step", flush=True)
            if engine.prefill_graphs is not None:
                out["prefill_graphs"] = engine.prefill_graphs.info()
            return out

        section(label, run)

    campaign_order("order projections first", lambda linears: [*linears, "rope", "rms_norm", "silu_mul"])
    if not args.smoke:
        campaign_order(
            "order interleaved",
            lambda linears: [*linears[:1], "rope", "rms_norm", *linears[1:2], "silu_mul", *linears[2:]],
        )

    summary = {}
    for name in (
        "eager",
        "eager+attn",
        "eager+attn+swaps",
        "graphs",
        "graphs+swap",
        "graphs+attn",
        "graphs+attn+rms_norm",
        "graphs+attn+rms_norm+rope",
        "graphs+attn+swaps",
        "graphs+attn+fused",
        "graphs+attn+fused+swaps",
        "graphs+attn+fused+swaps waiting",
        "graphs+attn+fused+swaps again",
        "graphs+attn+fused+swaps+linear",
        "graphs+attn+fused+swaps+linear waiting",
        "torch.compile",
    ):
        for b in batches:
            v = results["results"].get(name, {}).get(f"batch{b}", {})
            if isinstance(v, dict) and "tokens_per_s" in v:
                summary[f"{name} batch{b}"] = round(v["tokens_per_s"], 1)
    results["summary"] = summary
    g1 = max(summary.get("graphs+attn+swaps batch1", 0), summary.get("graphs+attn+fused+swaps batch1", 0)) or None
    results["target_400_tok_s_batch1"] = {"graphs+attn(+fused)+swaps": g1, "met": bool(g1 and g1 >= 400)}
    save()
    print(
        json.dumps(
            {
                "summary": summary,
                "checks": {k: v.get("ok") for k, v in results["checks"].items()},
                "errors": list(results["errors"]),
            },
            indent=1,
        )
    )
    return 0 if not results["errors"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
