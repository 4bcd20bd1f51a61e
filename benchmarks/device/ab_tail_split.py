# Device script (session 7): the int8-fp8 tail split A/B, interleaved rounds (attention only, same operands).
# ROUNDS (default 6) and SHAPES (comma-separated names below; default wan1.3b,cogvideox) from the environment.
import os, torch, statistics
from rotvid.kernels import cuda_backend as cb
from tests.kernels.helpers import cuda_qkv
SHAPES = {"wan1.3b": (12, 32760, 128), "wan14b-480p": (40, 32760, 128), "wan14b-720p": (40, 75600, 128),
          "cogvideox": (48, 17776, 64)}
for name in os.environ.get("SHAPES", "wan1.3b,cogvideox").split(","):
    h, n, d = SHAPES[name]
    q, k, v, _ = cuda_qkv(1, h, n, n, d, torch.bfloat16, "BHND", seed=1)
    qkv = cb.preprocess_int8fp8_cuda(q, k, v)
    def t(split):
        f = lambda: cb.attention_int8fp8_quantized(qkv, n_q=n, n_kv=n, head_dim=d, out_dtype=q.dtype, split_tail=split)
        for _ in range(3): f()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        xs = []
        for _ in range(10):
            s.record(); f(); e.record(); torch.cuda.synchronize(); xs.append(s.elapsed_time(e))
        return statistics.median(xs)
    res = {True: [], False: []}
    for r in range(int(os.environ.get("ROUNDS", "6"))):
        for split in (False, True) if r % 2 == 0 else (True, False):
            res[split].append(t(split))
    print(name, "whole", [round(x, 3) for x in res[False]], "split", [round(x, 3) for x in res[True]],
          "median whole %.3f split %.3f" % (statistics.median(res[False]), statistics.median(res[True])))
