"""Instruction counts of each loop (backward branch) in last.sass, written by sass_count.py."""
import re, collections, sys
sass = open('last.sass').read().splitlines()
ins = []
for l in sass:
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m: ins.append((int(m.group(1), 16), m.group(2)))
addr = {a: i for i, (a, _) in enumerate(ins)}
for i, (a, t) in enumerate(ins):
    m = re.search(r'BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))', t)
    m2 = re.search(r'BRA.*?\.L_x_(\d+)', t)
    tgt = None
    mm = re.search(r'0x([0-9a-f]+)', t) if 'BRA' in t else None
    if mm: tgt = int(mm.group(1), 16)
    if tgt is not None and tgt < a and tgt in addr:
        body = ins[addr[tgt]:i + 1]
        ops = collections.Counter(re.match(r'(@!?U?P\w+\s+)?([A-Z0-9_]+)', x).group(2) for _, x in body)
        print(f"loop {tgt:#x}-{a:#x}: {len(body)} instrs", ops.most_common(18))
