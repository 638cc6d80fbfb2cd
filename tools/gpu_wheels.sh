# Sourced by the tools that run on a GPU machine without network (gpu_check.sh,
# gpu_chapters.sh, gpu_record.sh): the wheels in .whl/ it lacks (numpy<2.5 for
# numba-cuda) installed to /tmp/site and put first on PYTHONPATH.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
