"""Importing kosmoss does nothing: no folders, no config, no logging handlers."""
import subprocess
import sys


def test_import_has_no_side_effects(tmp_path):
    home = tmp_path / "home"
    code = ("import logging, kosmoss, kosmoss.cli, kosmoss.run, kosmoss.model, kosmoss.data.store;"
            "print(len(logging.getLogger().handlers))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"KOSMOSS_HOME": str(home), "HOME": str(tmp_path / "user"),
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0"
    assert not home.exists() and not (tmp_path / "user" / ".kosmoss").exists()


def test_home_follows_the_environment(monkeypatch, tmp_path):
    from kosmoss.core import paths

    monkeypatch.setenv("KOSMOSS_HOME", str(tmp_path))
    assert paths.runs_root() == tmp_path / "runs"
    monkeypatch.delenv("KOSMOSS_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "u"))
    assert paths.data_root() == tmp_path / "u" / ".kosmoss" / "data"
