"""The macro-action page in a real browser: headless Chromium (Debian's ``chromium``) loads the page
``python -m marlhf.view`` writes, and the DOM and a screenshot show every macro action. Skipped where
no Chromium is installed (``apt-get install chromium``)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from marlhf.inference.macro_view import write_macro_page
from marlhf.macro.config import MacroConfig
from marlhf.macro.render import macro_groups

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
)  # fmt: skip

ITEMS = [
    {"prompt": "POST\nMy cat <Tom> & me\nTL;DR: ",
     "pieces": ["my", " cat", " <Tom>", " &", " me", "[EOS]"],
     "macro_end": [False, True, False, False, True, True], "reward": 0.5},
    {"prompt": "POST\nDog\nTL;DR: ", "pieces": ["dog", " barks", " at", " night"],
     "macro_end": [False, False, False, True], "reward": None},
]  # fmt: skip


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """Run headless Chromium with a fresh profile; fails the test on a non-zero exit."""
    profile = tmp_path / "profile"
    proc = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


class _Spans(HTMLParser):
    """The text of each ``span.ma`` of a DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[str] = []
        self._inside = False

    def handle_starttag(self, tag, attrs):
        if tag == "span" and ("class", "ma") in attrs:
            self._inside = True
            self.spans.append("")

    def handle_endtag(self, tag):
        if tag == "span":
            self._inside = False

    def handle_data(self, data):
        if self._inside:
            self.spans[-1] += data


def test_page_renders_every_macro_action(tmp_path):
    page = write_macro_page(
        str(tmp_path / "v.html"), ITEMS, MacroConfig(ngram=2), "run_config.json"
    )
    dom = chromium(tmp_path, "--dump-dom", f"file://{page}").stdout
    spans = _Spans()
    spans.feed(dom)
    # independent reference: the macro actions joined from the items' pieces
    want = ["".join(it["pieces"][s:e]) for it in ITEMS for s, e in macro_groups(it["macro_end"])]
    assert spans.spans == want  # escaped text ("<Tom>", "&") comes back as written
    assert "fixed n=2" in dom and "rule from run_config.json" in dom


def test_screenshot_shows_both_macro_colours(tmp_path):
    from PIL import Image

    page = write_macro_page(str(tmp_path / "v.html"), ITEMS, MacroConfig(ngram=2))
    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=900,500", f"file://{page}")
    colours = {c for _, c in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)}
    assert (0xCD, 0xEF, 0xFD) in colours and (0xFD, 0xE9, 0xB5) in colours  # the two backgrounds


def test_page_shows_controls_as_escapes_and_ends_with_the_histogram(tmp_path):
    items = [{"prompt": "q", "pieces": ["gnp\u202e", ".exe", " \x1b[2J"],
              "macro_end": [False, True, True], "reward": None}]  # fmt: skip
    page = write_macro_page(str(tmp_path / "v.html"), items, MacroConfig(ngram=2))
    dom = chromium(tmp_path, "--dump-dom", f"file://{page}").stdout
    spans = _Spans()
    spans.feed(dom)
    assert spans.spans == ["gnp\\u202e.exe", " \\x1b[2J"]
    assert "\u202e" not in dom and "\x1b" not in dom
    assert dom.rstrip().endswith("</body></html>") and "<img" in dom.split("</span>")[-1]
    assert 'src="data:image/png;base64,' in dom
