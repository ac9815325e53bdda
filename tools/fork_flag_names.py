"""The flag names a fork's argument file declares (its literal add_argument calls), one a line: how
tests/data/fork_flags/*.txt were made (megatron/config/flag_table_sources.md). Reads a git directory,
e.g. a bare clone:

    python tools/fork_flag_names.py Megatron-DeepSpeed.git megatron/arguments.py 4efb479d > deepspeedai.txt
"""
import ast
import subprocess
import sys


def flag_names(source: str) -> list[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and a.value.startswith("--"))
    return sorted(names, key=str.lower)


def main(argv: list[str]) -> None:
    git_dir, path, commit = argv
    source = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True,
                            text=True, check=True).stdout
    print("\n".join(flag_names(source)))


if __name__ == "__main__":
    main(sys.argv[1:])
