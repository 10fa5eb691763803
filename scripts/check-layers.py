#!/usr/bin/env python3
"""Checks kvmesh's one-way layering (docs/architecture.md, "Layers").

Reads every `#include "..."` of the C/C++/CUDA sources, maps each file to its
folder and layer with the table in scripts/layers.txt, and fails when
  - a file includes a header of a higher layer, or of another folder of the
    same layer (peers do not see each other), or
  - the folder graph has a cycle (checked on sub-folders too).
Prints the folder graph (who includes whom, how many lines) either way.

Usage: check-layers.py [--root DIR] [--table FILE] [--graph-only]
Exit status: 0 clean, 1 violations, 2 bad table.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = ('.h', '.hpp', '.cc', '.cpp', '.c', '.cu', '.cuh', '.in')


def load_table(path):
    """Returns (rank_of_folder, owner_of_public_header)."""
    ranks, owners = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            words = line.split()
            if words[0] == 'layer' and len(words) >= 3:
                rank = int(words[1])
                for folder in words[2:]:
                    ranks[folder] = rank
            elif words[0] == 'public' and len(words) >= 3:
                for header in words[2:]:
                    owners[header] = words[1]
            else:
                sys.exit(f'{path}:{n}: expected "layer RANK FOLDER..." or "public FOLDER HEADER..."')
    for header, owner in owners.items():
        if owner not in ranks:
            sys.exit(f'{path}: public header {header} names unknown folder {owner}')
    return ranks, owners


def top_folder(rel):
    return rel.split('/', 1)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--root', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    ap.add_argument('--table', default=None)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    ranks, owners = load_table(args.table or os.path.join(root, 'scripts', 'layers.txt'))

    files = []
    for folder in sorted(ranks):
        base = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
            for fn in sorted(filenames):
                if fn.endswith(SOURCE_EXT):
                    files.append(os.path.relpath(os.path.join(dirpath, fn), root))
    public_dir = os.path.join(root, 'include')
    for dirpath, _, filenames in os.walk(public_dir):
        for fn in sorted(filenames):
            if fn.endswith(SOURCE_EXT):
                files.append(os.path.relpath(os.path.join(dirpath, fn), root))

    def owner_folder(rel):
        """The folder a file belongs to, for the graph (its directory; a public
        header counts as its owner's top folder)."""
        if rel.startswith('include/'):
            name = rel[len('include/'):]
            return owners.get(name)
        return os.path.dirname(rel)

    def layer_of(rel):
        if rel.startswith('include/'):
            o = owners.get(rel[len('include/'):])
            return (o, ranks[o]) if o else (None, None)
        t = top_folder(rel)
        return (t, ranks[t]) if t in ranks else (None, None)

    violations = []
    edges = defaultdict(int)
    for rel in files:
        src_top, src_rank = layer_of(rel)
        if src_top is None:
            if rel.startswith('include/'):
                violations.append(f'{rel}: public header missing from the table ("public FOLDER {rel[8:]}")')
            continue
        src_dir = owner_folder(rel)
        with open(os.path.join(root, rel), errors='replace') as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if os.path.exists(os.path.join(root, 'include', inc)):
                    target = 'include/' + inc
                elif os.path.exists(os.path.join(root, inc)) and top_folder(inc) in ranks:
                    target = inc
                else:
                    continue  # generated, same-directory or third-party header
                dst_top, dst_rank = layer_of(target)
                if dst_top is None:
                    violations.append(f'{rel}:{n}: includes {inc}, which no layer owns')
                    continue
                dst_dir = owner_folder(target)
                if dst_dir != src_dir:
                    edges[(src_dir, dst_dir)] += 1
                if dst_rank > src_rank:
                    violations.append(f'{rel}:{n}: {src_top} (layer {src_rank}) includes {inc} of '
                                      f'{dst_top} (layer {dst_rank}): upward')
                elif dst_rank == src_rank and dst_top != src_top:
                    violations.append(f'{rel}:{n}: {src_top} includes {inc} of its peer {dst_top} '
                                      f'(both layer {src_rank})')

    # Cycles over sub-folders (Tarjan's strongly connected components).
    graph = defaultdict(set)
    for (a, b) in edges:
        graph[a].add(b)
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(set(graph) | {b for s in graph.values() for b in s}):
        if v not in index:
            strong(v)
    for comp in sccs:
        violations.append('folder cycle: ' + ' <-> '.join(comp))

    print('folder graph (includer -> included: #include lines):')
    for (a, b), c in sorted(edges.items(), key=lambda e: (ranks.get(top_folder(e[0][0]), 99), e[0])):
        print(f'  {a:28} -> {b:28} {c}')
    tops = defaultdict(int)
    for (a, b), c in edges.items():
        ta, tb = top_folder(a), top_folder(b)
        if ta != tb:
            tops[(ta, tb)] += c
    print('top-level folders:')
    for (a, b), c in sorted(tops.items(), key=lambda e: (ranks[e[0][0]], e[0])):
        mark = '' if ranks[b] < ranks[a] else '   <-- ' + ('upward' if ranks[b] > ranks[a] else 'peer')
        print(f'  {a} ({ranks[a]}) -> {b} ({ranks[b]}): {c}{mark}')
    if violations:
        print(f'\n{len(violations)} layering violation(s):')
        for v in violations:
            print('  ' + v)
        return 1
    print(f'\nlayering OK: {len(files)} files, {len(edges)} folder edges, no upward include, no cycle')
    return 0


if __name__ == '__main__':
    sys.exit(main())
