"""Writing a file the user named (``tilework.runtime.atomic``; ``Executable.save``,
``CompiledModel.save``, ``tilework build -o``): a target that is not a regular file is refused
and left as it was, a symbolic link is written through, the file gets the umask's mode (a
replaced one keeps its own), and a failed write names the file and leaves the old one whole."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import pytest

import tilework as tw
from tilework.cli import main
from tilework.errors import TileworkError
from tilework.runtime import atomic
from tilework.runtime.atomic import write_atomic, write_bytes_atomic

from tests.test_errors import TEXT_MODULE  # the two-input module of the CLI's error table


def _null_device(path: Path) -> None:
    """A character device node like /dev/null (1, 3), made here so that no real one is risked."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("making a device node needs root")


def _specials(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo, folder = tmp_path / "fifo", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    return {"fifo": (fifo, "a FIFO"), "folder": (folder, "a directory")}


def _temporaries(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("kind", ["device", "fifo", "folder", "socket"])
def test_a_target_that_is_not_a_regular_file_is_refused_and_kept(tmp_path: Path, kind: str) -> None:
    if kind == "device":
        path, what = tmp_path / "nulldev", "a character device"
        _null_device(path)
    elif kind == "socket":
        path, what = tmp_path / "sock", "a socket"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path, what = _specials(tmp_path)[kind]
    before = os.lstat(path)
    with pytest.raises(TileworkError, match=f"cannot write '{path}': not a regular file \\({what}\\)"):
        write_bytes_atomic(path, b"data")
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert _temporaries(tmp_path) == []
    if kind == "socket":
        sock.close()


def test_a_symlink_is_written_through_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "target.tw"
    target.write_bytes(b"old")
    link = tmp_path / "link.tw"
    link.symlink_to("target.tw")
    write_bytes_atomic(link, b"new")
    assert link.is_symlink() and os.readlink(link) == "target.tw"
    assert target.read_bytes() == b"new"
    dangling = tmp_path / "dangling.tw"
    dangling.symlink_to("made.tw")
    write_bytes_atomic(dangling, b"made")  # as open(path, "w") does: the file the link names is created
    assert dangling.is_symlink() and (tmp_path / "made.tw").read_bytes() == b"made"


def test_modes_follow_the_umask_and_a_replaced_file_keeps_its_own(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_bytes_atomic(tmp_path / "a.tw", b"x")
        os.umask(0o027)
        write_bytes_atomic(tmp_path / "b.tw", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.tw").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.tw").stat().st_mode) == 0o640
    (tmp_path / "a.tw").chmod(0o600)
    write_bytes_atomic(tmp_path / "a.tw", b"y")
    assert stat.S_IMODE((tmp_path / "a.tw").stat().st_mode) == 0o600 and (tmp_path / "a.tw").read_bytes() == b"y"


class _Full:
    """A file on a disk with ``room`` bytes left: writes past it raise ENOSPC."""

    def __init__(self, fh: BinaryIO, room: int) -> None:
        self.fh, self.room = fh, room

    def write(self, data: Any) -> int:
        n = min(len(data), self.room)
        self.fh.write(bytes(data[:n]))
        self.room -= n
        if n < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return n

    def fileno(self) -> int:
        return self.fh.fileno()

    def __enter__(self) -> "_Full":
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def full_disk(monkeypatch: pytest.MonkeyPatch, disk: Path, room: int = 100) -> None:
    """Every atomic write into ``disk`` from now on meets a full disk after ``room`` bytes."""
    real: Callable[[int, str], BinaryIO] = atomic._open
    monkeypatch.setattr(atomic, "_open", lambda fd, tmp: _Full(real(fd, tmp), room) if Path(tmp).resolve().is_relative_to(disk.resolve()) else real(fd, tmp))


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tw.build(tw.parse(TEXT_MODULE))
    path = tmp_path / "m.tw"
    exe.save(str(path))
    saved = path.read_bytes()
    full_disk(monkeypatch, tmp_path)
    with pytest.raises(TileworkError, match=f"^cannot write '{path}': No space left on device$"):
        exe.save(str(path))
    with pytest.raises(TileworkError, match="^cannot write 'elsewhere.tw': No space left on device$"):
        monkeypatch.chdir(tmp_path)
        write_atomic("elsewhere.tw", lambda fh: fh.write(b"\0" * 1000) and None)
    assert path.read_bytes() == saved and not (tmp_path / "elsewhere.tw").exists()
    assert _temporaries(tmp_path) == []


def test_compiled_model_save_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tilework import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            self.fc = nn.Linear(8, 4)

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    cm = tw.compile(Net().init_random(seed=1), {"x": nn.spec.Tensor([tw.dim("n", max=8), 8])})
    full_disk(monkeypatch, tmp_path)
    with pytest.raises(TileworkError, match="No space left on device"):
        cm.save(str(tmp_path / "cm.tw"))
    assert list(tmp_path.iterdir()) == []


def test_build_refuses_special_outputs_before_compiling_and_writes_through_links(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.txt").write_text(TEXT_MODULE)
    _null_device(tmp_path / "nulldev")
    specials = _specials(tmp_path)
    for name, what in [("nulldev", "a character device"), ("fifo", specials["fifo"][1]), ("folder", specials["folder"][1])]:
        assert main(["build", "m.txt", "-o", name]) == 2
        assert f"error: cannot write '{name}': not a regular file ({what})" in capsys.readouterr().err
    assert stat.S_ISCHR(os.lstat("nulldev").st_mode) and stat.S_ISFIFO(os.lstat("fifo").st_mode)
    Path("target").write_text("keep")
    os.symlink("target", "link.tw")
    assert main(["build", "m.txt", "-o", "link.tw"]) == 0
    assert os.path.islink("link.tw") and Path("target").read_bytes().startswith(b"\x89TWEXE")
    x, y = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(tw.VM(tw.load("link.tw"))["main"](x, y), x + y.T)


def test_build_refuses_to_overwrite_its_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.txt").write_text(TEXT_MODULE)
    os.symlink("m.txt", "alias.txt")
    for out, msg in [("m.txt", "error: -o m.txt is the input file: name another output"), ("./m.txt", "error: -o ./m.txt is the input file (m.txt)"), ("alias.txt", "error: -o alias.txt is the input file (m.txt)"), (str(tmp_path / "m.txt"), "is the input file")]:
        assert main(["build", "m.txt", "-o", out]) == 2
        assert msg in capsys.readouterr().err
    assert Path("m.txt").read_text() == TEXT_MODULE


def test_build_on_a_full_disk_names_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.txt").write_text(TEXT_MODULE)
    Path("small").mkdir()
    full_disk(monkeypatch, tmp_path / "small")
    assert main(["build", "m.txt", "-o", "small/a.tw"]) == 2
    assert capsys.readouterr().err.strip() == "error: cannot write 'small/a.tw': No space left on device"
    assert list(Path("small").iterdir()) == []
