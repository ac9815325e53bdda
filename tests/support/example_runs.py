"""examples/*.sh run as a user runs them."""
import os
import subprocess

from tests.support.launch import ROOT, free_port


def run_example(script, tmp_path, *flags, **env):
    env = dict(os.environ, MASTER_PORT=str(free_port()), CHECKPOINT_PATH=str(tmp_path / "ckpt"),
               TENSORBOARD_PATH=str(tmp_path / "tb"), **{k: str(v) for k, v in env.items()})
    proc = subprocess.run(["bash", f"examples/{script}", *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc.stdout
