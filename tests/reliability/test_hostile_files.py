"""Files a user names that are not what they seem: a FIFO, a device, a folder, a huge file
to read; a read-only or full disk to write to. Each is one line naming the flag, nothing
hangs, memory does not grow, and nothing the user had is lost. The disks are real tmpfs
mounts (root), so the errors are the kernel's own."""
import errno
import json
import os

import pytest

from helpers import fill_up, one_device_run, resize_tmpfs, small_tmpfs
from kosmoss.commands import bench, check, comm, lessons, project, stacks
from kosmoss.core import files
from kosmoss.core.errors import EXIT_FAILURE, EXIT_USAGE, RunFailed
from kosmoss.lessons.course import MANIFEST, bundle, source_root, to_ipynb
from kosmoss.scaling import projection

COMMANDS = {"bench": bench.main, "comm": comm.main, "project": project.main,
            "lessons": lessons.main, "stacks": stacks.main}


def _exit(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own errors exit from inside the parser
        return stop.code


def _one_line(capsys, main, argv, code=EXIT_USAGE) -> str:
    assert _exit(main, argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def hostile(tmp_path):
    """name -> a path that is not a regular file (or is one, far too large)."""
    fifo = tmp_path / "comm.fifo"
    os.mkfifo(fifo)
    (tmp_path / "folder.json").mkdir()
    return {"FIFO": fifo, "device": "/dev/zero", "folder": tmp_path / "folder.json"}


@pytest.mark.timeout(60)  # a FIFO read would wait for a writer forever
@pytest.mark.parametrize("kind, why", [("FIFO", "a FIFO, not a regular file"),
                                       ("device", "a device, not a regular file"),
                                       ("folder", "a folder, not a regular file")])
def test_read_json_reads_only_regular_files(hostile, kind, why):
    with pytest.raises(ValueError, match=why):
        files.read_json(hostile[kind])


def test_read_json_stops_at_its_limit_and_reads_what_fits(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 4096}))
    with pytest.raises(ValueError, match="over .* MiB, too large"):
        files.read_json(big, limit=4096)
    assert files.read_json(big, limit=8192) == {"x": "y" * 4096}
    with pytest.raises(FileNotFoundError):
        files.read_json(tmp_path / "missing.json")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["FIFO", "device", "folder"])
def test_project_comm_that_is_no_file_is_one_line(capsys, hostile, kind):
    path = hostile[kind]
    err = _one_line(capsys, project.main, ["--comm", str(path), "--intra", "pcie4"])
    assert f"--comm {path}: not readable (a " in err and "give kosmoss comm's comm.json" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, why", [("FIFO", "a FIFO, not a regular file"),
                                       ("device", "a device, not a regular file"),
                                       ("folder", "a folder, not a regular file")])
def test_check_notebook_that_is_no_file_is_one_line(capsys, hostile, kind, why):
    """It said "no such file" of each (a FIFO was safe only by that check's luck)."""
    path = hostile[kind]
    err = _one_line(capsys, check.main, ["--notebook", str(path), "01"])
    assert f"--notebook {path}: {why}; give the lesson's .ipynb or .py" in err


def test_check_notebook_of_any_json_is_one_line(capsys, tmp_path):
    """A notebook cut short, edited by hand, or not one: ``{}`` and ``{"cells": [5]}``
    were tracebacks (jupytext does not validate what it reads)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    cell = st.fixed_dictionaries({"cell_type": st.sampled_from(["code", "markdown", 7]),
                                  "source": leaves | st.just("# exercise: 01.x\n")})
    documents = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                             | st.dictionaries(st.sampled_from(["cells", "metadata",
                                                                "nbformat", "x"]), inner,
                                               max_size=3), max_leaves=8) \
        | st.fixed_dictionaries({"cells": st.lists(cell | leaves, max_size=3)},
                                optional={"nbformat": st.sampled_from([4, "4", None]),
                                          "nbformat_minor": st.integers(0, 6),
                                          "metadata": st.just({})})
    path = tmp_path / "01_context_and_data.ipynb"

    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(documents)
    def check_one(document):
        path.write_text(json.dumps(document))
        err = _one_line(capsys, check.main, ["--notebook", str(path), "01"])
        assert err.startswith("kosmoss check: error: "), err

    check_one()


@pytest.mark.timeout(60)
def test_project_from_a_fifo_result_is_one_line(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "result.json")
    err = _one_line(capsys, project.main, ["--from", str(run), "--intra", "pcie4"])
    assert f"--from {run}: no result.json or bench.json there" in err


OUT_FLAGS = [("bench", ["--quick", "--only", "raw-cpu"], "--out"),
             ("comm", ["--ranks", "2", "--sizes", "1K", "2K"], "--out"),
             ("project", ["--intra", "pcie4", "--device", "cpu"], "--out"),
             ("lessons", [], "--dest"),
             ("stacks", [], "--out")]


@pytest.mark.parametrize("command, argv, flag", OUT_FLAGS)
@pytest.mark.parametrize("disk, why", [("read-only", "{mount} is on a read-only file system"),
                                       ("full", "the disk holding {mount} is full")])
def test_an_output_folder_on_a_disk_that_takes_no_writes_is_refused_first(
        capsys, tmp_path, command, argv, flag, disk, why):
    with small_tmpfs(tmp_path / "disk", read_only=disk == "read-only",
                     full=disk == "full") as mount:
        before = sorted(mount.iterdir())
        out = mount / "out"
        err = _one_line(capsys, COMMANDS[command], [*argv, flag, str(out)])
        assert f"{flag} {out}: {why.format(mount=mount)}" in err, err
        assert sorted(mount.iterdir()) == before  # refused before anything was measured


@pytest.mark.parametrize("command, argv, flag", OUT_FLAGS)
@pytest.mark.parametrize("kernel", ["/proc", "/sys"])
def test_an_output_folder_on_a_kernel_file_system_is_refused_first(capsys, command, argv, flag,
                                                                   kernel):
    out = f"{kernel}/kosmoss-out"  # root passes os.access there; statvfs says "0 B free"
    err = _one_line(capsys, COMMANDS[command], [*argv, flag, out])
    assert f"{flag} {out}: {kernel} is on a kernel file system" in err, err


MARKED_OUT = [("bench", ["--quick", "--only", "raw-cpu"], "bench.json"),
              ("comm", ["--ranks", "2", "--sizes", "1K", "2K"], "comm.json"),
              ("project", ["--intra", "pcie4", "--device", "cpu"], "project.json")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command, argv, marker", MARKED_OUT)
@pytest.mark.parametrize("content, why", [
    ('{"my": "settings"}', "was not written by kosmoss (no kosmoss_"),
    ("{}", "was not written by kosmoss (no kosmoss_"),
    ("{broken", "cannot be read (Expecting property name"),
    ("[1, 2]", "cannot be read (it holds a JSON list"),
    (None, "cannot be read (a FIFO, not a regular file)")])
def test_an_output_folder_whose_marker_is_not_ours_is_refused(capsys, tmp_path, command, argv,
                                                              marker, content, why):
    """A folder holding a file of the marker's name was taken for an earlier output: the
    user's own comm.json (or one that no longer reads) and its neighbours, written over."""
    out = tmp_path / "mine"
    out.mkdir()
    if content is None:
        os.mkfifo(out / marker)
    else:
        (out / marker).write_text(content)
    (out / marker.replace(".json", ".csv")).write_text("my table")
    before = {path.name: path.is_file() and path.read_text() for path in out.iterdir()}
    err = _one_line(capsys, COMMANDS[command], [*argv, "--out", str(out)])
    assert f"--out {out}: its {marker} {why}" in err, err
    assert {path.name: path.is_file() and path.read_text() for path in out.iterdir()} == before


@pytest.fixture
def one_gpu_run(tmp_path, monkeypatch):
    """A 1-GPU run to project from, and step timings that do not depend on the machine."""
    monkeypatch.setattr(projection, "time_step", lambda batch, *a, **k: (0.01, 0.001))
    return one_device_run(tmp_path / "run", 1024)


def test_a_disk_that_fills_before_the_projection_is_written_keeps_the_earlier_one(
        capsys, tmp_path, monkeypatch, one_gpu_run):
    argv = ["--from", str(one_gpu_run), "--intra", "pcie4", "--devices", "1", "2", "--json"]
    with small_tmpfs(tmp_path / "disk", size_kib=1024) as disk:
        assert project.main([*argv, "--out", str(disk / "out")]) == 0
        earlier = {p.name: p.read_bytes() for p in (disk / "out").iterdir()}
        capsys.readouterr()
        monkeypatch.setattr(files, "MIN_FREE_BYTES", 0)  # the disk fills after the check
        fill_up(disk)
        code = _exit(project.main, [*argv, "--devices", "1", "4", "--out", str(disk / "out")])
        out, err = capsys.readouterr()
        assert code == EXIT_FAILURE and err.count("\n") == 1, err
        assert f"--out {disk / 'out'}: could not write project" in err
        assert "No space left on device" in err and "the results are printed above" in err
        assert json.loads(out)["rows"]  # the projection the user waited for is not lost
        assert {p.name: p.read_bytes() for p in (disk / "out").iterdir()} == earlier


def _whole(dest, shipped):
    """Every lesson file in ``dest`` is absent or exactly what kosmoss ships."""
    present = {name: (dest / name).read_bytes() for name in shipped if (dest / name).exists()}
    return all(content == shipped[name] for name, content in present.items()), len(present)


def test_lessons_copied_onto_a_disk_that_fills_are_whole_and_the_next_copy_finishes(
        capsys, tmp_path, monkeypatch):
    shipped = bundle(source_root(), to_ipynb if lessons.installed("jupytext") else None)
    size = sum(map(len, shipped.values()))
    monkeypatch.setattr(files, "MIN_FREE_BYTES", 0)
    with small_tmpfs(tmp_path / "disk", size_kib=size // 2 // 1024) as disk:
        dest = disk / "lessons"
        code = _exit(lessons.main, ["--dest", str(dest)])
        err = capsys.readouterr().err
        assert code == EXIT_FAILURE and err.count("\n") == 1, err
        assert f"--dest {dest}: could not write " in err and "every lesson there is whole" in err
        whole, copied = _whole(dest, shipped)
        assert whole and 0 < copied < len(shipped)
        assert not [p for p in dest.rglob(".*.tmp-*")]  # no temporary file left
        resize_tmpfs(disk, 4 * size // 1024)
        assert lessons.main(["--dest", str(dest)]) == 0
        out = capsys.readouterr().out
        assert "kept" not in out  # a lesson cut short is not taken for the learner's own
        assert _whole(dest, shipped) == (True, len(shipped)) and (dest / MANIFEST).is_file()


def test_an_error_that_is_not_about_the_disk_still_names_the_file(tmp_path):
    def broken(tmp):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(RunFailed) as failed:
        with files.writing_into(tmp_path, "--out"):
            files.atomic_write_with(tmp_path / "bench.png", broken)
    assert str(failed.value).startswith(f"--out {tmp_path}: could not write bench.png "
                                        "(Input/output error)")
    assert not list(tmp_path.iterdir())


def test_stacks_that_cannot_be_written_are_printed_instead(capsys, tmp_path, monkeypatch):
    """A hung run's stacks may not come again: a disk that fills after the check loses none."""
    from types import SimpleNamespace

    from kosmoss.diagnose import runs
    from kosmoss.diagnose import stacks as diagnose_stacks

    found = SimpleNamespace(run=SimpleNamespace(run_id="r1"), processes=[1, 2])
    monkeypatch.setattr(diagnose_stacks, "find_py_spy", lambda: "py-spy")
    monkeypatch.setattr(runs, "resolve", lambda run: run)
    monkeypatch.setattr(diagnose_stacks, "collect", lambda *a, **k: found)
    monkeypatch.setattr(diagnose_stacks, "render_text", lambda result: "rank 0: in all_reduce\n")
    monkeypatch.setattr(files, "MIN_FREE_BYTES", 0)  # the disk fills after the check
    with small_tmpfs(tmp_path / "disk", full=True) as disk:
        code = _exit(stacks.main, ["--out", str(disk / "stacks.txt")])
        out, err = capsys.readouterr()
        assert code == EXIT_FAILURE and err.count("\n") == 1, err
        assert f"--out {disk / 'stacks.txt'}: could not write it (No space left on device)" in err
        assert out == "rank 0: in all_reduce\n" and not (disk / "stacks.txt").exists()
