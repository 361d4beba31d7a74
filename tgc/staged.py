"""ONNX models with data-dependent output shapes (NonZero, Unique, NonMaxSuppression on values known only at run
time), run in stages: `StagedModel.run`.

Contract: the model's graph (ONNX nodes are topologically ordered) is cut at each node that raised
`tgc.onnx.NeedHost` while translating. The nodes before it run as an ordinary tgc `Program` (translated,
compiled, cached like any model) whose outputs are the values later nodes read; the cut node runs on the host
(numpy, `tgc.onnx.hostops.run_host`, ONNX's semantics); its outputs, now of known sizes, are inputs of the
next stage, so the sizes they decide are static dims there. The next stage is translated from the remaining
nodes, its inputs the values computed so far, and may cut again. A value computed at run time that decides a
shape in a later stage (Reshape's shape, ...) is made a constant (an initializer) of that stage, remembered per
stage. Stages are cached by the shapes and dtypes of their inputs and the bytes of their constants, so a second
run with the same sizes (not the same values) compiles and translates nothing. Results are the model's outputs
by their ONNX names, as `Program.run` gives them.

A StagedModel is what `tgc.load` gives for such a model, and serves the commands (`tgc.cli.staged_cmds`) with
the part of `Program`'s interface that a staged run has: `inputs` (declarations by ONNX name), `dim_names`
(the inputs' `dim_param`s), `output_names`, `conform`, `run`, `bench` (the whole staged run timed, host steps
included), `reference` (ONNX's own evaluator, `onnx.reference`), `compile` (the first stage's program before
any value is known, or every stage's once a run with inputs has reached them: `stage_programs`), and `beam`
(every stage a run reaches, searched as `Program.beam` searches one program).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any

import numpy as np

from tgc.api import Program
from tgc.errors import BindError, TgcError, unknown_dims
from tgc.onnx import NeedDims, NeedHost, NeedStatic, at_node, translate

__all__ = ["StagedModel", "load", "load_staged"]

MAX_STAGES = 32  # programs kept per model (one per stage and input shapes)


def _bf16() -> np.dtype:
    import ml_dtypes  # (onnx's own dependency: numpy's bfloat16)

    return np.dtype(ml_dtypes.bfloat16)


def _reads(nodes: list) -> set[str]:
    """The names `nodes` read, those their subgraphs (If branches, Loop bodies) read from outside included."""
    out: set[str] = set()
    for n in nodes:
        out.update(i for i in n.input if i)
        for a in n.attribute:
            if a.type == a.GRAPH:
                out |= _reads(list(a.g.node))
            elif a.type == a.GRAPHS:
                for g in a.graphs:
                    out |= _reads(list(g.node))
    return out


def load(path: str) -> Program | StagedModel:
    """`tgc.load`: `tgc.api.load`, except that an ONNX model with a data-dependent output shape (NonZero,
    Unique, NonMaxSuppression on run-time values) comes back as a `StagedModel` (read and checked once)."""
    import os

    from tgc.api import load as load_program
    from tgc.api import onnx_program
    from tgc.onnx import read_model

    path = os.fspath(path)
    if not path.lower().endswith(".onnx"):
        return load_program(path)
    model = read_model(path)
    try:
        return onnx_program(model, path)
    except (NeedHost, NeedDims) as e:
        staged = StagedModel(model, os.path.basename(path))
        staged.path = path
        if isinstance(e, NeedDims):
            staged.per_size = e.msg
        return staged


def load_staged(path: str) -> StagedModel:
    """A model file, checked (`tgc.onnx.read_model`), as a `StagedModel` (any model: one without host steps runs
    as one stage)."""
    import os

    from tgc.onnx import read_model

    return StagedModel(read_model(path), os.path.basename(path))


class StagedModel:
    """A checked ONNX model that needs host steps between tgc programs (see the module's contract)."""

    def __init__(self, model: Any, where: str = "<model>"):
        from onnx import numpy_helper

        self.model, self.where, self.path = model, where, None
        g = model.graph
        self.inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.input_names = [v.name for v in g.input if v.name not in self.inits]
        self.output_names = [o.name for o in g.output]
        self._types = {v.name: v.type for v in [*g.input, *g.output]}
        self._programs: dict[str, Program] = {}
        self._const_names: dict[str, set[str]] = {}  # per stage: the run-time values that decide its shapes
        self.stages: list[str] = []  # the last run's steps, in order: "tgc N nodes" or "host OP"
        self._last_programs: list[tuple[str, Program]] = []  # the last run's tgc stages: (step, program)
        # a run that was one tgc stage, by device and the inputs' dtypes and shapes: (program, the inputs it
        # reads, its outputs, its step); a repeat run at those sizes goes straight to the program (no submodel,
        # no key, no walk over the nodes: 1.6 ms of CPU a run of a small GPT, issue nufix3)
        self._one_stage: dict[tuple, tuple[Program, list[str], list[str], str]] = {}
        self._last_part: tuple[Program, list[str], list[str], set[str]] | None = None

    staged = True  # (a Program is not: the commands ask)
    # why a model without host steps is one: its shapes need its dims' values (NeedDims' message), so it is
    # translated per size, once its inputs are known; None for a model with data-dependent output shapes
    per_size: str | None = None

    def kind(self) -> str:
        """What the commands call this model in their messages."""
        return "a model translated per size" if self.per_size else "a model run in stages"

    @property
    def inputs(self) -> list[Any]:
        """The inputs a caller passes, as `InputDecl`s by ONNX name (a `dim_param` is a dim name)."""
        from tgc.dsl.frontend import InputDecl
        from tgc.dtype import dtypes
        from tgc.onnx.core import onnx_dtype

        out = []
        for name in self.input_names:
            tt = self._types[name].tensor_type
            dt = dtypes.from_numpy(onnx_dtype(tt.elem_type, f"input '{name}'").np)
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{name}_{i}")
                          for i, d in enumerate(tt.shape.dim))
            out.append(InputDecl(name, dt, shape, 0))
        return out

    @property
    def dim_names(self) -> list[str]:
        """The inputs' symbolic dims (`dim_param`), first seen first."""
        names: list[str] = []
        for d in self.inputs:
            names += [s for s in d.shape if isinstance(s, str) and s not in names]
        return names

    def conform(self, name: str, arr: Any, cast: bool = False) -> np.ndarray:
        """The array for input `name` in its declared dtype (converted with `cast`), its shape checked."""
        arr = np.asarray(arr)
        dt = next(d.dtype for d in self.inputs if d.name == name)
        want = _bf16() if dt.name == "bf16" else dt.np  # (a bf16 input cast from floats: to its values)
        if cast and arr.dtype != want and not (dt.name == "bf16" and arr.dtype == np.uint16):
            arr = arr.astype(want)
        return self._conform(name, arr)

    def run(self, device: str | None = None, dims: dict[str, int] | None = None, inputs: dict[str, Any] | None = None,
            symbolic: bool = False, **kw_inputs: Any) -> dict[str, np.ndarray]:
        """{ONNX output name: array} for the model's inputs given by their ONNX names. `dims`, where given, must
        agree with the inputs' sizes (the arrays decide every size). `symbolic=True` is refused (a TgcError
        saying why): a staged or per-size model has no kernels for all sizes."""
        if symbolic:
            self.compile_symbolic()
        given = {**(inputs or {}), **kw_inputs}
        for name in self.input_names:
            if name not in given:
                raise BindError(f"missing input '{name}'", need="input", name=name, hint="pass an array for it")
        extra = sorted(set(given) - set(self.input_names))
        if extra:
            raise TgcError(f"unknown input(s) {', '.join(extra)}: the model's inputs are "
                           f"{', '.join(self.input_names)}")
        values = {k: self._conform(k, np.asarray(given[k])) for k in self.input_names}
        bound: dict[str, tuple[int, str]] = {k: (v, "the dims given") for k, v in (dims or {}).items()}
        for decl in self.inputs:  # (a dim_param shared by inputs: one size, as a Program checks its dims)
            for axis, size in enumerate(decl.shape):
                if not isinstance(size, str):
                    continue
                have = values[decl.name].shape[axis]
                if size not in bound:
                    bound[size] = (have, f"input '{decl.name}'")
                elif bound[size][0] != have:
                    raise TgcError(f"dim {size} mismatch: input '{decl.name}' axis {axis} has size {have}, but "
                                   f"{size} = {bound[size][0]} from {bound[size][1]}")
        seen = (device, tuple((k, v.dtype.str, v.shape) for k, v in values.items()))
        hit = self._one_stage.get(seen)
        if hit is not None:
            prog, reads, outs, step = hit
            real = {n: values[n].view(np.uint16) if values[n].dtype == _bf16() else values[n] for n in reads}
            got = prog.run(device=device, inputs=real)
            self.stages, self._last_programs = [step], [(step, prog)]
            values.update({o: got[o] for o in outs})
        else:
            self.stages, self._last_programs, self._last_part = [], [], None
            self._run_span(list(self.model.graph.node), set(self.output_names), values, set(), device)
            part = self._last_part
            # (kept where the inputs' sizes alone decide the program: one stage, no input's values among the
            # constants that decided its shapes)
            if len(self._last_programs) == 1 and len(self.stages) == 1 and part is not None and \
                    not part[3] & set(self.input_names):
                if len(self._one_stage) >= MAX_STAGES:
                    self._one_stage.pop(next(iter(self._one_stage)))
                self._one_stage[seen] = (part[0], part[1], part[2], self.stages[0])
        out = {o: values[o] if o in values else self.inits[o] for o in self.output_names}
        return {o: a.astype(np.float32) if a.dtype == _bf16() else a for o, a in out.items()}  # (bf16 as f32,
        # as a Program gives it)

    def _conform(self, name: str, arr: np.ndarray) -> np.ndarray:
        from onnx import TensorProto

        from tgc.onnx.core import onnx_dtype

        tt = self._types[name].tensor_type
        want = onnx_dtype(tt.elem_type, f"input '{name}'").np
        if tt.elem_type == TensorProto.BFLOAT16 and arr.dtype in (want, _bf16()):  # bf16: numpy's bfloat16 (from
            arr = arr.view(_bf16())  # ml_dtypes) or its bits as uint16; bfloat16 inside, so a constant keeps its type
        elif arr.dtype != want:
            raise BindError(f"input '{name}' has dtype {arr.dtype}, the model declares {want}", need="cast",
                            name=name, dtype=str(want))
        dims = list(tt.shape.dim)
        if len(dims) != arr.ndim or any(d.HasField("dim_value") and d.dim_value != s for d, s in zip(dims, arr.shape)):
            decl = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
            raise TgcError(f"input '{name}' has shape {list(arr.shape)}, the model declares {decl}")
        return arr

    def _run_span(self, nodes: list, wanted: set[str], values: dict[str, np.ndarray], consts: set[str],
                  device: str | None) -> None:
        """Compute the `wanted` values of `nodes` into `values`, cutting at each node that needs the host."""
        start = 0
        while True:
            span = nodes[start:]
            try:
                self._run_part(span, wanted, values, consts, device)
                return
            except NeedHost as e:
                k = e.index
                if k < 0 or k >= len(span):
                    raise
            later = _reads(span[k:]) | wanted
            produced = {o for n in span[:k] for o in n.output if o}
            if produced & later:
                self._run_span(span[:k], produced & later, values, consts, device)
            self._host(span[k], values, consts)
            start += k + 1

    def _run_part(self, nodes: list, wanted: set[str], values: dict[str, np.ndarray], consts: set[str],
                  device: str | None) -> None:
        """One tgc program for `nodes` (raises NeedHost where one of them needs the host)."""
        produced = {o for n in nodes for o in n.output if o}
        outs = [o for o in self.output_names if o in wanted and o in produced] + \
            sorted(o for o in wanted if o in produced and o not in self.output_names)
        if not outs:
            return
        feeds = sorted((_reads(nodes) | set(outs)) - produced)
        sig = ",".join(o for n in nodes for o in n.output) + "|" + ",".join(feeds)
        local = set(consts) | self._const_names.get(sig, set())  # (the ones a run before found deciding shapes)
        for _ in range(len(feeds) + 1):
            key = self._key(nodes, feeds, values, local)
            prog = self._programs.get(key)
            if prog is None:
                model = self._submodel(nodes, feeds, outs, values, local)  # (only to translate)
                try:
                    tr = translate(model, self.where)
                except NeedStatic as e:
                    if e.name in values and e.name not in local:  # known now: a constant of this stage
                        local.add(e.name)
                        self._const_names.setdefault(sig, set()).add(e.name)
                        continue
                    raise
                names = {tg: n for n, tg in [*tr.inputs.items(), *tr.outputs.items()]}
                try:
                    prog = Program(tr.source, filename=self.where, weights=tr.weights, names=names)
                except TgcError as e:
                    raise at_node(e, tr) from None
                if len(self._programs) >= MAX_STAGES:
                    self._programs.pop(next(iter(self._programs)))
                self._programs[key] = prog
            real = {n: values[n] for n in feeds if n in values and n not in local and n not in self.inits}
            real = {n: a.view(np.uint16) if a.dtype == _bf16() else a for n, a in real.items()}  # (a Program: bits)
            got = prog.run(device=device, inputs=real)
            self._last_part = (prog, list(real), outs, local)
            self.stages.append(f"tgc {len(nodes)} nodes")
            self._last_programs.append((self.stages[-1], prog))
            values.update({o: got[o] for o in outs})
            return
        raise TgcError(f"{self.where}: cannot make the stage's shapes static")

    def _submodel(self, nodes: list, feeds: list[str], outs: list[str], values: dict[str, np.ndarray],
                  consts: set[str]) -> Any:
        from onnx import TensorProto, helper, numpy_helper

        inputs, inits = [], []
        for n in feeds:
            if n in self.inits:
                inits.append(numpy_helper.from_array(self.inits[n], n))
            elif n in consts:
                inits.append(numpy_helper.from_array(values[n], n))
            elif n in values:
                a = values[n]
                inputs.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                            list(a.shape)))
        outputs = []
        for o in outs:
            if o in self._types:
                outputs.append(helper.make_value_info(o, self._types[o]))
            else:
                outputs.append(helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None))
        g = helper.make_graph(nodes, self.model.graph.name or "stage", inputs, outputs, initializer=inits)
        m = helper.make_model(g, opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
        m.functions.extend(self.model.functions)
        return m

    def _key(self, nodes: list, feeds: list[str], values: dict[str, np.ndarray], consts: set[str]) -> str:
        h = hashlib.sha256()
        outs = ",".join(o for n in nodes for o in n.output)
        h.update(f"{outs}|{','.join(feeds)};".encode())
        for n in feeds:
            if n in values:
                a = np.require(values[n], requirements="C")  # (0-d stays 0-d: () and (1,) differ)
                h.update(f"{n}:{a.dtype.str}:{a.shape};".encode())
                if n in consts:
                    h.update(a.reshape(-1).view(np.uint8))
        return h.hexdigest()

    def _host(self, node: Any, values: dict[str, np.ndarray], consts: set[str]) -> None:
        """Compute `node` on the host (`tgc.onnx.hostops.run_host`, numpy); its outputs are inputs of the next
        stage (constants there where they decide a shape)."""
        from tgc.onnx.hostops import run_host

        ins = [(values[i] if i in values else self.inits[i]) if i else None for i in node.input]
        try:
            res = run_host(node, ins)
        except (ValueError, IndexError, TypeError) as e:
            raise TgcError(f"{self.where}: node '{node.name or node.output[0]}' ({node.op_type}) failed on the "
                           f"host: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        for o, a in zip(node.output, res):
            if o:
                values[o] = np.asarray(a)
        self.stages.append(f"host {node.op_type}")

    def compile_symbolic(self, *args: Any, **kw: Any) -> Any:
        """Refused: one TgcError saying why this model has no symbolic kernels (a plain `run` works)."""
        why = (self.per_size if self.per_size else "its later stages are translated at run time, once their "
               "sizes are known")
        raise TgcError(f"symbolic sizes are not available for {self.kind()}: {why}",
                       hint="drop --symbolic (symbolic=True): it is translated and compiled for the sizes given")

    # --- the rest of a Program's interface (the commands' needs)
    def stage_programs(self) -> list[tuple[str, Program]]:
        """The last run's tgc stages in order: (step, as in `stages`, and its program)."""
        return list(self._last_programs)

    def first_stage(self, dims: dict[str, int] | None = None) -> tuple[Program | None, list[str]]:
        """(the program of the stage before the first host step, None where there is none, i.e. the model
        starts with one; the steps after it that are translated at run time, once their sizes are known).
        Only the inputs' declared shapes are needed (their `dim_param`s from `dims`); a first stage whose
        shapes depend on the inputs' values raises a TgcError saying so."""
        from tgc.onnx import NeedHost, NeedStatic

        missing = [s for d in self.inputs for s in d.shape if isinstance(s, str) and s not in (dims or {})]
        if missing:
            missing = list(dict.fromkeys(missing))
            raise BindError(unknown_dims(missing), need="dim", name=missing[0], names=missing,
                            hint="give their sizes (-D)" if len(missing) > 1 else "give its size (-D)")
        placeholders = {}
        for d in self.inputs:
            shape = []
            for s in d.shape:
                shape.append(dims[s] if isinstance(s, str) else s)  # type: ignore[index]
            placeholders[d.name] = np.zeros(shape, d.dtype.np)
        nodes = list(self.model.graph.node)
        feeds = sorted((_reads(nodes) | set(self.output_names)) - {o for n in nodes for o in n.output if o})
        try:
            translate(self._submodel(nodes, feeds, self.output_names, placeholders, set()), self.where)
            k = len(nodes)
        except NeedHost as e:
            k = e.index
        except NeedStatic as e:
            raise TgcError(f"{self.where}: a size of the first stage depends on the value of '{e.name}'",
                           hint="give the inputs (-i or --random) to compile every stage of a run") from None
        later = [f"host {nodes[k].op_type}"] + (["..."] if k + 1 < len(nodes) else []) if k < len(nodes) else []
        prefix = nodes[:k]
        produced = {o for n in prefix for o in n.output if o}
        outs = [o for o in self.output_names if o in produced] + \
            sorted((_reads(nodes[k:]) & produced) - set(self.output_names))
        if not outs:
            return None, later
        feeds = sorted((_reads(prefix) | set(outs)) - produced)
        try:
            tr = translate(self._submodel(prefix, feeds, outs, placeholders, set()), self.where)
        except NeedStatic as e:
            raise TgcError(f"{self.where}: a size of the first stage depends on the value of '{e.name}'",
                           hint="give the inputs (-i or --random) to compile every stage of a run") from None
        names = {tg: n for n, tg in [*tr.inputs.items(), *tr.outputs.items()]}
        return Program(tr.source, filename=self.where, weights=tr.weights, names=names), later

    def reference(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The outputs by ONNX's own evaluator (`onnx.reference.ReferenceEvaluator`), for `--check`."""
        from onnx.reference import ReferenceEvaluator

        try:
            got = ReferenceEvaluator(self.model).run(None, {k: np.asarray(v) for k, v in inputs.items()})
        except Exception as e:  # noqa: BLE001 - the evaluator's failure is one line, not a traceback
            raise TgcError(f"{self.where}: ONNX's reference evaluator failed: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from None
        return {o: np.asarray(a) for o, a in zip(self.output_names, got)}

    def bench(self, device: str | None = None, inputs: dict[str, Any] | None = None, repeat: int = 10,
              warmup: int = 1) -> dict[str, Any]:
        """The whole staged run timed `repeat` times after `warmup` runs (translation and compiles happen in the
        warm-up): {"stages": [...], "runs": repeat, "median_s", "min_s", "stage_times": {step: median_s}}
        (stage_times: each tgc stage's program run alone on the last run's inputs). The counts are bounded as
        `tgc.engine.executable.bench`'s are."""
        from tgc.engine.executable import MAX_REPEAT, counts_ok

        if not counts_ok(repeat, warmup):
            raise TgcError(f"cannot time {repeat} runs after {warmup} warm-up runs: the counts are 1..{MAX_REPEAT} "
                           f"and 0..{MAX_REPEAT}", hint="use a smaller --repeat")
        inputs = dict(inputs or {})
        for _ in range(max(1, warmup)):
            self.run(device=device, inputs=inputs)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self.run(device=device, inputs=inputs)
            times.append(time.perf_counter() - t0)
        return {"file": self.where, "device": device or "", "stages": list(self.stages), "runs": repeat,
                "median_s": statistics.median(times), "min_s": min(times)}

    def beam(self, device: str | None = None, inputs: dict[str, Any] | None = None, width: int = 4,
             progress: Any = None, force: bool = False, budget_s: float | None = None) -> list[dict[str, Any]]:
        """Run once with `inputs` to reach every stage, then BEAM-search each stage's program (`Program.beam`):
        one result per tgc stage, with its "stage" step added."""
        self.run(device=device, inputs=dict(inputs or {}))
        results = []
        for step, prog in self._last_programs:
            kw: dict[str, Any] = {} if budget_s is None else {"budget_s": budget_s}
            res = prog.beam(device=device, width=width, progress=progress, force=force, **kw)
            results.append({**res, "stage": step})
        return results
