"""The pages a new user reads first stay short: docs/check-docs.py passes (the README at most
220 lines, no paragraph of the README or of docs/how-it-works.md over 150 words)."""

import subprocess
import sys

from conftest import ROOT


def test_the_readme_and_how_it_works_stay_short():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "check-docs.py")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_checker_finds_a_long_paragraph(tmp_path):
    page = tmp_path / "page.md"
    words = " ".join(["word"] * 151)
    page.write_text(f"# Title\n\n- a list item of few words\n\n{words}\n\n| {words} |\n\n```\n{words}\n```\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "check-docs.py"), str(page)], capture_output=True, text=True
    )
    assert done.returncode == 1 and "a paragraph of 151 words" in done.stdout, done.stdout
    assert done.stdout.count("a paragraph of") == 1, "tables and code blocks are not prose"
