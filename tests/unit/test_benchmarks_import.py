"""The suite does not run the benchmarks (they time things), so a rename in megatron could break
them unnoticed, as one did: every script must import, and every `from megatron... import name` in
them, at module level or inside a function, must name something that exists."""
import ast
import importlib
import importlib.util
import os
import runpy
import sys

import pytest
import torch

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
SCRIPTS = sorted(name for name in os.listdir(BENCHMARKS) if name.endswith(".py"))


def _megatron_imports(path):
    """(module, name) of every `from megatron... import name` in the file."""
    with open(path) as f:
        tree = ast.parse(f.read())
    return [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.split(".")[0] == "megatron" for alias in node.names]


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_imports_and_its_megatron_names_exist(script, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)  # as `python benchmarks/<script>` puts it first
    path = os.path.join(BENCHMARKS, script)
    if script == "gpu_check.py":  # without CUDA it imports only as its --cpu dry run
        monkeypatch.setattr(sys, "argv", [path, "--cpu"])
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    if script == "bench_gpu.py" and not torch.cuda.is_available():  # it stops at once, in one line
        with pytest.raises(SystemExit, match="^bench_gpu.py: no CUDA device visible to torch"):
            runpy.run_path(path, run_name="imported")
    else:
        runpy.run_path(path, run_name="imported")  # its main() does not run
    for module, name in _megatron_imports(path):
        assert hasattr(importlib.import_module(module), name) or \
            importlib.util.find_spec(f"{module}.{name}") is not None, f"{script}: from {module} import {name}"


def test_the_check_sees_imports_inside_functions():
    assert ("megatron.model.shape", "pad_vocab_size") in _megatron_imports(os.path.join(BENCHMARKS, "common.py"))
