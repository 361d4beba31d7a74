"""ONNX models: tgc against onnxruntime, each measured in a fresh process.

For each model: the first call (a fresh process: import, load, compile with an empty tgc cache, one run; the
wall time of the call and of the whole process), the steady-state median of later calls, and the process's
peak memory (ru_maxrss), for tgc (`tgc.load(model).run`, default kernels, CPU) and onnxruntime (CPU provider),
on the model's own input generator (arange / size, as ONNX's runner uses for the light models).

    python bench/bench_onnx.py [--repeat N] [MODEL.onnx | LIGHT_NAME ...]     (default: squeezenet bvlc_alexnet)

Light names are those of onnx/backend/test/data/light (resnet50, vgg19, ...). Cold tgc compiles of the big ones
take minutes on a 2-core machine: name them explicitly. Needs `pip install -e '.[bench]'` (onnxruntime).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
import numpy as np
path, runner, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
if runner == "tgc":
    import tgc
    prog = tgc.load(path)
    decls = [(d.name, tuple(int(s) for s in d.shape), d.dtype.np) for d in prog.inputs]
    call = lambda feeds: prog.run(device="CPU", inputs=feeds)
else:
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np_of = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    decls = [(i.name, tuple(d if isinstance(d, int) else 1 for d in i.shape), np_of[i.type]) for i in sess.get_inputs()]
    call = lambda feeds: sess.run(None, feeds)
feeds = {}
for name, shape, dt in decls:
    n = int(np.prod(shape))
    feeds[name] = (np.arange(n).reshape(shape) / max(n, 1)).astype(dt)
t1 = time.perf_counter()
call(feeds)
t2 = time.perf_counter()
times = []
for _ in range(repeat):
    s = time.perf_counter(); call(feeds); times.append(time.perf_counter() - s)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"first_call_s": t2 - t1, "first_process_s": t2 - t0, "median_s": float(np.median(times)),
                  "peak_bytes": peak}))
"""


def measure(path: str, runner: str, repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tgc-bench-onnx-") as cache:
        env = {**os.environ, "TGC_CACHE_DIR": cache}
        r = subprocess.run([sys.executable, "-c", CHILD, path, runner, str(repeat)], capture_output=True, text=True,
                           env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def model_path(arg: str) -> str:
    if arg.endswith(".onnx"):
        return arg
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{arg}.onnx")


def main() -> None:
    args = sys.argv[1:]
    repeat = 5
    if "--repeat" in args:
        i = args.index("--repeat")
        repeat = int(args[i + 1])
        del args[i:i + 2]
    models = args or ["squeezenet", "bvlc_alexnet"]
    print(f"{'model':<16} {'runner':<12} {'first call':>11} {'1st process':>12} {'median':>10} {'peak MiB':>9} "
          f"{'speed vs ort':>13}")
    for m in models:
        path = model_path(m)
        rows = {runner: measure(path, runner, repeat) for runner in ("onnxruntime", "tgc")}
        ort_median = rows["onnxruntime"].get("median_s")
        for runner, r in rows.items():
            if "error" in r:
                print(f"{os.path.basename(path)[:16]:<16} {runner:<12} error: {r['error']}")
                continue
            ratio = f"{ort_median / r['median_s']:.2f}x" if ort_median else "-"
            print(f"{os.path.basename(path)[:16]:<16} {runner:<12} {r['first_call_s']:>10.2f}s "
                  f"{r['first_process_s']:>11.2f}s {r['median_s'] * 1e3:>8.1f}ms {r['peak_bytes'] / 2**20:>9.0f} "
                  f"{ratio:>13}")


if __name__ == "__main__":
    main()
