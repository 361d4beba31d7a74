"""docs/LANGUAGE.md cannot drift from the implementation: every function of the front end's table has a
`### name(parameters)` section with the implementation's parameters, every such section names a real function,
every example compiles, and the README links the reference and no file the user does not have."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import tgc
from tgc.dsl.functions import FUNCTIONS

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = Path(__file__).resolve().parent.parent / "README.md"
HEADING = re.compile(r"^### (\w+)\((.*)\)\s*$", re.M)


def _sections() -> dict[str, str]:
    """{function name: the parameter list of its heading}; a name documented twice is an error."""
    out: dict[str, str] = {}
    for m in HEADING.finditer((DOCS / "LANGUAGE.md").read_text()):
        assert m.group(1) not in out, f"{m.group(1)} is documented twice"
        out[m.group(1)] = m.group(2)
    return out


def _shown_default(default: object) -> str:
    """A default as the heading writes it: a dtype by its name, a string in double quotes, else Python's."""
    if isinstance(default, str):
        return f'"{default}"'
    return str(getattr(default, "name", default))


def _param_names(params: str) -> list[str]:
    names = []
    for p in (p.strip() for p in params.split(",")):
        if p:
            names.append(p.split("=")[0].strip())
    return names


def test_every_function_is_documented_and_every_documented_function_exists():
    documented = set(_sections())
    assert not set(FUNCTIONS) - documented, f"undocumented: {sorted(set(FUNCTIONS) - documented)}"
    assert not documented - set(FUNCTIONS), f"documented but unknown: {sorted(documented - set(FUNCTIONS))}"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_documented_parameters_are_the_implementations(name):
    params = _sections().get(name)
    if params is None:
        pytest.fail(f"{name} is not documented")
    sig = inspect.signature(FUNCTIONS[name])
    want = [("*" if p.kind is p.VAR_POSITIONAL else "") + p.name for p in sig.parameters.values()]
    assert _param_names(params) == want
    for p in sig.parameters.values():  # documented defaults are the real ones
        if p.default is not inspect.Parameter.empty:
            shown = _shown_default(p.default)
            assert f"{p.name}={shown}" in params.replace(" ", ""), (name, p.name, shown)


def _examples() -> list[tuple[int, str]]:
    text = (DOCS / "LANGUAGE.md").read_text()
    out = []
    for m in re.finditer(r"```python\n(.*?)```", text, re.S):
        out.append((text[:m.start()].count("\n") + 1, m.group(1)))
    return out


def test_every_example_compiles():
    examples = _examples()
    assert len(examples) > len(FUNCTIONS)  # one per function, and the syntax's
    for line, src in examples:
        try:
            tgc.loads(src, filename=f"LANGUAGE.md:{line}")  # parses and traces (dims at trial sizes)
        except tgc.TgcError as e:
            pytest.fail(f"the example at docs/LANGUAGE.md line {line} does not compile:\n{e.format()}")


def test_the_parser_of_this_test_sees_real_headings():
    # a heading this test would miss (or misread) is no check at all
    assert _param_names("x, axis=None, keepdim=False") == ["x", "axis", "keepdim"]
    assert _param_names("*shape, dtype=f32") == ["*shape", "dtype"]
    assert "var" in _sections() and _sections()["cat"] == "*tensors, axis=0"


def test_readme_links_the_language_reference_and_no_missing_file():
    text = README.read_text()
    assert "docs/LANGUAGE.md" in text
    root = README.parent
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (root / target).exists(), f"README links {target}, which is not in the project"
    assert "DSL.md" not in text  # the internal spec is not the user's
    assert "LANGUAGE-" not in text  # one reference: the ops once documented apart are folded into LANGUAGE.md
    assert not list(DOCS.glob("LANGUAGE-*.md")), "fold it into docs/LANGUAGE.md: this test reads only that file"
