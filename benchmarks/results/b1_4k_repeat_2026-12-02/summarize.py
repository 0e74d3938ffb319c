"""Per run: SDPA, paged fp16 and ALR-KVD r16 times at B=1 L=4k and the ALR-KVD speed-up over SDPA; then the median."""
import json, statistics, sys

ratios = []
print("run | sdpa us | paged-fp16 us | alrkvd-r16 us | alrkvd speed-up over sdpa")
for path in sys.argv[1:]:
    us = {r["method"]: r["us"] for r in json.load(open(path))["rows"] if r["B"] == 1 and r["L"] == 4096}
    ratios.append(us["sdpa"] / us["alrkvd-r16"])
    print(f"{path.rsplit('/', 1)[-1]} | {us['sdpa']:.1f} | {us['paged-fp16']:.1f} | {us['alrkvd-r16']:.1f} | {ratios[-1]:.3f}x")
print(f"median {statistics.median(ratios):.3f}x, min {min(ratios):.3f}x, max {max(ratios):.3f}x, "
      f"{sum(r >= 1 for r in ratios)} of {len(ratios)} runs >= 1.00x")
