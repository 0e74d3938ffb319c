"""Device: the low-rank key scores as their own kernel (lr_scores) + the fused rest reading them, against skel_alr."""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3])); sys.path.insert(0, str(Path(__file__).parent))
import torch, triton
from benchmarks.devices import copy_bandwidth
from benchmarks import bench_attention as ba
from kernels.paged_attention import decode_reduce, LOG2E
import skeleton
from alr_data import H, G, D, R, T, alr_data, alr_ref, alr_args
dev = "cuda"
out_dir = Path(sys.argv[1]); out_dir.mkdir(parents=True, exist_ok=True)
rows = []
copy_bw = copy_bandwidth(dev)
for B, L in [(8, 32768), (1, 4096), (32, 32768)]:
    alr_bytes = B * H * L * (2 * D // 4 + 8) + B * H * L * 2 * R + B * H * (L // T) * 2 * R * (D + 6)
    ds = [alr_data(B, L, dev) for _ in range(ba.num_copies(alr_bytes, dev))]
    q = torch.randn(B, H * G, D, device=dev, dtype=torch.float16)
    data = [(q[:, :, None], torch.randn(B, H, L, D, device=dev, dtype=torch.float16), torch.randn(B, H, L, D, device=dev, dtype=torch.float16)) for _ in range(ba.num_copies(2 * B * H * L * D * 2, dev))]
    sdpa = ba.time_calls([ba.sdpa_call(*x) for x in data], dev) * 1e6
    del data
    print(f"B={B} L={L} sdpa {sdpa:.1f} us", flush=True)
    sp = max(1, min(64, L // 128, triton.cdiv(4 * 132, B * H)))
    while L % (sp * 128): sp -= 1
    S = torch.empty(B, H * G, L, device=dev, dtype=torch.float32)
    mid_o = torch.empty(B, H * G, sp, D, dtype=torch.float32, device=dev)
    mid_lse = torch.empty(B, H * G, sp, dtype=torch.float32, device=dev)
    out = torch.empty(B, H * G, D, dtype=torch.float16, device=dev)
    def lr(d, bn, w, f16):
        return lambda: skeleton.lr_scores[(B, H, L // bn)](q, S, L, d["KB"], d["KBS"], d["KL"], d["KLS"], d["KLZ"], d["Cos"], d["Sin"],
                                                            H=H, G=G, BLOCK_G=16, D=D, BLOCK_N=bn, R=R, T=T, F16=f16, num_warps=w)
    def main(d, bn, w, st, lr_keys, lr_buf):
        def call():
            skeleton.skel_alr[(B, H, sp)](q, d["KC"], d["KS"], d["KZ"], d["VC"], d["VS"], d["VZ"], mid_o, mid_lse, D ** -0.5 * LOG2E, L, sp,
                                          *alr_args(d), H=H, G=G, BLOCK_G=16, D=D, BLOCK_N=bn, R=R, T=T, ROPE_REGS=False, LR_KEYS=lr_keys,
                                          F16=True, S_lr=S, LR_BUF=lr_buf, num_warps=w, num_stages=st)
            return decode_reduce(mid_o, mid_lse, out)
        return call
    def rec(name, calls, check=None):
        us = ba.time_calls(calls, dev) * 1e6
        err = None
        if check is not None and B * L <= 4096:
            err = (check().float() - alr_ref(q, ds[0], D ** -0.5)).abs().max().item()
        rows.append(dict(B=B, L=L, name=name, us=us, sdpa_us=sdpa, err=err))
        print(f"{name:<50} {us:8.1f} us  {sdpa/us:5.2f}x sdpa  err {err}", flush=True)
    rec("fused skel_alr n64 w4 s3 f16", [main(d, 64, 4, 3, True, False) for d in ds])
    for bn, w, f16 in ((64, 4, False), (64, 4, True), (128, 4, True), (128, 8, True), (64, 8, True), (32, 4, True)):
        rec(f"lr_scores n{bn} w{w} f16={f16}", [lr(d, bn, w, f16) for d in ds])
    for bn, w, st in ((64, 4, 2), (64, 4, 3), (128, 4, 2)):
        rec(f"main+buf n{bn} w{w} s{st}", [main(d, bn, w, st, False, True) for d in ds])
    def both(d):
        a, m = lr(d, 64, 4, True), main(d, 64, 4, 3, False, True)
        def call():
            a(); return m()
        return call
    calls = [both(d) for d in ds]
    rec("split total: lr_scores n64 w4 f16 + main n64 w4 s3", calls, check=calls[0])
    del ds, S; torch.cuda.empty_cache()
(out_dir / "split.json").write_text(json.dumps(dict(copy_bw=copy_bw, triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), indent=1))
