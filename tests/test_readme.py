"""Every fenced code block of README.md and of every page of the documentation site (``docs/**/*.md``) is run here,
or marked with why not and which test covers it instead.

How a block is run, and the markers that change it, are in ``readme_blocks.py`` (beside this file). In short:
``fedsim`` commands (``bash`` blocks) run in a temporary folder with the installed ``fedsim``, each in its own
process, and must exit 0; a ``$ fedsim ...`` transcript runs the same way and every output line it shows must be
printed, in order (an error transcript: exactly, on stderr, with exit code 2); an output block is compared with
a real short run; ``python`` blocks are exec'd in a temporary folder (a ServerApp's ``main`` then runs on an
in-process grid); ``toml`` blocks are scenario fragments, merged into quickstart and loaded through the schema.
Runtime: about 55 s on the 2-core development machine, almost all of it the fedsim commands (the test prints
each command's time).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from readme_blocks import (
    MYPKG,
    ROOT,
    Block,
    apply_replacements,
    doc_files,
    read_blocks,
    run_fedsim,
    shell_commands,
    transcript,
    with_appends,
)

BLOCKS = [block for path in doc_files() for block in read_blocks(path=path)]
RUN = [b for b in BLOCKS if b.directive().kind != "skip"]
FEDSIM_BLOCKS = [b for b in RUN if b.lang == "bash" or b.directive().kind == "output"]
TRANSCRIPTS = [b for b in RUN if b.lang in ("", "console") and b.text.startswith("$ ")]
SHOWN_OUTPUT = [b for b in RUN if b.directive().kind == "output"]
PYTHON = [b for b in RUN if b.lang == "python"]
TOML = [b for b in RUN if b.lang == "toml"]
_ROW = re.compile(r"^round\s+(\d+)/(\d+) \|")
_NUMBER = r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?|inf|nan)"


def _id(block: Block) -> str:
    return block.name


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Flower stamps messages with the run's identity, which a SuperLink process sets; set it as one would."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)


# ------------------------------------------------------------------------------------------- every block
def test_every_block_is_run_here_or_marked_with_the_test_that_covers_it():
    assert len(BLOCKS) >= 10, "README.md and docs/ lost their code blocks?"
    handled = {id(b) for b in FEDSIM_BLOCKS + TRANSCRIPTS + PYTHON + TOML}
    for block in BLOCKS:
        d = block.directive()
        if d.kind == "skip":
            for ref in d.covered_by:
                path, _, test = ref.partition("::")
                assert (ROOT / path).is_file(), f"{block.where}: the marker names {path}, which is missing"
                if test:
                    assert re.search(rf"def {test}\(", (ROOT / path).read_text()), f"{ref} is not defined"
            continue
        assert id(block) in handled, (
            f"{block.where}: a {block.lang or 'plain'} block that no test runs: run it here or put a "
            "'<!-- readme-test: skip: WHY; covered by TEST -->' marker right before it"
        )
        if d.kind == "run" and block.lang == "bash":
            assert shell_commands(apply_replacements(block.text, d)), f"{block.where}: no commands"


# --------------------------------------------------------------------------------- fedsim commands (bash)
@pytest.fixture(scope="module")
def fedsim_results(request, tmp_path_factory) -> dict[str, list]:
    """The fedsim commands of the bash blocks, transcripts and output blocks that this session's selected tests ask
    for (all of them in a full run; a ``-k`` selection runs only its own), each block in its own folder; one runner
    for all of them (it imports fedsim and torch once)."""
    wanted = {
        item.callspec.params["block"].name
        for item in request.session.items
        if hasattr(item, "callspec") and isinstance(item.callspec.params.get("block"), Block)
    }
    commands, owners = [], []
    for block in FEDSIM_BLOCKS + TRANSCRIPTS:
        if block.name not in wanted:
            continue
        d = block.directive()
        cwd = tmp_path_factory.mktemp(block.name)
        for path, scenario in d.files.items():
            (cwd / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(_scenario_file(scenario), cwd / path)
        if d.page_folder:
            _replay_page(block, cwd)
        if block in TRANSCRIPTS:
            argvs = [transcript(apply_replacements(block.text, d))[0]]
        elif d.kind == "output":
            argvs = shell_commands(d.command)
        else:
            argvs = shell_commands(apply_replacements(block.text, d))
        for argv in argvs:
            commands.append((with_appends(argv, d), cwd))
            owners.append(block.name)
    results: dict[str, list] = {}
    for owner, res in zip(owners, run_fedsim(commands), strict=True):
        results.setdefault(owner, []).append(res)
        print(f"{owner}: {res.seconds:5.1f} s  exit {res.returncode}  {shlex.join(res.argv)}")
    return results


def _replay_page(block: Block, folder: Path) -> None:
    """What the blocks of ``block``'s page before it leave in the reader's folder (``in the page's folder``): each
    ``save as PATH`` block written to PATH, each other python block exec'd there, in page order."""
    cwd = Path.cwd()
    try:
        os.chdir(folder)
        for earlier in (b for b in BLOCKS if b.path == block.path and b.line < block.line):
            d = earlier.directive()
            if d.kind == "skip":
                continue
            if d.save_as:
                earlier.save(folder)
            elif earlier.lang == "python":
                earlier.exec()
    finally:
        os.chdir(cwd)


def _scenario_file(name: str) -> Path:
    import fedsim.scenarios

    return Path(fedsim.scenarios.__file__).parent / f"{name}.toml"


def test_the_fedsim_command_is_the_entry_point_the_runner_calls():
    """The runner calls ``fedsim.cli:main`` in a fork of one process: the installed ``fedsim`` script's target."""
    from importlib.metadata import distribution

    (script,) = [e for e in distribution("fedsim").entry_points if e.group == "console_scripts"]
    assert (script.name, script.value) == ("fedsim", "fedsim.cli:main")
    assert (Path(sys.executable).parent / "fedsim").is_file()


@pytest.mark.parametrize("block", [b for b in FEDSIM_BLOCKS if b.lang == "bash"], ids=_id)
def test_bash_block_runs(block, fedsim_results):
    results = fedsim_results[block.name]
    assert results
    for res in results:
        assert res.returncode == 0, f"{block.where}:\n{res.describe()}"
        assert "Traceback" not in res.stderr, res.describe()


@pytest.mark.parametrize("block", SHOWN_OUTPUT, ids=_id)
def test_shown_output_matches_a_real_run(block, fedsim_results):
    """The rows shown for rounds the short run reached must be printed exactly (but for the round total); every
    other line shown must have the same format (the same text, with any numbers) as a line the run printed."""
    (res,) = fedsim_results[block.name]
    assert res.returncode == 0, res.describe()
    printed = [line.rstrip() for line in res.stdout.splitlines()]
    rows = {int(m.group(1)): (line, m.group(2)) for line in printed if (m := _ROW.match(line))}
    assert rows, res.describe()
    checked_exactly = 0
    for shown in block.text.splitlines():
        if shown.strip() in ("", "..."):
            continue
        m = _ROW.match(shown)
        if m and int(m.group(1)) in rows:
            line, total = rows[int(m.group(1))]
            assert shown.replace(f"/{m.group(2)} |", f"/{total} |", 1) == line, f"{shown}\n{line}"
            checked_exactly += 1
            continue
        shape = _shape(shown)
        assert any(shape.fullmatch(line) for line in printed), (
            f"{block.where}: no printed line has the format of\n{shown}\nprinted:\n{res.stdout}"
        )
    assert checked_exactly >= 1, "the short run reached none of the rows shown"


def _shape(line: str) -> re.Pattern:
    """``line`` as a pattern: its numbers any numbers, its runs of spaces any runs of spaces."""
    pattern = ""
    for k, part in enumerate(re.split(rf"({_NUMBER})", line.strip())):
        if k % 2:
            pattern += _NUMBER
        else:
            pattern += "".join(r"\s+" if p.isspace() else re.escape(p) for p in re.split(r"(\s+)", part) if p)
    return re.compile(pattern)


@pytest.mark.parametrize("block", TRANSCRIPTS, ids=_id)
def test_transcript_prints_what_the_readme_shows(block, fedsim_results):
    """Every output line a ``$ fedsim ...`` block shows is printed, in this order (``...``: lines left out); an
    error is printed exactly as shown, on stderr, with exit code 2."""
    (res,) = fedsim_results[block.name]
    _, shown = transcript(block.text)
    if shown and shown[0].startswith("fedsim: error:"):
        assert res.returncode == 2, res.describe()
        assert res.stderr.rstrip("\n").splitlines() == shown, res.describe()
        return
    assert res.returncode == 0, res.describe()
    printed = [" ".join(line.split()) for line in res.stdout.splitlines()]
    k = 0
    for line in shown:
        want = " ".join(line.split())
        if want == "...":
            continue
        while k < len(printed) and printed[k] != want:
            k += 1
        assert k < len(printed), f"{block.where}: not printed (in this order):\n{line}\n---\n{res.stdout}"
        k += 1


# ------------------------------------------------------------------------------------------------- python
@pytest.mark.parametrize("block", PYTHON, ids=_id)
def test_python_block_runs(block, tmp_path, monkeypatch, capsys):
    d = block.directive()
    monkeypatch.chdir(tmp_path)
    if d.save_as:  # a file of the page's project (a module it then names by reference): importable from here
        block.save(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
    namespace = block.exec()
    if d.main_nodes:
        _run_server_app(namespace, d)
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    expected = [line.split("# prints: ", 1)[1] for line in block.text.splitlines() if "# prints: " in line]
    k = 0
    for want in expected:
        while k < len(printed) and printed[k] != want:
            k += 1
        assert k < len(printed), f"{block.where}: did not print {want!r}; printed {printed}"


def _run_server_app(namespace: dict, d) -> None:
    """The block's ``main(grid, context)`` on an in-process grid whose nodes run the shipped ClientApp."""
    from flwr.app import Context, RecordDict

    from fedsim.apps import client_app

    spec = importlib.util.spec_from_file_location("readme_loopback", ROOT / "tests" / "apps" / "loopback.py")
    loopback = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loopback)
    run_config = {k: _toml_value(v) for k, v in d.main_run_config.items()}
    grid = loopback.LoopbackGrid(client_app.app, d.main_nodes, run_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    namespace["main"](grid, context)
    rounds = {
        int(m.content["config"]["server-round"]) for m in grid.sent if m.metadata.message_type == "train"
    }
    assert rounds and max(rounds) <= int(run_config.get("num-server-rounds", max(rounds))), rounds
    assert grid.replies and not any(r.has_error() for r in grid.replies), [
        r.error.reason for r in grid.replies if r.has_error()
    ]


def _toml_value(text: str):
    return tomllib.loads(f"v = {text}")["v"] if re.fullmatch(r"[-+\d.e]+|true|false", text) else text


# --------------------------------------------------------------------------------------------------- toml
@pytest.mark.parametrize("block", TOML, ids=_id)
def test_toml_block_is_a_valid_scenario_fragment(block, tmp_path, monkeypatch):
    from fedsim.scenarios import load_scenario

    d = block.directive()
    fragment = tomllib.loads(block.text)
    assert fragment, "an empty toml block"
    if d.stand_ins:
        for path, source in MYPKG.items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
            monkeypatch.delitem(sys.modules, name)
    base = tomllib.loads(_scenario_file("quickstart").read_text())
    merged = {**base, **fragment}  # a fragment's sections replace quickstart's
    path = tmp_path / "fragment.toml"
    path.write_text(tomli_w.dumps(merged))
    scenario = load_scenario(str(path))
    for section, values in fragment.items():
        loaded = getattr(scenario, section)
        for key, value in values.items():
            if not isinstance(value, dict):
                assert getattr(loaded, key) == value, (section, key)
