# Device script: the whole GPU test suite (wheels from .whl), failures and skips listed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export ROTVID_EXT_CACHE=/tmp/rext
python3 -m pytest -q -m gpu tests -rfs 2>&1 | tail -${TEST_TAIL:-12} | tee $OUT/gpu_tests.txt
