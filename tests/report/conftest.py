"""A real headless browser for the HTML reports: Debian's Chromium driven by playwright.

``make test`` installs both when it can; where either is missing, or Chromium will not
start, the browser tests are skipped with a line that says which and how to install it.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """``$SHARDLAB_CHROMIUM``, else the first Chromium on PATH."""
    env = os.environ.get("SHARDLAB_CHROMIUM", "").strip()
    if env:
        return env if Path(env).is_file() else None
    return next((p for p in map(shutil.which, CHROMIUMS) if p), None)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        # Imported here: playwright is an optional dev extra; without it these tests skip.
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser checks skipped: playwright is not installed "
                    "(pip install -c constraints.txt -e '.[dev]'; `make test` does it)")
    exe = find_chromium()
    if exe is None:
        pytest.skip("browser checks skipped: no Chromium found (Debian: apt-get install "
                    "chromium; `make test` tries; or set SHARDLAB_CHROMIUM)")
    with sync_playwright() as p:
        try:
            # --no-sandbox: the suite may run as root (CI does), where Chromium's sandbox
            # refuses to start; the pages are our own files.
            b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        except Exception as e:  # any launch failure is an environment problem, not ours
            pytest.skip(f"browser checks skipped: Chromium at {exe} did not start: "
                        f"{str(e).splitlines()[0]}")
        yield b
        b.close()


@dataclass
class Seen:
    """What the browser saw while loading one page."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    scroll_width: int = 0
    inner_width: int = 0
    screenshot: bytes = b""

    @property
    def outside(self) -> list[str]:
        """Requests for anything but the page itself."""
        return self.requests[1:]

    @property
    def pixels(self) -> tuple[float, int]:
        """(standard deviation of the grey levels, distinct colours) of the screenshot:
        a blank page has (0, 1)."""
        return pixel_spread(self.screenshot)


def pixel_spread(png: bytes) -> tuple[float, int]:
    """(standard deviation of the grey levels, distinct colours) of a PNG screenshot."""
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.uint32)
    packed = (img[..., 0] << 16) | (img[..., 1] << 8) | img[..., 2]  # one int per colour
    return float(img.mean(axis=2).std()), len(np.unique(packed))


@pytest.fixture(scope="session")
def load_page(browser: Any) -> Callable[..., Seen]:
    """Open a file at a viewport size; record console errors, page errors, every request
    (all but the page's own are aborted), each chart's size and drawn elements, the page
    width, and a full-page screenshot."""
    def load(path: Path, width: int = 1280, height: int = 900) -> Seen:
        seen = Seen()
        ctx = browser.new_context(viewport={"width": width, "height": height})
        page = ctx.new_page()
        url = path.resolve().as_uri()

        def route(r: Any) -> None:
            seen.requests.append(r.request.url)
            if r.request.url == url:
                r.continue_()
            else:
                r.abort()

        page.route("**/*", route)
        page.on("console", lambda m: seen.console_errors.append(m.text)
                if m.type == "error" else None)
        page.on("pageerror", lambda e: seen.console_errors.append(str(e)))
        page.goto(url, wait_until="load")
        seen.charts = page.evaluate("""() => [...document.querySelectorAll('figure[data-chart]')]
            .map(f => { const s = f.querySelector('svg'); const r = s ? s.getBoundingClientRect()
                                                                        : {width: 0, height: 0};
                        return {name: f.dataset.chart, width: r.width, height: r.height,
                                drawn: s ? s.querySelectorAll('path, rect, text, use').length
                                         : 0}; })""")
        seen.scroll_width, seen.inner_width = page.evaluate(
            "[document.documentElement.scrollWidth, window.innerWidth]")
        seen.screenshot = page.screenshot(full_page=True)
        ctx.close()
        return seen

    return load


@dataclass
class Demo:
    """One whole ``shardlab demo`` run: its folder, exit code, output and wall time."""

    cwd: Path
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def report(self) -> Path:
        return self.cwd / "demo-report.html"


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Demo:
    """``shardlab demo --steps 4`` run once for the suite, in a fresh folder with a fresh
    SHARDLAB_HOME (so it measures this CPU itself, with a 1 s budget for the in-process
    phases, and writes nothing in ~). Its training run (FSDP on 2 processes, parity with
    one process) is the run directory the run-report tests read.

    About 27 s, over the suite's 30 s mark for one test with the browser tests' share:
    the whole demo is the test (budget, plan, measuring this CPU's 2-rank runtime, about
    12 s on any CPU, a real 2-process run and one process beside it, the report). Under
    pytest-xdist the workers share one run: the first to ask runs it under a file lock in
    their common temporary folder and records it; the others read the record (the
    documented recipe for a session fixture run once across workers; until 2026-12-07
    each worker whose files asked ran its own, 30-41 s each)."""
    root = tmp_path_factory.getbasetemp()
    root = root.parent if worker_id != "master" else root
    record = root / "demo.json"
    with open(root / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if record.is_file():
            saved = json.loads(record.read_text())
            return Demo(Path(saved.pop("cwd")), **saved)
        cwd = root / "demo"
        cwd.mkdir()
        env = {**os.environ, "SHARDLAB_HOME": str(cwd / "home")}
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "shardlab", "demo", "--steps", "4",
                            "--run-dir", str(cwd / "run"), "--measure-seconds", "1"], cwd=cwd,
                           env=env, capture_output=True, text=True, timeout=300)
        run = Demo(cwd, r.returncode, r.stdout, r.stderr, time.perf_counter() - start)
        record.write_text(json.dumps({**run.__dict__, "cwd": str(cwd)}))
        return run


@pytest.fixture(scope="session")
def run_dir(demo: Demo) -> Path:
    """The demo's run directory (report.json, train.jsonl)."""
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    return demo.cwd / "run"
