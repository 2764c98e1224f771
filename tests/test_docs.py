"""Every shell command and Python snippet in README.md, docs/*.md and examples/README.md runs, on
tiny real data (tools/doc_snippets.py); blocks marked ``<!-- skip: … -->`` are reported with their reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import doc_snippets  # noqa: E402

DOCS = doc_snippets.doc_files(ROOT)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("path", DOCS, ids=[p.relative_to(ROOT).as_posix() for p in DOCS])
def test_documented_snippets_run(path, tmp_path):
    skipped = doc_snippets.run_file(path, tmp_path)
    for snippet, _command, reason in skipped:
        assert reason.strip(), f"{snippet.where}: a skip marker needs a reason"


def test_every_doc_has_runnable_snippets():
    ran = [s for p in DOCS for s in doc_snippets.extract(p) if not s.skip]
    assert {s.file.name for s in ran} >= {"README.md", "pointclouds.md", "text.md", "gpu.md"}
    assert sum(s.lang == "python" for s in ran) >= 4


def test_extract_reads_blocks_markers_and_continuations(tmp_path):
    md = tmp_path / "doc.md"
    md.write_text(
        "Text.\n\n```bash\npackdata inspect a.h5   # comment\npackdata convert ./x y.h5 \\\n"
        "    --points 8\n```\n\n<!-- skip: needs a GPU -->\n```python\nimport torch\n```\n\n"
        "<!-- skip-line pip install: network -->\n```sh\npip install packdata\necho ok\n```\n\n"
        "```\nnot a snippet\n```\n\n```text\nnor this\n```\n\n"
        "```console\n$ packdata inspect b.h5\nb.h5: 3 samples\n```\n\n"
        "<!-- skip-line packdata demo: minutes -->\n```bash\n"
        "packdata demo --workdir d && packdata convert d/png c.lmdb\npackdata convert x y '&&'\n```\n")
    first, second, third, fourth, fifth = doc_snippets.extract(md)
    assert (first.lang, first.line, first.skip) == ("bash", 3, None)
    assert doc_snippets.commands(first) == [("packdata inspect a.h5", None),
                                            ("packdata convert ./x y.h5 --points 8", None)]
    assert (second.lang, second.skip, second.code) == ("python", "needs a GPU", "import torch\n")
    assert doc_snippets.commands(third) == [("pip install packdata", "network"), ("echo ok", None)]
    assert doc_snippets.commands(fourth) == [("packdata inspect b.h5", None)]
    assert doc_snippets.commands(fifth) == [  # a && chain: its commands in order, one reason
        ("packdata demo --workdir d", "minutes"), ("packdata convert d/png c.lmdb", "minutes"),
        ("packdata convert x y '&&'", None)]  # a quoted && is an argument


def test_a_failing_snippet_names_its_file_line_and_command(tmp_path):
    md = tmp_path / "bad.md"
    md.write_text("```bash\npackdata inspect missing.h5\n```\n\n```python\nundefined_name\n```\n")
    with pytest.raises(doc_snippets.SnippetError, match=r"bad.md:1: `packdata inspect missing.h5`"):
        doc_snippets.run_file(md, tmp_path / "w1")
    md.write_text("```python\nx = undefined_name\n```\n")
    with pytest.raises(doc_snippets.SnippetError, match=r"(?s)bad.md:1: .*NameError.*undefined_name"):
        doc_snippets.run_file(md, tmp_path / "w2")


def test_the_gpu_doc_says_how_many_torch_threads_its_figures_used():
    doc = (ROOT / "docs" / "gpu.md").read_text()
    speed = doc.split("## Speed", 1)[1]
    assert "1\nintra-op thread in the main process" in speed or "1 intra-op thread" in speed
    assert "torch.set_num_threads(1)" in speed and "packdata sets no thread count" in speed
