# Sourced by the one-call accelerator scripts (gpu_day.sh, attention_gpu.sh, serve_gpu.sh)
# after they set $out: the repo on PYTHONPATH, .whl/ (if any, from `make bench-wheels`)
# installed into a private folder in front of it (not when CARDJAX_SKIP_WHEELS is set: a
# CPU smoke run uses the environment it runs in), unbuffered output, and the machine (GPU,
# jax, devices) written to $out/machine.txt. $PYTHON picks the interpreter (python3).
# Exits 2 when jax is not importable: nothing to measure.
export PYTHONPATH="$PWD"
if [ -z "${CARDJAX_SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/cardjax-site .whl/*.whl \
    || echo "warning: .whl/ install failed; using the system packages"
  export PYTHONPATH="/tmp/cardjax-site:$PWD"
fi
export PYTHONUNBUFFERED=1
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 \
    | tee "$out/machine.txt"
else
  echo "no nvidia-smi" | tee "$out/machine.txt"
fi
if ! "${PYTHON:-python3}" -c "import jax, numpy; print('jax', jax.__version__, jax.devices())" 2>&1 \
    | tee -a "$out/machine.txt"; then
  echo "jax is not importable here; nothing to measure" | tee -a "$out/machine.txt"
  exit 2
fi
