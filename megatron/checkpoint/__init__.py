"""Checkpointing as one component: CheckpointManager (manager.py) saves, loads and plans a resume,
handed its section of the run configuration (config.py: CheckpointConfig).

  config.py      CheckpointConfig: the flags checkpointing reads, frozen (RunConfig.checkpoint)
  manager.py     CheckpointManager: should_save / save / load / plan_resume / verify, the RNG state
  writer.py      one iteration written whole or not at all (global_stepN.partial, renamed), a full disk
  manifest.py    every saved file's size and CRC-32, checked before a load builds anything
  lock.py        one run per --save DIR
  agree.py       the collectives the ranks agree through
  layout.py      what a --save DIR holds: CheckpointLayout, file names, trackers (torch-free)
  shards.py      reading one saved shard, a missing or unreadable one in one line
  reshard.py     any layout's checkpoint as full tensors (export, resume at another layout)
  zero_state.py  DeepSpeed's flat ZeRO / bf16 optimizer files as full tensors
  resume.py      the resume plan before the model is built, and the resharding load
  universal.py   DeepSpeed's universal checkpoints (ds_to_universal.py): save info, --universal-checkpoint
Nothing is imported here: megatron/config/run_config.py imports config.py, which must stay torch-free.
"""
