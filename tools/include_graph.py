#!/usr/bin/env python3
"""Print which folder includes which (the C++ tree's layers).

usage: tools/include_graph.py [--files]   (run from anywhere; reads src/, include/, cli/)

A folder is the file's directory (src/platform/posix and src/platform/windows count as
src/platform); `--files` also lists the including and included files of each edge. Exits 1
when two folders include each other (the include_layers test runs it).
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    folder = os.path.dirname(path)
    return "src/platform" if folder.startswith("src/platform/") else folder


def resolve(including, name):
    """The repository path an include names: beside the file, else under src/ or include/."""
    here = os.path.dirname(including)
    for base in (here, "src", "include"):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return candidate
    return None


def main():
    show_files = "--files" in sys.argv[1:]
    edges = defaultdict(set)
    for top in ("src", "include", "cli"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if not name.endswith((".cpp", ".hpp", ".h", ".c", ".cu")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), ROOT)
                with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                    text = f.read()
                for included in INCLUDE.findall(text):
                    target = resolve(path, included)
                    if target is None:
                        continue
                    a, b = folder_of(path), folder_of(target)
                    if a != b:
                        edges[(a, b)].add((path, target))
    by_source = defaultdict(list)
    for (a, b), pairs in sorted(edges.items()):
        by_source[a].append((b, pairs))
    for a in sorted(by_source):
        print(f"{a} -> " + ", ".join(f"{b} ({len(p)})" for b, p in by_source[a]))
        if show_files:
            for b, pairs in by_source[a]:
                for src, dst in sorted(pairs):
                    print(f"    {src} -> {dst}")
    # Two folders that include each other are not layers.
    cycles = sorted({tuple(sorted((a, b))) for (a, b) in edges if (b, a) in edges})
    for a, b in cycles:
        print(f"cycle: {a} <-> {b}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
