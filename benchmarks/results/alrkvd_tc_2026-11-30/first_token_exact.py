# The proxy of proxy.py with N=384 (argv), the first token of the compressed segment kept exact. Run from the repo root.
import sys; sys.argv=['x', '384']
src = open('benchmarks/results/alrkvd_tc_2026-11-30/proxy.py').read().split('if __name__')[0]
exec(src)
def sink_exact(coder, n=1):
    def c(layer, q, k, v):
        kh, vh = coder(layer, q, k, v); kh = kh.clone(); vh = vh.clone()
        kh[:n], vh[:n] = k[:n], v[:n]; return kh, vh
    return c
run("fmt k3v3", fmt_coder(dict(latent_bits=4, basis_bits=4, scale_bits=8, rank_budget=8, k_bits=3, v_bits=3)))
run("fmt k3v3 sink exact", sink_exact(fmt_coder(dict(latent_bits=4, basis_bits=4, scale_bits=8, rank_budget=8, k_bits=3, v_bits=3))))
run("tc k3v3 eye sink exact", sink_exact(tc_coder(3, 3, "eye", "eye")))
run("tc k3v3 query/oproj sink exact", sink_exact(tc_coder(3, 3)))
run("tc k2.5v2.5 query/oproj sink exact", sink_exact(tc_coder(2.5, 2.5)))
run("tc k2.5v2.5 eye sink exact", sink_exact(tc_coder(2.5, 2.5, "eye", "eye")))
