"""Reads back an offline W&B run (WANDB_MODE=offline) from its run-*.wandb file, written by wandb's
own service: a 7-byte header (":W&B", magic 0xBEE1, version), then LevelDB's log format (32 KiB
blocks of records, each a 7-byte header: CRC32C, length, type FULL / FIRST / MIDDLE / LAST) holding
wandb's protobuf Records. Independent of this project's code; wandb's protobuf classes decode."""
import glob
import json
import os
import struct

BLOCK, HEADER = 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # the block's tail is padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
        else:  # zeros: the end
            return


def offline_run(save_dir):
    """(run name, project, {step: {key: value}}, entity) of the one offline run under `save_dir`."""
    from wandb.proto import wandb_internal_pb2 as pb
    [path] = glob.glob(os.path.join(save_dir, "wandb", "offline-run-*", "run-*.wandb"))
    name = project = entity = None
    history = {}
    for data in records(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            name, project, entity = record.run.display_name, record.run.project, record.run.entity
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(record.history.step.num, {}).update(
                {k: v for k, v in items.items() if not k.startswith("_")})
    return name, project, history, entity
