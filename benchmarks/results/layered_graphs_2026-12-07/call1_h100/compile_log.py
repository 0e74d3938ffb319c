"""Run a script (argv[1:]) with every Triton JIT compile logged to stderr: seconds since start, kernel, arguments."""
import runpy, sys, time
t0 = time.time()
try:
    from triton import knobs

    def hook(*args, **kw):
        print(f"[compile {time.time() - t0:7.2f}s] {str(kw.get('repr', ''))[:400]}", file=sys.stderr, flush=True)
        return False
    knobs.runtime.jit_cache_hook = hook
except Exception as e:  # another Triton
    print("[compile hook not installed]", e, file=sys.stderr)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
