"""Output and input paths checked before any work (hpo.common.paths): nothing is created to check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hpo.common.paths import PathError, check_input_file, check_output_dir, check_output_file


def _read_only(path: Path) -> bool:
    """Make ``path`` unwritable (root ignores mode bits: chattr +i); False if this system cannot."""
    if os.geteuid() == 0:
        return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    path.chmod(0o555)
    return True


def _writable_again(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o755)


def test_output_dir_creatable_is_returned_absolute_and_nothing_is_created(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert check_output_dir(str(target), "output_dir") == target
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("value", ["", "   ", None])
def test_empty_output_path_is_refused(value: object) -> None:
    with pytest.raises(PathError, match="output_dir: empty path"):
        check_output_dir(value, "output_dir")  # type: ignore[arg-type]
    with pytest.raises(PathError, match="--predictor-out: empty path"):
        check_output_file(value, "--predictor-out")  # type: ignore[arg-type]


def test_dangling_symlink_is_refused_and_its_target_not_created(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    with pytest.raises(PathError, match="symbolic link.*missing.*does not exist"):
        check_output_dir(tmp_path / "link", "output_dir")
    with pytest.raises(PathError, match="symbolic link"):
        check_output_file(tmp_path / "link" / "p.json", "--predictor-out")
    assert not (tmp_path / "missing").exists()


def test_a_working_symlink_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert check_output_dir(tmp_path / "link", "output_dir") == tmp_path / "real"


def test_file_where_a_folder_is_needed(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PathError, match="exists and is not a directory"):
        check_output_dir(tmp_path / "afile", "output_dir")
    with pytest.raises(PathError, match="afile is a file, not a folder"):
        check_output_dir(tmp_path / "afile" / "sub", "output_dir")
    with pytest.raises(PathError, match="afile is a file, not a folder"):
        check_output_file(tmp_path / "afile" / "p.json", "--predictor-out")


def test_output_file_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(PathError, match="--predictor-out: .* is a directory; give a file path"):
        check_output_file(tmp_path, "--predictor-out")
    assert check_output_file(tmp_path / "new" / "p.json", "--predictor-out") == tmp_path / "new" / "p.json"


def test_unwritable_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    if not _read_only(folder):
        pytest.skip("cannot make a folder read-only here")
    try:
        with pytest.raises(PathError, match="output_dir: cannot write into .*ro .not writable"):
            check_output_dir(folder, "output_dir")
        with pytest.raises(PathError, match="cannot create .*ro/sub"):
            check_output_dir(folder / "sub", "output_dir")
        with pytest.raises(PathError, match="not writable"):
            check_output_file(folder / "p.json", "--predictor-out")
    finally:
        _writable_again(folder)


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "curves.csv"
    os.mkfifo(fifo)
    with pytest.raises(PathError, match="is a FIFO"):  # opening it would block for ever
        check_input_file(fifo, what="curve file")
    with pytest.raises(PathError, match="no such curve file"):
        check_input_file(tmp_path / "absent.csv", what="curve file")
    with pytest.raises(PathError, match="--curves: .* is a directory"):
        check_input_file(tmp_path, "--curves")
    (tmp_path / "ok.csv").write_text("a\n")
    assert check_input_file(tmp_path / "ok.csv") == tmp_path / "ok.csv"
