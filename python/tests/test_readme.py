"""The README's Python examples: the CPU ones run, from the repository's root where their paths
point; the others (GPU) are compiled. A newcomer meets a working CPU example early."""

import re
import subprocess
import sys

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def python_blocks():
    """(first line number, code) of every ```python block of the README."""
    blocks = []
    for match in re.finditer(r"```python\n(.*?)```", README, flags=re.S):
        line = README[: match.start()].count("\n") + 1
        blocks.append((line, match.group(1)))
    return blocks


def test_the_readme_has_python_examples_on_the_cpu_and_on_the_gpu():
    blocks = python_blocks()
    cpu = [line for line, code in blocks if 'device="cpu"' in code]
    assert cpu and min(cpu) < 100, "a CPU example within the first 100 lines"
    assert any('device="cuda' in code for _, code in blocks)
    commands = [i for i, l in enumerate(README.splitlines()) if l.startswith("gpufeed run") and "--cpu" in l]
    assert commands and commands[0] < 100, "a command line example within the first 100 lines"


def test_every_python_example_runs_or_compiles():
    for line, code in python_blocks():
        compile(code, f"README.md:{line}", "exec")
        if 'device="cpu"' not in code:
            continue
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"README.md:{line}:\n{done.stderr}"
        assert "batches," in done.stdout, done.stdout
