"""Extraction goldens, one page per generator, as each generator really renders it.

Built by the real generator in the test setup, from the sources under
tests/fixtures/docs-blocks/ (each generator is a test extra, pinned in
constraints.txt): MkDocs Material (mkdocs/, Material's recommended code-block
setup) and Sphinx (sphinx/, one source built with Furo and with the Read the
Docs theme). The same quickstart is written in both, so all three must agree
on every step, file and mark.

Transcribed, where the generator cannot run in the suite: Docusaurus (its
build is an npm tree of hundreds of packages and a webpack build, not
measured here but far past what one golden should cost), Mintlify (a hosted service), Hugo with Docsy (a Go binary
outside the registries) and a README as github.com renders it (a service).
tests/fixtures/docs-blocks/transcribed/*.html follow each one's real markup:
Docusaurus 3's CodeBlock (title, showLineNumbers, copy button), Mintlify's
code-block component (filename header, copy button), Hugo's Chroma output
(line-number table and inline numbers, a fence attribute on the wrapper)
and GitHub's highlight-source-* blocks with their clipboard-copy element.

FIRSTRUN_UPDATE_GOLDEN=1 rewrites the goldens under
tests/fixtures/docs-blocks/golden/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstrun.docs.blocks import extract, extract_markdown

FIXTURES = Path(__file__).parents[1] / "fixtures" / "docs-blocks"
GOLDEN = FIXTURES / "golden"
URL = "https://docs.example.test/quickstart/"
GENERATED = ("mkdocs-material", "sphinx-furo", "sphinx-rtd")
TRANSCRIBED = ("docusaurus", "mintlify", "hugo-docsy", "github-readme")


def _build(generator: str, out: Path) -> Path:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if generator == "mkdocs-material":
        argv = ["-m", "mkdocs", "build", "-q", "-f", str(FIXTURES / "mkdocs" / "mkdocs.yml"), "-d", str(out)]
    else:
        theme = {"sphinx-furo": "furo", "sphinx-rtd": "sphinx_rtd_theme"}[generator]
        argv = ["-m", "sphinx", "-q", "-b", "html", "-D", f"html_theme={theme}", str(FIXTURES / "sphinx"), str(out)]
    subprocess.run([sys.executable, *argv], check=True, env=env, capture_output=True)
    return out / "index.html"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("docs-blocks")
    return {generator: _build(generator, root / generator) for generator in GENERATED}


def _extracted(page: Path) -> list[dict]:
    return [block.to_data() for block in extract(page.read_bytes(), url=URL)]


def _golden(name: str, data: list[dict]) -> None:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("FIRSTRUN_UPDATE_GOLDEN"):
        path.write_text(json.dumps(data, indent=2) + "\n")
    assert data == json.loads(path.read_text())


@pytest.mark.parametrize("generator", GENERATED)
def test_a_generated_page_extracts_as_its_golden(built, generator):
    _golden(generator, _extracted(built[generator]))


@pytest.mark.parametrize("generator", TRANSCRIBED)
def test_a_transcribed_page_extracts_as_its_golden(generator):
    _golden(generator, _extracted(FIXTURES / "transcribed" / f"{generator}.html"))


def test_every_generator_gives_the_same_steps_files_and_marks(built):
    def essence(page: Path) -> list[tuple]:
        return [(b["index"], b["kind"], b["steps"], b["file"], b["skip"]) for b in _extracted(page)]

    mkdocs = essence(built["mkdocs-material"])
    assert len(mkdocs) == 13
    assert essence(built["sphinx-furo"]) == mkdocs
    assert essence(built["sphinx-rtd"]) == mkdocs


def test_the_markdown_source_read_raw_gives_what_the_built_pages_give(built):
    """A page served as Markdown (a raw README, an .md page): the MkDocs source itself."""
    def essence(blocks: list[dict]) -> list[tuple]:
        return [(b["index"], b["kind"], b["steps"], b["file"], b["skip"]) for b in blocks]

    source = (FIXTURES / "mkdocs" / "docs" / "index.md").read_text()
    raw = [block.to_data() for block in extract_markdown(source, url=URL)]
    assert essence(raw) == essence(_extracted(built["mkdocs-material"]))
