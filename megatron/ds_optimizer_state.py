"""The one place that writes into DeepSpeed's mixed-precision / ZeRO optimizer internals: putting
full per-parameter fp32 masters and Adam state into a built engine's flat, DP-partitioned groups
(ZeRO 1/2's DeepSpeedZeroOptimizer and BF16_Optimizer), the way DeepSpeed's own universal-
checkpoint loader does (deepspeed/runtime/base_optimizer.py: load_hp_checkpoint_state_from_
checkpoint_dir), but from tensors in memory instead of a converted folder on disk.

Each low-precision parameter `lp` carries `_hp_mapping`: where its fragment owned by this DP rank
sits in the parameter (`lp_fragment_address`) and in the flat fp32 partition (`hp_fragment`).
"""
import torch


def _lp_groups(optimizer):
    # BF16_Optimizer names its groups bf16_groups, DeepSpeedZeroOptimizer bit16_groups
    for name in ("bf16_groups", "bit16_groups"):
        if hasattr(optimizer, name):
            return getattr(optimizer, name)
    return None


def holds_flat_partitions(engine):
    """True for the optimizers whose parameters carry DeepSpeed's hp mapping."""
    groups = _lp_groups(engine.optimizer)
    return groups is not None and all(hasattr(p, "_hp_mapping") for group in groups for p in group)


def write_flat_state(engine, value_of, with_optimizer):
    """value_of(lp) -> (fp32 master of this TP rank, {moment: tensor}, step): written into this DP
    rank's partition; then the low-precision weights are refreshed from the masters (a DP
    all-gather, as after an optimizer step: every DP rank must call this)."""
    from deepspeed.utils.tensor_fragment import map_to_flat_opt_states
    optimizer = engine.optimizer
    base = optimizer.optimizer  # the torch optimizer over the flat fp32 partitions
    for lp_group, group in zip(_lp_groups(optimizer), base.param_groups):
        keys, step = set(), None
        for lp in lp_group:
            mapping = lp._hp_mapping
            if mapping is None:  # this DP rank owns no element of lp
                continue
            master, moments, saved_step = value_of(lp)
            address = mapping.lp_fragment_address
            mapping.get_hp_fragment().data.copy_(master.reshape(-1).narrow(0, address.start, address.numel))
            if with_optimizer:
                mapping.optim_fragment = {k: v.reshape(-1).narrow(0, address.start, address.numel).clone()
                                          for k, v in moments.items()}
                keys |= set(moments)
                step = saved_step if step is None else step
        if keys:
            for lp in lp_group:  # a parameter without saved state (it never had a gradient) starts at zero
                if lp._hp_mapping is not None:
                    fragment = lp._hp_mapping.get_hp_fragment()
                    for key in keys - set(lp._hp_mapping.optim_fragment):
                        lp._hp_mapping.optim_fragment[key] = torch.zeros_like(fragment)
            flat = group["params"][0]
            map_to_flat_opt_states(flat, lp_group, base.state, keys)
            if step is not None:
                base.state[flat]["step"] = step.clone() if torch.is_tensor(step) else torch.tensor(float(step))
    optimizer.update_lp_params()


def set_loss_scaler(engine, loss_scaler):
    """fp16 with ZeRO: carry the saved dynamic loss scale over (DeepSpeed's universal loader does
    the same), instead of restarting from --initial-loss-scale."""
    if loss_scaler is not None and hasattr(engine.optimizer, "loss_scaler"):
        engine.optimizer.loss_scaler = loss_scaler
        engine.optimizer.dynamic_loss_scale = loss_scaler.dynamic
