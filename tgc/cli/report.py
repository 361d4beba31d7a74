"""Tables for `tgc bench` and `tgc beam`, and the comparison of a bench with a saved baseline.

The dicts come from `Program.bench` and `Program.beam` (see README "bench" and "beam" for their shape);
every key but the times is optional here, so a backend that cannot count flops still gets a table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tgc.errors import TgcError

# A slowdown counts as a regression only beyond this fraction and beyond the measured spread.
MIN_NOISE = 0.05


def fmt_time(s: float | None) -> str:
    """Seconds as `812 ns`, `15.3 us`, `4.07 ms` or `1.25 s`."""
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def fmt_share(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def spread(rec: Mapping[str, Any]) -> float:
    """The relative spread of one timing record: its interquartile range over the median where the record
    has one (robust to a single slow outlier), else (max - min) / median; 0 when unknown."""
    med = rec.get("median_s")
    if not med:
        return 0.0
    if rec.get("iqr_s") is not None:
        return rec["iqr_s"] / med
    lo, hi = rec.get("min_s"), rec.get("max_s")
    return 0.0 if lo is None or hi is None else (hi - lo) / med


def fmt_range(rec: Mapping[str, Any]) -> str:
    lo, hi = rec.get("min_s"), rec.get("max_s")
    if lo is not None and hi is not None:
        return f"{fmt_time(lo)} .. {fmt_time(hi)}"
    return fmt_time(lo if lo is not None else hi)


def numpy_ratio(result: Mapping[str, Any]) -> float | None:
    """numpy's median time over the program's: above 1 means tgc is faster."""
    np_rec, prog = result.get("numpy"), result.get("program") or {}
    if not np_rec or not prog.get("median_s") or not np_rec.get("median_s"):
        return None
    return np_rec["median_s"] / prog["median_s"]


def compare_baseline(new: Mapping[str, Any], old: Mapping[str, Any], min_noise: float = MIN_NOISE
                     ) -> list[dict[str, Any]]:
    """One row per kernel (matched by position and name) and for the whole program.

    `regressed` is set when the new median is slower than the old one by more than the larger of
    `min_noise` and the relative spread (see `spread`) measured in either run.
    """
    rows = []
    old_kernels = list(old.get("kernels") or [])
    pairs: list[tuple[str, Mapping[str, Any], Mapping[str, Any] | None]] = []
    for i, k in enumerate(new.get("kernels") or []):
        match = None
        if i < len(old_kernels) and old_kernels[i].get("name") == k.get("name"):
            match = old_kernels[i]
        else:
            match = next((o for o in old_kernels if o.get("name") == k.get("name")), None)
        pairs.append((str(k.get("name")), k, match))
    if new.get("program"):
        pairs.append(("(program)", new["program"], old.get("program")))
    for what, rec, base in pairs:
        row: dict[str, Any] = {"name": what, "new_s": rec.get("median_s"), "old_s": None, "change": None,
                               "noise": None, "regressed": False}
        if base and base.get("median_s") and rec.get("median_s"):
            change = rec["median_s"] / base["median_s"] - 1
            noise = max(min_noise, spread(rec), spread(base))
            row.update(old_s=base["median_s"], change=change, noise=noise, regressed=change > noise)
        rows.append(row)
    return rows


MAX_BASELINE = 64 << 20  # characters of a --baseline file (a bench document of a thousand kernels: ~1 MiB)


def load_baseline(path: str) -> dict[str, Any]:
    """A previous `tgc bench --json` document."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_BASELINE + 1)  # (bounded: /dev/zero never ends)
        if len(text) > MAX_BASELINE:
            raise TgcError(f"--baseline: '{path}' is over {MAX_BASELINE >> 20} Mi characters: not a tgc bench --json "
                           "document", hint="save one with tgc bench --json > FILE")
        doc = json.loads(text)
    except OSError as e:
        raise TgcError(f"--baseline: cannot read '{path}': {e.strerror or e}") from None
    except ValueError as e:
        raise TgcError(f"--baseline: '{path}' is not JSON: {e}", hint="save one with tgc bench --json > FILE") from None
    if not isinstance(doc, dict) or "kernels" not in doc:
        raise TgcError(f"--baseline: '{path}' is not the output of tgc bench --json")
    wrong = _baseline_fault(doc)
    if wrong:
        raise TgcError(f"--baseline: '{path}' is not the output of tgc bench --json: {wrong}",
                       hint="save one with tgc bench --json > FILE")
    return doc


_TIME_KEYS = ("median_s", "min_s", "max_s", "iqr_s")


def _baseline_fault(doc: Mapping[str, Any]) -> str | None:
    """What makes a --baseline document unusable for `compare_baseline` (an edited or foreign file), else None:
    `kernels` a list of records, `program` a record or null, each record's times null or finite numbers >= 0."""
    kernels, program = doc.get("kernels"), doc.get("program")
    if not isinstance(kernels, list):
        return f"'kernels' is {json.dumps(kernels)}, not a list"
    if program is not None and not isinstance(program, dict):
        return f"'program' is {json.dumps(program)}, not an object"
    records = [(f"kernels[{i}]", k) for i, k in enumerate(kernels)] + ([("program", program)] if program else [])
    for where, rec in records:
        if not isinstance(rec, dict):
            return f"{where} is {json.dumps(rec)}, not an object"
        if not isinstance(rec.get("name", ""), str):
            return f"{where}.name is {json.dumps(rec['name'])}, not a string"
        for key in _TIME_KEYS:
            v = rec.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                return f"{where}.{key} is {json.dumps(v)}, not a time in seconds"
    return None


_IDENTITY_WORDS = (("program_sha256", "another program"), ("dims", "other dims"), ("device", "another device"),
                   ("device_model", "another device"), ("tgc_version", "another tgc version"))


def check_baseline(old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
    """Refuse (TgcError, exit 2) a baseline timed for another program, other dims, another device or another
    tgc version: `new` is `tgc.engine.bench.identity` of this run, `old["identity"]` the baseline's."""
    hint = "save a baseline of this run with: tgc bench ... --json > FILE"
    base = old.get("identity")
    if not isinstance(base, Mapping):
        raise TgcError(f"--baseline: '{path}' does not say which program, dims, device and tgc version it timed "
                       "(saved by an older tgc)", hint=hint)
    diffs: list[str] = []
    for key, words in _IDENTITY_WORDS:
        a, b = base.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            a, b = dict(a), dict(b)
        if a == b:
            continue
        if key == "program_sha256":
            was, now = base.get("file") or "?", new.get("file") or "?"
            text = f"{words} ({was}, not {now})" if was != now else f"{words} (the source of {now} has changed)"
        elif key == "dims":
            def show(d: Any) -> str:
                return " ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, Mapping) else str(d)
            text = f"{words} ({show(a)}, not {show(b)})"
        else:
            text = f"{words} ({a}, not {b})"
        if text not in diffs and not (key == "device_model" and any(d.startswith("another device") for d in diffs)):
            diffs.append(text)
    if diffs:
        raise TgcError(f"--baseline: '{path}' was timed for {'; '.join(diffs)}, so its times cannot be compared",
                       hint=hint)


def _table(title: str | None, columns: Sequence[tuple[str, str]]) -> Any:
    from rich.table import Table

    table = Table(title=title, show_edge=False, header_style="bold", title_justify="left")
    for name, justify in columns:
        table.add_column(name, justify=justify)
    return table


def _drop_line_column(table: Any, kernels: Sequence[Mapping[str, Any]]) -> Any:
    """Remove the `line` column when no kernel knows its `.tg` line."""
    if any(k.get("line") is not None for k in kernels):
        return table
    table.columns = [c for c in table.columns if c.header != "line"]
    return table


def bench_table(result: Mapping[str, Any], baseline_rows: list[dict[str, Any]] | None = None) -> Any:
    """The rich table of `tgc bench`."""
    cols = [("kernel", "left"), ("line", "right"), ("median", "right"), ("min .. max", "right"),
            ("GFLOP/s", "right"), ("GB/s", "right"), ("of peak", "right")]
    if baseline_rows is not None:
        cols.append(("vs baseline", "right"))
    by_name = {r["name"]: r for r in baseline_rows or []}
    table = _table(f"{result.get('device', '')}  repeat {result.get('repeat', '?')}", cols)

    def add(name: str, rec: Mapping[str, Any], line: Any = None, style: str | None = None) -> None:
        gbps = fmt_num(rec.get("gbps"))
        if rec.get("in_cache") and rec.get("gbps") is not None:
            gbps += " (cache)"
        cells = [name, "" if line is None else str(line), fmt_time(rec.get("median_s")),
                 fmt_range(rec), fmt_num(rec.get("gflops")), gbps, _share_cell(rec)]
        if baseline_rows is not None:
            cells.append(_baseline_cell(by_name.get(name)))
        table.add_row(*cells, style=style)

    for k in result.get("kernels") or []:
        add(str(k.get("name")), k, k.get("line"))
    if result.get("program"):
        add("(program)", result["program"], style="bold")
    if result.get("numpy"):
        add("numpy", result["numpy"], style="dim")
    return _drop_line_column(table, result.get("kernels") or [])


def _share_cell(rec: Mapping[str, Any]) -> str:
    """`41.2% mem` / `12.0% flop`: the larger share of the peak and which peak; `-` where none is known."""
    share = rec.get("peak_share")
    if share is None:
        return "in cache" if rec.get("in_cache") else "-"
    bound = rec.get("bound")
    return fmt_share(share) + {"memory": " mem", "compute": " flop"}.get(str(bound), "")


def fmt_bytes(n: float, precision: str = ".3g") -> str:
    """`n` bytes in B, KiB, MiB or GiB (whole bytes; the larger units with `precision`)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:{precision}} {unit}"
        n /= 1024
    return str(n)


def collectives_note(result: Mapping[str, Any]) -> str:
    """The line under `tgc bench`'s table on a device list: bytes each device sent and the collectives' share."""
    coll = result.get("collectives") or {}
    if not coll.get("steps"):
        return "collectives: none (no value crosses devices)"
    sent = ", ".join(f"{d} {fmt_bytes(b)}" for d, b in zip(result.get("devices") or [], coll.get("sent_bytes") or []))
    share = coll.get("share_of_program")
    return (f"collectives: {', '.join(coll['steps'])}; sent per run: {sent}; "
            f"{fmt_time(coll.get('median_s'))}" + (f", {fmt_share(share)} of the program" if share is not None else ""))


def peak_note(result: Mapping[str, Any]) -> str:
    """The line under `tgc bench`'s table: the peak the shares are of, and what `(cache)` means."""
    peak = result.get("peak") or {}
    parts = []
    if peak.get("gflops"):
        parts.append(f"{peak['gflops']:.4g} GFLOP/s")
    if peak.get("gbps"):
        mem = f"{peak['gbps']:.4g} GB/s"
        if peak.get("copy_gbps") == peak["gbps"] and peak.get("read_gbps"):  # the CPU's: a copy, a read beside it
            mem += f" (a threaded copy, bytes read + written; a threaded read: {peak['read_gbps']:.4g} GB/s)"
        parts.append(mem)
    if not parts:
        if str(peak.get("source") or "").startswith("not measured"):  # a package's bench: it compiles nothing
            return ("peak: not measured on this machine yet (a package compiles nothing; `tgc bench` of a .tg file "
                    "measures it once), so no share of it is shown")
        return f"peak: unknown for {result.get('device', 'this device')}, so no share of it is shown"
    source = {"measured": "measured on this machine", "device": "the device's figures"}.get(
        str(peak.get("source")), str(peak.get("source") or ""))
    note = f"peak: {', '.join(parts)}" + (f" ({source})" if source else "")
    if (result.get("program") or {}).get("in_cache") and peak.get("cache_bytes"):
        size = result.get("working_set_bytes")
        what = f"the program's {fmt_bytes(size)} of buffers" if size else "the program's buffers"
        note += (f"; (cache): {what} fit or nearly fit (up to 4x) the {fmt_bytes(peak['cache_bytes'])} cache, "
                 "which serves part or all of them between runs, so GB/s is not a share of the memory peak")
    return note


RECOMPUTE_UNKNOWN = ("recompute factor unknown (the program cache's entry was stored by a run that had not "
                     "compiled the whole program at these sizes, as a run in chunks; `DISABLE_COMPILER_CACHE=1 "
                     "tgc bench ...` computes it)")


def recompute_note(rec: Mapping[str, Any]) -> str:
    """`recompute factor 1.00 (...)`: the ops the kernels execute over the program's ops as written."""
    return (f"recompute factor {rec['factor']:.3f} (the kernels execute {fmt_num(rec['executed'] / 1e6, 4)} M ops; "
            f"the program as written has {fmt_num(rec['written'] / 1e6, 4)} M)")


def _baseline_cell(row: dict[str, Any] | None) -> str:
    if not row or row.get("change") is None:
        return "new"
    text = f"{100 * row['change']:+.1f}%"
    return f"[red]{text} slower[/red]" if row["regressed"] else text


def beam_table(result: Mapping[str, Any]) -> Any:
    """The rich table of `tgc beam`: time before and after the search, per kernel."""
    table = _table(f"{result.get('device', '')}  BEAM width {result.get('width', '?')}",
                   [("kernel", "left"), ("line", "right"), ("before", "right"), ("after", "right"),
                    ("speed-up", "right"), ("tried", "right"), ("opts", "left")])

    def speedup(rec: Mapping[str, Any]) -> str:
        b, a = rec.get("before_s"), rec.get("after_s")
        return f"{b / a:.2f}x" if a and b else "-"

    for k in result.get("kernels") or []:
        opts = k.get("opts") or []
        note = (f" (cached, width {k['width']})" if k.get("width") else " (cached)") if k.get("cached") else ""
        if k.get("same_as"):
            note += f" (same kernel as {k['same_as']})"
        elif k.get("skipped") and k.get("lighter"):  # (`search.budget_kernels`: a light share of the program)
            note += " (not searched: the budget went to heavier kernels; a later `tgc beam` searches it)"
        elif k.get("skipped"):
            note += " (not searched: the budget was spent; a later `tgc beam` searches it)"
        elif k.get("small"):
            note += " (small search: a negligible share of the program)"
        if (k.get("out_of_budget") or k.get("interrupted")) and not k.get("skipped"):  # (`search.store_result`)
            cut = "stopped at its share of the budget" if k.get("out_of_budget") else "interrupted"
            if k.get("kept"):
                note += f" ({cut}: an earlier finished search's winner is kept; a later `tgc beam` searches it)"
            elif k.get("stored") is False:
                when = "before trying a candidate" if not k.get("tried") else "before its best could be confirmed"
                note += f" ({cut} {when}: not stored; a later `tgc beam` searches it)"
            elif k.get("partial"):
                note += f" ({cut}: stored as partial; a later `tgc beam` searches it again)"
            else:
                note += f" ({cut})"
        if k.get("dropped"):
            note += " (dropped: runs its default)"  # (by a program check, this one's or an earlier one's)
        table.add_row(str(k.get("name")), "" if k.get("line") is None else str(k.get("line")),
                      fmt_time(k.get("before_s")), fmt_time(k.get("after_s")), speedup(k),
                      "" if k.get("tried") is None else str(k["tried"]), ", ".join(str(o) for o in opts) + note)
    if result.get("program"):
        p = result["program"]
        table.add_row("(program)", "", fmt_time(p.get("before_s")), fmt_time(p.get("after_s")), speedup(p), "", "",
                      style="bold")
    return _drop_line_column(table, result.get("kernels") or [])


def beam_time(result: Mapping[str, Any]) -> str:
    """The line under `tgc beam`'s table: the time it took (from the process' start) against its budget, and how
    many kernels the budget left unsearched."""
    seconds, budget = result.get("seconds"), result.get("budget_s")
    used = "-" if seconds is None else f"{seconds:.1f} s"
    line = f"beam: {used} of a {budget:g} s budget" if budget else f"beam: {used} (no budget)"
    skipped = sum(1 for k in result.get("kernels") or [] if k.get("skipped"))
    if skipped:
        line += f"; {skipped} kernel{'s' if skipped > 1 else ''} not searched (a later `tgc beam` searches them)"
    return line


def program_check_line(result: Mapping[str, Any]) -> str | None:
    """The line under `tgc beam`'s table on the program check (`Program.beam`): the whole program's time with the
    default kernels, with every winner and with the winners kept (the least of the rounds; the ratio that decides:
    the median of the rounds' winners/default), and which kernels' winners were dropped."""
    check = result.get("program_check")
    if not check:
        return None
    if check.get("skipped"):
        return f"program check: not timed ({check['skipped']}); the winners are kept"
    kept, dropped = check.get("kept") or [], check.get("dropped") or []

    def ratio(r: float | None) -> str:
        return "" if r is None else f" ({r:.2f}x)"

    line = (f"program check ({check.get('rounds')} rounds): default kernels {fmt_time(check.get('default_s'))}, "
            f"with the winners {fmt_time(check.get('tuned_s'))}{ratio(check.get('ratio'))}")
    if dropped and not kept:
        line += f", all dropped: the default kernels {fmt_time(check.get('default_s'))}"
    elif check.get("retimed") or dropped:
        line += f", with those kept {fmt_time(check.get('final_s'))}{ratio(check.get('final_ratio'))}"
    line += f"; {len(kept)} winner{'s' if len(kept) != 1 else ''} kept"
    if dropped:
        line += f", {len(dropped)} dropped (they run their default: {', '.join(dropped)})"
    return line


def structure_check_line(result: Mapping[str, Any]) -> str | None:
    """The line under `tgc beam`'s table on the winners the memory-plan check dropped (`Program._check_structure`:
    a kernel that no longer writes in place, a program that then runs in other chunks), or None."""
    drops = result.get("structure_check") or {}
    if not drops:
        return None
    whys: dict[str, list[str]] = {}
    for name, why in drops.items():
        whys.setdefault(why, []).append(name)
    return (f"memory-plan check: {len(drops)} winner{'s' if len(drops) != 1 else ''} dropped (they run their "
            f"default): " + "; ".join(f"{', '.join(names)}: {why}" for why, names in whys.items()))


def progress_bar(enabled: bool) -> tuple[Callable[[Mapping[str, Any]], None], Callable[[], None]]:
    """A `progress(event)` callback for `Program.beam` and `Program.compile` drawing a bar on stderr, and a
    function that closes it.

    An event is a dict with `kernel`, `index` and `total` (kernels), and while a kernel is searched
    `round`, `candidate`/`candidates`, `best_s` and `base_s`; `cached` marks a kernel found in the cache;
    `stage` ("lowered", "compiled": `index` of `total` binaries from the worker processes) a compile's steps.
    """
    if not enabled:
        return (lambda event: None), (lambda: None)
    return _draw_bar()


def compile_progress(enabled: bool, after_s: float = 1.0) -> tuple[Callable[[Mapping[str, Any]], None],
                                                                     Callable[[], None]]:
    """`progress_bar` for a compile without BEAM (`tgc compile`, `run`, `bench`): the bar shows only once
    compiling has taken `after_s` seconds."""
    if not enabled:
        return (lambda event: None), (lambda: None)
    import time

    start = time.monotonic()
    shown: list[tuple[Callable[[Mapping[str, Any]], None], Callable[[], None]]] = []

    def later(event: Mapping[str, Any]) -> None:
        if not shown and time.monotonic() - start >= after_s:
            shown.append(_draw_bar())
        if shown:
            shown[0][0](event)

    return later, (lambda: shown[0][1]() if shown else None)


def _draw_bar() -> tuple[Callable[[Mapping[str, Any]], None], Callable[[], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[kernels]}"),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task("beam", total=1.0, kernels="")
    bar.start()

    def update(event: Mapping[str, Any]) -> None:
        total = max(int(event.get("total") or 1), 1)
        index = int(event.get("index") or 0)
        step = (event.get("candidate") or 0) / (event.get("candidates") or 1)
        done = 1.0 if event.get("cached") else min(step, 1.0)
        desc = str(event.get("kernel", "beam"))
        if event.get("stage") == "compiled":
            bar.update(task, completed=(index + 1) / total, description=f"compiled {desc}",
                       kernels=f"binary {index + 1}/{total}")
            return
        if event.get("stage") == "lowered":
            bar.update(task, completed=(index + 1) / total, description=f"lowered {desc}",
                       kernels=f"kernel {index + 1}/{total}")
            return
        if event.get("cached"):
            desc += ": cached"
        elif event.get("round") is not None:
            desc += f" round {event['round']}: {fmt_time(event.get('best_s'))} (from {fmt_time(event.get('base_s'))})"
        bar.update(task, completed=(index + done) / total, description=desc, kernels=f"kernel {index + 1}/{total}")

    return update, bar.stop


def timings_text(rec: Any, wall_s: float) -> str:
    """`tgc compile --timings`: one row per kernel built (the seconds of each phase of `tgc.timings.PHASES` that
    took any, the rest, the whole build, and where its binary came from), a total row, and the program-level
    phases (parsing, tracing, scheduling)."""
    from tgc.timings import PHASES, fmt_s

    kernels = rec.kernels
    used = [p for p in PHASES if any(p in k.phases for k in kernels)]
    header = ["kernel", *used, "other", "total", "binary"]
    rows = []
    for k in kernels:
        rows.append([k.name, *(fmt_s(k.phases[p]) if p in k.phases else "-" for p in used), fmt_s(k.other),
                     fmt_s(k.total), {"hit": "cache", "miss": "compiled", "shared": "shared"}.get(k.cache or "", "-")])
    totals = rec.totals()
    hits = sum(1 for k in kernels if k.cache == "hit")
    rows.append(["(total)", *(fmt_s(totals.get(p, 0.0)) for p in used), fmt_s(sum(k.other for k in kernels)),
                 fmt_s(sum(k.total for k in kernels)), f"{hits} cached"])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    program = ", ".join(f"{name} {fmt_s(s)}" for name, s in rec.phases.items())
    n = len(kernels)
    shared = sum(1 for k in kernels if k.cache == "shared")
    lines.append(f"{n} kernel{'s' if n != 1 else ''}: {hits} binar{'ies' if hits != 1 else 'y'} from the cache, "
                 f"{sum(1 for k in kernels if k.cache == 'miss')} compiled"
                 f"{f', {shared} shared with an identical kernel' if shared else ''}; {program or 'nothing else'}; "
                 f"{fmt_s(wall_s)} in all")
    return "\n".join(lines)
