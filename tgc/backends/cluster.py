"""BEAM's candidates and a program's compiles spread over a Ray cluster (`--cluster ADDRESS`, `tgc worker`).

Contracts:
- Ray is an optional extra (`pip install 'tgc[cluster]'`); without it, `ray_module()` raises one `TgcError`
  naming the extra (exit 1: this installation lacks a part, as an unavailable device does).
- A worker node declares, as Ray custom resources, the device it serves (`tgc worker`): `tgc_eval_<fp>_<tag>`
  (1 unit: one candidate timed at a time, so that timings never share the device) and `tgc_compile_<fp>_<tag>`
  (one unit per core). `<fp>` is `device_fingerprint`: the device kind, its compiler and version, and for the CPU
  the CPU model, flags and core count, plus the tgc version; `<tag>` is derived from the cluster token. A task
  asks for the resource of the client's device, so Ray never places it on a node of another kind or token; the
  task checks both again on the worker (`_authorize`) and refuses: a worker of the wrong kind never times.
- The token never crosses the wire: each kernel's jobs carry a fresh nonce and HMAC-SHA256(token, nonce); the
  worker checks it against the token it was started with (`TGC_CLUSTER_TOKEN` in its environment).
- What crosses the wire is plain data: dicts of str/int/float/bytes/lists and numpy arrays (Ray serializes
  those itself); no tgc object. A kernel's inputs and reference output go once per kernel (`ray.put`).
- A batch's candidates are compiled first (compile tasks on every core of the matching nodes), then timed
  (evaluate tasks, one at a time per node): as in a local search, no compile runs beside a timed kernel.
- Faults: each task is retried by Ray on another node when its node dies (`max_retries`); each task has a
  deadline from its submission (at most two tasks per slot are in flight, so none waits long in a queue),
  after which it is cancelled and its candidate counts as failed: a search never hangs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import platform
import secrets
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from tgc.codegen.search import COMPILE_TIMEOUT_S, Candidate, _Timer
from tgc.dtype import bf16_to_f32
from tgc.engine.compare import matches
from tgc.engine.inputs import random_values
from tgc.errors import DeviceError, TgcError
from tgc.ir.shapes import shape_of
from tgc.version import __version__

TOKEN_ENV = "TGC_CLUSTER_TOKEN"
TOKEN_FILE_ENV = "TGC_CLUSTER_TOKEN_FILE"
TASK_DEADLINE_S = COMPILE_TIMEOUT_S + 40.0  # compile, one check and a few timed runs of one candidate
MAX_RETRIES = 3  # Ray's retries of a task whose node or worker process died
IN_FLIGHT_PER_SLOT = 2
ALIVE_CHECK_S = 5.0  # while waiting on tasks, how often to check that a node of the device's kind is left
EXTRA_HINT = "install the extra: pip install 'tgc[cluster]' (Ray)"


def ray_module() -> Any:
    """The `ray` package, or one clear error naming the extra."""
    try:
        import ray
    except ImportError:
        raise TgcError("--cluster needs Ray, which is not installed", hint=EXTRA_HINT, kind="runtime") from None
    return ray


# ------------------------------------------------------------------------------------------- identity and token


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_fingerprint(device: Any) -> str:
    """What a worker must share with the client to time its candidates: a short hash of the device kind, the
    compiler and its version (for the CPU: the CPU model and flags), the core count on the CPU, and tgc's
    version."""
    comp = device.compiler
    parts = [device.kind, comp.name if comp else "none", comp.cache_key if comp else "none", __version__]
    if not device.caps.gpu:
        parts += [_cpu_model(), str(os.cpu_count() or 1)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def describe(device: Any) -> str:
    """The device as a person reads it in an error: `CPU (Intel Xeon ..., 2 cores)`."""
    if device.caps.gpu:
        return device.kind
    return f"{device.kind} ({_cpu_model()}, {os.cpu_count() or 1} cores)"


def _tag(token: str) -> str:
    return hmac.new(token.encode(), b"tgc-cluster-resource", hashlib.sha256).hexdigest()[:10]


def resource_names(device: Any, token: str) -> tuple[str, str]:
    """The Ray resources (evaluate, compile) a worker serving `device` with `token` declares."""
    fp, tag = device_fingerprint(device), _tag(token)
    return f"tgc_eval_{fp}_{tag}", f"tgc_compile_{fp}_{tag}"


def ray_auth_env(token: str) -> dict[str, str]:
    """The environment that turns on Ray's own token authentication (Ray >= 2.5x: `RAY_AUTH_MODE=token`) with a
    token derived from the cluster's: every Ray connection (client, nodes) must present it."""
    derived = hmac.new(token.encode(), b"tgc-ray-auth", hashlib.sha256).hexdigest()
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": derived}


def _proof(token: str, nonce: str) -> str:
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def read_token(token: str | None = None, token_file: str | None = None) -> str | None:
    """The cluster token: given, else from the file given, else `TGC_CLUSTER_TOKEN`, else the file named by
    `TGC_CLUSTER_TOKEN_FILE`; None where none is set."""
    if token:
        return token
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if not token_file and os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as e:
            raise TgcError(f"cannot read the cluster token file {path}: {e.strerror}") from None
        if not text:
            raise TgcError(f"the cluster token file {path} is empty")
        return text
    return None


# ------------------------------------------------------------------------------------------- on the worker


def _authorize(job: dict) -> tuple[Any, str | None]:
    """The worker's device for `job`, or why the job is refused (a wrong token, another kind of device)."""
    from tgc.backends import get_device

    token = os.environ.get(TOKEN_ENV, "")
    if not token or not hmac.compare_digest(_proof(token, job["nonce"]), str(job["proof"])):
        return None, "refused: the cluster token does not match this worker's"
    try:
        device = get_device(job["kind"])
    except Exception as e:  # noqa: BLE001 - no such device on this worker
        return None, f"refused: no {job['kind']} device here ({e})"
    if device_fingerprint(device) != job["fingerprint"]:
        return None, f"refused: this worker's device is {describe(device)}, not the client's"
    return device, None


class _ArrayTimer(_Timer):
    """BEAM's timer (`search._Timer`: the same runs, early stops and NaN-filled check) on buffers filled from the
    client's arrays instead of a kernel's UOps."""

    def __init__(self, device: Any, shared: dict):
        self.device, self.bufs = device, []
        self.handles, self.sizes = [], []
        self.out_shape = tuple(shared["out_shape"])
        self.out_np = np.dtype(shared["out_np"])
        self.dtype_name = shared["dtype"]
        for i, n in enumerate(shared["sizes"]):
            h = device.allocator.alloc(n)
            data = shared["inputs"][i]
            if data is not None and data.nbytes:
                device.allocator.copyin(h, memoryview(np.ascontiguousarray(data)).cast("B"))
            self.handles.append(h)
            self.sizes.append(n)
        self.reference = shared["reference"]

    def output(self) -> np.ndarray:
        out = np.empty(self.out_shape, dtype=self.out_np)
        if out.nbytes:
            self.device.allocator.copyout(memoryview(out).cast("B"), self.handles[0])
        return out

    def correct(self, out: np.ndarray) -> bool:
        ref = self.reference
        if self.dtype_name == "bf16":
            out, ref = bf16_to_f32(out), bf16_to_f32(ref)
        return matches(out, ref, self.dtype_name)


_TIMERS: OrderedDict[str, _ArrayTimer] = OrderedDict()  # a worker process's buffers of its last kernels, by nonce
_TIMERS_LOCK = threading.Lock()


def _timer_for(device: Any, nonce: str, shared: dict) -> _ArrayTimer:
    with _TIMERS_LOCK:
        if nonce not in _TIMERS:
            _TIMERS[nonce] = _ArrayTimer(device, shared)
            while len(_TIMERS) > 2:
                _TIMERS.popitem(last=False)[1].free()
        return _TIMERS[nonce]


def _node_id() -> str:
    ray = sys.modules.get("ray")  # imported where this runs as a Ray task; never started here
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return platform.node()


def evaluate_job(job: dict, shared: dict, compiled: dict | None = None) -> dict:
    """A Ray task: time one candidate as BEAM does here and, where it beats `best_s`, check its output against the
    reference. Its binary came along in `job`, or from a `compile_job` task (`compiled`: Ray hands its answer
    over once it is done), or is compiled here. Returns a plain dict: `status` ("ok", "failed", "rejected", or
    "refused" where this worker may not serve the job), `time_s`, `binary`, `node`, `compile_s`, `error`."""
    node = _node_id()
    device, why = _authorize(job)
    if device is None:
        return {"status": "refused", "error": why, "node": node}
    binary, compile_s = job.get("binary"), 0.0
    if compiled is not None:
        if compiled.get("status") != "ok":
            return {"status": "failed", "error": str(compiled.get("error"))[:500], "node": node}
        binary, compile_s = compiled["binary"], float(compiled.get("seconds") or 0.0)
    start = time.perf_counter()
    try:
        if binary is None:
            binary = device.compiler.compile(job["src"])
            compile_s = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - the candidate does not compile: a failed candidate
        return {"status": "failed", "error": str(e)[:500], "node": node}
    cand = Candidate([], None, src=job["src"], name=job["name"], launch=job["launch"],  # type: ignore[arg-type]
                     buf_index=list(job["buf_index"]), binary=binary)
    timer = _timer_for(device, job["nonce"], shared)
    best_s = float(job["best_s"])
    try:
        time_s = timer.run(cand, best_s)
        if job.get("check") and time_s < best_s and not timer.correct(timer.checked_output(cand)):
            return {"status": "rejected", "node": node, "binary": binary, "compile_s": compile_s}
    except Exception as e:  # noqa: BLE001 - failed to run
        return {"status": "failed", "error": str(e)[:500], "node": node}
    return {"status": "ok", "time_s": time_s, "binary": binary, "node": node, "compile_s": compile_s}


def compile_job(job: dict) -> dict:
    """A Ray task: compile one source; `{"status": "ok", "binary", "seconds"}` or `{"status", "error"}`."""
    node = _node_id()
    device, why = _authorize(job)
    if device is None:
        return {"status": "refused", "error": why, "node": node}
    start = time.perf_counter()
    try:
        binary = device.compiler.compile(job["src"])
    except Exception as e:  # noqa: BLE001 - reported to the client, which compiles it again for the message
        return {"status": "failed", "error": getattr(e, "msg", None) or str(e)[:500], "node": node}
    return {"status": "ok", "binary": binary, "seconds": time.perf_counter() - start, "node": node}


# ------------------------------------------------------------------------------------------- on the client


def _refresh_ray_auth() -> None:
    """Make an already imported Ray read its auth settings from the environment again (Ray caches them); a Ray
    without these internals reads them when it first connects."""
    ray = sys.modules.get("ray")
    if ray is None:
        return
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # noqa: BLE001 - an older or newer Ray without them
        pass


class ClusterSession:
    """A connection to a Ray cluster for one command: BEAM's candidate evaluator (`kernel`) and a compile pool
    (`compile_pool`), both for a device of the client's kind (`tgc.codegen.search.use_evaluator`).

    `address` "local" starts a Ray instance on this machine whose one node serves this machine's devices (a
    token is made up for it); any other address needs the cluster's token. `stats` counts the tasks by node."""

    def __init__(self, address: str, token: str | None = None, deadline_s: float = TASK_DEADLINE_S):
        self.ray = ray_module()
        self.address, self.deadline_s = address, deadline_s
        self.local = address == "local"
        if not self.local and not token:
            raise TgcError(f"the cluster at {address} needs its token",
                           hint=f"set {TOKEN_ENV} (or {TOKEN_FILE_ENV}), as given to `tgc worker --token`")
        self.token = token or secrets.token_hex(16)
        # Ray's own token authentication with a token derived from the cluster's (as `tgc worker` starts nodes),
        # unless the user set Ray's auth up; set before Ray reads it, and put back on close
        self._old_env = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_BACKEND_LOG_LEVEL")}
        if "RAY_AUTH_MODE" not in os.environ and "RAY_AUTH_TOKEN" not in os.environ:
            os.environ.update(ray_auth_env(self.token))
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # Ray's C++ core: no retry warnings on stderr
        _refresh_ray_auth()
        self.stats: dict[str, Any] = {"by_node": {}, "refused": 0, "deadline": 0, "lost": 0, "tasks": 0,
                                      "compile_s": 0.0}
        self._owns_ray = False
        self._eval_fn = self.ray.remote(evaluate_job)
        self._compile_fn = self.ray.remote(compile_job)

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _restore_env(self) -> None:
        for k, v in self._old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _refresh_ray_auth()

    def _connect(self, device: Any) -> None:
        if self.ray.is_initialized():
            return
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR",
                              "configure_logging": True}

        try:
            if self.local:
                os.environ[TOKEN_ENV] = self.token  # the local node's worker processes inherit it
                ev, co = resource_names(device, self.token)
                cores = os.cpu_count() or 1
                self.ray.init(num_cpus=cores, resources={ev: 1, co: cores}, **kw)
            else:
                _probe(self.address)
                self.ray.init(address=self.address, **kw)
        except DeviceError:
            raise
        except Exception as e:  # noqa: BLE001 - Ray's own message says why (no cluster there, version mismatch)
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DeviceError(f"cannot connect to the Ray cluster at {self.address}: {detail}",
                              hint="is a cluster started there (`tgc worker --head`), with this token?") from None
        self._owns_ray = True

    def slots(self, device: Any, which: int = 0) -> int:
        """How many units of the device's evaluate (`which` 0) or compile (1) resource the cluster has now."""
        self._connect(device)
        name = resource_names(device, self.token)[which]
        return int(self.ray.cluster_resources().get(name, 0))

    def _need(self, device: Any, which: int) -> int:
        n = self.slots(device, which)
        if n <= 0:
            raise DeviceError(f"no tgc worker for {describe(device)} with this token in the cluster at {self.address}",
                              hint=f"start one on such a machine: tgc worker --address {self.address} "
                                   "--token-file FILE")
        return n

    def _job(self, device: Any, nonce: str) -> dict:
        return {"kind": device.kind, "fingerprint": device_fingerprint(device), "nonce": nonce,
                "proof": _proof(self.token, nonce)}

    def kernel(self, device: Any, timer: _Timer) -> _KernelBatch:
        """BEAM's evaluator for one kernel: its inputs (the same values as `timer`'s) and reference output go to the
        cluster once."""
        slots = (self._need(device, 0), self._need(device, 1))
        out = timer.bufs[0]
        inputs: list[np.ndarray | None] = [None]
        for i, node in enumerate(timer.bufs[1:], start=1):
            inputs.append(random_values(node.dtype, shape_of(node), 0, i))  # what `_Timer` filled in, again
        assert timer.reference is not None
        shared = {"inputs": inputs, "reference": timer.reference, "sizes": list(timer.sizes),
                  "out_shape": list(shape_of(out)), "out_np": np.dtype(out.dtype.np).str, "dtype": out.dtype.name}
        return _KernelBatch(self, device, self.ray.put(shared), slots)

    def compile_pool(self, device: Any) -> _ClusterCompilePool | None:
        """Compiles for `device` on the cluster's workers; None for a device that compiles nothing."""
        if device.compiler is None:
            return None
        self._need(device, 1)
        return _ClusterCompilePool(self, device)

    def record(self, ans: dict) -> None:
        self.stats["compile_s"] += float(ans.get("compile_s") or ans.get("seconds") or 0.0)
        node = str(ans.get("node") or "?")
        self.stats["by_node"][node] = self.stats["by_node"].get(node, 0) + 1
        if ans.get("status") == "refused":
            self.stats["refused"] += 1

    def close(self) -> None:
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self._owns_ray = False
        self._restore_env()


CONNECT_TIMEOUT_S = 5.0


def _probe(address: str) -> None:
    """One TCP connection to the cluster's `host:port` (or `ray://host:port`) first: Ray itself retries an address
    where nothing listens for minutes. Addresses without a port (`auto`) are left to Ray."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise DeviceError(f"cannot connect to the Ray cluster at {address}: {e.strerror or e}",
                          hint="start it with `tgc worker --head` (or `ray start --head`) there") from None


class _KernelBatch:
    """The evaluator of one kernel's candidates (`tgc.codegen.search`): a window of Ray tasks in flight."""

    def __init__(self, session: ClusterSession, device: Any, shared_ref: Any, slots: tuple[int, int]):
        self.session, self.device, self.shared = session, device, shared_ref
        self.window = max(1, slots[0] * IN_FLIGHT_PER_SLOT)  # candidates timed at once: per node, one and the next
        self.compile_window = max(1, slots[1] * IN_FLIGHT_PER_SLOT)
        self.nonce = secrets.token_hex(16)
        self.job = session._job(device, self.nonce)
        self.resources = resource_names(device, session.token)

    def evaluate(self, cands: list[Candidate], best_s: Callable[[], float],
                 on_result: Callable[[Candidate, str], None]) -> None:
        """Compile, check and time `cands` on the workers; set each one's `time_s` (inf unless "ok") and `binary`,
        and call `on_result(cand, status)` as each finishes, in this thread. As BEAM does here, every candidate is
        compiled (on every core of the matching nodes) before any is timed: a compile beside a timed kernel on
        the same cores makes its time noise."""
        s = self.session
        compile_opts = {"resources": {self.resources[1]: 1}, "num_cpus": 0, "max_retries": MAX_RETRIES,
                        "retry_exceptions": False}
        eval_opts = {**compile_opts, "resources": {self.resources[0]: 1}}
        failed: set[int] = set()

        def compiled(c: Candidate, ans: dict) -> None:
            s.record(ans)
            if ans.get("status") == "ok":
                c.binary = ans["binary"]
            else:
                failed.add(id(c))

        self._window([c for c in cands if c.binary is None], self.compile_window,
                     lambda c: s._compile_fn.options(**compile_opts).remote({**self.job, "src": c.src}), compiled,
                     self.resources[1])

        def timed(c: Candidate, ans: dict) -> None:
            self._finish(c, ans, on_result)

        for c in cands:
            if id(c) in failed:
                self._finish(c, {"status": "failed"}, on_result)
        self._window([c for c in cands if id(c) not in failed], self.window,
                     lambda c: s._eval_fn.options(**eval_opts).remote(
                         {**self.job, "src": c.src, "name": c.name, "binary": c.binary, "buf_index": list(c.buf_index),
                          "launch": _plain_launch(c.launch), "best_s": best_s(), "check": True}, self.shared),
                     timed, self.resources[0])

    def _window(self, items: list[Candidate], window: int, submit: Callable[[Candidate], Any],
                done: Callable[[Candidate, dict], None], resource: str) -> None:
        """Run `submit(item)` (a Ray task needing `resource`) for every item, at most `window` in flight, each with a
        deadline from its submission; `done(item, answer)` as each finishes (`{"status": "failed"}` where it was
        lost or late, or where no node with `resource` is left)."""
        ray, s = self.session.ray, self.session
        todo = list(items)
        pending: dict[Any, tuple[Candidate, float]] = {}
        while todo or pending:
            while todo and len(pending) < window:
                c = todo.pop(0)
                pending[submit(c)] = (c, time.monotonic() + s.deadline_s)
                s.stats["tasks"] += 1
            first_deadline = min(d for _, d in pending.values())
            wait_s = min(max(0.0, first_deadline - time.monotonic()), ALIVE_CHECK_S)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready and not ray.cluster_resources().get(resource, 0):  # no node of this kind is left
                for ref, (c, _) in list(pending.items()):
                    ray.cancel(ref, force=True)
                    done(c, {"status": "failed"})
                for c in todo:
                    done(c, {"status": "failed"})
                s.stats["lost"] += len(pending) + len(todo)
                return
            for ref in ready:
                c, _ = pending.pop(ref)
                try:
                    ans = ray.get(ref)
                except Exception:  # noqa: BLE001 - retries spent (nodes died) or cancelled: a failed candidate
                    s.stats["lost"] += 1
                    ans = {"status": "failed"}
                done(c, ans)
            now = time.monotonic()
            for ref, (c, deadline) in list(pending.items()):
                if deadline <= now:
                    ray.cancel(ref, force=True)
                    pending.pop(ref)
                    s.stats["deadline"] += 1
                    done(c, {"status": "failed"})

    def _finish(self, c: Candidate, ans: dict, on_result: Callable[[Candidate, str], None]) -> None:
        self.session.record(ans)
        status = ans.get("status")
        if status == "ok":
            c.time_s, c.binary = float(ans["time_s"]), ans["binary"]
        else:
            c.time_s = float("inf")
            if status == "rejected":
                c.binary = ans.get("binary")
            status = "rejected" if status == "rejected" else "failed"
        on_result(c, status)

    def close(self) -> None:
        self.shared = None  # the reference and inputs are freed once no task holds them


def _plain_launch(launch: dict) -> dict:
    return {"global_size": [int(x) for x in launch.get("global_size", (1, 1, 1))],
            "local_size": [int(x) for x in launch["local_size"]] if launch.get("local_size") else None,
            "vals": [int(x) for x in launch.get("vals", ())]}


class _ClusterCompilePool:
    """The compile pool's surface (`tgc.backends.compile_worker.WorkerPool`: `submit(kind, src) -> Future` of the
    binary, with `.seconds`) over Ray tasks on the workers, each with a deadline."""

    def __init__(self, session: ClusterSession, device: Any):
        self.session, self.device = session, device
        self.resource = resource_names(device, session.token)[1]

    def submit(self, kind: str, src: str, op: str = "compile") -> Future:
        if op != "compile":
            raise ValueError(f"the cluster compiles only (not {op})")
        s = self.session
        job = {**s._job(self.device, secrets.token_hex(16)), "src": src}
        ref = s._compile_fn.options(resources={self.resource: 1}, num_cpus=0, max_retries=MAX_RETRIES,
                                    retry_exceptions=False).remote(job)
        s.stats["tasks"] += 1
        fut: Future = Future()

        def wait() -> None:
            ready, _ = s.ray.wait([ref], timeout=s.deadline_s)
            if not ready:
                s.ray.cancel(ref, force=True)
                s.stats["deadline"] += 1
                fut.set_exception(TimeoutError(f"no compile from the cluster in {s.deadline_s:.0f} s"))
                return
            try:
                ans = s.ray.get(ref)
            except Exception as e:  # noqa: BLE001 - retries spent
                fut.set_exception(RuntimeError(f"the cluster lost the compile: {type(e).__name__}"))
                return
            s.record(ans)
            if ans.get("status") == "ok":
                fut.seconds = float(ans.get("seconds") or 0.0)  # type: ignore[attr-defined]
                fut.set_result(ans["binary"])
            else:
                fut.set_exception(RuntimeError(str(ans.get("error") or ans.get("status"))))

        threading.Thread(target=wait, daemon=True).start()
        return fut

    def kill(self) -> None:
        pass

    def shutdown(self, cancel_futures: bool = True) -> None:
        pass  # the session outlives one search


def worker_resources(device: Any, token: str, cores: int | None = None) -> dict[str, float]:
    """The Ray resources `tgc worker` declares for `device`: one evaluate slot, a compile slot per core."""
    ev, co = resource_names(device, token)
    return {ev: 1, co: cores or os.cpu_count() or 1}


def worker_command(device: Any, token: str, address: str | None, head: bool, port: int | None,
                   cores: int | None) -> list[str]:
    """The `ray start` command line (`--block`) of a node that serves `device` for a cluster with `token`."""
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
           "--resources", json.dumps(worker_resources(device, token, cores))]
    if cores:
        cmd += ["--num-cpus", str(cores)]
    if head:
        cmd += ["--head", "--include-dashboard=false"] + (["--port", str(port)] if port else [])
    else:
        cmd += ["--address", str(address)]
    return cmd
