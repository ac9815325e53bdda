"""Shared by the training benchmarks: our trainer built in-process, a plain PyTorch GPT with the
same shapes, interleaved timing, the GEMM ceiling and markdown tables."""
import contextlib
import io
import logging
import os
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported anywhere

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # tests/support/launch.py starts ranks for the benchmarks too
    sys.path.insert(0, ROOT)


def add_model_args(parser, layers=4, hidden=512, heads=8, seq=512, micro_batch=4, vocab=8192):
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--heads", type=int, default=heads)
    parser.add_argument("--seq", type=int, default=seq)
    parser.add_argument("--micro-batch", type=int, default=micro_batch)
    parser.add_argument("--vocab", type=int, default=vocab, help="mock-data vocabulary (padded to 128)")


def add_threads_arg(parser):
    # one thread by default: on this shared 2-core machine the second core absorbs other
    # people's test runs, which otherwise stretch random steps 3x
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same for every run")


def trainer_flags(layers, hidden, heads, seq, micro_batch, vocab, global_batch=None, train_iters=10 ** 6,
                  log_interval=10 ** 9, extra=()):
    """pretrain_gpt.py flags for a dropout-free fp32 run on mock data that never evaluates or
    saves, and by default never logs (in-process benchmarks time the steps themselves)."""
    flags = ["--num-layers", layers, "--hidden-size", hidden, "--num-attention-heads", heads,
             "--seq-length", seq, "--max-position-embeddings", seq, "--micro-batch-size", micro_batch,
             "--global-batch-size", global_batch or micro_batch, "--train-iters", train_iters, "--lr", 1e-4,
             "--mock-data", "--vocab-size", vocab, "--hidden-dropout", 0, "--attention-dropout", 0,
             "--eval-iters", 0, "--log-interval", log_interval, "--seed", 1234, *extra]
    return [str(f) for f in flags]


class Trainer:
    """Our trainer at world size 1: megatron.training.Trainer, built as pretrain() builds it (its
    startup report silenced); `step()` is its train_step, the loop's own iteration (minus logging /
    eval / save), and the first step's memory measurement as train() takes it."""

    def __init__(self, flags: list[str]) -> None:
        import pretrain_gpt
        from megatron.training import Trainer as OurTrainer
        from megatron.training.initialize import initialize_megatron

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()):  # the startup report, not a result
            self.args = initialize_megatron(args_list=flags)
            self.trainer = OurTrainer(self.args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
            self.trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider,
                                              pretrain_gpt.get_batch)
        self.engine, self.lr_scheduler, self.progress = self.trainer.engine, self.trainer.lr_scheduler, \
            self.trainer.progress
        self.engine.train()
        self.samples_per_step = self.args.global_batch_size
        self.flops_per_sample = self.args.flops_per_sample

    def step(self) -> torch.Tensor:
        loss, _ = self.trainer.train_step()
        if self.trainer.metrics.memory_probe is not None:  # after the first step, as train() does
            with contextlib.redirect_stdout(io.StringIO()):
                self.memory = self.trainer.measure_memory()
        return loss


class PlainBlock(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):  # [b, s, h]
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class PlainGPT(nn.Module):
    """The textbook GPT-2 forward with our model's exact parameter shapes (padded vocab, learned
    positions, biases everywhere, tied output layer), so it does the same FLOPs."""

    def __init__(self, layers, hidden, heads, seq, padded_vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(padded_vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(PlainBlock(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        for p in self.parameters():
            if p.ndim > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, labels):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.size(1)))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


class PlainTrainer:
    """Single process, no framework: forward, backward, clip to the same max norm our trainer
    uses (Megatron's default --clip-grad 1.0), AdamW with the same hyper-parameters and the same
    weight-decay groups."""

    def __init__(self, layers, hidden, heads, seq, micro_batch, vocab, clip_grad=1.0):
        from megatron.model.shape import pad_vocab_size
        padded = pad_vocab_size(vocab, 128, 1)
        torch.manual_seed(1234)
        self.model = PlainGPT(layers, hidden, heads, seq, padded).train()
        # the trainer's groups (megatron/training/optimizer.py): biases and LayerNorm gains are not decayed
        decay = [p for p in self.model.parameters() if p.ndim > 1]
        no_decay = [p for p in self.model.parameters() if p.ndim <= 1]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                            {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
        self.clip_grad = clip_grad
        text = torch.randint(0, vocab, (micro_batch, seq + 1))
        self.tokens, self.labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
        self.samples_per_step = micro_batch

    def step(self):
        loss = self.model(self.tokens, self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        self.optimizer.step()
        return loss.detach()


class LoadMeter:
    """CPU time used by OTHER processes on this machine while a block runs, in cores. This box is
    shared (another engineer's test runs take whole cores for seconds at a time), so every
    timed round is checked and retaken when someone else was busy."""

    def __init__(self):
        self.clock_ticks = os.sysconf("SC_CLK_TCK")

    def _busy_seconds(self):
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
        return (sum(values) - values[3] - values[4]) / self.clock_ticks  # minus idle and iowait

    def _own_seconds(self):
        t = os.times()  # this process (all threads) and the children it has waited for
        return t.user + t.system + t.children_user + t.children_system

    def start(self):
        self.begin = (self._busy_seconds(), self._own_seconds(), time.perf_counter())

    def stop(self):
        busy, own, wall = self.begin
        foreign = (self._busy_seconds() - busy) - (self._own_seconds() - own)
        return max(0.0, foreign) / (time.perf_counter() - wall)


def spare_cores(threads):
    """The foreign load a run of `threads` threads tolerates: the cores it leaves idle, plus a
    quarter core of background noise."""
    return max(0, os.cpu_count() - threads) + 0.25


def wait_for_quiet(max_load, timeout):
    """Sleep (up to `timeout` s) until other processes use less than `max_load` cores."""
    meter, deadline = LoadMeter(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        meter.start()
        time.sleep(0.5)
        if meter.stop() < max_load:
            return


class Rounds:
    """Interleaved repetitions: in every round each runner does its work once, in turn, so slow
    drifts hit all runners alike; a round during which other processes used more than
    `max_load` cores is thrown away and retaken (at most `retries` times per round)."""

    def __init__(self, max_load=0.25, retries=3, quiet_timeout=30):
        self.max_load, self.retries, self.quiet_timeout = max_load, retries, quiet_timeout
        self.rejected, self.loads = 0, []

    def run(self, reps, measure_round):
        """measure_round() -> {name: value}; returns {name: [value per accepted round]}."""
        results, meter = {}, LoadMeter()
        for _ in range(reps):
            for attempt in range(self.retries + 1):
                wait_for_quiet(self.max_load, self.quiet_timeout)
                meter.start()
                values = measure_round()
                load = meter.stop()
                if load <= self.max_load or attempt == self.retries:
                    break
                self.rejected += 1
            self.loads.append(load)
            for name, value in values.items():
                results.setdefault(name, []).append(value)
        return results

    def note(self):
        return (f"{len(self.loads)} rounds kept, {self.rejected} retaken because other processes were busy; "
                f"foreign CPU load in kept rounds: median {median(self.loads):.2f}, max {max(self.loads):.2f} cores")


def time_steps(runs, iters, reps, rounds, warmup=1):
    """{name: runner with .step()} -> {name: [seconds per step, one per round]}."""
    for runner in runs.values():
        for _ in range(warmup):
            runner.step()

    def measure_round():
        seconds = {}
        for name, runner in runs.items():
            start = time.perf_counter()
            for _ in range(iters):
                runner.step()
            seconds[name] = (time.perf_counter() - start) / iters
        return seconds
    return rounds.run(reps, measure_round)


def median(values):
    return statistics.median(values)


def gemm_flops(n=2048, dtype=torch.float32, device="cpu", reps=5):
    """Achieved FLOP/s of an n x n x n matmul (2n^3 FLOPs): the median of `reps` timed runs."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.mm(a, b, out=out)  # warm-up: thread pool, allocator, kernel selection
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / median(times)


def table(header, rows):
    """Markdown table; floats shown with 3 significant digits unless pre-formatted."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def model_label(a):
    return f"L{a.layers} h{a.hidden} a{a.heads} s{a.seq} mb{a.micro_batch} V{a.vocab}"
