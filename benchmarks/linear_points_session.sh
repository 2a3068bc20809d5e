source benchmarks/device_prelude.sh || exit 1
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee $OUT/versions.txt
G2="BLOCK_N=2,GEMV_WARPS=2"; G4="BLOCK_N=4,GEMV_WARPS=4"
R8="GEMV_MAX_ROWS=8,BLOCK_K=256"
lv() { timeout $1 python3 benchmarks/linear_verdicts.py --out $OUT/$2.json --weight $3 --shapes $4 ${5:+--bias} --points "$6" 2>&1 | tee $OUT/$2.log | grep -v Warn; }
lv 200 down 1536x8960 8x1x8960,1x1x8960 "" "$G2,SMALL_BLOCK_N=16,SMALL_STAGES=5;$G2,SMALL_BLOCK_N=32,SMALL_STAGES=3;$G2,SMALL_BLOCK_N=32,SMALL_STAGES=5;$G2,SMALL_BLOCK_N=64,SMALL_STAGES=3;$G2,SMALL_BLOCK_N=32,SMALL_STAGES=3,SMALL_SPLIT_K=8;$G2,SMALL_BLOCK_N=16,SMALL_STAGES=5,SMALL_SPLIT_K=6;$G2,SMALL_BLOCK_N=64,SMALL_BLOCK_K=256,SMALL_STAGES=3;$G2,$R8;$G2,$R8,SPLIT_K=4"
lv 120 gate_up 17920x1536 8x1x1536,1x1x1536 "" "$G2,SMALL_BLOCK_N=32,SMALL_STAGES=3;$G2,$R8;$G4,$R8,DEFER_REDUCE=False;$G2,SMALL_BLOCK_N=64,SMALL_STAGES=3"
lv 100 qkv 2048x1536 8x1x1536,1x1x1536 1 "$G4,SMALL_BLOCK_N=16,SMALL_STAGES=5;$G4,$R8;$G4,SMALL_BLOCK_N=32,SMALL_STAGES=3"
lv 100 o_proj 1536x1536 8x1x1536,1x1x1536 "" "$G4,SMALL_BLOCK_N=16,SMALL_STAGES=5;$G4,$R8;$G4,SMALL_BLOCK_N=32,SMALL_STAGES=3"
