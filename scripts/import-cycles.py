#!/usr/bin/env python3
"""Report import cycles between the modules (files) of each Rust crate.

    python3 scripts/import-cycles.py            # src/, core/src/, gateway/src/, bridge/src/, clients/rust/src/
    python3 scripts/import-cycles.py DIR ...    # other crate roots

A module's file refers to another when it names it through `crate::`,
`super::` or one of its own child modules (`use`, a path in code); a name a
module re-exports (`pub use child::name`) is taken from the child. A module
that declares or re-exports its children does not count as using them: a
folder's mod.rs is the room's door, and its children may use what it holds.
Every strongly connected group of two or more files is a cycle. Exit status
1 when there is one.
"""

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ["src", "core/src", "gateway/src", "bridge/src", "clients/rust/src"]

PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::\w+)*)::\{([^{}]*)\}")
CHILD_USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+(\w+)((?:::\w+)*)", re.M)
COMMENT = re.compile(r"//[^\n]*")


def modules(root):
    """module path (tuple) -> file, for every .rs file under the crate root."""
    found = {}
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("lib", "main", "mod"):
            parts = parts[:-1]
        if parts and parts[0] == "bin":
            continue  # other binaries are crates of their own
        found[tuple(parts)] = path
    return found


REEXPORT = re.compile(r"^\s*pub(?:\([^)]*\))?\s+use\s+(?:self::)?(\w+)::(?:\{([^}]*)\}|(\w+|\*))", re.M)
DEFINES = r"^\s*pub(?:\([^)]*\))?\s+(?:unsafe\s+)?(?:fn|struct|enum|const|static|trait|type|mod)\s+{}\b"


def reexports(mods):
    """module -> {name: child module} for its `pub use child::name` (and
    `child::*`, for the names the child defines)."""
    found = {}
    for module, path in mods.items():
        names = {}
        for child, group, single in REEXPORT.findall(COMMENT.sub("", path.read_text())):
            target = module + (child,)
            if target not in mods:
                continue
            items = [i.strip().split(" as ")[-1] for i in group.split(",")] if group else [single]
            for item in items:
                names[item] = target
        found[module] = names
    return found


def resolve(mods, segments, exported=None):
    """The module a path names: its longest known module prefix, or the
    child a module's `pub use` re-exports the next name from."""
    for end in range(len(segments), -1, -1):
        module = tuple(segments[:end])
        if module in mods:
            names = (exported or {}).get(module, {})
            if end < len(segments):
                name = segments[end]
                if name in names:
                    return names[name]
                for star, child in names.items():
                    if star == "*" and re.search(DEFINES.format(re.escape(name)), mods[child].read_text(), re.M):
                        return child
            return module
    return None


def references(mods, module, text, exported):
    text = COMMENT.sub("", text)
    base = {"crate": [], "self": list(module), "super": list(module[:-1])}
    found = set()

    def add(anchor, rest):
        segments = base[anchor] + [s for s in rest.split("::") if s]
        # super::super::x
        while "super" in segments:
            i = segments.index("super")
            segments = segments[: i - 1] + segments[i + 1 :]
        target = resolve(mods, segments, exported)
        if target is not None:
            found.add(target)

    for anchor, prefix, items in GROUP.findall(text):
        for item in items.split(","):
            item = item.strip().split(" as ")[0]
            if item and item != "self":
                add(anchor, prefix + "::" + item.replace(" ", ""))
    for anchor, rest in PATH.findall(text):
        add(anchor, rest)
    for first, rest in CHILD_USE.findall(text):
        if first not in ("crate", "super", "self", "std", "core", "alloc") and module + (first,) in mods:
            add("self", "::" + first + rest)
    # Declaring or re-exporting one's own children is not using them.
    return {t for t in found if t != module and t[: len(module)] != module}


def cycles(graph):
    """Tarjan's strongly connected components of two or more nodes."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main():
    roots = [Path(a) for a in sys.argv[1:]] or [REPO / r for r in ROOTS]
    bad = False
    for root in roots:
        mods = modules(root)
        exported = reexports(mods)
        graph = {m: references(mods, m, path.read_text(), exported) for m, path in mods.items()}
        edges = sum(len(v) for v in graph.values())
        found = cycles(graph)
        name = root.relative_to(REPO) if root.is_relative_to(REPO) else root
        print(f"{name}: {len(mods)} modules, {edges} references, {len(found)} cycle(s)")
        for group in found:
            bad = True
            print("  cycle: " + " <-> ".join(str(mods[m].relative_to(root)) for m in group))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
