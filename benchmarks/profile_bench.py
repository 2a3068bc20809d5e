"""Profile the Qwen2.5-1.5B architecture (random bf16 weights) at batch-1 decode and at a prefill batch.

    python benchmarks/profile_bench.py --out profile.json              # on a CUDA machine (< 4 min on an H200)
    python benchmarks/profile_bench.py --tiny --device cpu --out p.json  # smoke test anywhere

Builds the model from its config (no download), runs `gpuyantra.profiler.profile_model` with a
decode probe (one token per call for `--decode-batch` sequences on a `--context`-token KV cache;
the cache grows by one token a call, as in served decode) and a prefill probe (`--prefill-batch`
x `--prefill-len` tokens, no cache), prints regime, GPU busy fraction, launches and the ranked
targets per phase, and writes the whole profile as JSON to `--out`.

With `--what-if` (default on CUDA) it then binds the template Triton rms_norm kernel into every
matched RMSNorm module and measures the decode step again, so the profiler's Amdahl estimate for
that swap can be compared with what the swap actually does to served decode.

Runs on torch >= 2.11 and transformers >= 5.17.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN25_15B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    use_sliding_window=False,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    tie_word_embeddings=True,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu by default")
    p.add_argument("--tiny", action="store_true", help="a tiny Qwen2 config instead of 1.5B (smoke test)")
    p.add_argument("--decode-batch", type=int, default=1)
    p.add_argument("--context", type=int, default=128, help="KV-cache tokens before the decode steps")
    p.add_argument("--prefill-batch", type=int, default=4)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--repeat", type=int, default=10, help="timed probe calls per phase")
    p.add_argument("--profile-steps", type=int, default=3, help="profiled probe calls per phase")
    p.add_argument(
        "--what-if",
        dest="what_if",
        action="store_true",
        default=None,
        help="measure decode with the template Triton rms_norm swapped in (default on cuda)",
    )
    p.add_argument("--no-what-if", dest="what_if", action="store_false")
    p.add_argument("--out", default="profile_bench.json")
    return p.parse_args(argv)


def build_model(tiny: bool, device: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**(TINY if tiny else QWEN25_15B))
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval(), config


def make_probes(model, config, args, device):
    import inspect

    import torch

    # transformers renamed past_key_values to cache (5.2x); use whichever this version takes.
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"

    def cache_of(out):
        value = getattr(out, "cache", None)
        return value if value is not None else out.past_key_values

    gen = torch.Generator().manual_seed(1)
    vocab = config.vocab_size
    prompt = torch.randint(0, vocab, (args.decode_batch, args.context), generator=gen).to(device)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
    state = {"cache": cache_of(out), "token": out.logits[:, -1:].argmax(-1)}

    def decode():
        out = model(input_ids=state["token"], use_cache=True, **{cache_kw: state["cache"]})
        state["cache"] = cache_of(out)
        state["token"] = out.logits[:, -1:].argmax(-1)

    prefill_ids = torch.randint(0, vocab, (args.prefill_batch, args.prefill_len), generator=gen).to(device)

    def prefill():
        model(input_ids=prefill_ids, use_cache=False)

    return {"decode": decode, "prefill": prefill}


def time_probe(fn, device, repeat):
    import torch

    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        fn()
        sync()
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            sync()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def what_if_rms_norm(model, profile, probes, device, repeat, rounds=6):
    """Bind the template Triton rms_norm into every matched norm module and measure decode against
    the eager modules, interleaved (A/B/B/A...) so the growing KV cache and machine drift cancel."""
    import torch

    from gpuyantra.ops import get_op

    target = next((t for t in profile["targets"] if t["op"] == "rms_norm"), None)
    if target is None:
        return {"skipped": "no rms_norm target"}
    from gpuyantra.kernels import rms_norm as template

    family = get_op("rms_norm")
    modules = [
        m
        for _, m in model.named_modules()
        if f"{type(m).__module__}.{type(m).__qualname__}" == target["qualified_class"]
    ]
    swapped = {
        id(m): types.MethodType(family.replacement_forward(m, template.entry, target["adapter"]), m) for m in modules
    }
    originals = {id(m): m.__dict__.get("forward") for m in modules}

    def bind(use_kernel):
        for m in modules:
            if use_kernel:
                m.forward = swapped[id(m)]
            elif originals[id(m)] is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = originals[id(m)]

    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    samples = {False: [], True: []}
    per_round = max(repeat // 2, 2)
    try:
        with torch.no_grad():
            bind(True)
            probes["decode"]()  # compile / warm the kernel
            sync()
            for r in range(rounds):
                for use_kernel in (False, True) if r % 2 == 0 else (True, False):
                    bind(use_kernel)
                    probes["decode"]()
                    sync()
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        probes["decode"]()
                        sync()
                        samples[use_kernel].append((time.perf_counter() - t0) * 1e3)
    finally:
        bind(False)
    before, after = statistics.median(samples[False]), statistics.median(samples[True])
    decode = profile["phases"].get("decode", {})
    decode_target = next((t for t in decode.get("targets", []) if t["op"] == "rms_norm"), {})
    return {
        "modules": len(modules),
        "samples_each": len(samples[False]),
        "decode_step_ms_before": round(before, 4),
        "decode_step_ms_after": round(after, 4),
        "measured_gain_ms": round(before - after, 4),
        "measured_gain": round((before - after) / before, 5) if before else None,
        "predicted_gain_ms": round(decode_target.get("est_gain_us", 0.0) / 1e3, 4),
        "predicted_gain": decode_target.get("est_gain"),
    }


def print_profile(profile):
    print(
        f"hardware {profile['hardware']}  device {profile['device']}  "
        f"(copy {profile['hardware_spec']['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul "
        f"{profile['hardware_spec']['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s, eager launch "
        f"{profile['hardware_spec']['launch_us']:.1f} us, triton call "
        f"{profile['hardware_spec'].get('triton_launch_us') or float('nan'):.1f} us, "
        f"measured={profile['hardware_spec']['measured']})"
    )
    for name, phase in profile["phases"].items():
        busy = "GPU busy" if profile["device"].startswith("cuda") else "busy in ops"
        print(
            f"\n== {name}: step {phase['step_ms']:.2f} ms, {busy} {phase['busy_fraction']:.1%}, "
            f"device {phase['device_ms']:.2f} ms, {phase['launches_per_step']:.0f} launches/step, "
            f"{phase.get('syncs_per_step', 0):g} syncs/step, "
            f"regime {phase['regime']}, matmul AI {phase.get('matmul_arithmetic_intensity')}"
        )
        print(
            f"  {'rank':>4} {'op':10} {'class':16} {'mods':>4} {'regime':13} {'share':>6} {'dev us':>8} "
            f"{'host us':>8} {'launch':>6} {'AI':>6} {'floor us':>8} {'gain':>7}  shapes"
        )
        for t in phase["targets"]:
            print(
                f"  {t['rank']:>4} {t['op']:10} {t['module_class'][:16]:16} {t['modules']:>4} {t['regime']:13} "
                f"{t['share']:>6.1%} {t['device_us']:>8.1f} {t['host_us']:>8.1f} {t['launches']:>6.0f} "
                f"{(t['arithmetic_intensity'] or 0):>6.2f} {t['floor_us']:>8.1f} {t['est_gain']:>+7.1%}  "
                f"{t['shapes'][:2]}"
            )
            print(f"       why: {t['why']}")
        print("  top module classes by share:")
        for c in phase["classes"][:8]:
            top = ", ".join(f"{o['name']} {o['host_us']:.0f}" for o in c.get("top_ops", [])[:3])
            print(
                f"    {c['module_class'][:28]:28} x{c['modules']:<4} share {c['share']:>6.1%} "
                f"device {c['device_us']:>9.1f} us host {c['host_us']:>9.1f} us (ops {c.get('ops_host_us', 0):.0f}) "
                f"launches {c['launches']:>6.0f} syncs {c.get('syncs', 0):g}  [{top}]"
            )
    print("\nranked targets (per served request):")
    for t in profile["targets"]:
        print(
            f"  {t['rank']}. {t['op']} / {t['module_class']} x{t['modules']}: {t['regime']}, share "
            f"{t['share']:.1%}, est. gain {t['est_gain']:+.1%}"
        )
    for note in profile.get("notes", []):
        print(f"note: {note}")


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    from gpuyantra.triton_env import prepare

    device = prepare(args.device)
    import torch

    from gpuyantra.profiler.model import profile_model

    default_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    dtype = getattr(torch, args.dtype) if args.dtype else default_dtype
    model, config = build_model(args.tiny, device, dtype)
    built = time.perf_counter()
    probes = make_probes(model, config, args, device)
    profile = profile_model(
        model, probes=probes, device=device, repeat=args.repeat, profile_steps=args.profile_steps, warmup=2
    )
    what_if = args.what_if if args.what_if is not None else device.startswith("cuda")
    if what_if:
        try:
            profile["what_if_rms_norm"] = what_if_rms_norm(model, profile, probes, device, args.repeat)
        except Exception as exc:  # noqa: BLE001 - the profile itself is still worth writing
            profile["what_if_rms_norm"] = {"error": f"{type(exc).__name__}: {exc}"}
    import transformers

    profile["bench"] = {
        "model": "tiny-qwen2" if args.tiny else "Qwen2.5-1.5B architecture (random weights)",
        "dtype": str(dtype).replace("torch.", ""),
        "decode_batch": args.decode_batch,
        "context": args.context,
        "prefill_batch": args.prefill_batch,
        "prefill_len": args.prefill_len,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "build_s": round(built - started, 2),
        "total_s": round(time.perf_counter() - started, 2),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "pid": os.getpid(),
    }
    print_profile(profile)
    if "what_if_rms_norm" in profile:
        print(f"\nwhat-if (template Triton rms_norm swapped in): {json.dumps(profile['what_if_rms_norm'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(profile, indent=2, default=str))
    print(f"\nwrote {args.out} in {profile['bench']['total_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
