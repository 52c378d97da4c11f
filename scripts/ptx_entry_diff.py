"""Compare two PTX files kernel by kernel: each .entry body with its register names renumbered by
first use, branch labels, call-sequence numbers and the translation unit's hashes (the anonymous
namespace's, and the one after a file name's `_cu_`) blanked, then diffed. How the
gram6 branch showed that v7's Gram kernel v2 compiles to the same PTX after gram_v2.cuh's
parametrization (nvcc -O3 -std=c++17 -arch=sm_90a -ptx cuda_epoch.cu, before and after).

    python scripts/ptx_entry_diff.py BEFORE.ptx AFTER.ptx
"""

import difflib
import re
import sys

ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.entry (\S+)\(", re.M)
REG = re.compile(r"%(?:rd|r|f|fd|p|rs|h|hh)\d+")


def _renumber(body: str) -> str:
    names: dict[str, str] = {}

    def one(m: re.Match) -> str:
        k = m.group(0)
        if k not in names:
            names[k] = f"{re.match(r'%[a-z]+', k).group(0)}#{len(names)}"
        return names[k]

    body = REG.sub(one, body)
    body = re.sub(r"\$L__BB\d+_\d+", "$L", body)
    # numbered across the whole file: `{ // callseq 7, 0` opens a call, `} // callseq 7` ends it
    body = re.sub(r"callseq \d+(?:, \d+)?", "callseq", body)
    return re.sub(r"\.reg \.\S+ \s*%\S+<\d+>;", ".reg", body)


def entries(path: str) -> dict[str, str]:
    """The file's kernels, name → normalized body."""
    with open(path) as f:
        text = re.sub(r"(_GLOBAL__N__|_INTERNAL_|_cu_)[0-9a-f]{8}", r"\1H", f.read())
    out = {}
    for m in ENTRY.finditer(text):
        end = text.find("\n}\n", m.start())
        out[m.group(1)] = _renumber(text[m.start():end])
    return out


def main(argv: list[str]) -> int:
    a, b = entries(argv[0]), entries(argv[1])
    differ = 0
    for k in sorted(set(a) | set(b)):
        if a.get(k) == b.get(k):
            continue
        differ += 1
        d = list(difflib.unified_diff(a.get(k, "").splitlines(), b.get(k, "").splitlines(),
                                      lineterm="", n=1))
        print(f"{k} differs: {len(d)} diff lines")
        print("\n".join(d[:40]))
    print(f"{len(set(a) | set(b)) - differ} entries identical after renaming registers, "
          f"{differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
