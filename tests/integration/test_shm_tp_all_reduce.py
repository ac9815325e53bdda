"""The shared-memory TP all-reduce (megatron/mpu/shm_comm.py): the same losses and gradient norms
as gloo, bit for bit, and no file of it left in /dev/shm after a run, an error or a kill."""
import glob
import json
import os
import signal
import subprocess
import sys

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(HERE)), HERE])}


def start(mode):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "shm_tp_worker.py"), mode], cwd=HERE, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_until(proc, prefix):
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"no {prefix} line; stdout: {''.join(lines)}; stderr: {proc.stderr.read()[-2000:]}")


def value(lines, key):
    return next(line.split(" ", 1)[1].strip() for line in lines if line.startswith(key + " "))


def left_over(lines):
    """The group's file and any file of this code named after the worker processes."""
    pids = value(lines, "PIDS").split()
    return [p for p in [value(lines, "PATH")] if os.path.exists(p)] + \
        [p for pid in pids for p in glob.glob(f"/dev/shm/megatron-tp-{pid}-*")]


def test_same_losses_and_grad_norms_as_gloo_and_nothing_left():
    proc = start("compare")
    out, err = proc.communicate(timeout=300)
    lines = out.splitlines(keepends=True)
    assert value(lines, "EXIT") == "0 0", err[-2000:]
    assert "TP all-reduce: shared memory" in out
    for report in (json.loads(line) for line in lines if line.startswith("{")):
        # 3 SGD steps of a TP=2 GPT: (loss, gradient norm) exactly equal, and the model learns
        assert report["shm"] == report["gloo"], report["rank"]
        assert report["gloo"][2][0] < report["gloo"][0][0]
    assert left_over(lines) == []


def test_nothing_left_after_an_error():
    proc = start("error")
    out, err = proc.communicate(timeout=300)
    lines = out.splitlines(keepends=True)
    assert value(lines, "EXIT") == "1 1" and "failing on purpose" in err
    assert left_over(lines) == []


def test_nothing_left_after_a_kill():
    proc = start("kill")
    try:
        lines = read_until(proc, "READY")
        for pid in value(lines, "PIDS").split():
            os.kill(int(pid), signal.SIGKILL)
        lines += read_until(proc, "EXIT")
        assert value(lines, "EXIT") == f"{-signal.SIGKILL} {-signal.SIGKILL}"
        assert left_over(lines) == []
    finally:
        proc.kill()
        proc.communicate()



def test_multi_chunk_all_reduce_is_gloos_bit_for_bit():
    """Tensors larger than a slot go through in chunks: odd sizes ending in a partial chunk, exact
    multiples, a tensor of one chunk after them, and a tiny slot (41 chunks: both buffers reused
    many times), in every dtype a TP all-reduce carries (fp32, bf16; fp16 too, which gloo sums on
    CPU), for SUM and MAX: the result equals gloo's bit for bit, and the sum of both inputs. The
    same for sequence parallelism's dim-0 all-gather and reduce-scatter."""
    proc = start("chunks")
    out, err = proc.communicate(timeout=300)
    lines = out.splitlines(keepends=True)
    assert value(lines, "EXIT") == "0 0", err[-2000:]
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for report in reports:
        cases = {case: (chunks, gloo, summed) for case, chunks, gloo, summed in report["cases"]}
        # 2 M fp32 or 4 M half elements fill a 4 MiB slot; the tiny slot holds 1000 bytes
        assert cases["float32 2109497 default sum"][0] == cases["bfloat16 4206649 default sum"][0] == 3
        assert cases["float32 3145728 default max"][0] == cases["float16 6291456 default max"][0] == 3
        assert cases["float32 10007 tiny sum"][0] == 41 and cases["bfloat16 10007 tiny sum"][0] == 21
        assert len(cases) == 3 * 5 * 2
        wrong = [case for case, (_, gloo, summed) in cases.items() if not (gloo and summed)]
        assert wrong == [], report["rank"]
        # sequence parallelism's all-gather (chunks of a slot) and reduce-scatter (a chunk carries
        # the same stretch of both halves: half a slot): the default size's first case takes 3 and
        # 5 chunks; the tiny slot 41 and 81 in fp32
        sequence = {case: (chunks, gloo, expected) for case, chunks, gloo, expected in report["sequence"]}
        assert len(sequence) == 3 * 3 * 2
        assert sequence["float32 2109497 default all-gather"][0] == 3
        assert sequence["float32 2109497 default reduce-scatter"][0] == 5
        assert sequence["float32 10007 tiny all-gather"][0] == 41
        assert sequence["float32 10007 tiny reduce-scatter"][0] == 81
        wrong = [case for case, (_, gloo, expected) in sequence.items() if not (gloo and expected)]
        assert wrong == [], report["rank"]
    assert left_over(lines) == []
