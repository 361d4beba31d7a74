"""`tgc import model.onnx -o model.tg` and `tgc inspect model.onnx`: the ONNX front end on the command line.

`import` writes the `.tg` program that `tgc.load("model.onnx")` runs and its weights as an `.npz` beside it (the
same names), so `tgc run model.tg --inputs model.npz -i ...` gives the model's results. `inspect` lists the
opset, inputs, outputs, the ops used and any op tgc lacks, before anything is translated or run.
"""

from __future__ import annotations

import os
from typing import Any

import click

from tgc.cli.outputs import nonempty_path
from tgc.errors import TgcError


def is_onnx(path: str) -> bool:
    return path.lower().endswith(".onnx")


def inspect_onnx(file: str, as_json: bool) -> None:
    from tgc.onnx import inspect_model, read_model

    doc = inspect_model(read_model(file))
    if as_json:
        import json

        click.echo(json.dumps(doc, indent=1))
        return

    def io(d: dict) -> str:
        return f"  {d['name']:<16} {d['dtype']}[{', '.join(map(str, d['shape']))}]"

    click.echo(f"model:   {file} (opset {doc['opset']}, IR {doc['ir_version']}"
               + (f", from {doc['producer']}" if doc["producer"] else "") + ")")
    click.echo(f"inputs ({len(doc['inputs'])}):")
    for d in doc["inputs"]:
        click.echo(io(d))
    click.echo(f"outputs ({len(doc['outputs'])}):")
    for d in doc["outputs"]:
        click.echo(io(d))
    click.echo(f"weights: {doc['weights']} initializers, {doc['weight_bytes']} bytes")
    click.echo(f"ops ({len(doc['ops'])}): " + ", ".join(f"{k} x{v}" for k, v in doc["ops"].items()))
    if doc["missing"]:
        click.echo(f"not supported by tgc ({len(doc['missing'])}): {', '.join(doc['missing'])}")
    else:
        click.echo("not supported by tgc: none")
    if doc.get("host"):
        click.echo(f"data-dependent output shapes ({len(doc['host'])}): {', '.join(doc['host'])}: run in stages "
                   "(tgc run, compile, bench, beam; tgc.load) where their inputs are not constants")


def _replaceable(path: str) -> bool:
    """Whether `tgc import` may write its default `.tg` at `path` without being asked to: nothing there, or an
    earlier translation (its first line says so); never a program of the user's that happens to share the name."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().startswith("# translated by tgc from ONNX")
    except FileNotFoundError:
        return True
    except OSError:
        return False  # (a directory, no permission: not replaced either)


IMPORT_DIMS_HELP = ("Fix a dim_param of the inputs to a size (repeatable): for a model whose shapes need the "
                    "dims' values, or a program of fixed sizes.")


def fix_dims(model: Any, dims: dict[str, int]) -> None:
    """Give the inputs' `dim_param`s named in `dims` their sizes (dim_value), in place; a name the model has no
    dim of is a TgcError listing its dims."""
    params = [d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim
              if not d.HasField("dim_value") and d.dim_param]
    unknown = sorted(set(dims) - set(params))
    if unknown:
        raise TgcError(f"-D {', '.join(unknown)}: the model has no such dim",
                       hint=f"its dims: {', '.join(dict.fromkeys(params))}" if params else "its inputs' sizes are "
                       "all fixed")
    for v in model.graph.input:
        for d in v.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]


def _dims_needed(model: Any, dims: list[str], where: str, probe: int = 8) -> list[str]:
    """The dims a per-size model's import needs fixed: one of `dims` alone where fixing it (to `probe`) lets the
    rest translate symbolically (a causal mask `bias[:, :, :T, :T]` needs only T), else all of them. At most one
    translation per dim, and only when the import has already failed."""
    import copy

    from tgc.onnx import translate

    if len(dims) > 1:
        for d in dims[::-1]:  # (the later dims first: a sequence length more often than a batch)
            trial = copy.deepcopy(model)
            fix_dims(trial, {d: probe})
            try:
                translate(trial, where)
            except TgcError:
                continue
            return [d]
    return list(dims)


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out", metavar="PATH.tg", callback=nonempty_path,
              help="Where to write the program (default: FILE with .tg; the weights go to the same name with .npz).")
def import_(file: str, out: str | None, dims: dict[str, int] | None = None) -> None:
    """Translate an ONNX model to a readable .tg program, its weights to an .npz beside it.

    \f
    (`-D`, parsed by the commands' one parser, is added where tgc.cli.main registers the command.)"""
    import numpy as np

    from tgc.onnx import NeedDims, read_model, translate

    if not is_onnx(file):
        raise TgcError(f"{file} is not an .onnx file", hint="tgc import reads ONNX models")
    model = read_model(file)  # (a corrupt model is the error to report, before any conflict of the outputs)
    if dims:
        fix_dims(model, dims)
    default_out = not out
    out = out or os.path.splitext(file)[0] + ".tg"
    if not out.endswith(".tg"):
        raise click.UsageError("-o names the .tg file to write (PATH.tg)")
    if default_out and not _replaceable(out):
        raise TgcError(f"{out} exists and is not a translation by tgc import: it is left as it was",
                       hint="name the program to write with -o PATH.tg")
    weights = os.path.splitext(out)[0] + ".npz"
    if os.path.lexists(weights) and not (os.path.exists(out) and _replaceable(out)):
        # the weights beside a program that is not an earlier translation are not tgc's to replace
        raise TgcError(f"{weights} exists and is not the weights of an earlier translation by tgc import: it is "
                       "left as it was", hint="move it, or name another program with -o PATH.tg (its weights go "
                       "beside it as PATH.npz)")
    try:
        tr = translate(model, os.path.basename(file))
    except NeedDims as e:
        need = _dims_needed(model, e.dims, os.path.basename(file))
        e.hint = f"give {'its size' if len(need) == 1 else 'their sizes'}: tgc import " + \
            " ".join(f"-D {d}=INT" for d in need) + (" (the other dims stay symbolic)" if len(need) < len(e.dims)
                                                      else "")
        raise
    from tgc.cli.outputs import check_writable, write_files

    # both files at once (checked, staged, then renamed): a failure leaves an earlier program and its weights as
    # they were (a program was truncated before, then its weights failed to write)
    check_writable(out)
    check_writable(weights)
    write_files([(out, lambda f: f.write(tr.source.encode("utf-8"))), (weights, lambda f: np.savez(f, **tr.weights))])
    ins = " ".join(f"-i {tg}=..." for tg in tr.inputs.values())
    n = len(tr.weights)
    click.echo(f"wrote {out} ({len(tr.source.splitlines())} lines) and {weights} ({n} weight{'' if n == 1 else 's'}); "
               f"run it with: tgc run {out} --inputs {weights} {ins}".rstrip())
