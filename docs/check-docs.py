#!/usr/bin/env python3
"""Checks that the pages a new user reads first stay short: the README at most 220 lines, and
no paragraph of the README or of docs/how-it-works.md over 150 words.

A paragraph is a block of non-blank prose lines. Code blocks, tables and headings are not prose;
each list item is a paragraph of its own (with the indented lines that continue it).

    python3 docs/check-docs.py              # the README and how-it-works.md; exit 1 on a breach
    python3 docs/check-docs.py docs/*.md    # any pages: their longest paragraphs, and breaches
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 220
PARAGRAPH_MAX_WORDS = 150
CHECKED = ["README.md", "docs/how-it-works.md"]

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def paragraphs(text):
    """(first line number, text) of every prose paragraph of a Markdown page."""
    found = []
    current = None  # [first line number, lines]
    fence = None

    def close():
        nonlocal current
        if current:
            found.append((current[0], " ".join(current[1])))
        current = None

    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence):
                fence = None
            continue
        if stripped.startswith("```") or stripped.startswith("~~~"):
            close()
            fence = stripped[:3]
            continue
        if not stripped or stripped.startswith("#") or stripped.startswith("|"):
            close()
            continue
        if LIST_ITEM.match(line):
            close()
        if current is None:
            current = [number, []]
        current[1].append(stripped)
    close()
    return found


def shown(path):
    """The path from the repository's root when it lies there."""
    try:
        return path.relative_to(ROOT)
    except ValueError:
        return path


def words(paragraph):
    return len(paragraph.split())


def check(path, limit_words=PARAGRAPH_MAX_WORDS):
    """Breaches of the word limit in the page at `path`, as messages."""
    text = path.read_text(encoding="utf-8")
    return [
        f"{shown(path)}:{line}: a paragraph of {words(p)} words (at most {limit_words})"
        for line, p in paragraphs(text)
        if words(p) > limit_words
    ]


def main(arguments):
    pages = [pathlib.Path(a).resolve() for a in arguments] or [ROOT / p for p in CHECKED]
    problems = []
    for page in pages:
        found = paragraphs(page.read_text(encoding="utf-8"))
        longest = max((words(p) for _, p in found), default=0)
        lines = len(page.read_text(encoding="utf-8").splitlines())
        print(f"{shown(page)}: {lines} lines, {len(found)} paragraphs, the longest {longest} words")
        problems += check(page)
    readme = ROOT / "README.md"
    readme_lines = len(readme.read_text(encoding="utf-8").splitlines())
    if readme_lines > README_MAX_LINES:
        problems.append(f"README.md: {readme_lines} lines (at most {README_MAX_LINES})")
    for problem in problems:
        print(problem)
    print("ok" if not problems else f"{len(problems)} to fix")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
