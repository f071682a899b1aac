#!/usr/bin/env python3
"""Checks that the folders of src/ import each other in one direction only.

    check_layers.py [--src DIR] [--include DIR] [--objects DIR]
    check_layers.py --matrix        print the allowed matrix (docs/ARCHITECTURE.md)

Two kinds of edges between folders are collected:
  include edges  an `#include` line in one folder's .c/.h that resolves to a
                 header of another folder (resolved as the compiler does:
                 the file's own directory, then -Isrc, then -Iinclude);
  call edges     a symbol left undefined by one folder's object file (`nm`)
                 and defined by an object of another folder: a call or a use
                 of a global, whichever header declared it.
Each edge must be allowed by ALLOWED below, and the folder graph must have
no cycle. Call edges need the objects built (`make lib`); without
--objects only include edges are checked. Exit 0 when clean, 1 on any
violation (each listed with its file and line or symbol), 2 on bad usage.
"""
import argparse
import os
import re
import subprocess
import sys

# What each folder of src/ may import (include or call); every folder may
# import base/. contract.c, a file at the top of src/, is the folder
# "contract". Keep docs/ARCHITECTURE.md's table equal to this one (tests/
# layers_test.sh compares them).
ALLOWED = {
    "base": [],
    "kernels": ["base"],
    "compute": ["base", "kernels"],
    "core": ["base", "kernels", "compute"],
    "forward": ["base", "kernels", "compute", "core"],
    "cache": ["base", "kernels", "compute", "core", "forward"],
    "io": ["base", "core", "cache"],
    "contract": ["base", "core", "forward", "cache"],
}
ORDER = ["base", "kernels", "compute", "core", "forward", "cache", "io", "contract"]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def folder_of(rel):
    """src-relative path -> folder name, or None when outside every folder."""
    parts = rel.split(os.sep)
    if len(parts) > 1:
        return parts[0]
    stem = os.path.splitext(parts[0])[0]
    return stem


def source_files(src):
    for root, _dirs, files in os.walk(src):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.relpath(os.path.join(root, f), src)


def resolve_include(src, include_dir, rel, quote, name):
    """Where the compiler finds `name` included from src/rel: ('src', path),
    ('public', path), or None (a system header)."""
    candidates = []
    if quote == '"':
        candidates.append(("src", os.path.normpath(os.path.join(os.path.dirname(rel), name))))
    candidates.append(("src", os.path.normpath(name)))
    for kind, path in candidates:
        if not path.startswith("..") and os.path.isfile(os.path.join(src, path)):
            return kind, path
    if include_dir and os.path.isfile(os.path.join(include_dir, name)):
        return "public", name
    return None


def include_edges(src, include_dir, problems):
    """[(from_folder, to_folder, where)] for includes that cross folders."""
    edges = []
    for rel in source_files(src):
        with open(os.path.join(src, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                quote, name = m.groups()
                hit = resolve_include(src, include_dir, rel, quote, name)
                where = f"src/{rel}:{lineno}: #include {quote}{name}{'>' if quote == '<' else quote}"
                if hit is None:
                    if quote == '"':
                        problems.append(f"{where} is neither in src/ nor in include/")
                    continue
                kind, path = hit
                if kind == "src":
                    a, b = folder_of(rel), folder_of(path)
                    if a != b:
                        edges.append((a, b, where))
    return edges


def nm_symbols(obj):
    """(defined globals, undefined) symbol names of one object file."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper() or kind in "vw":
            defined.add(name)
    return defined, undefined


def call_edges(src, objects, problems):
    """[(from_folder, to_folder, where)] for symbols one folder's objects
    take from another folder's objects."""
    defined_by = {}
    undefined_of = {}
    for rel in source_files(src):
        if not rel.endswith(".c"):
            continue
        obj = os.path.join(objects, rel[:-2] + ".o")
        if not os.path.isfile(obj):
            problems.append(f"{obj} is missing: build the library first (make lib)")
            continue
        defined, undefined = nm_symbols(obj)
        for name in defined:
            defined_by.setdefault(name, rel)
        undefined_of[rel] = undefined
    edges = []
    for rel, undefined in sorted(undefined_of.items()):
        for name in sorted(undefined):
            owner = defined_by.get(name)
            if owner and folder_of(owner) != folder_of(rel):
                edges.append((folder_of(rel), folder_of(owner),
                              f"src/{rel} uses {name} (defined in src/{owner})"))
    return edges


def find_cycle(graph):
    """One cycle of the directed graph {node: set(nodes)} as a node list, or None."""
    state = {}
    stack = []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def print_matrix():
    print("| folder | may import |")
    print("|---|---|")
    for f in ORDER:
        print(f"| {f} | {', '.join(ALLOWED[f]) or '(nothing)'} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default="src")
    p.add_argument("--include", default="include", help="public header directory")
    p.add_argument("--objects", help="object directory mirroring src/ (e.g. build/src)")
    p.add_argument("--matrix", action="store_true", help="print the allowed matrix and exit")
    a = p.parse_args()
    assert set(ORDER) == set(ALLOWED) and find_cycle({k: set(v) for k, v in ALLOWED.items()}) is None
    if a.matrix:
        print_matrix()
        return 0
    if not os.path.isdir(a.src):
        print(f"check_layers: {a.src} is not a directory (expected the library's src/)", file=sys.stderr)
        return 2

    problems = []
    for rel in source_files(a.src):
        if folder_of(rel) not in ALLOWED:
            problems.append(f"src/{rel} is in folder '{folder_of(rel)}', which the matrix does not know; "
                            f"expected one of {', '.join(ORDER)} (add a new folder to ALLOWED in "
                            "scripts/check_layers.py and to docs/ARCHITECTURE.md)")
    edges = include_edges(a.src, a.include, problems)
    n_includes = len(edges)
    if a.objects:
        edges += call_edges(a.src, a.objects, problems)

    graph = {}
    for frm, to, where in edges:
        graph.setdefault(frm, set()).add(to)
        if frm in ALLOWED and to not in ALLOWED[frm]:
            problems.append(f"{where}: {frm}/ may not import {to}/ "
                            f"(expected only {', '.join(ALLOWED[frm]) or 'nothing'})")
    cycle = find_cycle(graph)
    if cycle:
        problems.append("cycle between folders: " + " -> ".join(cycle))

    if problems:
        for line in problems:
            print(f"check_layers: {line}", file=sys.stderr)
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    pairs = sorted({(f, t) for f, t, _ in edges})
    print(f"check_layers: {len(ALLOWED)} folders, {n_includes} include and {len(edges) - n_includes} "
          f"call edges ({len(pairs)} folder pairs), no cycle, all in the allowed direction"
          + ("" if a.objects else " (includes only: no --objects)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
