"""Runs every shell command of README.md and docs/*.md, in order, in one
temporary directory (with build/, tests/ and include/ linked from the
repository and python/ copied; PATH starts with /usr/bin, and pip installs
under the temporary directory), and fails on any error: the documented examples must
work as written from a fresh clone after `make`.

    python3 tests/docs_test.py [REPO_ROOT]

Fenced blocks, by label:
  sh, shell     run as one script with `sh -e`
  console       each `$ ` line (with its `\\` continuation lines) is run
                with `sh -c`; other lines are output and not compared
  c, python     not run (python examples are pytest's business)
  text          not run: output, formulas, layouts
An unlabelled fence is an error, so nothing is skipped by accident.
An HTML comment on the line before a fence changes what is expected:
  <!-- docs-test: skip REASON -->     the block is not run (keep these few)
  <!-- docs-test: exit N -->          the block's last command exits N
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

RUN = {"sh", "shell", "console"}
NOT_RUN = {"c", "python", "text"}


def blocks(path):
    """(line, label, directive, text) of every fenced block of a file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        label, start = m.group(1), i
        prev = lines[i - 1].strip() if i > 0 else ""
        d = re.match(r"<!--\s*docs-test:\s*(.*?)\s*-->", prev)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append((start + 1, label, d.group(1) if d else "", "\n".join(lines[i + 1:j])))
        i = j + 1
    return out


def console_commands(text):
    cmds, cur = [], None
    for line in text.split("\n"):
        if cur is not None:
            cur += "\n" + line
        elif line.startswith("$ "):
            cur = line[2:]
        else:
            continue
        if not cur.endswith("\\"):
            cmds.append(cur)
            cur = None
    return cmds


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    docs = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    work = tempfile.mkdtemp(prefix="mha_docs_")
    for d in ("build", "tests", "include"):
        os.symlink(os.path.join(root, d), os.path.join(work, d))
    # a copy, not a link: `pip install ./python` writes build files into it
    shutil.copytree(os.path.join(root, "python"), os.path.join(work, "python"),
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    # Debian's tools first (the docs name /usr/bin/python3 and Debian's pip),
    # and whatever pip installs goes under the temporary directory
    env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""),
               PIP_PREFIX=os.path.join(work, "prefix"), PIP_NO_INDEX="1")
    ran = skipped = 0
    failures = []
    for doc in docs:
        name = os.path.relpath(doc, root)
        for line, label, directive, text in blocks(doc):
            where = "%s:%d" % (name, line)
            if label not in RUN | NOT_RUN:
                failures.append("%s: fence labelled '%s'; label it sh, console, c, python or text" % (where, label))
                continue
            if label in NOT_RUN:
                continue
            if directive.startswith("skip"):
                skipped += 1
                continue
            want_last = int(directive.split()[1]) if directive.startswith("exit") else 0
            cmds = console_commands(text) if label == "console" else [text]
            for k, cmd in enumerate(cmds):
                want = want_last if k == len(cmds) - 1 else 0
                args = ["sh", "-c", cmd] if label == "console" else ["sh", "-e", "-c", cmd]
                p = subprocess.run(args, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   universal_newlines=True, timeout=600)
                ran += 1
                if p.returncode != want:
                    failures.append("%s: exit %d, want %d: %s\n%s" % (
                        where, p.returncode, want, cmd.split("\n")[0][:100], p.stdout[-1500:]))
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    print("docs_test: %d commands/blocks run, %d skipped by a docs-test comment, %d failures" % (
        ran, skipped, len(failures)))
    if not failures:
        subprocess.run(["rm", "-rf", work])
    else:
        print("docs_test: files left in " + work, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
