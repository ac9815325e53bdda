#!/usr/bin/env bash
# Mutation testing of the accounting core with mutmut 3 (pip install 'mutmut==3.*'); not part of CI.
#
#   bash benchmarks/mutation.sh                 # every module below, smallest first
#   bash benchmarks/mutation.sh mfu learning_rates   # some of them
#   MUTATION_JOBS=2 MUTATION_WORK=/tmp/mut bash benchmarks/mutation.sh mfu
#
# Each module runs on a scratch copy of the tree ($MUTATION_WORK/<module>, the working tree as it
# is, uncommitted edits included) whose setup.cfg [mutmut] section (this repository's) gets that
# module's only_mutate and its fast in-process test files appended, so a mutant only ever runs the
# tests chosen for its module (mutmut 3 further runs only the tests that reached the mutated
# function). Prints one table row per module (mutants, killed, survived, timeout, no tests: a
# mutated function none of the module's tests reaches, other: suspicious/segfault) and
# leaves `mutmut results` / `mutmut show <mutant>` usable in the scratch copy.
# The table in docs/testing.md counts one run of this script per module. To try new tests on a
# pass's survivors alone, copy them into both $dir/tests and $dir/mutants/tests and run
# `mutmut run NAME ...` there with the names `mutmut results` lists as survived; what such a
# re-run kills is not added to the table (run the script again).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${MUTATION_WORK:-/tmp/mutation}"
JOBS="${MUTATION_JOBS:-1}"

# module name -> "file to mutate|in-process test files or node ids that cover it". Only tests that
# stay in this process: mutmut records which tests reach a mutated function by running them, and
# cannot see (nor time) the ranks that run_distributed / deepspeed launches start.
declare -A MODULES=(
  [mfu]="megatron/metrics/mfu.py|tests/unit/test_mfu.py tests/unit/test_mfu_peak_resolution.py tests/unit/test_flops_convention.py tests/unit/test_breakdowns_by_hand.py::test_log_line_tflops_and_mfu_of_a_real_model_by_hand"
  [learning_rates]="megatron/schedules/learning_rates.py|tests/unit/test_learning_rates.py tests/unit/test_lr_schedule_edges.py tests/unit/test_lr_wsd.py tests/unit/test_weight_decay_schedule.py"
  [param_count]="tools/param_count.py|tests/unit/test_param_count_main.py tests/unit/test_flops_convention.py"
  [training_log]="megatron/metrics/training_log.py|tests/unit/test_claims_logging.py tests/unit/test_log_line_optional_fields.py tests/unit/test_log_event_files.py tests/unit/test_flops_convention.py tests/unit/test_breakdowns_by_hand.py::test_log_line_tflops_and_mfu_of_a_real_model_by_hand"
  [memory]="megatron/metrics/memory.py|tests/unit/test_memory_rules.py tests/unit/test_memory_report.py tests/unit/test_memory_sequence_parallel.py tests/unit/test_breakdowns_by_hand.py::test_memory_rows_by_hand_fp32_zero0 tests/unit/test_breakdowns_by_hand.py::test_memory_rows_by_hand_bf16_zero1_dp2"
  [partition]="megatron/model/partition.py|tests/unit/test_partition_rules.py tests/integration/test_pipeline_partition.py::test_deepspeed_methods_on_bloom_176b tests/integration/test_pipeline_partition.py::test_flops_balances_flops_on_bloom_176b tests/integration/test_pipeline_partition.py::test_flops_puts_the_weightless_moe_loss_item_with_the_later_stage"
  [shape]="megatron/model/shape.py|tests/unit/test_shape_rules.py tests/integration/test_variant_config.py::test_both_forks_spellings_give_one_shape tests/integration/test_variant_config.py::test_llama_count_by_hand tests/integration/test_seed_counts.py::test_padded_vocab tests/integration/test_norm_activation_variants.py::test_flags_give_the_variants_and_their_rules tests/integration/test_norm_activation_variants.py::test_the_layout_records_the_variants_and_refuses_another"
  [analytic]="megatron/model/analytic.py|tests/integration/test_flops.py::test_formula_terms_by_hand tests/integration/test_variant_config.py::test_llama_count_by_hand tests/integration/test_variant_config.py::test_describe_and_report_name_the_variant tests/unit/test_mfu.py tests/integration/test_moe.py::test_table_names_the_experts_by_global_index tests/integration/test_variants.py::test_untied_last_stage_holds_no_embedding_copy tests/integration/test_pipeline_partition.py::test_flops_puts_the_weightless_moe_loss_item_with_the_later_stage tests/unit/test_partition_rules.py tests/unit/test_analytic_by_hand.py tests/unit/test_memory_rules.py tests/unit/test_memory_report.py tests/unit/test_flops_convention.py"
  [utils]="megatron/utils.py|tests/unit/test_utils_counts_in_process.py tests/unit/test_flops_convention.py tests/unit/test_mfu.py tests/integration/test_variant_config.py::test_describe_and_report_name_the_variant tests/unit/test_param_count_main.py tests/unit/test_breakdowns_by_hand.py::test_log_line_tflops_and_mfu_of_a_real_model_by_hand"
)
ORDER=(mfu learning_rates param_count training_log memory partition shape analytic utils)
[ $# -gt 0 ] && ORDER=("$@")

command -v mutmut >/dev/null || { echo "mutation.sh: mutmut is not installed; pip install 'mutmut==3.*'" >&2; exit 2; }
for m in "${ORDER[@]}"; do
  [ -n "${MODULES[$m]:-}" ] || { echo "mutation.sh: unknown module '$m'; one of: ${!MODULES[*]}" >&2; exit 2; }
done

echo "| module | mutants | killed | survived | timeout | no tests | other | seconds |"
echo "|---|---|---|---|---|---|---|---|"
for m in "${ORDER[@]}"; do
  file="${MODULES[$m]%%|*}"
  tests="${MODULES[$m]#*|}"
  dir="$WORK/$m"
  rm -rf "$dir"
  mkdir -p "$dir"
  # the working tree without run outputs or caches
  (cd "$ROOT" && tar --exclude=./mutants --exclude=__pycache__ --exclude=.git --exclude=./checkpoints \
     --exclude=./runs --exclude=./output_dir -cf - .) | (cd "$dir" && tar -xf -)
  python - "$dir/setup.cfg" "$file" $tests <<'PY'
import configparser, sys
path, target, tests = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = configparser.ConfigParser()
cfg.read(path)
cfg["mutmut"]["only_mutate"] = "\n" + target
cfg["mutmut"]["pytest_add_cli_args_test_selection"] = "\n" + "\n".join(tests)
with open(path, "w") as f:
    cfg.write(f)
PY
  start=$SECONDS
  # mutmut imports the mutants from $dir/mutants: nothing else on the path may provide megatron
  (cd "$dir" && env -u PYTHONPATH DS_ACCELERATOR=cpu mutmut run --max-children "$JOBS" > mutmut.log 2>&1) || true
  (cd "$dir" && env -u PYTHONPATH mutmut export-cicd-stats > /dev/null 2>&1) || true
  python - "$dir/mutants/mutmut-cicd-stats.json" "$m" "$((SECONDS - start))" <<'PY'
import json, sys
path, name, seconds = sys.argv[1:]
try:
    s = json.load(open(path))
except OSError:
    print(f"| {name} | - | - | - | - | - | run failed: see mutmut.log | {seconds} |")
    sys.exit(0)
other = s["total"] - s["killed"] - s["survived"] - s["timeout"] - s["no_tests"]
print(f"| {name} | {s['total']} | {s['killed']} | {s['survived']} | {s['timeout']} | {s['no_tests']} | {other} | {seconds} |")
PY
done
