"""Compile the kernels for a GPU target without a GPU (Triton's bundled ptxas) and print their
resource use: registers, spill stack, shared memory. Catches compile errors and register spills
before a run on the H200. Takes a minute or two on a CPU:

    .venv/bin/python -m kernels.aot_check            # sm_90 (H200)
    .venv/bin/python -m kernels.aot_check --arch 100
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import (alrkvd_attention, alrkvd_compress, expert_copy, expert_slots, fused_moe, kivi_attention, norms,
                     paged_attention, trellis_viterbi)


def _usage(compiled) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    # cuobjdump's SHARED is the static part; Triton's pipeline buffers and layout scratch are dynamic (metadata)
    static = " ".join(line.strip() for line in out.splitlines() if "REG" in line)
    return f"{static} DYNAMIC_SHARED:{compiled.metadata.shared}"


def compile_one(fn, pointers: dict, floats: set, constexprs: dict, options: dict, target) -> str:
    """Compile `fn` for `target` with pointer element types `pointers`, fp32 scalars `floats`, i32 for
    the other runtime arguments; returns cuobjdump's resource line and the dynamic shared memory. Pointers and
    strides are marked multiples of 16, as the JIT finds torch's tensors and the served shapes' strides (but the
    block table's and the ranks'); unmarked, the 2-warp ALR-KVD launch compiled to 32 registers and 8 KB of spill
    stack, where the JIT's build has 255 and 1.3 KB."""
    sig = {}
    for p in fn.params:
        sig[p.name] = ("constexpr" if p.name in constexprs else "*" + pointers[p.name] if p.name in pointers
                       else "fp32" if p.name in floats else "i32")
    consts = {(fn.arg_names.index(name),): value for name, value in constexprs.items()}
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in sig.items()
               if kind.startswith("*") or (name.startswith("stride") and kind == "i32"
                                          and name not in ("stride_btb", "stride_rkn"))}
    return _usage(triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=aligned), target=target,
                                 options=options))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", type=int, default=90)
    target = GPUTarget("cuda", ap.parse_args().arch, 32)
    f16, f32 = tl.float16, tl.float32
    paged_ptrs = dict(Q="fp16", K_cache="fp16", V_cache="fp16", Block_tables="i32", Seq_lens="i32",
                      Mid_o="fp32", Mid_lse="fp32", Out="fp16", Tickets="i32")
    alr_ptrs = dict(Q="fp16", Block_tables="i32", Seq_lens="i32", Closed="i32", Window_slots="i32", Window_k="fp16",
                    Window_v="fp16", Tile_starts="i32", Tile_counts="i32", Cos="fp32", Sin="fp32", Ranks="i16",
                    Basis="i8", Basis_scale="fp16", Latent="u8", Latent_scale="fp16", Latent_zero="fp16",
                    K_resid="u8", K_rscale="fp16", K_rzero="fp16", V_resid="u8", V_rscale="fp16", V_rzero="fp16",
                    Mid_o="fp32", Mid_lse="fp32", Out="fp16", Tickets="i32")
    comp_ptrs = dict(K_src="fp16", V_src="fp16", Block_ids="i64", Ranks="i16", Basis="i8", Basis_scale="fp16",
                     Rot="fp32", Start_pos="i64", Cos="fp32", Sin="fp32", K_levels="fp32", K_edges="fp32",
                     V_levels="fp32", V_edges="fp32", Search="fp32",
                     Latent="u8", Latent_scale="fp16", Latent_zero="fp16", K_resid="u8", K_rscale="fp16",
                     K_rzero="fp16", V_resid="u8", V_rscale="fp16", V_rzero="fp16")
    cfg = alrkvd_attention._DEFAULT_STAGE1
    moe_prefill = fused_moe._default_config(128, torch.device("cuda"))  # the launcher's tiles at M=128
    # the strides that are 1 in the cache's layout are constants for the JIT too (it specializes ints equal to 1)
    alr_common = dict(NUM_KV_HEADS=8, GROUP=4, BLOCK_G=4, BLOCK_GN=8, MERGE_CHUNK=32, HEAD_DIM=128, BLOCK_SIZE=128,
                      BLOCK_S=16, K_BITS=2, V_BITS=2, ASM=True, HAS_CLOSED=False, TILE_Q=1, stride_lt=1, stride_kst=1,
                      stride_vst=1, stride_vrt=1)
    alr_launches = [(rot, r, alrkvd_attention.launch_config(cfg, many, r, rot))
                    for rot in (False, True) for r in (16, 64) for many in (False, True)]
    jobs = [
        ("paged stage 1 (D=128, G=4, page 16)", paged_attention._paged_decode_stage1, paged_ptrs, {"qk_scale"},
         dict(GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, PAGE_SIZE=16,
              BLOCK_N=paged_attention._DEFAULT_STAGE1["BLOCK_N"], DOT_DTYPE=f16, DOT_PRECISION="tf32",
              MERGE_G=4,
              MERGE_CHUNK=paged_attention.merge_chunk(4, 128, paged_attention._DEFAULT_STAGE1["num_warps"], 4),
              MIN_TILES=paged_attention.MIN_TOKENS_PER_SPLIT // paged_attention._DEFAULT_STAGE1["BLOCK_N"]),
         {k: v for k, v in paged_attention._DEFAULT_STAGE1.items() if k != "BLOCK_N"}),
        ("decode reduce (D=128)", paged_attention._decode_reduce_stage2, dict(Mid_o="fp32", Mid_lse="fp32", Out="fp16"),
         set(), dict(BLOCK_P=16, HEAD_DIM=128, BLOCK_D=128), dict(num_warps=1)),
    ] + [
        (f"alrkvd stage 1 (rank<={r}{', rotated keys' if rot else ''}, {c['num_warps']} warps, tile {c['BLOCK_N']})",
         alrkvd_attention._alrkvd_decode_stage1, alr_ptrs, {"qk_scale"},
         dict(alr_common, BLOCK_N=c["BLOCK_N"], WINDOW_N=c["WINDOW_N"], BLOCK_R=r, ROTATED_KEYS=rot,
              MIN_TILES=c["MIN_TOKENS_PER_SPLIT"] // c["BLOCK_N"]),
         dict(num_warps=c["num_warps"], num_stages=c["num_stages"]))
        for rot, r, c in alr_launches
    ] + [
        (f"alrkvd rebuild of closed blocks ({'rotated' if rot else 'post_rope'} keys, T=64, 4 bits)",
         alrkvd_attention._alrkvd_rebuild_kernel,
         dict(alr_ptrs, Blocks="i32", K_out="bf16", V_out="bf16"), set(),
         dict(NUM_KV_HEADS=4, BLOCK_SIZE=64, HEAD_DIM=128, BLOCK_R=16, BLOCK_S=8, K_BITS=4, V_BITS=4,
              ROTATED_KEYS=rot, DOT_PRECISION="tf32", stride_lt=1, stride_kst=1, stride_vst=1, stride_vrt=1),
         dict(num_warps=4 if rot else 8))
        for rot in (True, False)
    ] + [
        ("kivi stage 1 (2 bits, D=128, G=4)", kivi_attention._kivi_decode_stage1,
         dict(Q="fp16", Block_tables="i32", Seq_lens="i32", Window_slots="i32", Window_k="fp16", Window_v="fp16",
              K_codes="u8", K_scale="fp16", K_zero="fp16", V_codes="u8", V_scale="fp16", V_zero="fp16",
              Mid_o="fp32", Mid_lse="fp32"), {"qk_scale"},
         dict(GROUP_Q=4, BLOCK_G=4, HEAD_DIM=128, BLOCK_SIZE=128, BITS=2),
         {k: v for k, v in kivi_attention._DEFAULT_STAGE1.items() if k != "MIN_TOKENS_PER_SPLIT"}),
    ] + [
        ("alrkvd compress (T=128, D=128)", alrkvd_compress._alrkvd_compress_kernel, comp_ptrs, set(),
         dict(NUM_KV_HEADS=8, T=128, D=128, TC=32, BLOCK_R=64, BLOCK_S=16, K_BITS=2, V_BITS=2, GROUP=64, UNIFORM=False,
              ROTATE=True, NSEARCH=5, POST_ROPE=False), alrkvd_compress._DEFAULT),
        ("alrkvd compress, kernel preset (T=64, D=128)", alrkvd_compress._alrkvd_compress_kernel, comp_ptrs, set(),
         dict(NUM_KV_HEADS=8, T=64, D=128, TC=32, BLOCK_R=32, BLOCK_S=16, K_BITS=4, V_BITS=4, GROUP=128, UNIFORM=True,
              ROTATE=False, NSEARCH=5, POST_ROPE=True), alrkvd_compress._DEFAULT),
    ] + [
        (f"trellis viterbi ({L} state bits, k=3)", trellis_viterbi._viterbi_kernel,
         dict(X="fp32", Sq="fp32", M2="fp32", Past="fp32", Choice="u8", Codes="i32"), set(),
         dict(N_STEPS=64, LOW=1 << (L - 3), HI=8), dict(num_warps=2 if L < 12 else 8))
        for L in (9, 12)
    ] + [
        (f"expert placement ({'prefetch' if pre else 'run'}, E=128, S=64)", expert_slots._place_kernel,
         dict(Ids="i64", Slot_of="i64", Holder="i64", Stamp="i64", Uses="i64", Fresh="i1", Predicted="i1",
              Order="i64", Clock="i64", Counts="i64", Slot_map="i32", Copy_dst="i64", Copy_valid="i1"), set(),
         dict(PREFETCH=pre, LFU=False, FIRST_LAYER=not pre, SCORE=not pre, BLOCK_E=128, BLOCK_S=64, BLOCK_N=64),
         dict(num_warps=8))
        for pre in (False, True)
    ] + [
        ("expert copy from host (bf16, 8192 a chunk)", expert_copy._copy_rows_kernel,
         dict(Src="bf16", Dst="bf16", Src_rows="i64", Dst_rows="i64", Valid="i1"), set(), dict(BLOCK=8192),
         dict(num_warps=8)),
    ] + [  # the decode step's small kernels (Qwen3-30B-A3B: hidden 2048, 128 experts, top 8, 4 kv heads of 128)
        ("rms norm summing 8 pairs, with residual", norms._rms_norm_kernel,
         dict(X="bf16", Residual="bf16", W="bf16", Out="bf16", Sum="bf16"), {"eps"},
         dict(PARTS=8, HAS_RESIDUAL=True, BLOCK_N=2048), dict(num_warps=8)),
        ("moe align with routing counts (E=128)", fused_moe._moe_align_kernel,
         dict(Ids="i64", Sorted="i32", Expert_ids="i32", Num_post_padded="i32", Counts="fp64", Pair_weights="fp64"),
         set(), dict(E=128, BLOCK_E=128, BLOCK=64, FILL_BLOCK=1024, BLOCK_SIZE=16, HAS_COUNTS=True), dict(num_warps=4)),
        ("fused moe, no slot map (down, M=16)", fused_moe._fused_moe_kernel,
         dict(A="bf16", B="bf16", C="bf16", Topk_weights="bf16", Sorted_token_ids="i32", Expert_ids="i32",
              Num_tokens_post_padded="i32", Slot_map="i32"), set(),
         dict(TOP_K=1, HAS_SLOT_MAP=False, GLU=False, MUL_ROUTED_WEIGHT=True, DOT_DTYPE=tl.bfloat16,
              PRECISION="tf32", BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1),
         dict(num_warps=4, num_stages=4)),
        ("fused moe, gate/up of a 2,048-token chunk (M=128)", fused_moe._fused_moe_kernel,
         dict(A="bf16", B="bf16", C="bf16", Topk_weights="bf16", Sorted_token_ids="i32", Expert_ids="i32",
              Num_tokens_post_padded="i32", Slot_map="i32"), set(),
         dict(TOP_K=8, HAS_SLOT_MAP=False, GLU=True, MUL_ROUTED_WEIGHT=False, DOT_DTYPE=tl.bfloat16,
              PRECISION="tf32", BLOCK_SIZE_M=128, **{k: v for k, v in moe_prefill.items() if k.isupper()}),
         {k: v for k, v in moe_prefill.items() if not k.isupper()}),
        ("store kv (4 heads of 128)", paged_attention._store_kv_kernel,
         dict(K="bf16", V="bf16", K_dst="bf16", V_dst="bf16", Rows="i64", Offsets="i64"), set(),
         dict(ROW=512, BLOCK=512), dict(num_warps=1)),
    ]
    del f32
    for name, fn, ptrs, floats, consts, opts in jobs:
        t = time.perf_counter()
        try:
            usage = compile_one(fn, ptrs, floats, consts, opts, target)
        except Exception as exc:  # noqa: BLE001 - report every kernel
            usage = f"FAILED {type(exc).__name__}: {str(exc)[:300]}"
        print(f"{name:<42} {time.perf_counter() - t:5.1f}s  {usage}", flush=True)


if __name__ == "__main__":
    main()
