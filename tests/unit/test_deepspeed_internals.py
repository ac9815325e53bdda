"""DeepSpeed's internals stay in megatron/runtime/deepspeed_internals.py, and the startup check names an
untested DeepSpeed release.

The scan reads the source (ast) of megatron/, tools/ and pretrain_gpt.py and reports, per file:
  import     a DeepSpeed module outside its public API (deepspeed.runtime.*, deepspeed.utils, ...)
  private    `x._name` where no file of this tree defines `_name` (so it is someone else's private)
  write      an attribute written or deleted on a DeepSpeed object (`engine.x = ...`, a patched
             DeepSpeed module attribute)
  override   a private method of a DeepSpeed base class redefined in a subclass, or an attribute the
             base class's own code sets written on `self`
ALLOWED lists what is still outside the module on purpose; the scan must find exactly that.
"""
import ast
import functools
import importlib
import importlib.util
import inspect
import pathlib
import pkgutil
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
THE_MODULE = "megatron/runtime/deepspeed_internals.py"

# DeepSpeed's documented API: deepspeed.initialize / init_distributed / add_config_arguments (and
# the engine they return), the pipeline specs, activation checkpointing, the accelerator, the
# communication facade and the MoE layer class.
PUBLIC_MODULES = ("deepspeed.pipe", "deepspeed.checkpointing", "deepspeed.accelerator", "deepspeed.comm",
                  "deepspeed.zero", "deepspeed.moe.layer")
DEEPSPEED_OBJECTS = {"engine", "checkpoint_engine", "deepspeed_moe"}  # names this tree gives DeepSpeed's objects

# Private names of other libraries (torch, argparse, collections, os, atexit): not DeepSpeed's.
# torch._dynamo: its recompile limit has no public setter (megatron/model/compiled.py).
FOREIGN_PRIVATE = {"_dynamo", "_utils", "_flatten_dense_tensors", "_unflatten_dense_tensors", "_option_string_actions",
                   "_replace", "_asdict", "_fields", "_exit", "_run_exitfuncs"}
MODULE_DUNDERS = {"__version__", "__file__", "__path__", "__name__", "__doc__", "__dict__", "__class__"}

# The one site that cannot move: DeepSpeed's PipelineModule calls _partition_layers from its
# constructor, so our default split must override it in the subclass itself.
ALLOWED = {
    ("megatron/model/gpt_model.py", "override PipelineModule._partition_layers"),
}


@functools.cache
def _parsed():
    return _sources()


def _sources():
    files = sorted((ROOT / "megatron").rglob("*.py")) + sorted((ROOT / "tools").rglob("*.py"))
    files.append(ROOT / "pretrain_gpt.py")
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in files}


def _deepspeed_submodules():
    """DeepSpeed's top-level subpackages and modules, found on disk (nothing imported)."""
    spec = importlib.util.find_spec("deepspeed")
    return {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}


def _is_public(module):
    return module == "deepspeed" or any(module == p or module.startswith(p + ".") for p in PUBLIC_MODULES)


@functools.cache
def _our_names_in_the_tree():
    return frozenset(_our_private_names(_parsed()))


def _our_private_names(trees):
    """Every `_name` this tree defines: functions, classes, module / class variables, self._name."""
    names = set()
    for path, tree in trees.items():
        if path == THE_MODULE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and (node.asname or node.name).startswith("_"):
                names.add(node.asname or node.name)  # `import x as _y`: ours to name
    return {n for n in names if n.startswith("_")}


def _chain(node):
    """The names along `a.b.c` (calls and subscripts passed through)."""
    names = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value if not isinstance(node, ast.Call) else node.func
    return names + ([node.id] if isinstance(node, ast.Name) else [])


def _on_deepspeed_object(node):
    """`engine`, `engine.optimizer`, `x.checkpoint_engine`, ...; not `engine.module` (our model)."""
    inside = False
    for name in reversed(_chain(node)):
        if name in DEEPSPEED_OBJECTS:
            inside = True
        elif name == "module":
            inside = False
    return inside


def _root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _last_name(node):
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _scan_file(tree, ours, submodules):
    found = set()
    deepspeed_names = {}  # local name -> the deepspeed module or object it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "deepspeed":
                    deepspeed_names[alias.asname or alias.name.split(".")[0]] = alias.name
                    if not _is_public(alias.name):
                        found.add(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "deepspeed":
            for alias in node.names:
                deepspeed_names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                full = f"{node.module}.{alias.name}" if node.module == "deepspeed" and alias.name in submodules \
                    else node.module
                if not _is_public(full):
                    found.add(f"import {full}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root, base = _root_name(node), _last_name(node.value)
            on_deepspeed_object = _on_deepspeed_object(node.value)  # engine._x, engine.optimizer._x
            dunder = node.attr.startswith("__") and node.attr.endswith("__")
            if node.attr.startswith("_") and not dunder and (
                    on_deepspeed_object or (node.attr not in ours and node.attr not in FOREIGN_PRIVATE)):
                found.add(f"private {base}.{node.attr}")
            elif dunder and root in deepspeed_names and node.attr not in MODULE_DUNDERS:  # __compatible_ops__
                found.add(f"private {base}.{node.attr}")
            if root == "deepspeed" and isinstance(node.value, ast.Name) and node.attr in submodules \
                    and not _is_public(f"deepspeed.{node.attr}"):
                found.add(f"import deepspeed.{node.attr}")
            if isinstance(node.ctx, (ast.Store, ast.Del)) and (on_deepspeed_object or root in deepspeed_names):
                found.add(f"write {base}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            target = node.args[0]
            if _on_deepspeed_object(target) or _root_name(target) in deepspeed_names:
                found.add(f"write {_last_name(target)}.<{node.func.id}>")
        elif isinstance(node, ast.ClassDef):
            found |= _overrides(node, deepspeed_names)
    return found


def _overrides(cls, deepspeed_names):
    """A subclass of a DeepSpeed class: its private methods that the base defines too, and the
    attributes it writes on self that the base's own source sets (`self.name =`)."""
    found = set()
    for base in cls.bases:
        if not (isinstance(base, ast.Name) and base.id in deepspeed_names):
            continue
        module, _, name = deepspeed_names[base.id].rpartition(".")
        ds_class, source = _deepspeed_class(module, name)
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.endswith("__") \
                    and hasattr(ds_class, node.name):
                found.add(f"override {name}.{node.name}")
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and re.search(rf"self\.{node.attr}\s*=[^=]", source):
                found.add(f"override {name}.{node.attr}")
    return found


@functools.cache
def _deepspeed_class(module, name):
    """The class and the source of its DeepSpeed ancestors (importing deepspeed: ~10 s, once)."""
    ds_class = getattr(importlib.import_module(module), name)
    return ds_class, "".join(inspect.getsource(k) for k in ds_class.__mro__ if k.__module__.startswith("deepspeed"))


def scan(trees, ours=None):
    ours = _our_private_names(trees) if ours is None else ours
    submodules = _deepspeed_submodules()
    return {(path, what) for path, tree in trees.items() if path != THE_MODULE
            for what in _scan_file(tree, ours, submodules)}


def test_deepspeed_internals_only_in_their_module():
    found = scan(_parsed())
    unexpected, gone = sorted(found - ALLOWED), sorted(ALLOWED - found)
    assert not unexpected, ("DeepSpeed internals outside megatron/runtime/deepspeed_internals.py (move them there, "
                            f"with a comment saying why the public API does not suffice): {unexpected}")
    assert not gone, f"no longer found, remove from ALLOWED: {gone}"


@pytest.mark.parametrize("line, what", [
    ("    engine._foo = 1", "private engine._foo"),
    ("    x = steps.engine._micro_batches", "private engine._micro_batches"),  # a name this tree also uses
    ("    n = engine.optimizer._global_grad_norm", "private optimizer._global_grad_norm"),
    ("    steps.engine.global_steps = 0", "write engine.global_steps"),
    ("    engine.optimizer.loss_scaler = None", "write optimizer.loss_scaler"),
    ("    setattr(engine, 'skipped_steps', 0)", "write engine.<setattr>"),
    ("    deepspeed.ops.__compatible_ops__['x'] = 1", "private ops.__compatible_ops__"),
    ("    from deepspeed.runtime.utils import see_memory_usage", "import deepspeed.runtime.utils"),
    ("    import deepspeed.utils.groups", "import deepspeed.utils.groups"),
    ("    deepspeed.utils.logger.setLevel(10)", "import deepspeed.utils"),
    ("    from deepspeed import runtime", "import deepspeed.runtime"),
])
def test_scan_catches_a_new_site_in_training(line, what):
    """The scan fails on a site added to megatron/training/trainer.py (the training loop; what a reviewer would add)."""
    path = "megatron/training/trainer.py"
    source = (ROOT / path).read_text() + f"\n\ndef _added(engine, steps):\n{line}\n"
    assert (path, what) in scan({path: ast.parse(source)}, ours=_our_names_in_the_tree()) - ALLOWED


def test_scan_accepts_the_public_api():
    trees = {"megatron/x.py": ast.parse(
        "import deepspeed\nfrom deepspeed.pipe import PipelineModule\nfrom deepspeed.moe.layer import MoE\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "def f(engine, model):\n    deepspeed.checkpointing.configure(None)\n    engine.train_batch()\n"
        "    engine.optimizer.step()\n    x = engine.module\n    engine.module.info = x\n"
        "    return model._parts, deepspeed.__version__\n")}
    assert scan(trees, ours=_our_names_in_the_tree()) == set()


# --- the version check ------------------------------------------------------------------------------

def _tested_range_from_setup():
    """setup.py's DEEPSPEED_TESTED as a SpecifierSet (packaging: an implementation of its own)."""
    from packaging.specifiers import SpecifierSet
    text = (ROOT / "setup.py").read_text()
    return SpecifierSet(re.search(r'^DEEPSPEED_TESTED = "([^"]+)"', text, re.M).group(1))


def test_version_line_outside_the_tested_range(capsys):
    import deepspeed

    from megatron.runtime.deepspeed_internals import check_deepspeed_version
    tested = _tested_range_from_setup()
    # 0.19.8 is the release the suite runs on today (written by hand, so a range that excludes it fails)
    assert tested.contains("0.19.8")
    for version in ("0.14.0", "0.18.9", "0.19.0", "0.19.8", "0.19.99", "0.20.0", "0.20.1", "1.0.0",
                    deepspeed.__version__):
        line = check_deepspeed_version(version)
        out = capsys.readouterr().out
        if tested.contains(version):
            assert line is None and out == "", version
        else:
            assert out.count("\n") == 1 and out.startswith("WARNING: DeepSpeed ") and f" {version} " in out, out
            assert all(spec.version in out for spec in tested), out  # it names the tested range
