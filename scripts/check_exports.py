#!/usr/bin/env python3
"""Checks the library boundary: libmha.so exports exactly include/mha.h.

    check_exports.py build/libmha.so include/mha.h [python/mha/_lib.py]

Fails (exit 1) on
  - a dynamic symbol of the .so (nm -D --defined-only) that the header does
    not declare with MHA_API (an internal function leaking out);
  - an MHA_API function of the header that the .so does not define;
  - a C function the Python binding binds (`_sig("name", ...)`) that the
    header does not declare: the binding must use the public API only.
"""
import re
import subprocess
import sys

# Symbols every shared object defines for the toolchain, not the API.
TOOLCHAIN = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def header_functions(path):
    """Names declared `MHA_API ... name(` in the header (comments and
    preprocessor lines removed first)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)
    return set(re.findall(r"\bMHA_API\b[^;{}()]*?\b([A-Za-z_]\w*)\s*\(", text))


def exported_symbols(so):
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()} - TOOLCHAIN


def binding_functions(path):
    with open(path, encoding="utf-8") as f:
        return set(re.findall(r'_sig\(\s*"(\w+)"', f.read()))


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    so, header = argv[1], argv[2]
    declared = header_functions(header)
    exported = exported_symbols(so)
    problems = []
    if not declared:
        problems.append(f"{header} declares no MHA_API function (expected the public API)")
    for name in sorted(exported - declared):
        problems.append(f"{so} exports {name}, which {header} does not declare with MHA_API "
                        "(expected hidden: it is internal)")
    for name in sorted(declared - exported):
        problems.append(f"{header} declares {name}, which {so} does not export "
                        "(expected every MHA_API function to be defined and visible)")
    bound = set()
    if len(argv) == 4:
        bound = binding_functions(argv[3])
        for name in sorted(bound - declared):
            problems.append(f"{argv[3]} binds {name}, which {header} does not declare "
                            "(expected the binding to use the public API only)")
    if problems:
        for p in problems:
            print(f"check_exports: {p}", file=sys.stderr)
        return 1
    print(f"check_exports: {so} exports exactly the {len(declared)} functions of {header}"
          + (f"; the binding binds {len(bound)} of them" if bound else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
