"""Every result path the benchmark book and its journal cite must be there.

    python benchmarks/check_book_paths.py

Takes each path in BENCHMARKS.md, docs/journal/*.md and the other documents below that starts with
`benchmarks/results/` or `loadtest/benchmarks/` (globs `*` and brace lists `{a,b}` expanded, a trailing `/` meaning
a folder) and looks it up among the files git tracks. BENCHMARKS.md may cite only files in the tree; the journal
and the other documents may also cite files retired to the tag `results-archive-2026-12-04` (`git show
results-archive-2026-12-04:PATH` gets one back). Prints each path that is in neither, and exits 1 if there is one.
"""
import fnmatch
import glob
import re
import subprocess
import sys

TAG = "results-archive-2026-12-04"
ROOT = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
PATH = re.compile(r"(?:benchmarks/results|loadtest/benchmarks)(?:/[A-Za-z0-9_.*{},+\-]*)*")


def git_files(*args):
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split("\n") if out.returncode == 0 else None


def expand(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    return [q for alt in m.group(1).split(",") for q in expand(p[:m.start()] + alt + p[m.end():])]


def found(path, files):
    for p in expand(path):
        p = p.rstrip("/")
        if not any(f == p or f.startswith(p + "/") or fnmatch.fnmatchcase(f, p) for f in files):
            return False
    return True


def main():
    tree = git_files("ls-files")
    tag = git_files("ls-tree", "-r", "--name-only", TAG)
    if tag is None:
        print(f"the tag {TAG} is not in this clone (git fetch --tags); journal paths are checked in the tree only")
        tag = []
    docs = {f"{ROOT}/BENCHMARKS.md": False}
    for d in sorted(glob.glob(f"{ROOT}/docs/journal/*.md")) + [f"{ROOT}/{d}" for d in (
            "README.md", "docs/ALRKVD.md", "docs/LOADTEST.md", "kernels/README.md")]:
        docs[d] = True                      # may cite files retired to the tag
    bad = checked = 0
    for doc, tag_ok in docs.items():
        for n, line in enumerate(open(doc, encoding="utf-8"), 1):
            for m in PATH.finditer(line):
                path = m.group(0).rstrip(".,;:")
                checked += 1
                if found(path, tree) or (tag_ok and found(path, tag)):
                    continue
                bad += 1
                print(f"{doc[len(ROOT) + 1:]}:{n}: {path}")
    print(f"{checked} paths checked, {bad} missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
