"""bisector.repo.archives.extract: the 'data' filter's refusals, and the same refusals made by hand on a Python
without extraction filters (Debian 12's 3.11.2, where TarFile.extractall has no `filter`)."""
import io
import tarfile

import pytest

from bisector.repo.archives import extract

pytestmark = pytest.mark.unit


def archive(*members: tuple[str, bytes | None, str]) -> tarfile.TarFile:
    """A tar in memory: (name, data for a file or None, link target for a symlink or '')."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, content, link in members:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(content or b"")
                tar.addfile(info, io.BytesIO(content or b""))
    data.seek(0)
    return tarfile.open(fileobj=data)


@pytest.fixture(params=["filters", "no filters"])
def python(request, monkeypatch):
    """This Python as it is, and as one before extraction filters."""
    if request.param == "filters" and not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no extraction filters (the other case runs)")
    if request.param == "no filters":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


def test_files_and_inner_links_are_extracted(tmp_path, python):
    extract(archive(("vllm/a.py", b"x = 1\n", ""), ("vllm/b.py", None, "a.py")), tmp_path)
    assert (tmp_path / "vllm/a.py").read_text() == "x = 1\n"
    assert (tmp_path / "vllm/b.py").is_symlink() and (tmp_path / "vllm/b.py").read_text() == "x = 1\n"


def test_only_the_members_asked_for_are_extracted(tmp_path, python):
    tar = archive(("vllm/a.py", b"a", ""), ("README", b"r", ""))
    extract(tar, tmp_path, [member for member in tar if member.name.endswith(".py")])
    assert (tmp_path / "vllm/a.py").exists() and not (tmp_path / "README").exists()


@pytest.mark.parametrize("member", [("../evil.py", b"x", ""), ("vllm/out", None, "../../evil")])
def test_a_member_out_of_dest_is_refused_and_nothing_lands_outside(tmp_path, python, member):
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tarfile.TarError):
        extract(archive(member), dest)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dest"]


def test_an_absolute_name_never_lands_where_it_names(tmp_path, python):
    """The filter puts it inside dest (its leading slash stripped); by hand it is refused: either way, not there."""
    dest, named = tmp_path / "dest", tmp_path / "elsewhere" / "evil.py"
    dest.mkdir()
    try:
        extract(archive((str(named), b"x", "")), dest)
    except tarfile.TarError:
        assert python == "no filters"
    assert not named.exists() and not (tmp_path / "elsewhere").exists()
