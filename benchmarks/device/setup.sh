# Sourced by the device scripts (session4_final.sh, e2e.sh): wheels from .whl, the SageAttention2 peer from .peers,
# environment, the nvidia-smi clock line, and the extension built once ($OUT/build.log; "build N s" printed).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
mkdir -p /tmp/peers && tar -xzf .peers/sageattention2-*.tgz -C /tmp/peers && rm -rf /tmp/site/sageattention
export PYTHONPATH=$PYTHONPATH:/tmp/peers ROTVID_EXT_CACHE=/tmp/rext MAX_JOBS=16 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
python3 -c "from rotvid.kernels import cuda_backend as c; c.load_extension()" > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
