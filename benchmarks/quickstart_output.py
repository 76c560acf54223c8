"""Record what `hpo sweep quickstart` prints, for the README's "What you get" block.

Runs the packaged quickstart sweep as a user runs it (``python -m hpo.service.cli sweep
quickstart``, 80 columns, no terminal), keeps what it prints from the first rung decision on,
leaves out Ray's own log lines and the 30-second progress lines, writes the sweep's folder as
``$PWD/runs/quickstart`` (the default ``output_dir``) and saves the result to
``docs/quickstart_output.txt``. With ``--readme`` it also puts that text into README.md's block
that follows the line ``<!-- quickstart output -->``; ``tests/test_readme.py`` fails when the
two differ.

    nice -n 10 python benchmarks/quickstart_output.py --readme    # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "docs" / "quickstart_output.txt"
README = REPO / "README.md"
#: The line in README.md after which the recorded block (a ``` fence) sits.
MARKER = "<!-- quickstart output -->"
#: Lines that are Ray's (or MLflow's) own logging, not ours: left out of the record.
FOREIGN = re.compile(r"^(\d{4}[-/]\d\d[-/]\d\d \d\d:\d\d:\d\d|\(\w+ pid=|\[progress\]|\s*warnings\.warn)")


def recorded_text(printed: str, output: Path) -> str:
    """What a user reads in ``printed``: from the first rung decision to the end, without Ray's
    log lines and the progress lines, the temporary folder shown as the default one."""
    lines = printed.replace(str(output), "$PWD/runs/quickstart").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("rung t̂=")), None)
    if start is None:
        raise SystemExit("quickstart_output: the quickstart printed no rung decision; its output:\n" + printed[-3000:])
    kept = [line.rstrip() for line in lines[start:] if not FOREIGN.match(line)]
    text = "\n".join(kept).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text) + "\n"


def readme_block(readme: str) -> str:
    """The recorded block of README.md (the ``` fence after :data:`MARKER`)."""
    after = readme.split(MARKER, 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", action="store_true", help="also write the block into README.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "quickstart"
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "hpo.service.cli", "sweep", "quickstart", "--output", str(output)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "COLUMNS": "80", "TERM": "dumb"})
        wall = time.monotonic() - started
        if run.returncode != 0:
            print(run.stdout[-3000:], file=sys.stderr)
            return run.returncode
        text = recorded_text(run.stdout, output)
    RECORDED.write_text(text)
    print(f"{RECORDED.relative_to(REPO)}: {len(text.splitlines())} lines; the quickstart took {wall:.0f} s")
    if args.readme:
        readme = README.read_text()
        old = readme_block(readme)
        README.write_text(readme.replace(MARKER + "\n```\n" + old, MARKER + "\n```\n" + text, 1))
        print("README.md: block updated" if old != text else "README.md: block unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
