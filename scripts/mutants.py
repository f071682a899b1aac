#!/usr/bin/env python3
"""Mutation testing: does the test suite catch realistic bugs?

Reads the mutations of tests/mutants/*.txt (format in tests/mutants/README),
applies each one alone to a scratch copy of this checkout (the checkout
itself is never touched), rebuilds what the mutated file feeds, runs the
suites that can see it, stopping at the first that fails, and reports each
mutation as killed or survived. A mutation whose snippet is not found
exactly once, or that does not build, is an error: the list must follow
the code.

    scripts/mutants.py [--ci] [--check] [--list FILE]... [NAME_FILTER]...

--ci runs only the entries marked `ci: yes` (the subset `make mutants-ci` runs);
--check only verifies that every snippet is found exactly once (seconds).
Exit status: 0 when every mutation selected was killed, 1 otherwise.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"
SUITE_TIMEOUT = 300  # seconds; a hang counts as killed (the suite did not pass)

# suite name -> (make targets it needs, command)
SUITES = {
    "c": (["build/test_mha"], ["./build/test_mha"]),
    "cli": (["build/mha"], ["sh", "tests/cli_test.sh", "./build/mha"]),
    "io_cli": (["build/mha"], ["sh", "tests/io_cli_test.sh", "./build/mha"]),
    "mpi": (["build/mha", "build/mha-mpi", "build/mpi_api_test"], ["sh", "tests/mpi_test.sh", "./build"]),
    # OpenMP races: the fast forward's tests under TSan + Archer, two threads (clang builds its own tree)
    "archer": ([], ["make", "--no-print-directory", "test-archer", "ARCHER_FILTER=fast_"]),
    "python": (["build/libmha.so", "build/mha"], [PYTHON, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                     "tests/python"]),
}
# The suites that can see a change to a file, cheapest-to-fail first.
DEFAULT_SUITES = [("src/", ["c", "cli", "io_cli"]), ("tools/", ["cli", "io_cli"]),
                  ("python/", ["python"]), ("mpi/", ["mpi"])]


def parse(path):
    """Entries of one list file: dicts with file, find, replace, bug, ..."""
    entries, cur, lineno = [], {}, 0
    with open(path) as f:
        lines = f.read().split("\n")
    for lineno, line in enumerate(lines + [""], 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                entries.append(cur)
                cur = {}
            continue
        key, sep, value = line.partition(":")
        if not sep or key not in ("name", "file", "find", "replace", "bug", "suites", "ci"):
            sys.exit(f"{path}:{lineno}: expected 'KEY: value' with KEY in name, file, find, "
                     f"replace, bug, suites, ci; got {line!r}")
        value = value[1:] if value.startswith(" ") else value
        if key in cur:
            sys.exit(f"{path}:{lineno}: {key} given twice in one entry")
        cur[key] = value
        cur.setdefault("where", f"{os.path.relpath(path, ROOT)}:{lineno}")
    for e in entries:
        missing = [k for k in ("name", "file", "find", "replace", "bug") if k not in e]
        if missing:
            sys.exit(f"{e['where']}: entry lacks {', '.join(missing)}")
        # \n in find/replace is a newline, \\ a backslash
        for k in ("find", "replace"):
            e[k] = e[k].replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
        if e["find"] == e["replace"]:
            sys.exit(f"{e['where']}: find and replace are the same: not a mutation")
        if "suites" in e:
            e["suites"] = e["suites"].split()
            bad = [s for s in e["suites"] if s not in SUITES]
            if bad:
                sys.exit(f"{e['where']}: unknown suite {bad}; expected some of {list(SUITES)}")
        else:
            e["suites"] = next((s for pre, s in DEFAULT_SUITES if e["file"].startswith(pre)), None)
            if e["suites"] is None:
                sys.exit(f"{e['where']}: no default suites for {e['file']}; add 'suites:'")
        e["ci"] = e.get("ci", "no") == "yes"
    return entries


def copy_tree(dst):
    """Tracked and untracked-but-not-ignored files, plus build/ (mtimes kept,
    so make rebuilds only what is stale)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue  # deleted in the work tree
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))
    if os.path.isdir(os.path.join(ROOT, "build")):
        shutil.copytree(os.path.join(ROOT, "build"), os.path.join(dst, "build"), symlinks=True,
                        ignore=shutil.ignore_patterns("*.gcda", "*.gcno"))


def run(cmd, cwd, timeout=None, env=None):
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"


def make(tree, targets):
    return run(["make", "-j2", "--no-print-directory"] + targets, tree)


def try_mutant(tree, e, env):
    """'killed by SUITE', 'survived', or 'error: ...'; the tree is restored."""
    path = os.path.join(tree, e["file"])
    if not os.path.isfile(path):
        return f"error: {e['file']} does not exist"
    with open(path) as f:
        original = f.read()
    n = original.count(e["find"])
    if n != 1:
        return f"error: snippet found {n} times in {e['file']} (expected once): {e['find']!r}"
    try:
        with open(path, "w") as f:
            f.write(original.replace(e["find"], e["replace"]))
        targets = sorted({t for s in e["suites"] for t in SUITES[s][0]})
        rc, out = make(tree, targets)
        if rc != 0:
            last = "\n".join(out.strip().split("\n")[-5:])
            return f"error: does not build:\n{last}"
        for s in e["suites"]:
            rc, out = run(SUITES[s][1], tree, timeout=SUITE_TIMEOUT, env=env)
            if rc != 0:
                return f"killed by {s}" + (" (timeout)" if rc is None else "")
        return "survived"
    finally:
        with open(path, "w") as f:  # a new mtime: make rebuilds it next time
            f.write(original)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ci", action="store_true", help="only the entries marked 'ci: yes'")
    ap.add_argument("--check", action="store_true", help="only check that every snippet is found once")
    ap.add_argument("--list", action="append", help="list files (default tests/mutants/*.txt)")
    ap.add_argument("filter", nargs="*", help="only entries whose name contains one of these")
    a = ap.parse_args()
    lists = a.list or sorted(glob.glob(os.path.join(ROOT, "tests", "mutants", "*.txt")))
    entries = [e for p in lists for e in parse(p)]
    names = [e["name"] for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        sys.exit(f"mutants: duplicate names {dup}")
    entries = [e for e in entries if (not a.ci or e["ci"]) and (not a.filter or any(f in e["name"] for f in a.filter))]
    if not entries:
        sys.exit("mutants: no entry selected")
    if a.check:
        bad = 0
        for e in entries:
            path = os.path.join(ROOT, e["file"])
            n = open(path).read().count(e["find"]) if os.path.isfile(path) else 0
            if n != 1:
                bad += 1
                print(f"{e['where']}: {e['name']}: snippet found {n} times in {e['file']} (expected once)")
        print(f"mutants --check: {len(entries) - bad} of {len(entries)} snippets found once")
        return 1 if bad else 0
    t0 = time.time()
    env = dict(os.environ, MHA_TEST_FAIL_FAST="1")
    results = {}
    with tempfile.TemporaryDirectory(prefix="mha-mutants-") as tree:
        copy_tree(tree)
        need = sorted({t for e in entries for s in e["suites"] for t in SUITES[s][0]})
        rc, out = make(tree, need)
        if rc != 0:
            print(out[-3000:])
            sys.exit("mutants: the unmutated tree does not build")
        # a failing suite would "kill" every mutant: the unmutated tree must pass
        for s in [s for s in SUITES if any(s in e["suites"] for e in entries)]:
            rc, out = run(SUITES[s][1], tree, timeout=SUITE_TIMEOUT, env=env)
            if rc != 0:
                print(out[-3000:])
                sys.exit(f"mutants: the unmutated tree fails suite {s}; fix that first")
        print(f"mutants: unmutated tree builds and passes ({time.time() - t0:.0f} s)", flush=True)
        for e in entries:
            t1 = time.time()
            r = try_mutant(tree, e, env)
            results[e["name"]] = r
            print(f"{r.split(chr(10))[0]:<24} {time.time() - t1:5.1f}s  {e['name']}: {e['bug']}"
                  + (f"\n    {e['where']}\n    " + "\n    ".join(r.split("\n")[1:]) if "\n" in r else ""),
                  flush=True)
    killed = sum(r.startswith("killed") for r in results.values())
    survived = [n for n, r in results.items() if r == "survived"]
    errors = [n for n, r in results.items() if r.startswith("error")]
    print(f"mutants: {killed} killed, {len(survived)} survived, {len(errors)} errors "
          f"of {len(results)} in {time.time() - t0:.0f} s")
    for n in survived:
        print(f"  SURVIVED {n}")
    for n in errors:
        print(f"  ERROR {n}")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
