"""The teacher pack keeps one time per lesson and leaves every lesson its time: the
agenda's table is the one place the times live; each lesson's opening line says the same;
each slot of both agendas is at least the lesson's teaching time plus its run time; the
README's lesson table names the lessons as the notebooks do and says which ones the
3-hour agenda holds."""
from __future__ import annotations

import math
import re

import pytest
from helpers import REPO

from kosmoss.lessons.course import LESSON_GLOB

AGENDA = REPO / "docs" / "teaching" / "agenda.md"
ROW = re.compile(r"^\| \[(\w+) — ([^\]]+)\]\(\.\./\.\./notebooks/([^)]+)\) \| (\d+) min \| "
                 r"([^|]+) \|", re.M)
SLOT = re.compile(r"^\| (\d+):(\d\d) \| ([^|]+) \|", re.M)
OPENING = re.compile(r"Time: ~(\d+) min; the cells run in ~(\d+) min on 2 CPU cores")


def _seconds(text: str) -> int:
    minutes = re.search(r"(\d+) min", text)
    seconds = re.search(r"(\d+) s\b", text)
    assert minutes or seconds, f"a run time such as '4 min 58 s', not {text!r}"
    return 60 * int(minutes.group(1) if minutes else 0) + int(seconds.group(1) if seconds else 0)


def costs() -> dict:
    """lesson id -> (title, notebook, teaching minutes, run minutes rounded up)."""
    table = AGENDA.read_text().split("## A 3-hour session")[0]
    return {lesson: (title, notebook, int(teach), math.ceil(_seconds(ran) / 60))
            for lesson, title, notebook, teach, ran in ROW.findall(table)}


def schedule(section: str) -> list:
    """(start minute, what) of every row of one agenda's table."""
    text = AGENDA.read_text().split(section)[1].split("\n## ")[0]
    return [(60 * int(h) + int(m), what.strip()) for h, m, what in SLOT.findall(text)]


def _title(name: str) -> str:
    heading = (REPO / "notebooks" / name).read_text().split("\n# # Lesson ", 1)[1]
    return heading.split("\n", 1)[0].split(" — ", 1)[1]


def test_the_agenda_has_every_lesson_once():
    lessons = sorted(p.name for p in (REPO / "notebooks").glob(LESSON_GLOB))
    assert sorted(notebook for _, notebook, _, _ in costs().values()) == lessons


@pytest.mark.parametrize("lesson", list(costs()))
def test_each_lesson_opens_with_the_agendas_times(lesson):
    title, notebook, teach, run = costs()[lesson]
    opening = OPENING.search((REPO / "notebooks" / notebook).read_text())
    assert opening, notebook
    assert (int(opening.group(1)), int(opening.group(2))) == (teach, run), \
        f"{notebook} says ~{opening.group(1)} and ~{opening.group(2)} min, the agenda {teach} " \
        f"and {run} (its run time rounded up)"
    assert _title(notebook).startswith(title), (title, _title(notebook))


@pytest.mark.parametrize("section", ["## A 3-hour session", "## A full day"])
def test_every_slot_leaves_a_lesson_its_teaching_and_its_run_time(section):
    rows = schedule(section)
    assert rows == sorted(rows), "the times go forward"
    by_id = costs()
    seen = 0
    for (start, what), (end, _) in zip(rows, rows[1:]):
        lesson = what.split(" — ", 1)[0]
        if lesson in by_id and " — " in what:
            _, _, teach, run = by_id[lesson]
            assert end - start >= teach + run, f"{section}: {what} has {end - start} min, " \
                f"needs {teach} to teach + {run} to run"
            seen += 1
    assert seen >= 6


def test_the_readme_table_names_the_lessons_and_the_3_hour_agenda():
    readme = (REPO / "README.md").read_text()
    table = readme.split("| lesson | what it covers | 3-hour agenda |")[1].split("\n\n")[0]
    rows = re.findall(r"^\| (\w+) ([^|]+?) \| [^|]+ \| (yes|full day) \|$", table, re.M)
    by_id = costs()
    short = {what.split(" — ", 1)[0] for _, what in schedule("## A 3-hour session")
             if " — " in what}
    assert [lesson for lesson, _, _ in rows] == list(by_id)
    for lesson, title, where in rows:
        assert _title(by_id[lesson][1]).startswith(title), (lesson, title)
        assert (where == "yes") == (lesson in short), (lesson, where)
