"""render_yaml.py MODEL_CONFIG OUT: the MODEL_ARGS of a Megatron-LM functional test's model_config.yaml as
the arguments its launcher passes to pretrain_gpt.py, one per line, to OUT (appended after OUT's header
lines, if any). `true`: the switch alone; `false`: left out; a value with spaces: one argument per word
(an nargs flag); `${VAR}`: the placeholder VAR. How the YAML-sourced files in flag_table/ were made."""
import re
import sys

import yaml


def arguments(model_args):
    out = []
    for flag, value in model_args.items():
        if value is True:
            out.append(flag)
        elif value is not False:
            out += [flag, *(re.sub(r"\$\{(\w+)\}", r"\1", word) for word in str(value).split())]
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        model_args = yaml.safe_load(f)["MODEL_ARGS"]
    with open(sys.argv[2], "a") as f:
        f.write("".join(a + "\n" for a in arguments(model_args)))
