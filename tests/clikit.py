"""Running the CLI in-process for the tests, and checking that a failure is one clean error line."""

from __future__ import annotations

import re

from click.testing import CliRunner

from tgc.cli.main import main


def invoke(*args: str, env: dict | None = None):
    return CliRunner(env={"NO_COLOR": "1", "DEBUG": None, "TGC_DEVICE": None, **(env or {})}).invoke(
        main, list(args), prog_name="tgc")


def assert_clean(r, code: int, *words: str) -> None:
    """Exit `code` with one `error:` message holding `words`, never a traceback or an internal error."""
    assert r.exit_code == code, (r.exit_code, r.stderr, r.exception)
    assert re.match(r"(\S+: )?error: ", r.stderr), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


# A whole `tgc ARGS...` process (`python -c WARM_CLI ARGS...`) that prints, last on stderr, `HEAVY ` and the
# heavy modules it imported (llvmlite, the optimizer, the front end, the scheduler, the Python API): a warm run
# from the program cache must print none.
WARM_CLI = """
import sys
from tgc.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] == "llvmlite" or m.startswith(
        ("tgc.codegen", "tgc.dsl", "tgc.engine.schedule", "tgc.api")))
    print("HEAVY " + ",".join(heavy), file=sys.stderr)
"""
