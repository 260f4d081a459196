#!/usr/bin/env python3
"""The link check: every relative link of README.md and docs/*.md must name a file
that exists and, when it has one, an anchor that a heading of that file makes.

    python3 scripts/check-links.py [FILE.md ...]     (default: README.md, docs/*.md)

Anchors are made the way GitHub makes them from headings: the text without its
Markdown (backticks, emphasis, link targets), lower case, every character that is
not a letter, digit, space, `-` or `_` dropped, spaces turned into `-`; a repeated
heading gets `-1`, `-2`, ... Links inside code (fenced blocks, `inline code`) and
links to other sites (http:, https:, mailto:) are not checked. scripts/doctest.py
runs this check first; exit status 1 lists every broken link.
"""

import re
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+).+?\1")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def shown(path):
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def default_files():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(path.read_text().split("\n"), 1):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):].strip():
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # [text](target) -> text
    text = re.sub(r"<[^>]+>", "", text)                         # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(c for c in text
                   if c.isalnum() or c in " -_" or unicodedata.category(c).startswith("M"))
    return kept.replace(" ", "-")


_anchors = {}


def anchors(path):
    """Every anchor the headings of path make."""
    path = path.resolve()
    if path not in _anchors:
        seen, result = {}, set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = result
    return _anchors[path]


def broken_links(path):
    """(line, target, why) of every broken relative link in path."""
    path = path.resolve()
    out = []
    for n, line in prose_lines(path):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group(1)
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                out.append((n, target, f"no such file: {shown(dest)}"))
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append((n, target, f"no heading of {shown(dest)} makes the anchor #{anchor}"))
    return out


def check(files):
    """Print the broken links of files; True when there is none."""
    bad = 0
    for f in files:
        for n, target, why in broken_links(Path(f)):
            print(f"  {shown(Path(f))}:{n}: ({target}) {why}")
            bad += 1
    return bad == 0, bad


def main():
    files = [Path(a) for a in sys.argv[1:]] or default_files()
    ok, bad = check(files)
    if ok:
        print(f"==> check-links: every relative link of {len(files)} file(s) resolves")
        return 0
    print(f"==> check-links: {bad} broken link(s)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
