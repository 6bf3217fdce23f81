#!/usr/bin/env bash
# Call 126 (one H200, run as this one command line, .peer/ carried): the fused SwiGLU's GPU tests
# after the review fixes (NaN kept by the amax kernel, the block input's cast following
# tiled_cast_fqns, the kernels only for bf16 inputs).
# Result: 6 passed in 69.6 s (the compiled 1B block's errors against bf16 as in call 124).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/s .peer/whl/torchao*.whl && PYTHONPATH=/tmp/s:$PWD timeout 170 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_float8_swiglu_on_gpu.py 2>&1 | grep -E "relative error|passed|failed|Error|assert" | head -30
