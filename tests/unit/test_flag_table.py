"""megatron/config/flag_table.py against the parser (both ways, each status doing what it says), against
the forks' own flag lists (tests/data/fork_flags, read from their argument files) and against
docs/flags.md, which renders it."""
import os

import pytest

from tests.support.flag_runs import check_one_line, flags
from tests.support.flag_table_scripts import ITEM_7, PUBLISHED, WORLD

HERE = os.path.dirname(os.path.abspath(__file__))
FORK_LISTS = {"b": "bigscience", "m": "deepspeedai", "a": "argonne", "l": "megatron_lm"}
MEGATRON_DEEPSPEED = "bma"


def _fork_list(letter):
    with open(os.path.join(HERE, "..", "data", "fork_flags", FORK_LISTS[letter] + ".txt")) as f:
        return {line.strip() for line in f if line.strip()}


def _actions():
    from megatron.config.arguments import build_parser
    return {flag: action for flag, action in build_parser()._option_string_actions.items()
            if flag.startswith("--") and flag != "--help"}


def _rows(status=None):
    from megatron.config import flag_table
    return {row.flag: row for row in flag_table.rows() if status in (None, row.status)}


# --- the parser and the table: the same flags ----------------------------------------------------

def test_every_parser_flag_has_a_row_and_every_row_is_a_parser_flag():
    from megatron.config import flag_table
    rows = _rows()
    assert len(rows) == len(flag_table.rows()), "a flag has two rows"
    assert set(_actions()) - set(rows) == set()
    assert set(rows) - set(_actions()) == set()


def _a_value(action, avoid=()):
    """A value the action parses, none of `avoid` (a switch: none)."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(c for c in action.choices if c not in avoid))]
    return [{int: "3", float: "0.25"}.get(action.type, "x")]


def _parsed(argv):
    from megatron.config.arguments import parse_args
    args = vars(parse_args(args_list=argv))
    args.pop("given_flags")
    return args


# implemented flags that spell out a default: each changes the args after the flag that undoes it
UNDONE_BY = {"--apply-query-key-layer-scaling": "--no-query-key-layer-scaling"}


def test_an_implemented_flag_changes_the_args_and_is_not_called_no_effect():
    from megatron.config.arguments import parse_args
    from megatron.config.script_flags import no_effect_line
    actions = _actions()
    unchanged, called_no_effect = [], []
    for flag in _rows("implemented"):
        without = flags({flag: "drop"}) + ([UNDONE_BY[flag]] if flag in UNDONE_BY else [])
        argv = without + [flag, *_a_value(actions[flag], avoid=(actions[flag].default,))]
        if _parsed(argv) == _parsed(without):
            unchanged.append(flag)
        if no_effect_line(parse_args(args_list=argv)) is not None:
            called_no_effect.append(flag)
    assert (unchanged, called_no_effect) == ([], [])


def test_a_no_effect_flag_is_named_in_the_startup_line():
    from megatron.config.arguments import parse_args
    from megatron.config.script_flags import EFFECTIVE_WHEN, no_effect_line
    from megatron.config.validation import validate_args
    actions, missing = _actions(), []
    for flag in _rows("no-effect"):
        value = _a_value(actions[flag], avoid=(EFFECTIVE_WHEN.get(flag, (None, None))[1],))
        args = validate_args(parse_args(args_list=flags({}) + [flag, *value]), world_size=1, cuda_available=False)
        line = no_effect_line(args) or ""
        if not line.startswith(f"accepted, no effect: {flag} ("):
            missing.append((flag, line))
    assert missing == []


def _given(row):
    """The flag as a script passes it, with a value of the shape the fork declares."""
    return {row.flag: None if row.shape in ("", "?") else "1"}


@pytest.mark.parametrize("status", ["refused", "other-model"])
def test_a_refused_or_other_model_flag_ends_the_run_in_one_line(status, entry_point):
    """Through pretrain_gpt.main: exit 2, one line, nothing built; the line names what to do."""
    wrong = {}
    for flag, row in _rows(status).items():
        line = check_one_line(entry_point, flags(_given(row)), 1, flag)
        if status == "other-model":
            expected = (f"{flag}: a flag of {row.why} models; this trainer is GPT pretraining (pretrain_gpt.py): "
                        f"drop the flag")
        else:
            expected = f"{flag}: {row.why} is not supported by this trainer; {row.instead or 'drop the flag'}"
        if line != "pretrain_gpt.py: error: " + expected:
            wrong[flag] = line
    assert wrong == {}


@pytest.mark.parametrize("changes, line", ITEM_7, ids=[next(iter(c)) for c, _ in ITEM_7])
def test_item_7_refusals(changes, line, entry_point):
    assert check_one_line(entry_point, flags(changes), 1, next(iter(changes))) == f"pretrain_gpt.py: error: {line}"


def test_the_first_refused_flag_given_is_the_one_named(entry_point):
    line = check_one_line(entry_point, flags({"--use-mics": None, "--fp8-e4m3": None}), 1, "--use-mics")
    assert "--fp8-e4m3" not in line


def test_kill_switch_file_is_kill_switch_path():
    """Microsoft's and Argonne's spelling: when the file exists, save and exit, as BigScience's."""
    file_spelling = _parsed(flags({"--kill-switch-file": "/tmp/stop"}))
    assert file_spelling == _parsed(flags({"--kill-switch-path": "/tmp/stop"}))
    assert file_spelling["kill_switch_path"] == "/tmp/stop"


# --- issue 39 item 8: published scripts using the table's flags (tests/data/published_scripts/flag_table) ---

def test_the_published_scripts_are_these():
    folder = os.path.join(HERE, "..", "data", "published_scripts", "flag_table")
    assert sorted(name[:-4] for name in os.listdir(folder) if name.endswith(".txt")) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_script_validates_or_is_one_line(name):
    """The run validates at the script's scale or ends in one line (the forks' flags are all known; Megatron-LM's
    newer scripts pass flags of features this trainer has never had, "unrecognized" here)."""
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from megatron.runtime.refusal import ConfigError
    from tests.support.published_scripts import load
    argv = load(os.path.join(HERE, "..", "data", "published_scripts", "flag_table", name + ".txt"))
    try:
        validate_args(parse_args(args_list=argv), world_size=WORLD.get(name, 128), cuda_available=True)
        line = None
    except ConfigError as refused:
        line = str(refused)
    assert line == PUBLISHED[name]


# --- the forks' lists ------------------------------------------------------------------------------

def test_no_megatron_deepspeed_flag_is_missing():
    missing = {letter: _fork_list(letter) - set(_rows()) for letter in MEGATRON_DEEPSPEED}
    assert missing == {letter: set() for letter in MEGATRON_DEEPSPEED}


@pytest.mark.parametrize("letter", list(FORK_LISTS))
def test_the_forks_column_is_the_forks_lists(letter):
    listed = _fork_list(letter)
    wrong = {flag for flag, row in _rows().items() if (letter in row.forks) != (flag in listed)}
    assert wrong == set()


# --- docs/flags.md renders the table --------------------------------------------------------------

def test_docs_page_is_the_rendered_table():
    import re

    from tests.support.tool_modules import load_tool
    doc = load_tool("flag_table_doc")
    with open(doc.PAGE) as f:
        page = f.read()
    assert page[page.index(doc.BEGIN):page.index(doc.END) + len(doc.END)] == doc.render()
    table = page[page.index(doc.BEGIN):page.index(doc.END)]
    assert set(re.findall(r"^\| `(--[^`]+)` \|", table, re.M)) == set(_rows()) == set(_actions())
