"""The command line, end to end, including the README's commands."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from typer.main import get_command
from typer.testing import CliRunner

from packdata.cli import app
from tests.conftest import fifo_folder

runner = CliRunner()


def fresh_python(script: str, *args: str, timeout: float = 60, **env: str
                 ) -> subprocess.CompletedProcess:
    """``script`` run by a fresh interpreter from the repository root, as a command line starts:
    its output captured; ``env`` added to the environment."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env}, cwd=Path(__file__).parents[1])


def test_convert_and_inspect(tmp_path, png_folder):
    out = tmp_path / "c.lmdb"
    result = runner.invoke(app, ["convert", str(png_folder), str(out), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "120 image samples (lmdb)" in result.output
    result = runner.invoke(app, ["inspect", str(out), "--json"])
    info = json.loads(result.stdout)
    assert info["count"] == 120 and info["fields"]["image"]["shape"] == [3, 32, 32]
    assert info["classes"][0] == "airplane" and info["bytes_on_disk"] > 120 * 3072
    grid = tmp_path / "grid.png"
    result = runner.invoke(app, ["inspect", str(out), "--preview", str(grid)])
    assert result.exit_code == 0 and "samples" in result.stdout
    with Image.open(grid) as im:
        assert im.size == (8 * 34, 8 * 34)


def test_cli_errors_are_one_line_not_tracebacks(tmp_path, png_folder):
    out = tmp_path / "c.h5"
    assert runner.invoke(app, ["convert", str(png_folder), str(out)]).exit_code == 0
    result = runner.invoke(app, ["convert", str(png_folder), str(out)])
    assert result.exit_code == 2 and "pass --overwrite" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["inspect", str(png_folder)])
    assert result.exit_code == 2 and "not a packdata dataset" in result.output
    lmdb = tmp_path / "c.lmdb"
    assert runner.invoke(app, ["convert", str(png_folder), str(lmdb)]).exit_code == 0
    for inside in (lmdb / "data.mdb", lmdb / "records.npz"):  # the folder is the dataset
        result = runner.invoke(app, ["inspect", str(inside)])
        assert result.exit_code == 2 and result.output.strip() == (
            f"error: {inside}: a file inside the packdata dataset {lmdb}; open {lmdb}")
    result = runner.invoke(app, ["convert", str(png_folder), str(tmp_path / "x.h5"),
                                 "--encoding", "keep", "--resize", "16"])
    assert result.exit_code == 2 and "--resize needs --encoding raw" in result.output


def folder_with_a_broken_png(tmp_path: Path, png_folder: Path, name: str) -> Path:
    """Five real PNGs and one that is not."""
    folder = tmp_path / "f"
    folder.mkdir()
    for p in sorted(png_folder.glob("*.png"))[:5]:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / name).write_bytes(b"\x89PNG garbage")
    return folder


def test_convert_flags_are_the_kinds_options(tmp_path, png_folder):
    """Every kind's OPTIONS is a `packdata convert` flag, and a flag reaches the source."""
    from packdata import sources

    declared = {o.flag for k in sources.KINDS for o in sources.get(k).OPTIONS}
    from packdata.cli.app import build_convert

    command = build_convert()
    flags = {f for p in command.params for f in p.opts}
    assert declared <= flags, declared - flags
    assert {"--mode", "--labels", "--dtype"} <= declared  # e.g. mode was once library-only
    out = tmp_path / "grey.h5"
    result = runner.invoke(app, ["convert", str(png_folder), str(out), "--mode", "L",
                                 "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)[
        "fields"]["image"]["shape"] == [32, 32]
    result = runner.invoke(app, ["convert", str(png_folder), str(tmp_path / "t.h5"), "--per-line"])
    assert result.exit_code == 2 and "option --per-line does not apply to image" in result.output


def test_skip_lists_bad_inputs(tmp_path, png_folder):
    folder = folder_with_a_broken_png(tmp_path, png_folder, "broken.png")
    result = runner.invoke(app, ["convert", str(folder), str(tmp_path / "o"), "--on-error", "skip"])
    assert result.exit_code == 0 and "skipped 1 input:" in result.output
    assert "broken.png" in result.output
    from packdata.describe import lines

    assert "skipped inputs" in runner.invoke(app, ["inspect", str(tmp_path / "o")]).stdout
    info = json.loads(runner.invoke(app, ["inspect", str(tmp_path / "o"), "--json"]).stdout)
    assert [s["path"] for s in info["skipped"]] == [str(folder / "broken.png")]
    assert dict(lines(info))["skipped inputs"] == \
        f"1: {folder / 'broken.png'} (not an image format Pillow recognises)"


def test_a_bad_choice_or_a_bad_input_is_one_line_saying_what_to_do(tmp_path, png_folder):
    """A choice outside an option's table is the library's one line (not typer's box); a bad
    input under the default --on-error fail says how to skip it."""
    result = runner.invoke(app, ["convert", str(png_folder), str(tmp_path / "x.h5"),
                                 "--encoding", "jpeg"])
    assert result.exit_code == 2
    assert result.output == "error: --encoding 'jpeg': expected one of raw, keep\n"
    folder = folder_with_a_broken_png(tmp_path, png_folder, "broken.png")
    result = runner.invoke(app, ["convert", str(folder), str(tmp_path / "y.h5")])
    assert result.exit_code == 2 and "(--on-error skip skips bad inputs and lists them)" in \
        result.output.splitlines()[-1]


def test_error_messages_keep_brackets_in_paths(tmp_path, png_folder):
    """Rich markup must not eat '[red]' from a file name, nor '[lidar]' from an install hint."""
    folder = folder_with_a_broken_png(tmp_path, png_folder, "photo[red].png")
    result = runner.invoke(app, ["convert", str(folder), str(tmp_path / "o.h5")])
    assert result.exit_code == 2 and "photo[red].png" in result.output


def test_help_teaches():
    result = runner.invoke(app, ["convert", "--help"])
    assert result.exit_code == 0
    for option in ("--format", "--workers", "--encoding", "--resize", "--labels", "--on-error",
                   "--overwrite", "--shard-size"):
        assert option in result.output


def test_demo_runs(tmp_path):
    result = runner.invoke(app, ["demo", "--count", "600", "--seconds", "0.05",
                                 "--json", str(tmp_path / "d.json")])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "d.json").read_text())["rows"]
    names = ["per-file PNG Dataset", "packdata lmdb", "packdata hdf5", "packdata tar",
             "numpy array in RAM"]
    assert [r["name"] for r in rows] == names
    rate = {r["name"]: r["samples_per_s"] for r in rows}
    # the demo's point, by a margin no busy machine erases: a batched read of raw pixels against
    # a PIL open + PNG decode per sample (about 100× here)
    for container in ("lmdb", "hdf5", "tar"):
        assert rate[f"packdata {container}"] > 5 * rate["per-file PNG Dataset"]
    for r in rows:
        assert f"{r['samples_per_s']:,.0f}" in result.output  # the table shows what the JSON has


def test_demo_compares_each_rate_with_the_per_file_and_in_ram_rates(tmp_path, monkeypatch):
    """Known rates in place of the measurements (by what each measures: the per-file
    DataLoader, packdata.loader, the in-RAM batches): the ratios are hand counts."""
    from torch.utils.data import DataLoader

    from packdata import demo
    from packdata.bench.baselines import InMemoryBatches
    from packdata.loading.loader import Loader

    known = {DataLoader: 2_000.0, Loader: 500_000.0, InMemoryBatches: 1_000_000.0}
    monkeypatch.setattr(demo, "sample_rate", lambda make, **_: known[type(make())])
    rows = demo.run_demo(count=40, workdir=tmp_path, log=lambda _: None)["rows"]
    assert [(r["name"], r["vs_per_file"], r["vs_ram"]) for r in rows] == [
        ("per-file PNG Dataset", 1.0, 0.002), ("packdata lmdb", 250.0, 0.5),
        ("packdata hdf5", 250.0, 0.5), ("packdata tar", 250.0, 0.5),
        ("numpy array in RAM", 500.0, 1.0)]


def test_readme_quickstart_matches_ci():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    block = re.search(r"## Quickstart\n.*?```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2
    assert commands[1] in (root / ".ci" / "run").read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("moment", ["typer", "numpy", "packdata.cli", "h5py"])
def test_ctrl_c_at_any_moment_is_one_line(tmp_path, png_folder, moment):
    """SIGINT to the process group (as a terminal's Ctrl-C) right after a module finished
    importing (-X importtime reports each): while starting up, or converting (h5py loads when the
    first record is written: past one worker task of images). One line, status 130, never a
    traceback, never ignored."""
    folder = fifo_folder(tmp_path / "in", png_folder, count=300 if moment == "h5py" else 4)
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "packdata", "convert", str(folder),
         str(tmp_path / "o.h5"), "--workers", "1"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        cwd=Path(__file__).parents[1],
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("import time:") and line.rsplit("|", 1)[1].strip() == moment:
            break
    else:
        pytest.fail(f"never imported {moment}: {''.join(seen[-5:])}")
    os.killpg(proc.pid, signal.SIGINT)
    said = [line for line in proc.stderr if not line.startswith("import time:") and line.strip()]
    assert proc.wait() == 130, said
    assert len(said) == 1 and said[0].startswith("interrupted"), said
    assert not (tmp_path / "o.h5").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_an_interrupt_out_of_evaluated_source_still_exits_130(tmp_path):
    """A KeyboardInterrupt raised inside code run from a string (a dataclass or namedtuple being
    built while a module imports, when Ctrl-C lands there) leaves CPython set to end a
    ``python -m`` process by SIGINT once it exits; the command line's status stays 130."""
    (tmp_path / "interrupted_command.py").write_text(
        "import sys\n"
        "import packdata.cli\n"
        "from packdata import __main__ as command_line\n"
        "def interrupted_while_importing():\n"
        "    exec('raise KeyboardInterrupt')\n"
        "packdata.cli.run = interrupted_while_importing\n"
        "sys.exit(command_line.main())\n"
    )
    done = subprocess.run([sys.executable, "-m", "interrupted_command"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (130, "interrupted\n")


def test_an_interrupt_python_swallowed_still_counts():
    """A KeyboardInterrupt raised inside a finaliser is dropped by Python ("Exception ignored");
    the command line still notices it at its next check."""
    script = (
        "import gc, os, signal\n"
        "from packdata import interrupts\n"
        "interrupts.install()\n"
        "class Finalised:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "Finalised()\n"
        "gc.collect()\n"
        "print('still running')\n"
        "interrupts.check()\n"
    )
    done = fresh_python(script)
    assert "still running" in done.stdout and "Exception ignored" in done.stderr
    assert done.returncode != 0 and done.stderr.rstrip().endswith("KeyboardInterrupt")


HELPED = ["convert", "inspect", "verify", "bench", "demo", "check-resume", "index"]
#: every command's --help in one fresh interpreter, each after a line naming it
HELPS = ("import sys\nfrom packdata.__main__ import main\n"
         "for command in sys.argv[1:]:\n"
         "    print(f'=== {command}', flush=True)\n"
         "    sys.argv = ['packdata', command, '--help']\n"
         "    try:\n        main()\n    except SystemExit:\n        pass\n")


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """``packdata COMMAND --help`` as a CI log shows it: 80 columns, no terminal."""
    done = fresh_python(HELPS, *HELPED, timeout=120, COLUMNS="80")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    parts = out.split("=== ")[1:]
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


@pytest.mark.parametrize("command", HELPED)
def test_help_at_80_columns_is_whole(command, helps):
    """No help text is cut (Rich puts … where a word does not fit), the usage line names the
    arguments as the help does, and Rich markup in help texts is not eaten."""
    text = helps[command]
    assert "…" not in text
    usage = next(line for line in text.splitlines() if "Usage:" in line).split()
    assert "{" not in " ".join(usage)
    assert usage[-2:] == (["SRC", "DST"] if command == "convert" else
                          [command, "[OPTIONS]"] if command == "demo" else ["[OPTIONS]", "DATASET"])
    if command == "bench":
        assert '"packdata[plot]"' in text
    if command == "convert":
        assert "xyz,intensity" in text and "--max-size" in text
        workers = text[text.index("--workers"):text.index("--on-error")]
        assert "the cores this process may use" in workers and "[default" not in workers


def test_flags_follow_the_library_tables():
    """convert's own flags are packdata.convert's keywords, with its defaults; bench's are
    run_bench's options (a keyword it does not know is refused, as Python would)."""
    import inspect

    from packdata.bench.settings import OPTIONS as BENCH
    from packdata.bench.suite import run_bench
    from packdata.cli.app import build_convert
    from packdata.conversion.dispatch import convert
    from packdata.conversion.settings import OPTIONS

    keywords = inspect.signature(convert).parameters
    assert {o.name: o.default for o in OPTIONS} == {
        o.name: keywords[o.name].default for o in OPTIONS}
    flags = {f for p in build_convert().params for f in p.opts}
    assert {"--format", "-f", "--on-error", "--part-size"} <= flags
    bench = get_command(app).commands["bench"]
    assert {o.flag for o in BENCH} <= {f for p in bench.params for f in p.opts}
    assert "--cold" in {f for p in bench.params for f in p.secondary_opts}
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['crop'\\]"):
        run_bench("any", crop="center-crop:224")


def test_packdata_help_lists_every_command_without_importing_torch():
    script = ("import sys\nfrom packdata.__main__ import main\nsys.argv = ['packdata', '--help']\n"
              "status = main()\nprint('torch loaded:', 'torch' in sys.modules)\n")
    done = fresh_python(script, timeout=120, COLUMNS="80")
    assert "torch loaded: False" in done.stdout, done.stdout + done.stderr
    panel = done.stdout.split("Commands")[1].splitlines()
    listed = [line.split()[1] for line in panel if line.startswith("│ ") and line[2] != " "]
    assert listed[:7] == ["convert", "inspect", "verify", "check-resume", "index", "demo",
                          "bench"]


def test_plurals_and_whole_numbers_in_messages(tmp_path, png_folder):
    import warnings

    import packdata
    from packdata.describe import number as _number
    from packdata.errors import InputWarning
    from packdata.resume_check import ScenarioResult, format_row

    (tmp_path / "in").mkdir()
    for png in sorted(png_folder.glob("*.png"))[:3]:
        (tmp_path / "in" / png.name).write_bytes(png.read_bytes())
    (tmp_path / "in" / "notes.txt").write_text("not an image")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        packdata.open_source(tmp_path / "in").items()
    said = " ".join(str(w.message) for w in caught)
    assert "ignored 1 file of another kind than image" in said and "1 files" not in said
    assert " 1 trial " in format_row(ScenarioResult(name="s", trials=1))
    assert " 2 trials " in format_row(ScenarioResult(name="s", trials=2))
    assert (_number(1024.0), _number(1024.5), _number(12)) == ("1,024", "1,024.5", "12")


def test_no_command_takes_keyword_arguments_as_typer_reads_it():
    """typer before 0.29 refuses a command whose signature has **kwargs (``Type not yet
    supported: typing.Any``), and builds every command of the group for any command run: one
    such signature broke the whole command line there. Read in a fresh process, as a command
    line starts (convert's full flags are built later, when it runs)."""
    code = ("import inspect; from packdata.cli.app import app\n"
            "calls = [c.callback for c in app.registered_commands]\n"
            "kinds = {c.__name__: [str(p.kind) for p in inspect.signature(c).parameters.values()]"
            " for c in calls}\n"
            "print([n for n, k in kinds.items() if 'VAR_KEYWORD' in k], len(kinds))")
    out = fresh_python(code)
    assert out.stdout.split() == ["[]", "7"], out.stdout + out.stderr  # 7 commands, none


def test_what_finalisers_raise_after_an_interrupt_is_not_shown():
    """An interrupt cuts library code short anywhere (a ZipFile half made, at a SIGTERM during
    a tar index's writing); what its finaliser then raises is the interrupt's doing and is not
    shown after the command's one line. Before an interrupt it is reported as Python does."""
    script = (
        "import gc, os, signal\n"
        "from packdata import interrupts\n"
        "interrupts.install()\n"
        "class HalfMade:\n"
        "    def __del__(self):\n"
        "        raise AttributeError('before')\n"
        "HalfMade(); gc.collect()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "HalfMade.__del__ = lambda self: (_ for _ in ()).throw(AttributeError('after'))\n"
        "HalfMade(); gc.collect()\n"
        "print('done')\n"
    )
    done = fresh_python(script)
    assert "done" in done.stdout
    assert "AttributeError: before" in done.stderr and "after" not in done.stderr
