"""README.md and docs/ stay true to the tree: every relative link and every repo file a fenced
command names exists, README stays a first screen (under 250 lines) and opens with the two
commands, and CI runs exactly the README's test command."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
# repo files a command runs: tools/x.py, examples/x.sh, benchmarks/x.py, pretrain_gpt.py
NAMED_FILE = re.compile(r"(?<![\w/.-])((?:tools|examples|benchmarks)/[\w-]+\.(?:py|sh)|pretrain_gpt\.py)\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(_read(page)):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), target))):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert broken == []


def test_every_file_a_command_names_exists():
    missing = []
    for page in PAGES:
        for block in FENCE.findall(_read(page)):
            missing += [f"{os.path.relpath(page, ROOT)}: {name}" for name in NAMED_FILE.findall(block)
                        if not os.path.isfile(os.path.join(ROOT, name))]
    assert missing == []


def test_every_source_path_the_text_names_exists():
    """A module moved or renamed leaves no stale path behind in the prose."""
    path = re.compile(r"(?<![\w/.-])((?:megatron|tools|tests|benchmarks|examples)/[\w/.-]*\.(?:py|sh|json))\b")
    missing = []
    for page in PAGES:
        missing += [f"{os.path.relpath(page, ROOT)}: {name}" for name in path.findall(_read(page))
                    if not os.path.isfile(os.path.join(ROOT, name))]
    assert missing == []


def test_every_docs_page_is_linked_from_the_readme():
    readme = _read(os.path.join(ROOT, "README.md"))
    unlinked = [os.path.relpath(p, ROOT) for p in PAGES[1:] if f"(docs/{os.path.basename(p)}" not in readme]
    assert PAGES[1:] and unlinked == []


def test_readme_is_a_first_screen_that_opens_with_the_two_commands():
    readme = _read(os.path.join(ROOT, "README.md"))
    assert len(readme.splitlines()) < 250
    first = FENCE.search(readme)
    assert first is not None and readme.index(first.group(0)) < 200  # right under the title
    commands = [line for line in first.group(1).splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and "examples/pretrain_gpt_tiny_cpu.sh" in commands[0]
    assert commands[1].endswith("python -m pytest -q tests")


def test_ci_runs_the_readme_test_command():
    readme = _read(os.path.join(ROOT, "README.md"))
    test_command = [line for line in FENCE.search(readme).group(1).splitlines() if "pytest" in line][0]
    ci = [line for line in _read(os.path.join(ROOT, ".ci", "run")).splitlines() if "pytest" in line]
    assert ci == [test_command]
