"""Rebuild data/corpus.jsonl from the docstrings of Python's standard library.

The docstrings are part of CPython and covered by the PSF License Agreement
(see data/PSF-LICENSE.txt), so the corpus may be redistributed with this
project. Modules that CPython ships under their own licence notices are left
out so that one notice covers every line of the corpus.

Usage: python data/build_corpus.py [--output data/corpus.jsonl]
"""
import argparse
import ast
import json
import os
import sysconfig

# Incorporated third-party code with its own notice (see "Licenses and
# Acknowledgements for Incorporated Software" in the Python docs).
EXCLUDED = {"asynchat.py", "asyncore.py", "http/cookies.py", "trace.py", "uu.py"}
EXCLUDED_PACKAGES = ("xmlrpc/",)
# Test suites and demos are mostly code, not prose.
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "turtledemo", "__pycache__"}


def module_files(stdlib):
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), stdlib).replace(os.sep, "/")
            if name.endswith(".py") and rel not in EXCLUDED and not rel.startswith(EXCLUDED_PACKAGES):
                yield rel


def document(stdlib, rel):
    """One document per module: its docstring, then each documented def/class."""
    with open(os.path.join(stdlib, rel), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    module = rel[:-3].replace("/", ".").removesuffix(".__init__")
    parts = [ast.get_docstring(tree) or ""]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node)
            if doc and not node.name.startswith("_"):
                signature = "" if isinstance(node, ast.ClassDef) else f"({ast.unparse(node.args)})"
                parts.append(f"{module}.{node.name}{signature}\n\n{doc}")
    return "\n\n".join(p for p in parts if p)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.jsonl"))
    args = parser.parse_args()
    stdlib = sysconfig.get_paths()["stdlib"]
    with open(args.output, "w", encoding="utf-8") as out:
        for rel in module_files(stdlib):
            text = document(stdlib, rel)
            if len(text) < 200:  # modules without prose add nothing but noise
                continue
            out.write(json.dumps({"text": text, "source": f"Lib/{rel}"}, ensure_ascii=False) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
