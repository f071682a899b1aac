#!/usr/bin/env python3
"""Checks the library boundary: libmha.so exports exactly include/mha.h.

    check_exports.py build/libmha.so include/mha.h [--binding python/mha/_lib.py]
                     [--archive build/libmha.a --clients build/tools]

Fails (exit 1) on
  - a dynamic symbol of the .so (nm -D --defined-only) that the header does
    not declare with MHA_API (an internal function leaking out);
  - an MHA_API function of the header that the .so does not define;
  - a C function the Python binding binds (`_sig("name", ...)`) that the
    header does not declare: the binding must use the public API only;
  - a symbol a client's object file (the CLI's, which links libmha.a and
    so could reach anything) takes from the library but the header does
    not declare.
"""
import argparse
import glob
import os
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


def global_symbols(path, undefined):
    """Global symbols an object file or archive defines (or, with
    undefined, leaves undefined), hidden ones included."""
    flags = ["-g", "-u"] if undefined else ["-g", "--defined-only"]
    out = subprocess.run(["nm", "-P", *flags, path], capture_output=True, text=True,
                         check=True).stdout
    return {f[0] for f in (line.split() for line in out.split("\n")) if len(f) >= 2 and not f[0].endswith(":")}


def client_uses(objects_dir):
    """{symbol: object} for the symbols the objects under the dir take from
    outside themselves."""
    objs = sorted(glob.glob(os.path.join(objects_dir, "**", "*.o"), recursive=True))
    own = set().union(*(global_symbols(o, False) for o in objs)) if objs else set()
    uses = {}
    for obj in objs:
        for name in global_symbols(obj, True) - own:
            uses.setdefault(name, obj)
    return uses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("so")
    p.add_argument("header")
    p.add_argument("--binding", help="the Python binding's _lib.py")
    p.add_argument("--archive", help="the static library the clients link (libmha.a)")
    p.add_argument("--clients", action="append", default=[],
                   help="a directory of client object files (repeatable; needs --archive)")
    a = p.parse_args()
    if a.clients and not a.archive:
        p.error("--clients needs --archive (the library the clients link)")
    declared = header_functions(a.header)
    exported = exported_symbols(a.so)
    problems = []
    if not declared:
        problems.append(f"{a.header} declares no MHA_API function (expected the public API)")
    for name in sorted(exported - declared):
        problems.append(f"{a.so} exports {name}, which {a.header} does not declare with MHA_API "
                        "(expected hidden: it is internal)")
    for name in sorted(declared - exported):
        problems.append(f"{a.header} declares {name}, which {a.so} does not export "
                        "(expected every MHA_API function to be defined and visible)")
    bound = set()
    if a.binding:
        bound = binding_functions(a.binding)
        for name in sorted(bound - declared):
            problems.append(f"{a.binding} binds {name}, which {a.header} does not declare "
                            "(expected the binding to use the public API only)")
    internal = global_symbols(a.archive, False) - declared if a.clients else set()
    for d in a.clients:
        for name, obj in sorted(client_uses(d).items()):
            if name in internal:
                problems.append(f"{obj} uses the library's internal {name} "
                                f"(expected only the functions of {a.header})")
    if problems:
        for line in problems:
            print(f"check_exports: {line}", file=sys.stderr)
        return 1
    print(f"check_exports: {a.so} exports exactly the {len(declared)} functions of {a.header}"
          + (f"; the binding binds {len(bound)} of them" if a.binding else "")
          + (f"; {', '.join(a.clients)} use only the header" if a.clients else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
