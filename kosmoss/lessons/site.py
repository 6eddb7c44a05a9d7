"""The course as a static web site, and a machine made ready for a session.

    kosmoss lessons --site course-site                      # run every lesson now, then build
    kosmoss lessons --site course-site --executed DIR       # publish notebooks already run
    kosmoss lessons --prepare                               # datasets and caches, the day before
    python -c "from kosmoss.lessons.site import build; build('executed/', 'course-site')"

The site is one HTML page per lesson, named after its file
(``04_scaling_the_learning_rate.html``) with every output and plot, one page per Markdown
file of ``docs/`` (and the README), and ``index.html`` linking them all. It works offline,
opened as files: a lesson page is one self-contained file.

Why nbconvert's ``HTMLExporter``, not mkdocs-material + mkdocs-jupyter or jupyter-book: it
comes with JupyterLab (the lessons' own extra), renders outputs exactly as JupyterLab
shows them (its "lab" template and CSS), and needs no site generator, theme or config;
mkdocs-jupyter itself calls nbconvert per page, and both generators would add a Node- or
theme-sized dependency for a dozen pages. Its lab template loads require.js, MathJax,
Mermaid and the widget manager from CDNs: the lessons use none of them (no TeX, widgets
or diagrams), so :data:`TEMPLATE` drops those tags; CSS is inlined and plots are ``data:``
URIs. Markdown pages go through Python-Markdown (installed with tensorboard, a kosmoss
dependency).

Executions are reused, never repeated: :func:`build` takes executed notebooks (a folder
of ``.ipynb``, a list of files, or ``{name: NotebookNode}``), as the lesson tests or a
teacher's own run leave them. Exercise cells are shown as the learner gets them (the
skeleton, not the reference answer the tests put in) and checker cells without output.

Bad input: a non-empty ``--site`` folder that is not an earlier site (marked by
:data:`MARKER`) -> one line, exit 2, nothing written; a notebook whose cells did not all
run -> exit 2. A lesson with an error output fails the build (:class:`LessonFailed`, exit
1) naming the lesson and the cell; nothing is written then either.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import html
import json
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Union

from ..core.errors import Interrupted, RunFailed, UsageError
from ..core.files import atomic_write_json, check_writable

MARKER = ".kosmoss-site.json"
LESSON_PATTERN = re.compile(r"\A(?:executed-)?(\d\d[a-z]?_\w+)\.ipynb\Z")
EXECUTED_PREFIX = "executed-"  # how tests/lessons names the notebooks it ran
CELL_TIMEOUT_S = 600  # lesson 8's `kosmoss bench --quick` cell is the longest
# kosmoss is installed from its checkout, with the pinned CPU torch (README.md).
INSTALL_HINT = 'pip install torch==2.13.0 -e ".[lessons]" in the kosmoss checkout'
EXERCISE_MARK = re.compile(r"\A#\s*exercise:\s*(\S+)")
CHECKER_CALL = "from kosmoss.exercises import check"
# Where a relative link names a Markdown page, the site has its HTML page.
MD_LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|#|/)([^"#?]+)\.md(#[^"]*)?"')
# A link to a lesson's source (``../notebooks/04_x.py``) becomes its page, beside notebooks/.
LESSON_LINK = re.compile(r'<a href="((?:\.\./)*)notebooks/(\w+)\.py">(.*?)</a>', re.S)

# The lab template minus everything it would fetch from a CDN, plus the site's navigation.
TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">{{ resources.kosmoss_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}{{ resources.kosmoss_nav }}{%- endblock body_header -%}
{%- block body_footer -%}{{ resources.kosmoss_nav }}{{ super() }}{%- endblock body_footer -%}
"""
TEMPLATE_NAME = "kosmoss-site.html.j2"
CSS = """
.jp-RenderedText pre { white-space: pre; overflow-x: auto; }  /* tables scroll, not wrap */
nav.kosmoss-nav { font: 15px/1.6 system-ui, sans-serif; padding: 8px 0; margin: 0 auto;
  max-width: 60em; border-bottom: 1px solid #ddd; }
nav.kosmoss-nav a { margin-right: 1.5em; }
main.kosmoss-doc { font: 16px/1.55 system-ui, sans-serif; max-width: 60em; margin: 0 auto;
  padding: 0 1em 3em; color: #222; }
main.kosmoss-doc pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; }
main.kosmoss-doc code { font-size: 90%; }
main.kosmoss-doc table { border-collapse: collapse; }
main.kosmoss-doc th, main.kosmoss-doc td { border: 1px solid #ccc; padding: 3px 8px; }
main.kosmoss-doc img { max-width: 100%; }
"""
DOC_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<style type="text/css">{css}</style>
</head>
<body>
{nav}
<main class="kosmoss-doc">
{body}
</main>
</body>
</html>
"""


class LessonFailed(RunFailed):
    """A lesson's notebook holds an error output: the site would publish a broken lesson."""


@dataclass
class Site:
    folder: Path
    lessons: Dict[str, str] = field(default_factory=dict)  # lesson name -> page (relative)
    documents: Dict[str, str] = field(default_factory=dict)  # Markdown file -> page
    files: List[str] = field(default_factory=list)  # everything written, relative


# ------------------------------------------------------------------ building


def build(executed, out_dir, *, docs: Union[Path, str, None, bool] = True,
          flag: str = "--site", log: Callable[[str], None] = lambda line: None) -> Site:
    """Write the site for the ``executed`` lesson notebooks into ``out_dir``.

    ``executed``: a folder of ``.ipynb`` (``NN_name.ipynb`` or the lesson tests'
    ``executed-NN_name.ipynb``), a list of ``.ipynb`` files, or ``{name: NotebookNode}``.
    ``docs``: the repository whose ``docs/`` and README are published (True: this
    kosmoss's own; None/False: none). Everything is checked and rendered before any file
    is written or an earlier site removed."""
    out_dir = Path(out_dir)
    earlier = _claim(out_dir, flag)
    notebooks = load_executed(executed)
    for name, notebook in notebooks.items():
        check_executed(name, notebook)
    root = _docs_root(docs, log)
    documents = _documents(root)
    pages = _render_lessons(notebooks)
    pages.update(_render_documents(documents, notebooks))
    pages["index.html"] = _index(notebooks, documents)
    site = Site(out_dir, {name: f"{name}.html" for name in notebooks},
                {str(rel): _doc_page(rel) for rel in documents})
    try:
        site.files = _write(out_dir, pages, _assets(root), earlier)
    except OSError as err:
        raise RunFailed(f"{flag} {out_dir}: could not write {Path(err.filename or '?').name} "
                        f"({err.strerror or err}); the earlier site there is as it was: free "
                        "some space, then build it again") from None
    log(f"site: {len(notebooks)} lessons, {len(documents)} documents -> {out_dir / 'index.html'}")
    return site


def _claim(out_dir: Path, flag: str) -> List[str]:
    """The files of the earlier site in ``out_dir`` (none if it is new or empty); bad input
    when it is a file or a folder holding anything else."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{flag} {out_dir}: is a file; give a folder for the site")
    check_writable(out_dir, flag)
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return []
    marker = out_dir / MARKER
    if not marker.is_file():
        raise UsageError(f"{flag} {out_dir}: not empty and not a site kosmoss built (no "
                         f"{MARKER}); nothing changed: give a new or empty folder")
    try:
        return [str(name) for name in json.loads(marker.read_text())["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # a damaged marker: its own files are written over, nothing is removed


def load_executed(executed) -> Dict[str, object]:
    """``{lesson name: notebook}`` in lesson order, from a folder, files or a mapping."""
    import nbformat

    if isinstance(executed, Mapping):
        return dict(sorted(executed.items()))
    if isinstance(executed, (str, Path)) and not Path(executed).is_dir():
        raise UsageError(f"--executed {executed}: no such folder; give the folder holding the "
                         "executed lesson notebooks (.ipynb)")
    files = _lesson_files(Path(executed)) if isinstance(executed, (str, Path)) \
        else {_lesson_name(Path(f)): Path(f) for f in executed}
    if not files:
        raise UsageError(f"--executed {executed}: no lesson notebooks in it (NN_name.ipynb); "
                         "run the lessons there first, or leave --executed out to run them now")
    loaded = {}
    for name, file in sorted(files.items()):
        try:
            loaded[name] = nbformat.read(file, as_version=4)
        except (OSError, ValueError) as err:
            raise UsageError(f"--executed {file}: not a readable notebook ({err})") from None
    return loaded


def _lesson_files(folder: Path) -> Dict[str, Path]:
    """Each lesson's notebook in ``folder``; the lesson tests' ``executed-`` copy wins over
    the unexecuted ``.ipynb`` beside it."""
    files: Dict[str, Path] = {}
    for file in sorted(folder.glob("*.ipynb"), key=lambda f: f.name.startswith(EXECUTED_PREFIX)):
        match = LESSON_PATTERN.match(file.name)
        if match:
            files[match.group(1)] = file
    return files


def _lesson_name(file: Path) -> str:
    if file.suffix != ".ipynb":
        raise UsageError(f"--executed {file}: not a notebook (.ipynb)")
    return file.stem[len(EXECUTED_PREFIX):] if file.stem.startswith(EXECUTED_PREFIX) else file.stem


def check_executed(name: str, notebook) -> None:
    """A cell with an error output fails the lesson (:class:`LessonFailed`); a code cell
    that never ran is bad input (the notebook was not executed top to bottom)."""
    code_cells = [(number, cell) for number, cell in enumerate(notebook.cells, 1)
                  if cell.cell_type == "code"]
    for number, cell in code_cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                reason = (output.get("evalue") or "").strip().splitlines()[:1]
                raise LessonFailed(
                    f"lesson {name}: cell {number} ({_first_line(cell.source)}) failed: "
                    f"{output.get('ename')}: {''.join(reason)[:200]}")
    for number, cell in code_cells:
        if cell.source.strip() and cell.get("execution_count") is None:
            raise UsageError(f"lesson {name}: cell {number} ({_first_line(cell.source)}) did not "
                             "run; execute the whole lesson before publishing it")


def _first_line(source: str) -> str:
    line = next((line for line in source.splitlines() if line.strip()), "")
    return repr(line.strip()[:60])


# ------------------------------------------------------------------ lesson pages


def _render_lessons(notebooks: Dict[str, object]) -> Dict[str, str]:
    exporter = _exporter()
    titles = {name: lesson_title(notebook) or name for name, notebook in notebooks.items()}
    names = list(notebooks)
    pages = {}
    for index, name in enumerate(names):
        notebook = as_published(notebooks[name])
        notebook.metadata["title"] = titles[name]
        nav = _nav(".", _neighbours(names[index - 1] if index else None,
                                    names[index + 1] if index + 1 < len(names) else None, titles))
        resources = {"metadata": {"name": name}, "kosmoss_css": CSS, "kosmoss_nav": nav}
        body, _ = exporter.from_notebook_node(notebook, resources=resources)
        pages[f"{name}.html"] = _html_links(body, names)
    return pages


def _neighbours(previous: Optional[str], following: Optional[str],
                titles: Dict[str, str]) -> List[tuple]:
    """(text, page) of the lessons before and after one."""
    links = [(f"&larr; {html.escape(titles[previous])}", f"{previous}.html")] if previous else []
    if following:
        links.append((f"{html.escape(titles[following])} &rarr;", f"{following}.html"))
    return links


def _exporter():
    try:
        import jinja2
        from nbconvert import HTMLExporter
    except ImportError:
        raise UsageError(f"--site needs nbconvert: {INSTALL_HINT}") from None
    loader = jinja2.DictLoader({TEMPLATE_NAME: TEMPLATE})
    return HTMLExporter(template_name="lab", template_file=TEMPLATE_NAME, extra_loaders=[loader])


def as_published(notebook):
    """A copy of the executed lesson as a learner opens it: exercise cells hold the
    skeleton (tests run them with the reference answer), checker cells no verdict."""
    from ..exercises.core import find

    published = copy.deepcopy(notebook)
    for cell in published.cells:
        if cell.cell_type != "code":
            continue
        mark = EXERCISE_MARK.match(cell.source)
        if mark:
            try:
                cell.source = find(mark.group(1)).skeleton.rstrip("\n")
            except UsageError:
                pass  # an exercise the catalogue does not know: shown as it ran
            cell.outputs = []
        elif cell.source.lstrip().startswith(CHECKER_CALL):
            cell.outputs = []
    return published


def lesson_title(notebook) -> Optional[str]:
    """"Lesson 4 — Scaling the learning rate": the first heading of the first Markdown cell."""
    return _in_opening(notebook, r"(?m)^#\s+(.+)$", group=1)


def lesson_time(notebook) -> Optional[str]:
    """The lesson's own "Time: ~N min; ..." line."""
    return _in_opening(notebook, r"(?m)^Time: .+$")


def _in_opening(notebook, pattern: str, group: int = 0) -> Optional[str]:
    """What ``pattern`` finds in the lesson's first Markdown cell, or None."""
    opening = next((cell for cell in notebook.cells if cell.cell_type == "markdown"), None)
    found = re.search(pattern, opening.source) if opening is not None else None
    return found.group(group).strip() if found else None


def _nav(to_root: str, links: Iterable[tuple] = ()) -> str:
    """The bar on top of every page: the index, then (text, page) links beside it."""
    anchors = [f'<a href="{to_root}/index.html">Course index</a>']
    anchors += [f'<a href="{to_root}/{page}">{text}</a>' for text, page in links]
    return f'<nav class="kosmoss-nav">{" ".join(anchors)}</nav>'


def _html_links(page: str, published: Iterable[str]) -> str:
    """Links to Markdown files and lessons, pointed at their pages; a link to a lesson this
    site does not publish is left as its text."""
    published = set(published)

    def lesson_page(link) -> str:
        prefix, name, text = link.groups()
        return f'<a href="{prefix}{name}.html">{text}</a>' if name in published else text

    page = LESSON_LINK.sub(lesson_page, page)
    return MD_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', page)


# ------------------------------------------------------------------ documents


def _docs_root(docs, log: Callable[[str], None]) -> Optional[Path]:
    """The repository folder whose docs/ and README.md are published."""
    if docs is None or docs is False:
        return None
    if docs is True:
        from .course import source_root

        root = source_root()
        if not (root / "docs").is_dir():
            log(f"no docs/ beside the lessons in {root}: the site has the lessons only")
            return None
        return root
    return Path(docs)


def _documents(root: Optional[Path]) -> Dict[Path, Path]:
    """Relative page source -> file: README.md and every Markdown file under docs/."""
    if root is None:
        return {}
    found = {Path(file.relative_to(root)): file for file in sorted((root / "docs").rglob("*.md"))}
    if (root / "README.md").is_file():
        found = {Path("README.md"): root / "README.md", **found}
    return found


def _doc_page(rel: Path) -> str:
    return str(Path(rel).with_suffix(".html"))


def _render_documents(documents: Dict[Path, Path], lessons: Iterable[str]) -> Dict[str, str]:
    import markdown

    pages = {}
    for rel, file in documents.items():
        text = file.read_text()
        body = markdown.markdown(text, extensions=["extra", "sane_lists", "toc"])
        heading = re.search(r"(?m)^#\s+(.+)$", text)
        title = heading.group(1).strip() if heading else rel.stem
        to_root = os.path.relpath(".", rel.parent)
        pages[_doc_page(rel)] = _html_links(DOC_PAGE.format(
            title=html.escape(title.replace("`", "")), css=CSS, body=body, nav=_nav(to_root)),
            lessons)
    return pages


def _assets(root: Optional[Path]) -> Dict[str, Path]:
    """Files the documents link to (figures, tables): everything under docs/ but Markdown."""
    if root is None:
        return {}
    return {str(file.relative_to(root)): file for file in sorted((root / "docs").rglob("*"))
            if file.is_file() and file.suffix != ".md"}


def _index(notebooks: Dict[str, object], documents: Dict[Path, Path]) -> str:
    lessons = "\n".join(
        f'<li><a href="{name}.html">{_inline(lesson_title(nb) or name)}</a>'
        f'<br><small>{html.escape(lesson_time(nb) or "")}</small></li>'
        for name, nb in notebooks.items())
    teaching = [rel for rel in documents if rel.parts[:2] == ("docs", "teaching")]
    reference = [rel for rel in documents if rel not in teaching]
    sections = [f"<h1>kosmoss — the course</h1>\n<h2>Lessons</h2>\n<ol>\n{lessons}\n</ol>"]
    for heading, group in (("For the teacher", teaching), ("Documents", reference)):
        if group:
            items = "\n".join(f'<li><a href="{_doc_page(rel)}">{_inline(_doc_title(documents[rel]))}</a>'
                              f" <small>({rel})</small></li>" for rel in group)
            sections.append(f"<h2>{heading}</h2>\n<ul>\n{items}\n</ul>")
    return DOC_PAGE.format(title="kosmoss — the course", css=CSS, nav="",
                           body="\n".join(sections))


def _inline(title: str) -> str:
    """A Markdown title as HTML: escaped, its `code` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(title))


def _doc_title(file: Path) -> str:
    heading = re.search(r"(?m)^#\s+(.+)$", file.read_text())
    return heading.group(1).strip() if heading else file.stem


# ------------------------------------------------------------------ writing


def _replace_earlier_site(out_dir: Path, earlier: Iterable[str]) -> None:
    """Remove the files the earlier site listed (and only those, inside ``out_dir``)."""
    root = out_dir.resolve()
    for rel in earlier:
        target = (out_dir / rel).resolve()
        if target.is_relative_to(root) and target != root and target.is_file():
            target.unlink()


def _write(out_dir: Path, pages: Dict[str, str], assets: Dict[str, Path],
           earlier: Iterable[str]) -> List[str]:
    """Every file is written beside its name first; only when all are written is the earlier
    site removed and the new one renamed into place: a disk that fills keeps the earlier."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: Dict[str, Path] = {}
    try:
        for rel, text in pages.items():
            staged[rel] = _staged(out_dir / rel, lambda tmp: tmp.write_text(text, "utf-8"))
        for rel, source in assets.items():
            staged[rel] = _staged(out_dir / rel, lambda tmp: shutil.copyfile(source, tmp))
    except OSError:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise
    _replace_earlier_site(out_dir, earlier)
    for rel, tmp in staged.items():
        os.replace(tmp, out_dir / rel)
    files = sorted(staged)
    atomic_write_json(out_dir / MARKER, {"built_by": "kosmoss lessons --site", "files": files})
    return files


def _staged(target: Path, write: Callable[[Path], object]) -> Path:
    """``target``'s content written to a temporary file beside it (removed if that fails)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        err.filename = str(target)
        raise
    return tmp


# ------------------------------------------------------------------ executing


def execute_notebook(path: Path, *, timeout: int = CELL_TIMEOUT_S):
    """Run one notebook top to bottom in its own folder with this Python's kernel. A failing
    cell stops it and keeps its error output, which :func:`check_executed` then names."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(path, as_version=4)
    client = _stopping_client(NotebookClient)(
        notebook, kernel_name="python3", timeout=timeout,
        resources={"metadata": {"path": str(Path(path).parent)}})
    try:
        client.execute()
    except CellExecutionError:
        pass  # the cell's error output says what failed; the build reports it
    except Interrupted:
        client.end_kernel()
        raise
    return notebook


def _stopping_client(base):
    """nbclient answers Ctrl-C or SIGTERM by shutting the kernel down and going on: the
    lesson fails and the next one starts (``NotebookClient.async_setup_kernel``). Here the
    signal stops the command, and :meth:`end_kernel` shuts the kernel down."""

    class StoppingClient(base):
        async def async_start_new_kernel(self, **kwargs):
            # nbclient sets its handlers just before starting the kernel: replaced here, not
            # once the kernel is ready, a signal while it starts would leave execute() with
            # no client (nbclient's handler drops it) and fail on an assert, not stop
            loop = asyncio.get_running_loop()
            for number in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(number, _stop, number)
            await super().async_start_new_kernel(**kwargs)

        def end_kernel(self) -> None:
            """SIGKILL to the kernel's process group (what its cells started too): shut down
            politely mid-cell, ipykernel printed a ZMQ traceback after the command's line.
            Then what nbclient's exit handler would do at exit (a private name of nbclient
            0.11, guarded by tests/site/test_site.py)."""
            atexit.unregister(self._cleanup_kernel)
            group = getattr(getattr(self.km, "provisioner", None), "pgid", None)
            if group:  # jupyter_client starts each kernel in a session of its own
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
            if self.km is not None:
                # A stop while the kernel started leaves jupyter_client's ready future settled
                # (its in_pending_state wrapper): the shutdown then fails to record its own
                # error, after nbclient's cleanup_resources ran and the group was killed above.
                with contextlib.suppress(asyncio.InvalidStateError):
                    self._cleanup_kernel()

    return StoppingClient


def _stop(number: int) -> None:
    raise Interrupted(number)


def execute_lessons(names: Optional[Iterable[str]] = None, *, timeout: int = CELL_TIMEOUT_S,
                    log: Callable[[str], None] = print) -> Dict[str, object]:
    """Run lessons (all by default; names like ``01_context_and_data``) in a fresh working
    folder made as ``kosmoss lessons`` makes it, in this KOSMOSS_HOME; notebooks and the
    seconds each took (``notebook.metadata["kosmoss"]["seconds"]``)."""
    from .course import bundle, copy_lessons, lesson_sources, source_root, to_ipynb

    available = [lesson.stem for lesson in lesson_sources()]
    wanted = list(names) if names is not None else available
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise UsageError(f"no lesson named {', '.join(unknown)}: choose from {', '.join(available)}")
    executed = {}
    with tempfile.TemporaryDirectory(prefix="kosmoss-site-") as work:
        copy_lessons(Path(work), bundle(source_root(), to_ipynb))
        for name in wanted:
            started = time.monotonic()
            log(f"running {name} ...")
            executed[name] = execute_notebook(Path(work) / f"{name}.ipynb", timeout=timeout)
            seconds = round(time.monotonic() - started, 1)
            executed[name].metadata["kosmoss"] = {"seconds": seconds}
            log(f"  {name}: {seconds:.0f} s")
    return executed


def site_command(site: Path, executed: Optional[Path], log: Callable[[str], None] = print) -> Site:
    """``kosmoss lessons --site DIR [--executed FOLDER]``: publish the notebooks in FOLDER,
    or run every lesson first (the course's whole run time) when FOLDER is not given."""
    from .course import lesson_sources

    _claim(Path(site), "--site")  # refuse a wrong folder before running anything
    _exporter()
    notebooks = load_executed(executed) if executed is not None else execute_lessons(log=log)
    built = build(notebooks, site, log=log)
    missing = [lesson.stem for lesson in lesson_sources() if lesson.stem not in notebooks]
    if missing:
        log(f"  not in {executed}, so not on the site: {', '.join(missing)}")
    return built


# ------------------------------------------------------------------ before a session


@dataclass(frozen=True)
class LessonDataset:
    name: str  # folder under $KOSMOSS_HOME/data, as the lessons ask for it
    source: Callable[[], object]  # a ColumnSource
    shard_size: int


def lesson_datasets() -> List[LessonDataset]:
    """Every dataset the lessons open, with the request they make (tests/site checks this
    list against the notebooks' code)."""
    from ..data.presets import PRESETS
    from ..data.sources import SyntheticSource

    presets = [LessonDataset(name, PRESETS[name].source, PRESETS[name].shard_size)
               for name in ("tiny", "small")]  # tiny: most lessons and bench --quick; small: 2
    lesson04 = LessonDataset("lesson04-levels30", lambda: SyntheticSource(32_768, levels=30), 8192)
    return presets + [lesson04]


def prepare_for_lessons(log: Callable[[str], None] = print) -> None:
    """Make every dataset and cache the lessons need, so that the first cells of a session
    do not prepare them on every laptop at once. Datasets already there are kept."""
    from ..core import paths
    from ..data.store import prepare

    for dataset in lesson_datasets():
        started = time.monotonic()
        prepared = prepare(dataset.source(), paths.data_root() / dataset.name, dataset.shard_size)
        state = "already there" if prepared.reused else \
            f"prepared in {time.monotonic() - started:.0f} s"
        log(f"dataset {dataset.name}: {state} ({prepared.path})")
    log(f"matplotlib font cache: {_font_cache()}")


def _font_cache() -> str:
    """Build matplotlib's font list (its first import in a kernel otherwise does, slowly)."""
    import matplotlib
    from matplotlib import font_manager

    return f"{len(font_manager.fontManager.ttflist)} fonts listed in {matplotlib.get_cachedir()}"
