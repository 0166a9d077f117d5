"""The documentation site: it builds strictly as `make docs` builds it, a broken link or anchor fails
that build, every command and objective has its page, and the built site renders in a real browser
(headless Chromium) with its navigation.

Each build takes a few seconds (mkdocstrings reads the package without importing it; the command
pages' `--help` texts come from one child process), and the browser opens two pages.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

# One worker builds the site once for every test here (make test runs `--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("docs_site")

ROOT = Path(__file__).resolve().parents[2]
# What `make docs` runs (the Makefile's docs target is checked to say the same), with this Python.
BUILD = [sys.executable, "-m", "mkdocs", "build", "--strict"]
BUILD_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
# What the site needs beside docs/: the config, the hooks that write the command pages, the tables
# generated from the code and the math, the page the reliability page includes, and the package
# mkdocstrings, the tables and `ditty --help` read.
SITE_INPUTS = (
    "mkdocs.yml",
    "docs",
    "tools/docs_cli_help.py",
    "tools/docs_tables.py",
    "tools/docs_math.py",
    "RELIABILITY.md",
)


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**BUILD_ENV, "PYTHONPATH": str(root)}
    return subprocess.run([*BUILD, "-d", str(site)], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def copy_of_the_docs(destination: Path) -> Path:
    """The site's sources in a directory of their own (the package linked, not copied)."""
    for name in SITE_INPUTS:
        source, target = ROOT / name, destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    (destination / "ditty").symlink_to(ROOT / "ditty")
    return destination


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built from the repository as it is."""
    out = tmp_path_factory.mktemp("site") / "site"
    done = build(ROOT, out)
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return out


def test_make_docs_runs_the_strict_build():
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and "mkdocs build --strict" in recipe.group(1)
    assert re.search(r"^test: .*\bdocs\b", (ROOT / "Makefile").read_text(), re.M), "make test builds the docs"


def test_the_site_builds_with_every_page(site):
    for page in ("index.html", "objectives/preference/index.html", "cli/run/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    api = (site / "python-api" / "reference" / "index.html").read_text()
    assert "Pipeline" in api and "ModelFactory" in api  # generated from the docstrings
    run_help = (site / "cli" / "run" / "index.html").read_text()
    assert "ditty run --help" in run_help and "--optimizer.lr" in run_help  # generated from --help
    metrics = (site / "metrics" / "index.html").read_text()
    assert "<td><code>reward_std</code></td>" in metrics and "ditty-metrics" not in metrics  # the glossary
    reference = (site / "recipes" / "reference" / "index.html").read_text()
    assert "<td><code>max_staleness</code></td>" in reference and "ditty-recipe-reference" not in reference
    config_api = (site / "python-api" / "config" / "index.html").read_text()
    assert "TrainerConfig" in config_api and "RLConfig" in config_api  # the classes, for the Python API
    losses = (site / "objectives" / "rl" / "index.html").read_text()
    assert losses.count("<math") >= 5 and "arithmatex" not in losses  # the math, as MathML made at build time


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    root = copy_of_the_docs(tmp_path / "tree")
    page = root / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md) and [lost](data.md#no-such-heading)\n")
    done = build(root, tmp_path / "site")
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-3000:]
    assert "no-such-page.md" in said and "no-such-heading" in said, said[-3000:]


def test_every_command_and_objective_has_a_page():
    from ditty.cli.commands import COMMANDS

    nav = (ROOT / "mkdocs.yml").read_text()
    for command in COMMANDS:
        page = ROOT / "docs" / "cli" / f"{command}.md"
        assert page.is_file(), f"`ditty {command}` has no page: add docs/cli/{command}.md"
        assert f"<!-- ditty-help: {command} -->" in page.read_text(), f"{page} does not show `--help`"
        assert f"cli/{command}.md" in nav, f"{page} is not in mkdocs.yml's nav"
    objectives = ("sft", "model-tasks", "preference", "reward-models", "rl", "vllm", "tools", "environments")
    for objective in (*objectives, "distillation", "online-preference"):
        assert f"objectives/{objective}.md" in nav, objective


def test_the_demo_s_figures_say_what_varies_across_machines():
    """tiny_sft's figures differ by CPU (another summation order): the README and the getting-started
    page say so, and what stays equal, rather than promise the same figure on every run."""
    readme = (ROOT / "README.md").read_text()
    demo = readme[readme.index("make demo") :][:1500]
    assert "vary by CPU" in demo and "on every run" not in demo, demo
    start = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    assert "What stays equal:" in start and "What varies:" in start


def test_every_benchmark_record_is_listed_on_the_summary():
    summary = (ROOT / "docs" / "benchmarks" / "index.md").read_text()
    records = sorted((ROOT / "docs" / "benchmarks").glob("20*.md"))
    assert records
    for record in records:
        assert re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$", record.name), f"{record.name}: DATE-topic.md"
        assert f"({record.name})" in summary, f"docs/benchmarks/index.md does not link {record.name}"


# ---------------------------------------------------------------- in a browser


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI has no Chromium: .ci/run installs Debian's `chromium`")
        pytest.skip("no Chromium here (apt-get install -y chromium)")
    return found


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on a free local port, as a user's browser gets it."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def headless(url: str, profile: Path, *what: str) -> str:
    """Chromium, headless, on a fresh profile, with no network of its own: what it prints."""
    args = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
        *what,
        url,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def rendered(url: str, profile: Path) -> str:
    """The page's DOM after its scripts ran."""
    return headless(url, profile, "--dump-dom")


def nav_titles(dom: str) -> list[str]:
    """The titles of the primary navigation's links and section labels, in order."""
    primary = dom[dom.index('md-nav--primary"') :]
    return [re.sub(r"\s+", " ", t).strip() for t in re.findall(r'class="md-ellipsis">\s*([^<]+?)\s*<', primary)]


def scripts_ran(dom: str) -> bool:
    """The theme's script ran: the built page's `<html class="no-js">` is replaced by its classes."""
    html = re.search(r"<html[^>]*>", dom).group(0)
    return "no-js" not in html and "js-focus-visible" in html


def test_the_home_page_renders_with_its_navigation(served, tmp_path):
    dom = rendered(served + "/", tmp_path / "profile")
    assert "<h1" in dom and ">ditty<" in dom
    titles = nav_titles(dom)
    for title in ("Getting started", "Training objectives", "Preference optimisation", "Command line", "Benchmarks"):
        assert title in titles, titles
    assert scripts_ran(dom)
    assert 'href="objectives/preference/"' in dom  # the navigation links the objective page


def test_an_objective_page_renders_with_its_navigation(served, tmp_path):
    dom = rendered(served + "/objectives/preference/", tmp_path / "profile")
    assert re.search(r"<h1[^>]*>Preference optimisation", dom)
    active = re.findall(r'md-nav__link--active"[^>]*>\s*<span class="md-ellipsis">\s*([^<]+?)\s*<', dom)
    assert "Preference optimisation" in active, active  # the page is marked where it sits in the navigation
    assert "Reward models" in nav_titles(dom) and scripts_ran(dom)
    assert '<div class="highlight"' in dom and '"dpo"</span>' in dom  # the recipe block, highlighted


def test_the_math_renders_as_mathml(served, tmp_path):
    """The losses are MathML the browser lays out: the formula has a height of its own and no
    LaTeX source shows."""
    dom = rendered(served + "/objectives/preference/", tmp_path / "profile")
    assert dom.count("<math") >= 5 and "\\frac" not in dom and "$$" not in dom


def test_the_home_page_paints(served, tmp_path):
    """A screenshot of the home page is a page, not a blank: many colours, the theme's header among them."""
    from PIL import Image

    shot = tmp_path / "home.png"
    headless(served + "/", tmp_path / "profile", f"--screenshot={shot}")
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is nearly one colour"
    top = image.crop((0, 0, 1280, 40)).getcolors(maxcolors=1 << 16)
    red, green, blue = max(top)[1]
    assert blue > red + 40, f"the header is not the indigo of the theme: {(red, green, blue)}"
