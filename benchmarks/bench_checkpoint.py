"""Cost of a crash-proof save: today's CheckpointManager.save (every rank writes into
global_stepN.partial, a manifest of every file's size and CRC-32, one rename, then the trackers)
against the save as it was before (DeepSpeed writes global_stepN in place, our two JSON files, the trackers),
on a realistic checkpoint: the seed's 52M GPT (8 layers, hidden 512, seq 1024, vocab 50257) in
fp32 with Adam, one training step taken so the optimizer state is full (~620 MB of files).

The manifest takes each shard's CRC-32s from its zip directory (torch computes them while it
writes); the alternative, a CRC-32 of every byte re-read right after the save (from the page
cache), is timed too, and the throughput of the checksums it could use.

Single process, gloo, world size 1; rounds interleave the two saves (common.Rounds), each into a
fresh iteration directory, the previous round's removed outside the timing.

Usage: python benchmarks/bench_checkpoint.py [--reps 5] [--dir /tmp] [--layers 8 --hidden 512 ...]
"""
import argparse
import contextlib
import hashlib
import io
import os
import shutil
import tempfile
import time
import zlib

import common
import torch.distributed as dist


def old_save(manager, engine, lr_scheduler, progress):
    """The save before this change, with the same client state: DeepSpeed writes global_stepN in
    place, then rank 0 writes the layout, model info and trackers."""
    from megatron.checkpoint.layout import step_dir, step_tag, write_layout, write_model_info, write_tracker
    from megatron.checkpoint.reshard import optimizer_param_names
    config, iteration = manager.config, progress.iteration
    client_state = {"iteration": iteration, "progress": progress.state_dict(),
                    "lr_scheduler": lr_scheduler.state_dict(), "layout": manager.layout.to_dict(),
                    "optimizer_param_names": optimizer_param_names(engine)}
    engine.save_checkpoint(config.save, tag=step_tag(iteration), client_state=client_state, save_latest=False)
    dist.barrier()
    write_layout(step_dir(config.save, iteration), manager.layout)
    write_model_info(step_dir(config.save, iteration), manager.model_info())
    write_tracker(config.save, iteration)
    dist.barrier()


def checksum_rates(step_directory):
    """{name: MB/s} of each candidate over every file of a saved iteration (page-cached)."""
    files = [os.path.join(step_directory, n) for n in sorted(os.listdir(step_directory))]
    data = [open(p, "rb").read() for p in files]  # noqa: SIM115  (read once: the rates compare the hashes alone)
    size = sum(len(d) for d in data)
    candidates = {
        "zlib.crc32 (chosen)": lambda b: zlib.crc32(b),
        "zlib.adler32": lambda b: zlib.adler32(b),
        "hashlib.blake2b": lambda b: hashlib.blake2b(b).digest(),
        "hashlib.sha256": lambda b: hashlib.sha256(b).digest(),
        "hashlib.md5": lambda b: hashlib.md5(b).digest(),
    }
    rates = {}
    for name, fn in candidates.items():
        start = time.perf_counter()
        for d in data:
            fn(d)
        rates[name] = size / (time.perf_counter() - start) / 1e6
    return size, rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_model_args(parser, layers=8, hidden=512, heads=8, seq=1024, micro_batch=1, vocab=50257)
    common.add_threads_arg(parser)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: a temp dir)")
    a = parser.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    root = tempfile.mkdtemp(prefix="bench_ckpt_", dir=a.dir)
    save_dir = os.path.join(root, "ckpt")
    flags = common.trainer_flags(a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab,
                                 extra=["--save", save_dir])
    runner = common.Trainer(flags)
    runner.step()  # Adam's moments exist: the checkpoint holds what a real one does
    trainer = runner.trainer
    manager, engine, lr_scheduler, progress = trainer.checkpointer, trainer.engine, trainer.lr_scheduler, \
        trainer.progress
    from megatron.checkpoint.layout import step_dir
    from megatron.checkpoint.manifest import checksum_share, file_checksum, step_files
    made = []

    def timed(save):
        progress.iteration += 1
        if made:  # the previous round's directory: removed outside the timing
            shutil.rmtree(made.pop(), ignore_errors=True)
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            save(engine, lr_scheduler, progress)
        seconds = time.perf_counter() - start
        made.append(step_dir(save_dir, progress.iteration))
        return seconds

    def measure_round():
        old = timed(lambda e, s, p: old_save(manager, e, s, p))
        new = timed(manager.save)
        step = step_dir(save_dir, progress.iteration)
        start = time.perf_counter()
        checksum_share(step, step_files(step), 0, 1)  # the manifest's part of the new save, alone
        manifest = time.perf_counter() - start
        start = time.perf_counter()
        for name in step_files(step):  # the alternative: every byte re-read and checksummed
            file_checksum(os.path.join(step, name))
        return {"before": old, "now": new, "manifest": manifest, "reread": time.perf_counter() - start}

    rounds = common.Rounds(max_load=common.spare_cores(a.threads))
    results = rounds.run(a.reps, measure_round)
    size, rates = checksum_rates(made[-1])
    manager.release_save_dir()
    shutil.rmtree(root, ignore_errors=True)

    before, now, manifest, reread = (common.median(results[k]) for k in ("before", "now", "manifest", "reread"))
    ratios = common.median([n / b for n, b in zip(results["now"], results["before"], strict=True)])
    print(f"## Save of {common.model_label(a)}: {size / 1e6:.0f} MB of files, {a.threads} thread(s)\n")
    print(common.table(["save", "median s", "MB/s"], [
        ["before: DeepSpeed writes global_stepN in place", before, size / before / 1e6],
        ["now: .partial + manifest + rename", now, size / now / 1e6],
        ["  of which the manifest (sizes, zip directories' CRC-32s)", manifest, size / manifest / 1e6],
        ["alternative manifest: CRC-32 of every byte, re-read", reread, size / reread / 1e6],
    ]))
    print(f"\nnow / before (median of per-round ratios): {ratios:.3f}\n")
    print(rounds.note())
    print(f"\n## Checksums on those {size / 1e6:.0f} MB (page-cached), one thread\n")
    print(common.table(["checksum", "MB/s", f"s per {size / 1e6:.0f} MB"],
                       [[name, rate, size / rate / 1e6] for name, rate in rates.items()]))


if __name__ == "__main__":
    main()
