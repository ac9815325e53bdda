"""The fenced commands README.md and docs/ mark `<!-- runnable -->` run as printed: each line
that is not a comment, with bash from the repository root, exits 0. (The main job and the
example scripts are run by test_examples and test_variant_examples; the other commands name
files that test_docs checks exist.)"""
import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKED = re.compile(r"^<!-- runnable -->\n```[a-z]*\n(.*?)^```", re.M | re.S)


def _runnable() -> list[tuple[str, str]]:
    found = []
    for page in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(page, encoding="utf-8") as f:
            for block in MARKED.findall(f.read()):
                found += [(os.path.relpath(page, ROOT), line) for line in block.splitlines()
                          if line.strip() and not line.lstrip().startswith("#")]
    return found


COMMANDS = _runnable()


def test_some_commands_are_marked():
    assert len(COMMANDS) >= 3


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_marked_command_runs(page, command):
    env = dict(os.environ, PYTHONPATH=ROOT, DS_ACCELERATOR="cpu")
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{page}: `{command}` exited {proc.returncode}:\n{proc.stderr[-2000:]}"
