"""tgc: a command-line kernel compiler and runner for small tensor-expression (`.tg`) files.

The Python API: `tgc.load(path)` / `tgc.loads(text)` give a `Program`; `Program.run(...)` executes it
and `Program.compile(...)` returns its kernels. Heavy modules are imported on first use.
"""

from tgc.errors import TgcError
from tgc.version import __version__


def load(path: str):
    """Parse a `.tg` file (or translate an `.onnx` model) into a Program (raises TgcError on a bad file); an ONNX
    model with data-dependent output shapes comes back as a `tgc.staged.StagedModel`, which runs it in stages."""
    from tgc.staged import load as _load
    return _load(path)


def loads(source: str, filename: str = "<string>"):
    """Parse `.tg` source text into a Program."""
    from tgc.api import loads as _loads
    return _loads(source, filename)


def load_package(path: str):
    """Read and validate a compiled package (`tgc compile FILE --package OUT`): `.run(...)` runs it without the
    source and without compiling."""
    from tgc.package import load_package as _load_package
    return _load_package(path)


def devices(info: bool = True) -> list:
    """Every registered backend: available here or not (and why), renderer, compiler, version, peak figures."""
    from tgc.api import devices as _devices
    return _devices(info)


def profiling(path: str | None = None):
    """`with tgc.profiling("trace.json") as prof:` records every kernel launch, copy, compile and collective in
    the block as a profile trace (Chrome trace-event JSON for ui.perfetto.dev), written to `path` at the end
    (`prof.doc()` is the document). See `tgc.profile`."""
    from tgc.profile import profiling as _profiling
    return _profiling(path)


def __getattr__(name: str):
    if name in ("Program", "Kernel"):
        import tgc.api
        return getattr(tgc.api, name)
    raise AttributeError(name)


__all__ = ["load", "loads", "load_package", "devices", "profiling", "TgcError", "__version__"]
