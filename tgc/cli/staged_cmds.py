"""The commands for an ONNX model that runs in stages (`tgc.staged.StagedModel`: NonZero, Unique,
NonMaxSuppression on run-time values): `tgc run|compile|bench|beam model.onnx` when `tgc.load` gives such a
model. A thin shell over the StagedModel's Python interface.

Contract: `after_load(ctx, prog)` is called by the commands' loader with what `tgc.load` gave. For a Program it
only refuses `tgc compile`'s input options (those are for staged models); for a StagedModel it does the
command named by `ctx.info_name` with `ctx.params` and ends it (exit 0), or raises: a `TgcError` (exit 2 for
bad input, 1 for a failed `--check`), a `click.UsageError` for an option a staged run does not have (device
lists, `--symbolic`, `--package`, `compile -o`, ...). (`--profile` writes its trace and prints its "wrote"
line: `tgc.cli.trace` takes `ctx.exit(0)` as the command's end.) `add_compile_inputs(cmd)` gives `tgc compile`
the `-i`, `--inputs` and `--random` options with which every stage of a run is compiled.
"""

from __future__ import annotations

from typing import Any

import click

from tgc.errors import TgcError, dim_flags, unknown_dims

_COMPILE_INPUTS = "tgc.staged.compile_inputs"  # ctx.meta key: tgc compile's input options


def add_compile_inputs(cmd: click.Command) -> None:
    """Give `tgc compile` -i/--inputs/--random (for staged models): they go to ctx.meta, not to its callback."""
    callback = cmd.callback
    cmd.params += [
        click.Option(["-i", "--input", "staged_pairs"], multiple=True, metavar="NAME=PATH.npy",
                     help="An ONNX model run in stages: one input (.npy); every stage of a run is compiled."),
        click.Option(["--inputs", "staged_npz"], metavar="IN.npz",
                     help="An ONNX model run in stages: its inputs from an .npz."),
        click.Option(["--random", "staged_random"], is_flag=True,
                     help="An ONNX model run in stages: random inputs (sizes from -D), every stage compiled."),
    ]

    def wrapped(**kw: Any) -> Any:
        ctx = click.get_current_context()
        pairs = []
        for text in kw.pop("staged_pairs", ()):
            name, sep, path = text.partition("=")
            if not sep or not name.strip() or not path:
                raise click.BadParameter(f"expected NAME=PATH.npy, got {text!r}", param_hint="'-i'")
            pairs.append((name.strip(), path))
        ctx.meta[_COMPILE_INPUTS] = (pairs, kw.pop("staged_npz", None), kw.pop("staged_random", False))
        return callback(**kw) if callback else None

    cmd.callback = wrapped


def after_load(ctx: click.Context, prog: Any) -> Any:
    """Do the command for a staged model and end it; for any other program refuse compile's input options.
    `tgc compile --package` of a model translated per size with every dim given (-D): the Program translated
    at those sizes (returned; `ctx.meta[FIXED_DIMS]` says the dims are in it), packaged as any fixed-size one."""
    pairs, npz, use_random = ctx.meta.get(_COMPILE_INPUTS, ((), None, False))
    if not getattr(prog, "staged", False):
        if pairs or npz or use_random:
            raise click.UsageError("-i, --inputs and --random of tgc compile are for ONNX models with data-dependent "
                                   "shapes (run in stages): this program compiles from its dims alone")
        return prog
    command = ctx.info_name
    dims = dict(ctx.params.get("dims") or {})
    emit = ctx.params.get("emit")
    built = ctx.params.get("package") or ctx.params.get("outdir") or (emit and emit != "src")
    if (command == "compile" and prog.per_size and built and prog.dim_names
            and set(prog.dim_names) <= set(dims) and not (pairs or npz or use_random)):
        return _at_sizes(ctx, prog, dims)
    handlers = {"run": _run, "compile": _compile, "bench": _bench, "beam": _beam}
    if command not in handlers:
        what = ("a model whose shapes are computed from its dims' values (translated per size)" if prog.per_size
                else "a model with data-dependent output shapes (run in stages)")
        raise TgcError(f"tgc {command} does not take {what}", hint="tgc run, compile, bench, beam and inspect do")
    params = dict(ctx.params)
    if command == "compile":
        params.update(pairs=pairs, npz=npz, use_random=use_random, cast=False, seed=0)
    _refuse(params, prog.per_size)
    handlers[command](prog, params)
    ctx.exit(0)


FIXED_DIMS = "tgc.staged.fixed_dims"  # ctx.meta key: the -D sizes a per-size model was translated at


def _at_sizes(ctx: click.Context, model: Any, dims: dict[str, int]) -> Any:
    """A per-size model translated with its dims fixed to `dims` (as `tgc import -D` does): a Program, which
    `tgc compile` then packages (--package), writes (-o) or emits (--emit) as any fixed-size one."""
    import copy

    from tgc.api import onnx_program
    from tgc.cli.onnx_cmds import fix_dims

    fixed = copy.deepcopy(model.model)
    _check_dims_given(model, dims)
    fix_dims(fixed, {k: v for k, v in dims.items() if k in model.dim_names})
    prog = onnx_program(fixed, model.path or model.where)
    ctx.meta[FIXED_DIMS] = dims
    at = ', '.join(f'{k}={v}' for k, v in dims.items() if k in model.dim_names)
    if ctx.params.get("package"):
        click.echo(f"note: {model.where} is translated per size: packaged at {at} (the package runs at those "
                   "sizes only)", err=True)
    else:
        click.echo(f"note: {model.where} is translated per size: compiled at {at}", err=True)
    return prog


def _refuse(p: dict[str, Any], per_size: str | None = None) -> None:
    """Options a staged run does not have: one usage error each (`per_size`: why the model is translated per
    size, see `StagedModel.per_size`)."""
    what = "a model translated per size" if per_size else "a model run in stages"
    why = (f"{per_size}; it runs at the sizes given, translated and compiled for each" if per_size else
           "its later stages are compiled at run time, once their sizes are known")
    if p.get("shard") or "," in (p.get("device") or ""):
        raise click.UsageError(f"{what} runs on one device, not a device list ({why})")
    for flag, key in (("--symbolic", "symbolic"), ("--package", "package"), ("--vs", "vs"),
                      ("--baseline", "baseline"), ("--emit", "emit"), ("compile -o", "outdir")):
        value = p.get(key)
        if value and not (key == "emit" and value == "src"):
            also = f"; with every dim given (-D NAME=INT), tgc compile {flag.replace('compile ', '')} compiles " \
                "it at those sizes" if per_size and key in ("package", "outdir", "emit") else ""
            if key == "symbolic":
                also = "; drop --symbolic to run it at the sizes given"
            raise click.UsageError(f"{flag} is not available for {what} ({why}){also}")


def _inputs(model: Any, p: dict[str, Any], use_random: bool) -> dict[str, Any]:
    """The inputs named on the command line, and random ones for the rest with `use_random`."""
    from tgc.cli import inputs as inp

    notes: list[str] = []
    given = inp.gather(model, p.get("npz"), p.get("pairs", ()), p.get("cast", False), notes)
    for note in notes:
        click.echo(note, err=True)
    _check_dims_given(model, p.get("dims") or {})
    return inp.fill_random(model, given, p.get("dims") or {}, p.get("seed") or 0) if use_random else given


def _check_dims_given(model: Any, dims: dict[str, int]) -> None:
    from tgc.cli.inputs import did_you_mean

    for name in dims:
        if name not in model.dim_names:
            click.echo(f"warning: -D {name}={dims[name]}: the model has no dim {name}; "
                       f"{did_you_mean(name, model.dim_names, 'dim')}", err=True)


def _stages_line(model: Any) -> str:
    if model.per_size:  # (one stage: the whole model, translated for the sizes of this run)
        return f"note: one program, translated for these sizes, as its shapes need the dims' values: {model.per_size}"
    return "stages: " + ", ".join(model.stages)


def _dtype_names(outs: dict[str, Any]) -> dict[str, str]:
    from tgc.dtype import dtypes

    names = {}
    for name, arr in outs.items():
        dt = dtypes.from_numpy(arr.dtype)
        names[name] = dt.name if dt is not None else str(arr.dtype)
    return names


def _run(model: Any, p: dict[str, Any]) -> None:
    from tgc.cli.inputs import flag_hint
    from tgc.cli.outputs import input_files, print_output_table, resolve_outs, save_outputs
    from tgc.errors import BindError

    if p.get("seed") is not None and not p.get("use_random"):
        raise click.UsageError("--seed needs --random")
    specs = resolve_outs(p.get("outs") or [], model.output_names, input_files(p.get("pairs", ()), p.get("npz")))
    arrays = _inputs(model, p, p.get("use_random", False))
    try:
        results = model.run(device=p.get("device"), dims=p.get("dims") or {}, inputs=arrays)
    except BindError as e:
        raise flag_hint(e) from None
    names = _dtype_names(results)
    if p.get("check"):
        from tgc.cli.check import check_outputs

        bad, worst = check_outputs(results, model.reference(arrays), names, p.get("rtol"))
        if bad:
            raise TgcError("check failed: " + "\n  ".join(m.describe() for m in bad), kind="runtime",
                           hint=None if not specs else "no output file was written")
        n = len(results)
        click.echo(f"check: ok: {n} output{'s match' if n != 1 else ' matches'} ONNX's reference evaluator "
                   f"(worst error {worst:.2g} of the tolerance)", err=True)
    click.echo(_stages_line(model), err=True)
    if specs:
        for path in save_outputs(specs, results):
            click.echo(f"wrote {path}", err=True)
    else:
        print_output_table(results, names)


def _compile(model: Any, p: dict[str, Any]) -> None:
    import json

    device = p.get("device")
    if p.get("pairs") or p.get("npz") or p.get("use_random"):
        model.run(device=device, inputs=_inputs(model, p, p.get("use_random", False)))
        stages, later = model.stage_programs(), []
    else:
        first, later = model.first_stage(p.get("dims") or {})
        stages = [("first stage", first)] if first is not None else []
    shown = []
    for step, prog in stages:
        kernels = prog.compile(device=device)
        shown.append({"stage": step, "kernels": [{"name": k.name, "binary_bytes": len(k.binary or b"")}
                                                  for k in kernels]})
        if not p.get("as_json"):
            for k in kernels:
                if model.per_size:  # (one program: its kernels headed as a Program's, no stage named)
                    from tgc.cli.emit import header, source_kind

                    click.echo(header(k, model.where, source_kind("", k.src)[0]))
                else:
                    click.echo(f"// {step}: {k.name}")
                click.echo(k.src)
    note = ""
    if later:
        note = (f"the later stages ({', '.join(later)}) are compiled at run time, once their sizes are known; "
                "give the inputs (-i, --inputs or --random) to compile every stage of a run")
    if p.get("as_json"):
        click.echo(json.dumps({"file": model.where, "staged": True, "stages": shown, "later": later}, indent=1))
    elif note:
        click.echo(f"note: {note}", err=True)
    elif model.stages or model.per_size:
        click.echo(_stages_line(model), err=True)


def _bench(model: Any, p: dict[str, Any]) -> None:
    import json

    arrays = _inputs(model, p, True)
    if p.get("beam"):
        model.beam(device=p.get("device"), inputs=arrays, width=p["beam"])
    result = model.bench(device=p.get("device"), inputs=arrays, repeat=p.get("repeat") or 10)
    if p.get("as_json"):
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(_stages_line(model))
    what = "whole run" if model.per_size else "whole run (host steps included)"
    click.echo(f"{what}: median {result['median_s'] * 1e3:.3f} ms, "
               f"min {result['min_s'] * 1e3:.3f} ms over {result['runs']} runs")


def _beam(model: Any, p: dict[str, Any]) -> None:
    import json

    from tgc.cli import report
    from tgc.cli.outputs import make_console

    missing = [d for d in model.dim_names if d not in (p.get("dims") or {})]
    if missing:
        raise TgcError(f"{unknown_dims(missing)}: tgc beam runs the model once with random inputs to reach its "
                       f"stages", hint=f"give {dim_flags(missing)}")
    arrays = _inputs(model, {**p, "seed": 0}, True)
    progress, close = report.progress_bar(False)
    try:
        results = model.beam(device=p.get("device"), inputs=arrays, width=p.get("width") or 4, progress=progress,
                             force=p.get("force", False), budget_s=p.get("budget"))
    finally:
        close()
    if p.get("as_json"):
        click.echo(json.dumps({"stages": results}, indent=1, default=str))
    else:
        console = make_console()
        for res in results:
            console.print(f"stage: {res['stage']}")
            console.print(report.beam_table(res))
    if any(r.get("interrupted") for r in results):
        click.echo("beam: interrupted; the winners found so far are stored", err=True)
        click.get_current_context().exit(130)
