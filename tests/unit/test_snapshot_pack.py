"""corral.sdk.snapshot: what `pack` takes from a real directory, that its digest depends on
the content only, and that `check` refuses the archives a hostile upload would send."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from corral.sdk.snapshot import Snapshot, SnapshotTooLarge, pack
from corral.spec.snapshots import check


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def members(snapshot: Snapshot) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(snapshot.data), mode="r:gz") as archive:
        return {member.name: member for member in archive.getmembers()}


def test_ignore_files_at_any_depth_and_corralignore_leave_out_what_they_name(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        {
            ".gitignore": "*.log\n!keep.log\nbuild/\n*.tmp\n",
            ".corralignore": "data/\n!wanted.tmp\n",
            "train.py": "",
            "debug.log": "",
            "keep.log": "",
            "build/out.bin": "",
            "sub/build": "a file: `build/` names directories only",
            "sub/.gitignore": "local.txt\n!debug.log\n",
            "sub/local.txt": "",
            "sub/debug.log": "",
            "sub/other.log": "",
            "local.txt": "",
            "data/big.bin": "",
            "scratch.tmp": "",
            "wanted.tmp": "",
            ".git/HEAD": "ref: refs/heads/main\n",
            "vendor/lib/.git": "gitdir: ../../.git/modules/lib\n",
            "vendor/lib/code.py": "",
        },
    )
    # Were the walk to enter an ignored directory, it would report this FIFO as skipped.
    os.mkfifo(tmp_path / "build" / "pipe")

    snapshot = pack(tmp_path)

    assert sorted(members(snapshot)) == [
        ".corralignore",
        ".gitignore",
        "keep.log",
        "local.txt",
        "sub",
        "sub/.gitignore",
        "sub/build",
        "sub/debug.log",
        "train.py",
        "vendor",
        "vendor/lib",
        "vendor/lib/code.py",
        "wanted.tmp",
    ]
    assert snapshot.skipped == ()
    assert snapshot.files == 10


def test_symlinks_inside_are_kept_relative_and_those_out_are_skipped_by_name(
    tmp_path: Path,
) -> None:
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    write(tree, {"lib/util.py": "x = 1\n", "main.py": ""})
    write(outside, {"secret": "s"})
    (tree / "rel").symlink_to("lib/util.py")
    (tree / "lib" / "back").symlink_to("../main.py")
    (tree / "abs_inside").symlink_to(tree / "main.py")
    (tree / "libdir").symlink_to("lib")
    (tree / "chain").symlink_to("rel")
    (tree / "out").symlink_to("../outside/secret")
    (tree / "abs_out").symlink_to(outside / "secret")
    (tree / "dangling").symlink_to("nowhere")
    (tree / "lib" / "via").symlink_to("../out")
    os.mkfifo(tree / "pipe")

    snapshot = pack(tree)
    found = members(snapshot)

    links = {name: m.linkname for name, m in found.items() if m.issym()}
    assert links == {
        "rel": "lib/util.py",
        "lib/back": "../main.py",
        "abs_inside": "main.py",
        "libdir": "lib",
        "chain": "lib/util.py",
    }
    # A symlinked directory is never followed: its files travel once, under lib/.
    assert not any(name.startswith("libdir/") for name in found)
    assert snapshot.skipped == ("abs_out", "dangling", "lib/via", "out", "pipe")


def test_over_the_cap_names_the_largest_files_and_the_way_out(tmp_path: Path) -> None:
    sizes = {"a.bin": 100, "b.bin": 900, "c.bin": 800, "d.bin": 700, "e.bin": 600, "f.bin": 500}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)

    with pytest.raises(SnapshotTooLarge) as refused:
        pack(tmp_path, cap=3000)

    message = str(refused.value)
    assert isinstance(refused.value, ValueError)
    assert "hold 3.5 KiB, over the cap of 2.9 KiB" in message
    for name in ("b.bin (900 B)", "c.bin", "d.bin", "e.bin", "f.bin (500 B)"):
        assert name in message
    assert "a.bin" not in message
    assert ".corralignore" in message


def test_a_huge_file_is_refused_from_its_size_without_being_read(tmp_path: Path) -> None:
    # Sparse: 64 GiB on paper, nothing on disk; reading it would take minutes.
    with (tmp_path / "huge.bin").open("wb") as handle:
        handle.truncate(64 * 1024**3)
    (tmp_path / "code.py").write_text("")

    with pytest.raises(SnapshotTooLarge, match=r"more than 64\.0 GiB.*huge\.bin \(64\.0 GiB\)"):
        pack(tmp_path, cap=1024**2)


def test_a_directory_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        pack(tmp_path / "missing")


def test_the_digest_depends_on_the_content_only(tmp_path: Path) -> None:
    tree = tmp_path / "one"
    write(tree, {"a.py": "print(1)\n", "pkg/b.py": "", "pkg/data/c.txt": "c", "run.sh": "go"})
    (tree / "run.sh").chmod(0o755)
    (tree / "link").symlink_to("pkg/b.py")
    first = pack(tree)
    assert first.digest.startswith("sha256:") and len(first.digest) == len("sha256:") + 64

    # Times, group and other bits, and another copy made in another order: same digest.
    for path in [tree, *tree.rglob("*")]:
        os.utime(path, (1_234_567, 1_234_567), follow_symlinks=False)
    (tree / "a.py").chmod(0o600)
    (tree / "run.sh").chmod(0o700)
    (tree / "pkg").chmod(0o700)
    assert pack(tree).digest == first.digest
    copy = tmp_path / "two"
    copy.mkdir()
    for name in ["run.sh", "pkg/data/c.txt", "pkg/b.py", "a.py"]:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tree / name, copy / name)
    (copy / "link").symlink_to("pkg/b.py")
    assert pack(copy).digest == first.digest
    # Content and the executable bit are what count.
    (copy / "a.py").chmod(0o755)
    assert pack(copy).digest != first.digest

    info = members(first)["run.sh"]
    assert (info.mode, info.uid, info.gid, info.uname, info.gname) == (0o755, 0, 0, "", "")
    assert members(first)["a.py"].mode == 0o644
    assert first.data[4:8] == bytes(4)  # gzip header: no time


def test_check_accepts_what_pack_makes(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "a", "pkg/b.py": "bb", "pkg/deep/c.py": "ccc"})
    (tmp_path / "pkg" / "deep" / "up").symlink_to("../../a.py")
    (tmp_path / "self").symlink_to(".")
    snapshot = pack(tmp_path)

    info = check(io.BytesIO(snapshot.data), max_unpacked=6)
    assert (info.files, info.size) == (snapshot.files, snapshot.size) == (5, 6)
    (tmp_path.parent / "upload.tar.gz").write_bytes(snapshot.data)
    assert check(tmp_path.parent / "upload.tar.gz", max_unpacked=6) == info


def member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def tarball(*entries: tarfile.TarInfo, contents: bytes = b"") -> bytes:
    """A .tar.gz of `entries`, written as given (tarfile checks nothing when writing)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info in entries:
            if info.isreg():
                info.size = len(contents)
                archive.addfile(info, io.BytesIO(contents))
            else:
                archive.addfile(info)
    return buffer.getvalue()


EVIL = {
    "absolute": ([member("/etc/cron.d/x")], "an absolute name"),
    "dot-dot": ([member("a/../../x")], "'..' component"),
    "symlink out": ([member("up", tarfile.SYMTYPE, "../../etc")], "outside the tree"),
    "absolute symlink": ([member("etc", tarfile.SYMTYPE, "/etc")], "absolute path '/etc'"),
    "link chain out": (
        [
            member("d", tarfile.DIRTYPE),
            member("d/up", tarfile.SYMTYPE, ".."),
            member("esc", tarfile.SYMTYPE, "d/up/.."),
        ],
        "outside the tree through 'd/up'",
    ),
    "link chain out, declared later": (
        [member("first", tarfile.SYMTYPE, "second/x"), member("second", tarfile.SYMTYPE, "..")],
        "'first'.*outside the tree through 'second'",
    ),
    "loop": (
        [member("a", tarfile.SYMTYPE, "b/c"), member("b", tarfile.SYMTYPE, "a/c")],
        "loop of symlinks",
    ),
    "hard link": ([member("a"), member("h", tarfile.LNKTYPE, "a")], "'h': a hard link"),
    "device": ([member("mem", tarfile.CHRTYPE)], "'mem': a device"),
    "block device": ([member("sda", tarfile.BLKTYPE)], "'sda': a device"),
    "fifo": ([member("pipe", tarfile.FIFOTYPE)], "'pipe': a FIFO"),
    "duplicate": ([member("a.py"), member("./a.py")], "'./a.py': the name appears twice"),
    "file where a directory was": (
        [member("d/x"), member("d", tarfile.SYMTYPE, "elsewhere")],
        "'d': a link where earlier members have a directory",
    ),
    "under a symlink": (
        [member("l", tarfile.SYMTYPE, "sub"), member("l/x")],
        "'l/x': its parent 'l' is a link",
    ),
    "the root as a file": ([member("./")], "root of the tree"),
}


@pytest.mark.parametrize("case", sorted(EVIL))
def test_check_refuses_a_crafted_archive_naming_the_member(case: str) -> None:
    entries, problem = EVIL[case]
    with pytest.raises(ValueError, match=problem):
        check(io.BytesIO(tarball(*entries, contents=b"x")), max_unpacked=1024)


def test_check_bounds_members_and_size() -> None:
    four = tarball(*(member(f"f{n}") for n in range(4)), contents=b"abc")
    assert check(io.BytesIO(four), max_unpacked=12, max_members=4).files == 4
    with pytest.raises(ValueError, match="'f3': the archive has more than 3"):
        check(io.BytesIO(four), max_unpacked=12, max_members=3)
    with pytest.raises(ValueError, match="'f3': the content unpacked exceeds 11 bytes"):
        check(io.BytesIO(four), max_unpacked=11)


NOT_A_TAR_GZ = r"not a valid \.tar\.gz archive"


@pytest.mark.parametrize(
    "data",
    [b"", b"not an archive at all", gzip.compress(b"gzip, but no tar inside" * 40)],
    ids=["empty", "text", "gzip of text"],
)
def test_check_refuses_what_is_not_a_tar_gz(data: bytes) -> None:
    with pytest.raises(ValueError, match=NOT_A_TAR_GZ):
        check(io.BytesIO(data), max_unpacked=1024)


def test_check_refuses_a_truncated_or_corrupted_archive(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(os.urandom(50_000))
    data = pack(tmp_path).data
    with pytest.raises(ValueError, match=NOT_A_TAR_GZ):
        check(io.BytesIO(data[: len(data) // 2]), max_unpacked=10**6)
    corrupted = data[:-8] + bytes(b ^ 0xFF for b in data[-8:])  # gzip's CRC and length
    with pytest.raises(ValueError, match=NOT_A_TAR_GZ):
        check(io.BytesIO(corrupted), max_unpacked=10**6)


def bomb(size: int) -> bytes:
    """A .tar.gz of one file of `size` zero bytes: a few KiB per 64 MiB."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9) as zipped,
        tarfile.open(fileobj=zipped, mode="w") as archive,
    ):
        info = tarfile.TarInfo("zeros")
        info.size = size
        archive.addfile(info, _Zeros(size))
    return buffer.getvalue()


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def test_a_gzip_bomb_over_the_bound_is_refused() -> None:
    data = bomb(64 * 1024**2)
    assert len(data) < 128 * 1024
    with pytest.raises(ValueError, match="'zeros': the content unpacked exceeds"):
        check(io.BytesIO(data), max_unpacked=1024**2)


def test_a_header_bomb_is_refused_before_it_is_decompressed() -> None:
    # tarfile reads a pax header into memory whole: this one is 16 MiB.
    info = member("innocent")
    info.pax_headers = {"comment": "x" * (16 * 1024**2)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="headers at its start are larger than any archive"):
        check(io.BytesIO(buffer.getvalue()), max_unpacked=10**9)
