# Sourced on the device machine from the checkout's root, after call 1 unpacked part1 into
# /tmp/fa: unpacks part2 (.gpu/part2.tar.xz), installs the wheels in .whl (the image lacks them:
# EngineCore's imports need grpcio, grpcio-health-checking, grpcio-reflection, grpcio-tools,
# protobuf, blake3 and llguidance, at pyproject's versions, downloaded for cp312 manylinux)
# into /tmp/site, and exports the paths and flash-attn's kernel cache (.gpu/fa_cache.tar from
# an earlier run saves the JIT). `save_fa_cache` writes it to $OUT.
if [ ! -d /tmp/fa/flash_attn ]; then echo "fresh machine: run call 1 (unpack part1) first"; exit 2; fi
tar -C /tmp/fa -xJf .gpu/part2.tar.xz || exit 2
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 2
fi
export PYTHONPATH=/tmp/site:/tmp/fa:/tmp/fa/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
export PATH=/tmp/site/bin:$PATH  # py-spy, when its wheel travels
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa_cache
if [ -f .gpu/fa_cache.tar ]; then tar -C /tmp -xf .gpu/fa_cache.tar; fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader

save_fa_cache() {
  if [ -d /tmp/fa_cache ]; then tar -C /tmp -cf "${OUT:-/tmp}/fa_cache.tar" fa_cache; fi
}
