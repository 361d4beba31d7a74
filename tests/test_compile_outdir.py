"""`tgc compile -o DIR` into a directory that holds other things: an earlier compile's files, the user's own, a
manifest written by someone else or broken, a compile cut short, two compiles at once. The rule: tgc removes or
overwrites only files it wrote and that are unchanged since, never hangs, and fails with one message."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import pytest

from tgc.cli import emit
from tgc.cli.emit import LOCK, MANIFEST, Emitted, write_dir
from tgc.errors import TgcError


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """Each test its own cache directory, and so its own key for signing manifests."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))


def signed(d, doc: dict) -> str:
    """`doc` as a manifest tgc wrote into `d` (signed with this user's key): for the tests of what tgc does with
    the entries of its own manifest."""
    files = doc["files"]
    return json.dumps({**doc, "hmac": emit._mac(emit._key(create=True), str(d), files)})


def kernels(*names: str, text: str = "") -> list[Emitted]:
    return [Emitted(n, f"; kernel {n}", f"define void @{n}() {{ ret void }} ; {text}", "llvm", ".ll") for n in names]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def listed(d) -> dict:
    return json.loads((d / MANIFEST).read_text())["files"]


def own(d) -> set[str]:
    return {n for n in os.listdir(d) if n not in (MANIFEST, LOCK)}


def test_kernel_file_pattern_is_every_name_file_names_makes():
    for ext in emit.EXTENSIONS:
        for name in ("r_4_8", "E_N", "a b/c", "", "x" * 50):
            made = emit.file_names([Emitted(name, "", "", "text", ext)] * 101)
            assert all(emit.KERNEL_FILE.fullmatch(n) for n in made), made
    for other in ("setup.py", "notes.txt", "00_a.ll.orig", "0_a.ll", "00_.ll", MANIFEST, LOCK, "00_a.exe", "00_a/b.ll"):
        assert not emit.KERNEL_FILE.fullmatch(other), other


def test_a_manifest_removes_only_files_of_names_tgc_writes(tmp_path):
    """D1: a manifest shipped in a directory (a tarball's, a repository's) named the user's setup.py with its
    sha256: the compile removed it. Now only names tgc writes (NN_NAME.EXT) are ever removed."""
    d = tmp_path / "d"
    d.mkdir()
    mine = {"setup.py": b"print('mine')\n", "notes.txt": b"mine\n", "00_a.ll.orig": b"mine\n", "7_a.ll": b"m\n"}
    for n, b in mine.items():
        (d / n).write_bytes(b)
    (d / "05_old.ll").write_bytes(b"old\n")  # a name tgc writes, with the sha256 the manifest gives: tgc's
    doc = {"files": {**{n: sha(b) for n, b in mine.items()}, "05_old.ll": sha(b"old\n")}}
    (d / MANIFEST).write_text(signed(d, doc))
    done = write_dir(str(d), kernels("k"))
    assert done.removed == [str(d / "05_old.ll")] and done.kept == []
    assert {n: (d / n).read_bytes() for n in mine} == mine
    assert set(listed(d)) == {"00_k.ll"}


@pytest.mark.parametrize("doc", [
    '{"files": {"a\\u0000b": "00", "01_x.ll\\u0000": "%s"}}',
    '{"files": {"a\\ud800b": "%s", "01_x\\udc80.ll": "%s"}}',
    '{"files": ' + "[" * 100000,
    '{"files": {"01_x.ll": "%s"}, "pad": "' + "x" * (emit.MANIFEST_MAX_BYTES + 10) + '"}',
    '{"files": {"01_x.ll": ["%s", 7, null]}}',
])
def test_a_broken_or_hostile_manifest_is_no_manifest_not_a_crash(tmp_path, doc):
    """D2: NUL or a lone surrogate in a name, deep nesting: internal errors (ValueError, UnicodeEncodeError,
    RecursionError), after the kernel files were renamed in, and stored in the next manifest so every later
    compile crashed the same way. A manifest over MANIFEST_MAX_BYTES is not read."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "01_x.ll").write_bytes(b"x\n")
    text = doc.replace("%s", sha(b"x\n"))
    try:  # (as tgc's own, signed, where it reads as JSON)
        text = signed(d, json.loads(text))
    except (ValueError, RecursionError):
        pass
    (d / MANIFEST).write_text(text, encoding="utf-8", errors="surrogatepass")
    done = write_dir(str(d), kernels("k"))
    assert done.paths == [str(d / "00_k.ll")]
    if doc.startswith('{"files": {"01_x.ll": ['):  # (the one good sha256 of a list counts)
        assert done.removed == [str(d / "01_x.ll")]
    else:
        assert done.removed == [] and (d / "01_x.ll").read_bytes() == b"x\n"
    assert listed(d) == {"00_k.ll": sha((d / "00_k.ll").read_bytes())}
    assert write_dir(str(d), kernels("k")).paths == [str(d / "00_k.ll")]  # (and the next compile too)


def test_a_manifest_or_lock_that_is_not_a_regular_file_is_refused_before_the_work(tmp_path, monkeypatch):
    """D3: a FIFO as the manifest hung `compile -o` forever; a directory failed after the kernel files were
    renamed in. Now check_outdir (before the compile) refuses them, exit 2, and nothing is written."""
    import stat

    for name, make, kind in ((MANIFEST, os.mkfifo, "a FIFO"), (MANIFEST, os.mkdir, "a directory"),
                             (LOCK, os.mkfifo, "a FIFO"), (LOCK, os.mkdir, "a directory"),
                             (LOCK, lambda p: os.symlink("/dev/null", p), "a symbolic link")):
        d = tmp_path / f"d{len(os.listdir(tmp_path))}"
        d.mkdir()
        make(str(d / name))
        with pytest.raises(TgcError) as e:
            emit.check_outdir(str(d))
        assert e.value.kind == "user" and f"cannot write '{d / name}': it is {kind}" in e.value.msg, e.value.msg
        with pytest.raises(TgcError):  # (one made after the check: write_dir refuses it too, before any rename)
            write_dir(str(d), kernels("k"))
        assert os.listdir(d) == [name] and not stat.S_ISREG(os.lstat(d / name).st_mode)


def test_a_manifest_that_is_a_link_is_replaced_and_its_target_untouched(tmp_path):
    d, target = tmp_path / "d", tmp_path / "target.json"
    d.mkdir()
    (d / "01_x.ll").write_bytes(b"x\n")
    target.write_text(json.dumps({"files": {"01_x.ll": sha(b"x\n")}}))
    before = target.read_bytes()
    (d / MANIFEST).symlink_to(target)
    emit.check_outdir(str(d))
    done = write_dir(str(d), kernels("k"))
    assert done.removed == [] and (d / "01_x.ll").exists()  # (a link's manifest is not read)
    assert not (d / MANIFEST).is_symlink() and set(listed(d)) == {"00_k.ll"} and target.read_bytes() == before
    (d / "dev").symlink_to("/dev/null")
    os.replace(d / "dev", d / MANIFEST)  # (to a device: not written in place either)
    write_dir(str(d), kernels("k"))
    assert not (d / MANIFEST).is_symlink() and set(listed(d)) == {"00_k.ll"}


def test_a_stale_file_that_cannot_be_removed_is_said_and_stays_listed(tmp_path, monkeypatch):
    """D4: it was reported as 'kept: it has changed since' (false) and dropped from the manifest, so no later
    compile removed it."""
    d = tmp_path / "d"
    write_dir(str(d), kernels("old", "k"))
    real = os.unlink

    def refuse(p, *a, **k):
        if str(p).endswith("00_old.ll"):
            raise PermissionError(1, "Operation not permitted", p)
        return real(p, *a, **k)

    monkeypatch.setattr(os, "unlink", refuse)
    done = write_dir(str(d), kernels("k"))
    assert done.unremoved == [(str(d / "00_old.ll"), "operation not permitted")] and done.kept == []
    assert set(listed(d)) == {"00_k.ll", "00_old.ll"}
    monkeypatch.setattr(os, "unlink", real)
    assert write_dir(str(d), kernels("k")).removed == [str(d / "00_old.ll")] and own(d) == {"00_k.ll"}


def test_a_stale_file_that_cannot_be_removed_gets_its_own_note(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tgc.cli.main import main

    d = tmp_path / "d"
    write_dir(str(d), kernels("old"))
    stale = str(d / "00_old.ll")
    monkeypatch.setattr(emit, "write_dir", lambda directory, emitted: emit.Written(
        [], [], [], [(stale, "operation not permitted")], [(str(d / "00_k.ll"), str(d / "00_k.ll.orig"))]))
    r = CliRunner(env={"NO_COLOR": "1", "DEBUG": None}).invoke(
        main, ["compile", str(emit.__file__).replace("tgc/cli/emit.py", "kernels/elementwise.tg"), "-D", "N=4",
               "-d", "CPU", "-o", str(d)])
    assert r.exit_code == 0, r.output
    assert f"note: {stale}, of an earlier compile, could not be removed: operation not permitted" in r.stderr
    assert "has changed since" not in r.stderr.split(stale)[1].split("\n")[0]
    assert f"note: moved {d / '00_k.ll'} to {d / '00_k.ll.orig'}: tgc had not written it" in r.stderr


@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_compile_interrupted_among_the_renames_leaves_no_staged_file_and_its_files_known(tmp_path, monkeypatch,
                                                                                            at):
    """D5: Ctrl-C at a rename left a staged `.tmp` file for good, and a kernel file whose content the (old)
    manifest did not list: never removed, reported as the user's."""
    d = tmp_path / "d"
    write_dir(str(d), kernels("k", "x", text="first"))
    real, n = os.replace, [0]

    def cut(a, b):
        n[0] += 1
        if n[0] == at:
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        write_dir(str(d), kernels("k", "x", "y", text="second"))
    monkeypatch.setattr(os, "replace", real)
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")], os.listdir(d)
    done = write_dir(str(d), kernels("z"))
    assert done.kept == [] and done.set_aside == [] and own(d) == {"00_z.ll"}, (done, os.listdir(d))


def test_write_files_leaves_no_staged_file_on_ctrl_c(tmp_path, monkeypatch):
    from tgc.cli.outputs import write_files

    real, n = os.replace, [0]

    def cut(a, b):
        n[0] += 1
        if n[0] == 2:
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        write_files([(str(tmp_path / f"o{i}.npy"), lambda f: f.write(b"x")) for i in range(3)])
    assert sorted(os.listdir(tmp_path)) == ["o0.npy"]


def test_two_compiles_into_one_directory_take_turns(tmp_path):
    """D6: two compiles at once read the same manifest; both programs' kernels stayed, one of them unlisted."""
    import fcntl

    d = tmp_path / "d"
    write_dir(str(d), kernels("a"))
    fd = os.open(d / LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # (another compile holds the directory)
    # (a daemon, and the lock let go whatever the assertion says: a failing check never hangs the run)
    t = threading.Thread(target=write_dir, args=(str(d), kernels("b", "c")), daemon=True)
    try:
        t.start()
        time.sleep(0.5)
        assert own(d) == {"00_a.ll"} and t.is_alive()
    finally:
        os.close(fd)
    t.join(10)
    assert not t.is_alive()
    assert own(d) == {"00_b.ll", "01_c.ll"} and set(listed(d)) == {"00_b.ll", "01_c.ll"}


def test_a_file_tgc_did_not_write_is_set_aside_not_overwritten(tmp_path):
    """D7: a kernel file the user edited was overwritten without a word when the new compile wrote its name."""
    d = tmp_path / "d"
    write_dir(str(d), kernels("k", text="first"))
    (d / "00_k.ll").write_text("my edit\n")
    done = write_dir(str(d), kernels("k", text="second"))
    assert done.set_aside == [(str(d / "00_k.ll"), str(d / "00_k.ll.orig"))]
    assert (d / "00_k.ll.orig").read_text() == "my edit\n" and "second" in (d / "00_k.ll").read_text()
    assert write_dir(str(d), kernels("k", text="third")).set_aside == []  # (tgc's own, unchanged: replaced)
    (d / "00_k.ll").write_text("my second edit\n")
    assert write_dir(str(d), kernels("x")).kept == [str(d / "00_k.ll")]  # (stale and changed: kept)
    done = write_dir(str(d), kernels("k", text="fourth"))  # (the user's file of that name; a .orig there)
    assert done.set_aside == [(str(d / "00_k.ll"), str(d / "00_k.ll.orig.1"))]
    assert (d / "00_k.ll.orig").read_text() == "my edit\n" and (d / "00_k.ll.orig.1").read_text() == "my second edit\n"
    # a link or a FIFO of a kernel's name: moved aside (never followed, never opened), its target untouched
    e = tmp_path / "e"
    e.mkdir()
    (tmp_path / "t.ll").write_text("target\n")
    (e / "00_k.ll").symlink_to(tmp_path / "t.ll")
    os.mkfifo(e / "01_x.ll")
    done = write_dir(str(e), kernels("k", "x"))
    assert [b for _, b in done.set_aside] == [str(e / "00_k.ll.orig"), str(e / "01_x.ll.orig")]
    assert (e / "00_k.ll.orig").is_symlink() and (tmp_path / "t.ll").read_text() == "target\n"
    # a file of the same content as the new one (an older tgc's, no manifest): nothing to keep
    f = tmp_path / "f"
    f.mkdir()
    (f / "00_k.ll").write_bytes((d / "00_k.ll").read_bytes())
    assert write_dir(str(f), kernels("k", text="fourth")).set_aside == []


def test_staged_files_of_a_killed_compile_are_removed_by_the_next(tmp_path):
    """A compile killed (SIGKILL) between staging and renaming leaves its staged files: the next compile into
    the directory (holding the lock, so no other compile is staging there) removes those, and only those."""
    from tgc.files import stage

    d = tmp_path / "d"
    write_dir(str(d), kernels("k"))
    left = [stage(str(d / n), lambda f: f.write(b"x")) for n in ("00_k.ll", "01_y.cl", MANIFEST)]
    mine = [d / ".notes.txt.abcdefgh.tmp", d / ".00_k.ll.tmp", d / "00_k.ll.abcdefgh.tmp"]
    for m in mine:
        m.write_text("mine")
    write_dir(str(d), kernels("k"))
    assert not any(os.path.exists(p) for p in left) and all(m.exists() for m in mine)


def test_a_manifest_tgc_did_not_write_removes_and_overwrites_nothing(tmp_path, monkeypatch):
    """N1 (review10): a crafted manifest listing ordinary names of the kernel-file form (2024_report.txt,
    01_config.json) with their sha256s had them removed; one listing the user's own 00_k.ll with its sha256 had
    it overwritten with no .orig. A manifest counts only where this user's key signed it for this directory."""
    d = tmp_path / "d"
    d.mkdir()
    mine = {"2024_report.txt": b"report\n", "01_config.json": b"{}\n", "00_k.ll": b"my kernel\n"}
    for n, b in mine.items():
        (d / n).write_bytes(b)
    crafted = {"format": 2, "files": {"2024_report.txt": [sha(mine["2024_report.txt"]), "0" * 64],
                                      "01_config.json": sha(mine["01_config.json"]), "00_k.ll": sha(mine["00_k.ll"])}}
    other_key = emit._mac(b"f" * 64, str(d), crafted["files"])
    elsewhere = tmp_path / "elsewhere"  # (signed by this user, for another directory, copied here)
    for doc in (crafted, {**crafted, "hmac": other_key}, json.loads(signed(elsewhere, crafted))):
        (d / MANIFEST).write_text(json.dumps(doc))
        done = write_dir(str(d), kernels("k"))
        assert done.removed == [] and done.kept == []
        assert done.set_aside == [(str(d / "00_k.ll"), str(d / "00_k.ll.orig"))]
        assert {n: (d / n).read_bytes() for n in ("2024_report.txt", "01_config.json")} == {
            n: mine[n] for n in ("2024_report.txt", "01_config.json")}
        assert (d / "00_k.ll.orig").read_bytes() == mine["00_k.ll"]
        os.replace(d / "00_k.ll.orig", d / "00_k.ll")
    # tgc's own manifest: a recompile removes the stale kernels, and replaces its own files without a .orig
    e = tmp_path / "e"
    write_dir(str(e), kernels("k", "old", text="first"))
    done = write_dir(str(e), kernels("k", text="second"))
    assert done.removed == [str(e / "01_old.ll")] and done.set_aside == [] and own(e) == {"00_k.ll"}
    # no key (cleared, or another cache directory): nothing is known to be tgc's; nothing removed
    write_dir(str(e), kernels("k", "old", text="first"))
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache2"))
    done = write_dir(str(e), kernels("k", text="second"))
    assert done.removed == [] and done.set_aside == [(str(e / "00_k.ll"), str(e / "00_k.ll.orig"))]
    assert own(e) == {"00_k.ll", "00_k.ll.orig", "01_old.ll"}
    key = tmp_path / "cache2" / emit.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    os.chmod(key, 0o644)  # (a key others can read is no key)
    assert emit._key(create=False) is None and emit._manifest(str(e)) == {}


def test_a_lock_that_cannot_be_opened_for_writing_is_locked_read_only(tmp_path, monkeypatch):
    """N2 (review10): another user's lock (or one at 0444) in a shared directory failed every compile, after the
    work: flock works on a read-only fd. One that cannot be opened at all is refused by check_outdir, exit 2."""
    d = tmp_path / "d"
    write_dir(str(d), kernels("a"))
    real = os.open

    def no_write(path, flags, *a):  # (as for a non-root user: the lock is not writable)
        if str(path).endswith(LOCK) and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied", path)
        return real(path, flags, *a)

    monkeypatch.setattr(os, "open", no_write)
    emit.check_outdir(str(d))
    assert write_dir(str(d), kernels("b")).removed == [str(d / "00_a.ll")] and own(d) == {"00_b.ll"}

    def none(path, flags, *a):
        if str(path).endswith(LOCK):
            raise PermissionError(13, "Permission denied", path)
        return real(path, flags, *a)

    monkeypatch.setattr(os, "open", none)
    with pytest.raises(TgcError) as e:
        emit.check_outdir(str(d))
    assert e.value.kind == "user" and f"cannot use '{d / LOCK}'" in e.value.msg and "permission denied" in e.value.msg


def test_a_backup_name_fits_name_max(tmp_path):
    """N3 (review10): the user's file at a kernel name near NAME_MAX could not be set aside (NAME.orig too
    long): exit 2 after the manifest and earlier kernels were renamed in, every time."""
    from tgc.cli.outputs import _name_max

    d = tmp_path / "d"
    d.mkdir()
    limit = _name_max(str(d))
    long = "N" * (limit - len("00_.ll"))
    names = emit.file_names(kernels("a", long, long[:-1] + "M"))
    for n in names:
        (d / n).write_text(f"user {n}\n")
    done = write_dir(str(d), kernels("a", long, long[:-1] + "M"))
    backups = [b for _, b in done.set_aside]
    assert len(backups) == 3 and len(set(backups)) == 3
    assert all(len(os.path.basename(b).encode()) <= limit for b in backups)
    assert [(d / b).read_text() for b in backups] == [f"user {n}\n" for n in names]
    assert not any(emit.KERNEL_FILE.fullmatch(os.path.basename(b)) for b in backups)
    (d / names[1]).write_text("user again\n")  # (a second backup of that name: a new name, the first kept)
    done = write_dir(str(d), kernels("a", long, long[:-1] + "M"))
    assert len(done.set_aside) == 1 and done.set_aside[0][1] not in backups
    assert (d / done.set_aside[0][1]).read_text() == "user again\n"


def test_staged_files_of_long_names_are_removed_after_a_kill(tmp_path):
    """N4 (review10): a staged name is cut to STAGE_NAME_BYTES: for a kernel name over it, the cleanup's
    pattern (the whole name) never matched, and the file stayed forever."""
    from tgc.files import stage

    d = tmp_path / "d"
    long = "E_" + "N" * 200
    write_dir(str(d), kernels(long))
    left = stage(str(d / emit.file_names(kernels(long))[0]), lambda f: f.write(b"x"))
    mine = d / (".00_" + "x" * 96 + ".notes.abcdefgh.tmp")  # (100-byte stems that no kernel name begins with)
    mine2 = d / (".notes" + "x" * 94 + ".abcdefgh.tmp")
    for m in (mine, mine2):
        m.write_text("mine")
    write_dir(str(d), kernels(long))
    assert not os.path.exists(left) and mine.exists() and mine2.exists()


def test_a_held_lock_is_said_and_the_probe_and_set_aside_notes_survive_ctrl_c(tmp_path, monkeypatch, capsys):
    """N5 (review10): (a) a compile waited silently on a held lock; (b) Ctrl-C during the writability probe
    left .tgc-check-PID; (c) Ctrl-C after a file was set aside: no note; (d) the new kernel file took the mode
    of the file it displaced (0444); (e) a directory at a kernel's name failed after the manifest was written."""
    import fcntl

    from tgc.cli import outputs

    d = tmp_path / "d"
    write_dir(str(d), kernels("a"))
    fd = os.open(d / LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    t = threading.Thread(target=write_dir, args=(str(d), kernels("a")))
    t.start()
    time.sleep(emit.WAIT_NOTE_S + 0.5)
    os.close(fd)
    t.join(10)
    assert capsys.readouterr().err.count(f"waiting for another compile into {d}") == 1
    # (b)
    real_close = os.close

    def cut_close(f):
        real_close(f)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "close", cut_close)
    with pytest.raises(KeyboardInterrupt):
        outputs.file_creation_error(str(d))
    monkeypatch.setattr(os, "close", real_close)
    assert not [n for n in os.listdir(d) if n.startswith(".tgc-check-")]
    # (c), (d)
    (d / "00_a.ll").write_text("mine\n")
    os.chmod(d / "00_a.ll", 0o444)
    real_replace, n = os.replace, [0]

    def cut(a, b):
        n[0] += 1
        if n[0] == 2:  # (the manifest is renamed in, then the file is set aside, then Ctrl-C)
            raise KeyboardInterrupt
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        write_dir(str(d), kernels("a", text="new"))
    monkeypatch.setattr(os, "replace", real_replace)
    assert f"note: moved {d / '00_a.ll'} to {d / '00_a.ll.orig'}" in capsys.readouterr().err
    assert (d / "00_a.ll.orig").read_text() == "mine\n"
    (d / "00_b.ll").write_text("mine\n")
    os.chmod(d / "00_b.ll", 0o400)
    write_dir(str(d), kernels("b"))
    from tgc.files import default_mode

    assert (d / "00_b.ll.orig").stat().st_mode & 0o777 == 0o400
    assert (d / "00_b.ll").stat().st_mode & 0o777 == default_mode()
    # (e)
    (d / "00_c.ll").mkdir()
    before = {n: (d / n).read_bytes() for n in os.listdir(d) if (d / n).is_file()}
    with pytest.raises(TgcError) as e:
        write_dir(str(d), kernels("c"))
    assert e.value.kind == "user" and f"cannot write '{d / '00_c.ll'}': it is a directory" in e.value.msg
    assert {n: (d / n).read_bytes() for n in os.listdir(d) if (d / n).is_file()} == before


def test_a_compile_that_cannot_keep_its_key_says_so(tmp_path, monkeypatch):
    """Where tgc's cache directory cannot hold the key (a file in its place here), the manifest goes unsigned and
    a later compile sets the files aside instead of replacing them: the compile says why, once; with a key, no
    such note."""
    import pathlib
    import subprocess
    import sys

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("x")
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[N]\nreturn x * 2.0\n")

    def compile_into(cache) -> subprocess.CompletedProcess:
        env = {**os.environ, "TGC_CACHE_DIR": str(cache)}
        script = pathlib.Path(sys.executable).parent / "tgc"
        tgc_cmd = [str(script)] if script.exists() else [sys.executable, "-m", "tgc.cli.main"]
        return subprocess.run([*tgc_cmd, "compile", str(prog), "-o", str(tmp_path / "out")], env=env,
                              capture_output=True, text=True, timeout=120)

    first = compile_into(blocked / "cache")
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("could not keep its key") == 1 and "not-a-dir" in first.stderr
    again = compile_into(blocked / "cache")
    assert "set aside" in again.stderr or ".orig" in again.stderr  # (the unsigned files: not known as tgc's)
    fine = compile_into(tmp_path / "cache-ok")
    assert fine.returncode == 0 and "could not keep its key" not in fine.stderr
