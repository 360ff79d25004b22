#!/usr/bin/env python3
"""Registers written while a wgmma that reads them may still run, in a cuobjdump -sass listing.

A wgmma whose A operand comes from registers (HGMMA ... Rd, Ra, gdesc[...]) reads Ra .. Ra+3 until a
WARPGROUP.DEPBAR covers it; PTX calls writing them before that undefined, and ptxas 13.0 was seen giving them
to a later load (docs/DESIGN.md §8). This walks every path from each such HGMMA to the next DEPBAR through
the branches and prints each instruction on the way that writes one of those registers (and each kernel
with such wgmma, with its count).
Usage: wgmma_hazards.py LISTING.sass  (exit 1 when any kernel has a hazard)
"""
import re
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
FUNC = re.compile(r"Function : (\S+)")
REG = re.compile(r"\bR(\d+)\b")
# Opcodes that write no general register (stores, control flow, barriers, fences).
NO_DEST = ("ST", "STS", "STG", "STL", "RED", "BRA", "BAR", "EXIT", "RET", "CALL", "WARPSYNC", "NOP",
           "MEMBAR", "FENCE", "SYNCS.ARRIVE", "WARPGROUP", "UTMALDG", "UBLKCP", "BSYNC", "BSSY", "DEPBAR",
           "ERRBAR", "CCTL", "YIELD", "BPT", "ELECT")


def width(op):
    """Registers an instruction writes from its first operand on."""
    if op.startswith("LDSM"):  # ldmatrix: .x1/.x2/.x4 as a trailing .1/.2/.4
        return int(op.rsplit(".", 1)[1]) if op.rsplit(".", 1)[1] in ("1", "2", "4") else 4
    if ".128" in op:
        return 4
    if ".64" in op or ".WIDE" in op or op.startswith(("DADD", "DMUL", "DFMA", "DSETP")) or ".F64" in op:
        return 2
    return 1


def functions(text):
    name, body = None, []
    for line in text.splitlines():
        m = FUNC.search(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSTR.search(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2) or "", m.group(3), m.group(4)))
    if name:
        yield name, body


def hazards(body):
    at = {addr: i for i, (addr, _, _, _) in enumerate(body)}
    found = []
    for i, (addr, _, op, args) in enumerate(body):
        if not op.startswith("HGMMA"):
            continue
        regs = REG.findall(args)
        if len(regs) < 2 or "gdesc" in args.split(",")[1]:
            continue  # A from shared memory
        a0 = int(regs[1])
        live = set(range(a0, a0 + 4))
        todo, seen = [i + 1], set()
        while todo:
            j = todo.pop()
            while j < len(body) and j not in seen:
                seen.add(j)
                jaddr, pred, jop, jargs = body[j]
                if jop.startswith("WARPGROUP.DEPBAR"):
                    break
                if not jop.startswith(NO_DEST) and not jop.startswith("HGMMA"):
                    first = jargs.split(",")[0].strip()
                    m = re.fullmatch(r"R(\d+)", first)
                    if m:
                        d = int(m.group(1))
                        if live & set(range(d, d + width(jop))):
                            found.append(f"  HGMMA at {addr:#x} reads R{a0}-R{a0 + 3}; {jaddr:#x}: {jop} {jargs}")
                if jop.startswith("BRA"):
                    target = int(re.search(r"0x([0-9a-f]+)", jargs).group(1), 16)
                    if target in at:
                        todo.append(at[target])
                    if not pred:
                        break
                if jop.startswith(("EXIT", "RET")) and not pred:
                    break
                j += 1
    return found


def main():
    bad = 0
    for name, body in functions(open(sys.argv[1]).read()):
        found = hazards(body)
        rs = sum(1 for _, _, op, args in body if op.startswith("HGMMA") and "gdesc" not in args.split(",")[1])
        if rs:
            print(f"{name}: {rs} register-operand wgmma, {len(found)} hazards")
        for f in found:
            print(f)
        bad += len(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
