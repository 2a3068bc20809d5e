#!/usr/bin/env bash
# Every GPU measurement of the project in device calls of < 10 minutes on an H200:
#   device run, carry [".whl"], command: bash benchmarks/gpu_session.sh [parts...]
# parts (default: all): verify ops sweep launch profile serving http campaign
#   on demand: abuse verify-speed kb-conv kb-f32 cand-profile (.kb/cands/PROBLEM.py) kb-ab (.kb/ab/GROUP/) kb-matmul kb-pool kb-l1 kb-l2 kb-l2-all kb-both (4 GPUs) campaign-linear campaign-quick campaign-repeat serving-nocompile linear-regimes linear-points linear-b8-grid
#   campaign-state, then join-ahead and mixed-rows on its kernels (GY_STATE, default /tmp/gystate)
# Fetch the wheels first, here: benchmarks/device_wheels.sh liger-kernel
# Results land in $OUT; copy them into docs/perf/<date>-h200-*/ with the date and versions.
set -uo pipefail
source benchmarks/device_prelude.sh || exit 1
OUT=${OUT:-/tmp/gy-out}; mkdir -p "$OUT"
parts=${*:-verify ops sweep launch profile serving http campaign}
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
python3 -c 'import liger_kernel; print("liger_kernel", getattr(liger_kernel, "__version__", "installed"))' 2>&1 | tail -1 | tee -a "$OUT/versions.txt"
run() { local name=$1; shift; echo "== $name"; timeout "$@" 2>&1 | tee "$OUT/$name.log" | tail -45; }
for part in $parts; do
  case $part in
    verify) run verify_rms_norm 120 python3 -m gpuyantra.cli verify gpuyantra/kernels/rms_norm.py --device cuda --shapes 1x1536,4096x1536 --dtypes bfloat16 --json ;;
    ops) run ops_bench 280 python3 benchmarks/ops_bench.py --out "$OUT" --budget-s 240 ;;
    sweep) run strategy_sweep_bf16 150 python3 benchmarks/strategy_sweep.py --ops layer_norm,rope,softmax,rms_norm --shape large --dtype bf16 --only-extra --extra "$(cat benchmarks/sweep_points.json)"
           run strategy_sweep_fp16 100 python3 benchmarks/strategy_sweep.py --ops rms_norm,layer_norm,rope --shape large --dtype fp16 --only-extra --extra "$(cat benchmarks/sweep_points.json)" ;;
    launch) run launch_probe 60 python3 benchmarks/launch_probe.py ;;
    profile) run profile_bench 100 python3 benchmarks/profile_bench.py --out "$OUT/profile_h200.json" ;;
    serving) run serving_bench 420 python3 benchmarks/serving_bench.py --out "$OUT/serving_bench.json" ;;
    serving-nocompile) run serving_bench 300 python3 benchmarks/serving_bench.py --out "$OUT/serving_bench.json" --skip-compile ;;
    http) run http_serving 200 python3 benchmarks/http_serving_bench.py --out "$OUT/http_serving.json" ;;
    # normal chat streams alone, then beside abusive clients (benchmarks/abuse_bench.py)
    abuse) run abuse_bench 420 python3 benchmarks/abuse_bench.py --out "$OUT/abuse.json" ;;
    verify-speed) run verify_speed 300 python3 benchmarks/verify_speed.py --out "$OUT/verify_speed.json" --between-s 8 ;;
    # KernelBench parts need the problems carried too: carry [".whl", ".kb"] (.kb/level1, .kb/level2).
    kb-matmul) run kb_matmul 560 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level1 --device cuda --shards 3 --max-iterations 2 --deadline-s 530 --out "$OUT/kb_matmul" --only 1-18,93,96,98,100 ;;
    kb-pool) run kb_pool 300 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level1 --device cuda --shards 2 --max-iterations 2 --deadline-s 280 --out "$OUT/kb_pool" --only 41-46 ;;
    kb-l1) run kb_l1 570 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level1 --device cuda --shards ${KB_SHARDS:-3} --max-iterations 1 --deadline-s ${KB_DEADLINE_S:-540} --out /tmp/kb_l1 ${KB_L1_ONLY:+--only $KB_L1_ONLY}
             cp /tmp/kb_l1/results.json "$OUT/kb_l1.json"; tar czf "$OUT/kb_l1_cands.tgz" --exclude='*.pt' --exclude='state-gpu*' -C /tmp kb_l1 2>/dev/null ;;
    kb-l2) run kb_l2 560 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level2 --device cuda --shards 3 --max-iterations 2 --deadline-s 530 --out "$OUT/kb_l2" --only 9,12,14,18,22,28,29,30,33,37,39,40,41,45,51,53,55,56,59,62,63,64,66,68,70,75,76,80,81,84,86,88,94,95,97,98,99 ;;
    kb-conv) run kb_conv_l1 260 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level1 --device cuda --shards 3 --max-iterations 1 --deadline-s 240 --out "$OUT/kb_conv_l1" --only 54,57,63,67,77,82,87
             run kb_conv_l2 220 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level2 --device cuda --shards 3 --max-iterations 1 --deadline-s 200 --out "$OUT/kb_conv_l2" --only 10,11,13 ;;
    kb-f32) # float32 matmuls and convolutions of both levels (the MM_F32_TC knob's problems)
             run kb_f32_l1 340 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level1 --device cuda --shards 3 --max-iterations 1 --deadline-s 320 --out /tmp/kb_f32_l1 --only 1-18,54,57,63,67,77,82,87
             cp /tmp/kb_f32_l1/results.json "$OUT/kb_f32_l1.json"
             run kb_f32_l2 190 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level2 --device cuda --shards 3 --max-iterations 1 --deadline-s 170 --out /tmp/kb_f32_l2 --only 10,11,12,13,14,18
             cp /tmp/kb_f32_l2/results.json "$OUT/kb_f32_l2.json" ;;
    cand-profile) for c in .kb/cands/*.py; do n=$(basename "$c" .py); prob=$(ls .kb/level1/"$n".py .kb/level2/"$n".py 2>/dev/null | head -1)
             run "profile_$n" 120 python3 benchmarks/candidate_profile.py "$c" --problem "$prob" --json "$OUT/profile_$n.json"; done ;;
    # Knob settings side by side against eager and torch.compile: each .kb/ab/GROUP/ holds candidates
    # (PROBLEM/candidate_1.py, as `gpuyantra kernelbench --out` writes them) and settings.txt.
    kb-ab) for g in .kb/ab/*/; do n=$(basename "$g")
             run "ab_$n" ${KB_AB_S:-150} python3 benchmarks/knob_ab.py "$g" --compile --settings="$(cat "$g/settings.txt")" --out "$OUT/ab_$n.json"; done ;;
    kb-l2-all) run kb_l2_all 575 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py .kb/level2 --device cuda --shards ${KB_SHARDS:-4} --max-iterations ${KB_ITER:-1} --deadline-s ${KB_DEADLINE_S:-545} --order ${KB_ORDER:-number} --out /tmp/kb_l2 ${KB_L2_ONLY:+--only $KB_L2_ONLY}
             cp /tmp/kb_l2/results.json "$OUT/kb_l2.json"; tar czf "$OUT/kb_l2_cands.tgz" --exclude='*.pt' --exclude='state-gpu*' -C /tmp kb_l2 2>/dev/null ;;
    # Both levels at once on a host of 4 GPUs: level 1 on GPUs 0-1, level 2 on GPUs 2-3.
    kb-both) kb="env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benchmarks/kernelbench_sharded.py --device cuda --gpus 2 --max-iterations 1 --deadline-s ${KB_DEADLINE_S:-520}"
             CUDA_VISIBLE_DEVICES=0,1 timeout 580 $kb .kb/level1 --shards 6 --out /tmp/kb_l1 ${KB_L1_ONLY:+--only $KB_L1_ONLY} >"$OUT/kb_l1.log" 2>&1 &
             CUDA_VISIBLE_DEVICES=2,3 timeout 580 $kb .kb/level2 --shards 8 --order number --out /tmp/kb_l2 ${KB_L2_ONLY:+--only $KB_L2_ONLY} >"$OUT/kb_l2.log" 2>&1 &
             wait; tail -n 4 "$OUT/kb_l1.log" "$OUT/kb_l2.log"
             cp /tmp/kb_l1/results.json "$OUT/kb_l1.json"; cp /tmp/kb_l2/results.json "$OUT/kb_l2.json"
             tar czf "$OUT/kb_cands.tgz" --exclude='*.pt' --exclude='*.bin' --exclude='state-gpu*' -C /tmp kb_l1 kb_l2 2>/dev/null; ls -la "$OUT" ;;
    campaign-quick) run campaign_bench 340 python3 benchmarks/campaign_bench.py --out "$OUT/campaign" --max-targets 8 --max-iterations 2 --min-reward 2 --budget-s 330 --skip-compile ;;
    campaign-repeat) run campaign_bench 580 python3 benchmarks/campaign_bench.py --out "$OUT/campaign" --phases before,cold,warm,after --warm-runs 2 --max-targets 8 --max-iterations 2 --min-reward 2 --budget-s 565 ;;
    campaign-linear) run campaign_bench 580 python3 benchmarks/campaign_bench.py --out "$OUT/campaign" --max-targets 8 --max-iterations 2 --min-reward 2 --budget-s 560 ;;
    # The linear template judged by the verifier at knob points of each decode projection (batch 8 and 1).
    linear-points)
      g2="BLOCK_N=2,GEMV_WARPS=2"; g4="BLOCK_N=4,GEMV_WARPS=4"; r8="GEMV_MAX_ROWS=8,BLOCK_K=256"
      lv() { run "$1" "$2" python3 benchmarks/linear_verdicts.py --out "$OUT/$1.json" --weight "$3" --shapes "$4" ${5:+--bias} --points "$6"; }
      lv down 200 1536x8960 8x1x8960,1x1x8960 "" "$g2,SMALL_BLOCK_N=16,SMALL_STAGES=5;$g2,SMALL_BLOCK_N=32,SMALL_STAGES=3;$g2,SMALL_BLOCK_N=32,SMALL_STAGES=5;$g2,SMALL_BLOCK_N=64,SMALL_STAGES=3;$g2,SMALL_BLOCK_N=32,SMALL_STAGES=3,SMALL_SPLIT_K=8;$g2,SMALL_BLOCK_N=16,SMALL_STAGES=5,SMALL_SPLIT_K=6;$g2,SMALL_BLOCK_N=64,SMALL_BLOCK_K=256,SMALL_STAGES=3;$g2,$r8;$g2,$r8,SPLIT_K=4"
      lv gate_up 120 17920x1536 8x1x1536,1x1x1536 "" "$g2,SMALL_BLOCK_N=32,SMALL_STAGES=3;$g2,$r8;$g4,$r8,DEFER_REDUCE=False;$g2,SMALL_BLOCK_N=64,SMALL_STAGES=3"
      lv qkv 100 2048x1536 8x1x1536,1x1x1536 1 "$g4,SMALL_BLOCK_N=16,SMALL_STAGES=5;$g4,$r8;$g4,SMALL_BLOCK_N=32,SMALL_STAGES=3"
      lv o_proj 100 1536x1536 8x1x1536,1x1x1536 "" "$g4,SMALL_BLOCK_N=16,SMALL_STAGES=5;$g4,$r8;$g4,SMALL_BLOCK_N=32,SMALL_STAGES=3" ;;
    # Batch-8 decode tiles of each projection over a knob grid (both tile orientations): every point
    # compiled first in four processes at once (timings thrown away; Triton's cache keeps the
    # binaries, PYTHONHASHSEED keeps the rendered file names), then timed one shape at a time.
    linear-b8-grid)
      sw="SMALL_SWAP_AB=False|True"
      declare -A grid=(
        [qkv]="$sw;SMALL_BLOCK_N=16|32|64;SMALL_BLOCK_K=128|256|512;SMALL_SPLIT_K=1|2;SMALL_STAGES=3"
        [o_proj]="$sw;SMALL_BLOCK_N=16|32|64;SMALL_BLOCK_K=128|256|512;SMALL_SPLIT_K=1|2;SMALL_STAGES=3"
        [down_proj]="$sw;SMALL_BLOCK_N=16|32|64;SMALL_BLOCK_K=128|256;SMALL_SPLIT_K=0|4|8;SMALL_STAGES=4"
        [gate_up]="$sw;SMALL_BLOCK_N=32|64|128;SMALL_BLOCK_K=128|256;SMALL_STAGES=3|4"
      )
      lg() { PYTHONHASHSEED=0 python3 benchmarks/linear_gemv.py --batches 8 --no-compile --max-points 64 --shapes "$1" --grid "${grid[$1]}" "${@:2}"; }
      for s in "${!grid[@]}"; do timeout 240 bash -c "$(declare -p grid); $(declare -f lg); lg $s --replays 1 --repeats 1 --out /tmp/warm_$s.json" > "$OUT/warm_$s.log" 2>&1 & done
      wait; tail -n 2 "$OUT"/warm_*.log
      for s in qkv o_proj down_proj gate_up; do run "b8_grid_$s" 150 bash -c "$(declare -p grid); $(declare -f lg); lg $s --out $OUT/b8_grid_$s.json"; done ;;
    linear-regimes) run linear_regimes_a 290 python3 benchmarks/linear_gemv.py --shapes qkv,o_proj,down_proj --no-compile --out "$OUT/linear_regimes_a.json"
           run linear_regimes_b 290 python3 benchmarks/linear_gemv.py --shapes gate_up,lm_head --no-compile --out "$OUT/linear_regimes_b.json" ;;
    campaign) run campaign_bench 560 python3 benchmarks/campaign_bench.py --out "$OUT/campaign" --max-targets 2 --max-iterations 2 ;;
    # a campaign over the profiler's top 10 targets whose kernels stay in $GY_STATE for the parts below
    # (GY_PHASES, GY_BUDGET_S and GY_TIMEOUT_S shorten it to share a call with the parts below)
    campaign-state) run campaign_bench "${GY_TIMEOUT_S:-580}" python3 benchmarks/campaign_bench.py --out "$OUT/campaign" --state-dir "${GY_STATE:-/tmp/gystate}" --phases "${GY_PHASES:-before,cold,after}" --max-targets 10 --max-iterations 2 --min-reward 2 --budget-s "${GY_BUDGET_S:-300}" ;;
    # mixed steps queued behind a step running ahead (fed on the device) against fed by the host
    join-ahead) run serve_variants 540 python3 benchmarks/serve_variants.py --state-dir "${GY_STATE:-/tmp/gystate}" --out "$OUT/join_ahead.json" --site-hooks --variant fed= --variant hostfed= --env hostfed=GY_NO_JOIN_AHEAD:1 --variant nomixed=--mixed-prompt-tokens=0 --http-runs 3 ;;
    # the same, fed on the device against fed by the host only
    join-ab) run serve_variants 300 python3 benchmarks/serve_variants.py --state-dir "${GY_STATE:-/tmp/gystate}" --out "$OUT/join_ab.json" --site-hooks --variant fed= --variant hostfed= --env hostfed=GY_NO_JOIN_AHEAD:1 --http-runs 3 ;;
    # mixed graphs of 8 + 56 rows (one 64-row tile of the projections) against 8 + 64
    mixed-size) run serve_variants 300 python3 benchmarks/serve_variants.py --state-dir "${GY_STATE:-/tmp/gystate}" --out "$OUT/mixed_size.json" --variant m56=--mixed-prompt-tokens=56 --variant m64=--mixed-prompt-tokens=64 --http-runs 3 ;;
    # a mixed step's extra GPU time by its rows, on $GY_STATE's kernels where that folder exists
    mixed-rows) run mixed_rows "${GY_TIMEOUT_S:-240}" python3 benchmarks/mixed_rows_sweep.py --out "$OUT/mixed_rows.json" --prompt-tokens "${GY_PROMPT_TOKENS:-8,16,24,32,40,48,56,64,72,88,120}" $([ -d "${GY_STATE:-/tmp/gystate}" ] && echo --state-dir "${GY_STATE:-/tmp/gystate}") ;;
    *) echo "unknown part $part" ;;
  esac
done
