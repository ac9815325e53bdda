#!/bin/bash
# render.sh SCRIPT OUT [ARGS...]: run a published launch script with stub launchers and write the arguments
# it passes to pretrain_gpt.py (one per line) to OUT. How the files next to this one were made.
# The script runs in a scratch directory; `set -e`, `source` and `module` lines are dropped, the
# launchers (deepspeed, torchrun, python, srun, sbatch, uv run, ...) only record, nvidia-smi / ds_ssh report 8
# GPUs on 8 nodes, `date` is fixed, and the cluster variables are placeholders.
set -u
script=$(readlink -f "$1"); out=$(readlink -f "$2")
scratch=$(mktemp -d); mkdir -p "$scratch/bin" "$scratch/cwd"
: > "$scratch/cwd/pretrain_gpt.py"  # Megatron-LM's examples stop unless run from the repository root
cat > "$scratch/bin/capture" <<'STUB'
#!/bin/bash
found=0
for a in "$@"; do
  [ $found = 1 ] && printf '%s\n' "$a" >> "$CAPTURE"
  case "$a" in *pretrain_gpt.py|*pretrain_prefix_lm.py) found=1 ;; esac
done
exit 0
STUB
printf '#!/bin/bash\nwhile [ $# -gt 0 ] && [ "$1" != bash ]; do shift; done\n[ $# -gt 0 ] && exec "$@"\nexit 0\n' \
  > "$scratch/bin/srun"
printf '#!/bin/bash\nfor i in 1 2 3 4 5 6 7 8; do echo "NVIDIA A100-SXM4-80GB"; done\n' > "$scratch/bin/nvidia-smi"
printf '#!/bin/bash\necho header; echo header\nfor h in 1 2 3 4 5 6 7 8; do "$@"; done\n' > "$scratch/bin/ds_ssh"
printf '#!/bin/bash\nexec /bin/date -u -d @1700000000 "$@"\n' > "$scratch/bin/date"
printf '#!/bin/bash\necho node1\n' > "$scratch/bin/scontrol"
printf '#!/bin/bash\nexit 0\n' > "$scratch/bin/clear"
printf '#!/bin/bash\nexec bash\n' > "$scratch/bin/sbatch"  # runs the job script it reads (its srun line)
printf '#!/bin/bash\n[ "$1" = run ] && shift\nexec "$@"\n' > "$scratch/bin/uv"  # `uv run CMD`: CMD
for n in deepspeed torchrun python python3 mpirun; do ln -s capture "$scratch/bin/$n"; done
chmod +x "$scratch"/bin/*
sed -E -e 's/^\s*set -.*$//' -e 's/^\s*(source|module|conda) .*$//' "$script" > "$scratch/script.sh"
: > "$out"
( cd "$scratch/cwd" && env -i PATH="$scratch/bin:/usr/bin:/bin" HOME="$scratch" CAPTURE="$out" \
    six_ALL_CCFRWORK=/six_ALL_CCFRWORK six_ALL_CCFRSCRATCH=/six_ALL_CCFRSCRATCH six_ALL_CCFRSTORE=/six_ALL_CCFRSTORE \
    SLURM_NNODES=NNODES SLURM_JOB_ID=JOBID SLURM_JOBID=JOBID SLURM_JOB_NODELIST=nodes SLURM_PROCID=0 HOSTNAME=host \
    bash "$scratch/script.sh" "${@:3}" > "$scratch/log" 2>&1 )
sed -i -E "s#$scratch/cwd#.#g; s#$scratch#.#g" "$out"
rm -rf "$scratch"
