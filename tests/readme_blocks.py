"""The fenced code blocks of README.md and of every page of the documentation site (``docs/**/*.md``), the markers
that say how each is run, and a fast runner for ``fedsim`` commands.

Used by ``tests/test_readme.py``. A block is run as written unless the line right before it (blank lines aside)
is a marker, an HTML comment that neither GitHub nor the built site shows. A MyST directive (a fence whose info
string is ``{name}``, such as ``{toctree}``) is markup, not an example, and is not a block here.

``<!-- readme-test: skip: WHY; covered by PATH[::TEST], ... -->``
    not run here; each PATH must exist (and each TEST be defined in it).
``<!-- readme-test: run; CLAUSE; CLAUSE ... (REMARK) -->``
    run, changed only as the clauses say:

    - ``append `ARGS` to fedsim SUB``: ARGS go after every ``fedsim SUB ...`` command of the block;
    - ``replace `OLD` with `NEW```: in the block's text, before it is run;
    - ``write PATH as scenario NAME``: the shipped scenario NAME is copied to PATH first (a file the block names);
    - ``then main(grid, context) on N LoopbackGrid nodes with run config `k=v ...```: a Python block that defines
      a ServerApp; its ``main`` is then called on ``tests/apps/loopback.py``'s in-process grid of N nodes, each the
      shipped ClientApp, with that run config;
    - ``with stand-ins for mypkg``: a TOML block naming a user's package; ``mypkg`` (:data:`MYPKG`) is importable;
    - ``save as PATH``: a ``python`` or ``toml`` block that is a file of the page's project (a tutorial's model
      factory, its scenario); a python block is also exec'd, a toml block also checked as a fragment;
    - ``in the page's folder``: a ``bash`` block run where the page's earlier blocks left their work: each earlier
      ``save as`` block written to its PATH, each earlier python block without one exec'd there, in page order;
      a command may start with ``PYTHONPATH=.`` (paths relative to that folder), as the page tells the reader to;
    - a final ``(REMARK)`` says why, for the reader.
``<!-- readme-test: output of `COMMAND`; CLAUSE ... -->``
    a block that shows output only: COMMAND (after the clauses) is run and its output compared with the block.

A ``bash`` block is a list of ``fedsim`` commands (``\\`` continues a line, ``#`` starts a comment); a block whose
first line starts with ``$ `` is a transcript: the command, then its output. A ``python`` block's ``# prints: X``
lines are lines it must print. A ``toml`` block is a scenario fragment: its sections replace quickstart's.

``fedsim`` commands go to :func:`run_fedsim`: one process imports the installed ``fedsim`` (the console script's
``fedsim.cli:main``) once and forks a child per command, which runs ``main(argv)`` with its own stdout, stderr and
exit code. That keeps each command in its own process without paying torch's import for each (2-4 s here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def doc_files() -> list[Path]:
    """README.md and every Markdown page of the site (the build folder aside), in a fixed order."""
    pages = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
    return [README, *pages]


_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!-- readme-test: (.*) -->$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

#: the stand-in user package a scenario fragment may name (``with stand-ins for mypkg``): file -> source
MYPKG = {
    "mypkg/__init__.py": "",
    "mypkg/models.py": (
        "import math\n\nfrom torch import nn\n\n\n"
        "def resnet_gn(input_shape, num_classes, width=16):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.GroupNorm(4, width),\n"
        "                         nn.ReLU(), nn.Linear(width, num_classes))\n"
    ),
    "mypkg/losses.py": (
        "import torch.nn.functional as F\n\n\n"
        "def focal(outputs, targets):\n"
        "    return F.cross_entropy(outputs, targets, reduction='none')\n"
    ),
    "mypkg/data.py": (
        "import numpy as np\n\n\n"
        "def load(num_clients, seed, root):\n"
        "    rng = np.random.default_rng(seed)\n"
        "    return {'x': rng.normal(size=(20 * num_clients, 8)).astype('float32'),\n"
        "            'y': rng.integers(0, 4, size=20 * num_clients)}\n"
    ),
}


@dataclass
class Directive:
    """What a block's marker says (no marker: ``run`` as written)."""

    kind: str = "run"  # run | skip | output
    text: str = ""
    covered_by: list[str] = field(default_factory=list)
    command: str = ""  # output of `COMMAND`
    appends: dict[str, list[str]] = field(default_factory=dict)
    replaces: list[tuple[str, str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    main_nodes: int = 0
    main_run_config: dict[str, str] = field(default_factory=dict)
    stand_ins: bool = False
    save_as: str = ""
    page_folder: bool = False


@dataclass
class Block:
    lang: str
    text: str
    line: int  # the opening fence's line number (1-based)
    marker: str | None
    section: str
    path: Path = README

    @property
    def where(self) -> str:
        """``docs/how-to/sweeps.md:12``: the file (relative to the repository) and the opening fence's line."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def name(self) -> str:
        page = self.path.relative_to(ROOT).with_suffix("").as_posix().removeprefix("docs/").replace("/", ".")
        return f"{page}-L{self.line}-{self.lang or 'text'}"

    def directive(self) -> Directive:
        return parse_marker(self.marker) if self.marker is not None else Directive()

    def save(self, folder: Path) -> None:
        """A ``save as PATH`` block written to ``folder / PATH``, as the page shows it (the reader's file)."""
        path = folder / self.directive().save_as
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text)

    def exec(self) -> dict:
        """A python block exec'd in the current folder, with its marker's replacements; its namespace."""
        namespace = {"__name__": f"docs_{self.line}"}
        exec(compile(apply_replacements(self.text, self.directive()), self.where, "exec"), namespace)
        return namespace


def read_blocks(text: str | None = None, path: Path = README) -> list[Block]:
    """Every fenced block of ``path`` (README.md by default; ``text`` in its place if given), with the marker right
    before it (if any) and its section heading. MyST directives are left out (see the module docstring)."""
    lines = (path.read_text() if text is None else text).splitlines()
    out: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"#{1,6} ", line):
            section = line.lstrip("#").strip()
        m = _FENCE.match(line)
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path.relative_to(ROOT)}:{start + 1}: code block never closed")
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = _MARKER.match(lines[j].strip()) if j >= 0 else None
        if not m.group(1).startswith("{"):
            text_ = "\n".join(body) + "\n"
            out.append(
                Block(m.group(1), text_, start + 1, marker.group(1) if marker else None, section, path)
            )
        i += 1
    return out


def _split_clauses(text: str) -> tuple[list[str], str]:
    """``a; b; c (remark)`` -> ``[a, b, c]``, ``remark`` (``;`` inside backticks or the remark does not split)."""
    remark = ""
    m = re.search(r"\s\(([^`]*)\)$", text)
    if m:
        remark, text = m.group(1), text[: m.start()]
    clauses, cur, quoted = [], "", False
    for ch in text:
        if ch == "`":
            quoted = not quoted
        if ch == ";" and not quoted:
            clauses.append(cur.strip())
            cur = ""
        else:
            cur += ch
    clauses.append(cur.strip())
    return [c for c in clauses if c], remark


def parse_marker(text: str) -> Directive:
    d = Directive(text=text)
    if text.startswith("skip"):
        d.kind = "skip"
        m = re.search(r"covered by (.+)$", text)
        if not m:
            raise ValueError(f"a skip marker must say which test covers the block: {text!r}")
        d.covered_by = re.findall(
            r"(?:tests|scripts|benchmarks)/[\w/.-]+\.(?:py|sh)(?:::\w+)?|\.ci/run", m.group(1)
        )
        if not d.covered_by:
            raise ValueError(f"no test path after 'covered by' in {text!r}")
        return d
    clauses, _remark = _split_clauses(text)
    head = clauses.pop(0)
    if head == "run":
        d.kind = "run"
    elif m := re.fullmatch(r"output of `([^`]+)`", head):
        d.kind, d.command = "output", m.group(1)
    else:
        raise ValueError(f"marker must start with 'run', 'skip' or 'output of `COMMAND`': {text!r}")
    for clause in clauses:
        if m := re.fullmatch(r"append `([^`]*)` to fedsim (\w+)", clause):
            d.appends.setdefault(m.group(2), []).extend(shlex.split(m.group(1)))
        elif m := re.fullmatch(r"replace `([^`]+)` with `([^`]*)`", clause):
            d.replaces.append((m.group(1), m.group(2)))
        elif m := re.fullmatch(r"write (\S+) as scenario (\S+)", clause):
            d.files[m.group(1)] = m.group(2)
        elif m := re.fullmatch(
            r"then main\(grid, context\) on (\d+) LoopbackGrid nodes with run config `([^`]*)`", clause
        ):
            d.main_nodes = int(m.group(1))
            d.main_run_config = dict(item.split("=", 1) for item in shlex.split(m.group(2)))
        elif clause == "with stand-ins for mypkg":
            d.stand_ins = True
        elif m := re.fullmatch(r"save as (\S+)", clause):
            d.save_as = m.group(1)
        elif clause == "in the page's folder":
            d.page_folder = True
        else:
            raise ValueError(f"unknown clause {clause!r} in marker {text!r}")
    return d


def apply_replacements(text: str, d: Directive) -> str:
    for old, new in d.replaces:
        if old not in text:
            raise ValueError(f"marker replaces {old!r}, which the block does not contain")
        text = text.replace(old, new)
    return text


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped, blank lines skipped."""
    joined: list[str] = []
    cur = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        joined.append(cur + line)
        cur = ""
    if cur:
        joined.append(cur)
    return [argv for line in joined if (argv := shlex.split(line, comments=True))]


def transcript(text: str) -> tuple[list[str], list[str]]:
    """A ``$ command`` block: (argv, the output lines shown after it)."""
    lines = text.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("$ "), "a transcript starts with '$ '"
    cmd = lines[0][2:]
    k = 1
    while cmd.rstrip().endswith("\\"):
        cmd = cmd.rstrip()[:-1] + " " + lines[k].strip()
        k += 1
    return shlex.split(cmd), lines[k:]


def with_appends(argv: list[str], d: Directive) -> list[str]:
    """``argv`` with the marker's ``append ... to fedsim SUB`` arguments for its subcommand."""
    env = argv[:1] if argv and argv[0].startswith("PYTHONPATH=") else []
    command = argv[len(env) :]
    if len(command) >= 2 and command[0] == "fedsim" and command[1] in d.appends:
        return [*env, *command, *d.appends[command[1]]]
    return list(argv)


def clean(text: str) -> str:
    return _ANSI.sub("", text)


# ---------------------------------------------------------------------------------------------- the runner
@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float = 0.0

    def describe(self) -> str:
        return f"$ {shlex.join(self.argv)}\n-> exit {self.returncode}\n{self.stdout}\n{self.stderr}"


def run_fedsim(commands: list[tuple[list[str], Path]], timeout: float | None = None) -> list[Result]:
    """Run ``fedsim`` commands in order, each ``(argv, cwd)`` in its own forked process (see the module docstring).

    The runner sets ``OMP_NUM_THREADS=1`` unless it is set: on a small machine shared with other work, torch's
    thread pool spinning against other processes made the same commands 3-20x slower (the printed numbers do not
    depend on it: the README's rows, from 1-CPU Ray workers, are compared exactly)."""
    # a budget per command (the site's pages have dozens; a few sweeps take minutes on a loaded 2-core machine)
    timeout = timeout if timeout is not None else 300.0 + 120.0 * len(commands)
    for argv, _ in commands:
        argv = argv[1:] if argv and argv[0].startswith("PYTHONPATH=") else argv
        if not argv or argv[0] != "fedsim":
            raise ValueError(f"only fedsim commands run here, not {shlex.join(argv)!r}")
    with tempfile.TemporaryDirectory(prefix="readme-run-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"commands": [(a, str(cwd)) for a, cwd in commands], "out": tmp}))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(
            [sys.executable, __file__, str(job)], capture_output=True, text=True, timeout=timeout, env=env
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the fedsim runner failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        codes = json.loads((Path(tmp) / "codes.json").read_text())
        return [
            Result(
                argv,
                codes[k],
                clean((Path(tmp) / f"{k}.out").read_text(errors="replace")),
                clean((Path(tmp) / f"{k}.err").read_text(errors="replace")),
                codes[len(commands) + k],
            )
            for k, (argv, _) in enumerate(commands)
        ]


def _child(argv: list[str], cwd: str, out: str, err: str) -> int:
    """``[PYTHONPATH=P] fedsim ARGS`` in ``cwd``: P's folders (relative to ``cwd``) go first on ``sys.path``, where
    the engines hand it to their workers, as the variable would for a fresh ``fedsim`` process."""
    from fedsim.cli import main

    os.chdir(cwd)
    if argv[0].startswith("PYTHONPATH="):
        paths = [os.path.abspath(p) for p in argv.pop(0).split("=", 1)[1].split(os.pathsep) if p]
        sys.path[:0] = paths
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    argv = argv[1:]  # "fedsim"
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["fedsim", *argv]
    try:
        return int(main(argv) or 0)
    except SystemExit as exc:  # argparse's own errors
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1


def _serve(job_path: str) -> None:
    import traceback

    job = json.loads(Path(job_path).read_text())
    # what the commands import, imported once before the forks (the console script imports fedsim.cli:main)
    import flwr_datasets.partitioner  # noqa: F401
    import sklearn.datasets  # noqa: F401

    import fedsim.cli
    import fedsim.engine.runner
    import fedsim.report.privacy
    import fedsim.scenarios
    import fedsim.sweep  # noqa: F401
    from fedsim.report.plots import pyplot

    plt = pyplot()
    fig = plt.figure()  # font cache and renderer warmed once, not in every run's plots
    fig.text(0.5, 0.5, "warm-up")
    fig.canvas.draw()
    plt.close(fig)

    codes, seconds = [], []
    for k, (argv, cwd) in enumerate(job["commands"]):
        out, err = (os.path.join(job["out"], f"{k}.{s}") for s in ("out", "err"))
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = _child(argv, cwd, out, err)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
        seconds.append(round(time.monotonic() - start, 2))
    Path(job["out"], "codes.json").write_text(json.dumps(codes + seconds))


if __name__ == "__main__":
    _serve(sys.argv[1])
