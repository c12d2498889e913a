"""The tuning report: report.md and a self-contained report.html whose images render in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from tune_helpers import PlantedBackend, tune_prompts

from sglang_specpilot.controller.tune_loop import TuneConfig, Tuner
from sglang_specpilot.controller.tune_profile import write
from sglang_specpilot.controller.tune_report import write_report

CFG = TuneConfig(rounds=2, candidates=8, blocks=20, screen_blocks=20, kinds=("gamma",))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune")
    b = PlantedBackend()
    res = Tuner(b, tune_prompts(3), tune_prompts(3, seed=7), out, CFG).run()
    return write_report(out, res, write(out, res, b.describe(), b.stock))


def test_report_md_and_html(report):
    md, page = report
    text = md.read_text()
    assert "## Ceiling per round" in text and "gamma=8" in text and "Sealed final" in text
    assert "no floors" in text  # the CPU run says its kernel factor is unavailable
    pytest.importorskip("matplotlib", reason="matplotlib not installed: the report has no images to check")
    assert page.read_text().count("data:image/png;base64,") == 4 and 'src="http' not in page.read_text()


def test_report_renders_in_headless_chromium(report, tmp_path):
    # CI (.ci/run) installs Debian's Chromium and sets SPECPILOT_REQUIRE_BROWSER: there a missing browser or
    # matplotlib fails this test instead of skipping it.
    required = os.environ.get("SPECPILOT_REQUIRE_BROWSER") == "1"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if required:
        import matplotlib  # noqa: F401  (the report's images)

        assert browser is not None, "SPECPILOT_REQUIRE_BROWSER=1 but no chromium on PATH"
    pytest.importorskip("matplotlib", reason="matplotlib not installed: the report has no images to check")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    _, page = report
    # A copy with a probe: after load, the body records how many images decoded with a nonzero width.
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", "<script>window.onload=()=>{const i=[...document.images];"
                     "document.body.setAttribute('data-ok', i.filter(x=>x.complete&&x.naturalWidth>0).length+'/'+"
                     "i.length)}</script></body>"))  # fmt: skip
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom",
         probe.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert 'data-ok="4/4"' in out.stdout, out.stderr[-2000:]
