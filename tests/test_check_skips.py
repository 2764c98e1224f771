"""tools/check_skips.py: CI fails on a skip the machine does not explain (tools/ is not a
package: the script is loaded by path)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import load_script

check_skips = load_script(Path(__file__).parents[1] / "tools" / "check_skips.py", "check_skips")

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_device" name="test_on_gpu"><skipped type="pytest.skip"
 message="needs a CUDA device"/></testcase>
<testcase classname="tests.test_bench_cli" name="test_no_gpu"><skipped type="pytest.skip"
 message="needs a machine without a GPU"/></testcase>
<testcase classname="tests.test_gather" name="test_rows"><skipped type="pytest.skip"
 message="packdata._rowhash was not built (an install without a C compiler)"/></testcase>
<testcase classname="tests.test_tar" name="test_empty"><skipped type="pytest.xfail"
 message="a known bug"/></testcase>
<testcase classname="tests.test_ok" name="test_runs"/>
</testsuite></testsuites>
"""


def test_only_skips_the_hardware_explains_pass(tmp_path, capsys):
    report = tmp_path / "r.xml"
    report.write_text(REPORT)
    found = check_skips.skips(report)
    assert [test for test, _ in found] == ["tests.test_device::test_on_gpu",
                                           "tests.test_bench_cli::test_no_gpu",
                                           "tests.test_gather::test_rows"]  # not the xfail
    native = ("tests.test_gather::test_rows",
              "packdata._rowhash was not built (an install without a C compiler)")
    assert check_skips.unexpected(found, cuda=False) == [
        ("tests.test_bench_cli::test_no_gpu", "needs a machine without a GPU"), native]
    assert check_skips.unexpected(found, cuda=True) == [
        ("tests.test_device::test_on_gpu", "needs a CUDA device"), native]
    assert check_skips.main([str(report)]) == 1
    err = capsys.readouterr().err
    assert "unexpected skip: tests.test_gather::test_rows: packdata._rowhash was not built" in err
    report.write_text(REPORT.replace("packdata._rowhash was not built (an install without a C "
                                     "compiler)", "needs a CUDA device")
                      .replace("needs a machine without a GPU", "needs a CUDA device"))
    assert check_skips.unexpected(check_skips.skips(report), cuda=False) == []


def test_a_missing_report_fails(tmp_path, capsys):
    assert check_skips.main([str(tmp_path / "none.xml")]) == 1
    assert "no test report" in capsys.readouterr().err
