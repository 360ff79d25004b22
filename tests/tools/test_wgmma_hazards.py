"""wgmma_hazards.py on hand-written listings: a write to an in-flight A register on a branch path is found,
a write after the wait, a write to other registers and a shared-memory A operand are not."""
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("wgmma_hazards", sys.argv[1])
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)


def listing(name, lines):
    body = "\n".join(f"        /*{addr:04x}*/                   {text} ;" for addr, text in lines)
    return f"\n\tFunction : {name}\n{body}\n"


text = (
    # The write sits behind a branch taken before the wait: found through the branch.
    listing("on_branch", [(0x00, "WARPGROUP.ARRIVE"), (0x10, "HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24, gsb0"),
                          (0x20, "@P0 BRA 0x50"), (0x30, "WARPGROUP.DEPBAR.LE gsb0, 0x0"), (0x40, "EXIT"),
                          (0x50, "LDS.64 R58, [R2]"), (0x60, "BRA 0x30")])
    # ldmatrix .4 from R54 reaches R56.
    + listing("ldmatrix", [(0x00, "HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24, gsb0"),
                           (0x10, "LDSM.16.M88.4 R54, [R3]"), (0x20, "WARPGROUP.DEPBAR.LE gsb0, 0x0"),
                           (0x30, "EXIT")])
    # Other registers before the wait, the operand registers after it.
    + listing("clean", [(0x00, "HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR4], R24, gsb0"),
                        (0x10, "LDS.64 R60, [R2]"), (0x20, "FADD R55, R1, R2"),
                        (0x30, "WARPGROUP.DEPBAR.LE gsb0, 0x0"), (0x40, "LDS.128 R56, [R2]"), (0x50, "EXIT")])
    # A from shared memory: no register operand to watch.
    + listing("shared_a", [(0x00, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0"),
                           (0x10, "LDS.128 R56, [R2]"), (0x20, "WARPGROUP.DEPBAR.LE gsb0, 0x0"), (0x30, "EXIT")])
)
found = {name: checker.hazards(body) for name, body in checker.functions(text)}
expect = {"on_branch": 1, "ldmatrix": 1, "clean": 0, "shared_a": 0}
got = {name: len(h) for name, h in found.items()}
if got != expect:
    print(f"hazards per kernel: got {got}, expected {expect}")
    for name, h in found.items():
        print(name, h)
    sys.exit(1)
assert "0x50: LDS.64 R58" in found["on_branch"][0], found["on_branch"]
print("wgmma_hazards: ok", got)
