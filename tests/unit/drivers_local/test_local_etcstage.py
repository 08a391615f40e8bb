"""The staged /etc: copies of the allowed files, refreshed when a source changes (a temp dir as
the host's /etc)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from warmshell.core import egress
from warmshell.drivers.local.runtime.etcstage import TREE_LIMIT, EtcStage, link_system_bundle


@pytest.fixture
def host_etc(tmp_path: Path) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "ssl").mkdir()
    (etc / "ssl" / "cert.pem").write_text("cert")
    (etc / "ssl" / "certs").mkdir()
    (etc / "ssl" / "certs" / "ca.pem").symlink_to("../cert.pem")
    (etc / "ssl" / "private").mkdir(mode=0o710)
    (etc / "ssl" / "private" / "key.pem").write_text("secret key")
    (etc / "ssl" / "pip.conf").write_text("index-url = https://user:token@example.invalid\n")
    (etc / "shadow").write_text("root:secret\n")
    (tmp_path / "zone").write_text("UTC")
    (etc / "localtime").symlink_to(tmp_path / "zone")
    return etc


def stage(tmp_path: Path, host_etc: Path) -> EtcStage:
    return EtcStage(tmp_path / "staged", host_etc, ["passwd", "hosts", "ssl", "localtime", "gone"])


def test_allowed_files_and_directories_are_copied(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    directory = staged.directory
    assert sorted(os.listdir(directory)) == ["hosts", "localtime", "passwd", "ssl"]
    assert (directory / "passwd").read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert (directory / "localtime").read_text() == "UTC"  # a symlink's content, not the link
    assert not (directory / "localtime").is_symlink()
    assert not (directory / "shadow").exists()
    # A directory is a tree whose symlinks stay links (they resolve in the sandbox as through a bind).
    assert (directory / "ssl" / "cert.pem").read_text() == "cert"
    assert os.readlink(directory / "ssl" / "certs" / "ca.pem") == "../cert.pem"


def test_private_entries_are_empty_placeholders_and_tool_configs_are_left_out(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    ssl = staged.directory / "ssl"
    assert sorted(os.listdir(ssl)) == ["cert.pem", "certs", "private"]  # no pip.conf
    assert os.listdir(ssl / "private") == []
    assert (ssl / "private").stat().st_mode & 0o777 == 0o710  # listed as through a bind, not entered
    assert "secret key" not in _all_text(staged.directory)
    assert "token" not in _all_text(staged.directory)


def test_a_change_inside_a_copied_tree_is_followed(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    (host_etc / "ssl" / "cert.pem").write_text("edited in place")
    (host_etc / "ssl" / "certs" / "new.pem").symlink_to("../cert.pem")
    staged.refresh()
    assert (staged.directory / "ssl" / "cert.pem").read_text() == "edited in place"
    assert os.readlink(staged.directory / "ssl" / "certs" / "new.pem") == "../cert.pem"
    (host_etc / "ssl" / "certs" / "ca.pem").unlink()
    staged.refresh()
    assert sorted(os.listdir(staged.directory / "ssl" / "certs")) == ["new.pem"]
    assert sorted(os.listdir(staged.directory)) == ["hosts", "localtime", "passwd", "ssl"]  # no leftovers
    shutil.rmtree(host_etc / "ssl")
    staged.refresh()
    assert not (staged.directory / "ssl").exists()


def test_an_unchanged_stage_is_checked_without_copying(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    inode = os.stat(staged.directory / "ssl").st_ino
    staged.refresh()
    assert os.stat(staged.directory / "ssl").st_ino == inode


def _all_text(directory: Path) -> str:
    return "".join(p.read_text() for p in directory.rglob("*") if p.is_file())


def test_a_copy_keeps_its_sources_permission_bits(tmp_path: Path, host_etc: Path) -> None:
    os.chmod(host_etc / "hosts", 0o600)
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    assert (staged.directory / "hosts").stat().st_mode & 0o777 == 0o600
    assert (staged.directory / "passwd").stat().st_mode & 0o777 == 0o644 & ~_umask()


def test_changed_replaced_and_removed_sources_are_followed(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    (host_etc / "hosts").write_text("10.0.0.1 changed-in-place and longer\n")
    replacement = host_etc / "passwd.new"
    replacement.write_text("root:x:0:0::/root:/bin/bash\n")
    replacement.replace(host_etc / "passwd")  # as vipw and resolvconf do: a new inode
    (host_etc / "localtime").unlink()
    staged.refresh()
    assert (staged.directory / "hosts").read_text() == "10.0.0.1 changed-in-place and longer\n"
    assert (staged.directory / "passwd").read_text() == "root:x:0:0::/root:/bin/bash\n"
    assert not (staged.directory / "localtime").exists()


def test_a_new_gateway_starts_from_a_clean_directory(tmp_path: Path, host_etc: Path) -> None:
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "shadow").write_text("left by someone")
    stage(tmp_path, host_etc).refresh()
    assert not (tmp_path / "staged" / "shadow").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_remove_leaves_nothing_and_a_later_refresh_starts_again(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    staged.remove()
    assert not staged.directory.exists()
    staged.refresh()
    assert (staged.directory / "passwd").exists()


def test_a_tree_with_read_only_directories_is_copied_again_when_it_changes(tmp_path: Path, host_etc: Path) -> None:
    # A copy keeps its source's bits, so its directories may be read-only to the gateway itself
    # (a non-root gateway could then not remove the previous copy).
    (host_etc / "ssl" / "certs").chmod(0o555)
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    assert (staged.directory / "ssl" / "certs").stat().st_mode & 0o777 == 0o555
    (host_etc / "ssl" / "certs").chmod(0o755)
    (host_etc / "ssl" / "certs" / "second.pem").symlink_to("../cert.pem")
    (host_etc / "ssl" / "certs").chmod(0o555)
    staged.refresh()
    assert sorted(os.listdir(staged.directory / "ssl" / "certs")) == ["ca.pem", "second.pem"]
    assert sorted(os.listdir(staged.directory)) == ["hosts", "localtime", "passwd", "ssl"]
    (host_etc / "ssl" / "certs").chmod(0o755)  # so that pytest can remove tmp_path


def test_a_directory_too_big_to_copy_is_a_mount_point_for_its_own_bind(tmp_path: Path, host_etc: Path) -> None:
    # Symlink farms such as /etc/alternatives: copying hundreds of links took most of a second of
    # a gateway's first start on a busy disk, so such a directory keeps its bind.
    (host_etc / "alternatives").mkdir()
    for index in range(TREE_LIMIT + 1):
        (host_etc / "alternatives" / f"tool{index}").symlink_to("/usr/bin/true")
        (host_etc / "ssl" / "certs" / f"{index}.pem").symlink_to("../cert.pem")
    staged = EtcStage(tmp_path / "staged", host_etc, ["passwd", "hosts", "ssl", "localtime", "alternatives"])
    staged.refresh()
    assert staged.subdirectories == ("alternatives",)
    assert os.listdir(staged.directory / "alternatives") == []  # bound over, not copied
    assert sorted(os.listdir(staged.directory)) == ["alternatives", "hosts", "localtime", "passwd", "ssl"]
    # The system bundle's directory is copied whatever its size (its bundle becomes a link).
    assert len(os.listdir(staged.directory / "ssl" / "certs")) == TREE_LIMIT + 2


def _host_bundle(host_etc: Path, text: str = "host CAs\n") -> Path:
    bundle = host_etc / "ssl" / "certs" / "ca-certificates.crt"
    bundle.write_text(text)
    bundle.chmod(0o644)
    return bundle


def test_the_staged_system_bundle_links_into_the_egress_directory(tmp_path: Path, host_etc: Path) -> None:
    _host_bundle(host_etc)
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    certs = staged.directory / "ssl" / "certs"
    assert staged.bundle_linked
    assert os.readlink(certs / "ca-certificates.crt") == f"{egress.SANDBOX_DIR}/{egress.SYSTEM_BUNDLE_COPY}"
    kept = certs / Path(egress.HOST_BUNDLE).name
    assert kept.read_text() == "host CAs\n"
    assert kept.stat().st_mode & 0o777 == 0o644
    assert sorted(os.listdir(certs)) == sorted(["ca.pem", "ca-certificates.crt", kept.name])
    # Each start's link leads back to the host's bundle as the sandbox sees it.
    egress_dir = tmp_path / "li-1.egress"
    egress_dir.mkdir()
    link_system_bundle(egress_dir)
    assert os.readlink(egress_dir / egress.SYSTEM_BUNDLE_COPY) == egress.HOST_BUNDLE
    # And the names only an intercepting activation's variables give, into the shared trust.
    assert {name: os.readlink(egress_dir / name) for name in (egress.CA_FILE, egress.BUNDLE_FILE)} == {
        egress.CA_FILE: f"{egress.SHARED_TRUST_DIR}/{egress.CA_FILE}",
        egress.BUNDLE_FILE: f"{egress.SHARED_TRUST_DIR}/{egress.BUNDLE_FILE}",
    }


def test_a_changed_host_bundle_is_staged_again_still_linked(tmp_path: Path, host_etc: Path) -> None:
    bundle = _host_bundle(host_etc)
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    bundle.write_text("host CAs, and one more\n")  # update-ca-certificates
    staged.refresh()
    certs = staged.directory / "ssl" / "certs"
    assert (certs / Path(egress.HOST_BUNDLE).name).read_text() == "host CAs, and one more\n"
    assert os.readlink(certs / "ca-certificates.crt") == f"{egress.SANDBOX_DIR}/{egress.SYSTEM_BUNDLE_COPY}"
    staged.remove()
    assert not staged.bundle_linked


def test_a_host_bundle_that_is_a_link_or_missing_is_copied_as_it_is(tmp_path: Path, host_etc: Path) -> None:
    staged = stage(tmp_path, host_etc)
    staged.refresh()  # no bundle at all
    assert not staged.bundle_linked
    (host_etc / "ssl" / "certs" / "ca-certificates.crt").symlink_to("../cert.pem")  # as on Fedora
    staged.refresh()
    assert not staged.bundle_linked
    assert os.readlink(staged.directory / "ssl" / "certs" / "ca-certificates.crt") == "../cert.pem"


def test_a_read_only_certs_directory_is_linked_and_keeps_its_bits(tmp_path: Path, host_etc: Path) -> None:
    _host_bundle(host_etc)
    (host_etc / "ssl" / "certs").chmod(0o555)
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    (host_etc / "ssl" / "certs").chmod(0o755)  # so that pytest can remove tmp_path
    assert staged.bundle_linked
    assert (staged.directory / "ssl" / "certs").stat().st_mode & 0o777 == 0o555


def _shared(staged: EtcStage) -> Path:
    return staged.directory / Path(egress.SHARED_TRUST_DIR).relative_to("/etc")


@pytest.mark.parametrize("told_first", [True, False], ids=["told-before-the-stage", "told-after-the-stage"])
def test_the_gateways_ca_is_placed_once_beside_the_kept_host_bundle(
    tmp_path: Path, host_etc: Path, told_first: bool
) -> None:
    _host_bundle(host_etc, "host CAs")  # no final newline: the bundle adds one
    (host_etc / "ssl").chmod(0o555)
    staged = stage(tmp_path, host_etc)
    if told_first:
        staged.trust(b"THE CA\n")  # the gateway's CA is loaded before the first start makes the stage
        assert not staged.directory.exists()
    staged.refresh()
    if not told_first:
        assert not _shared(staged).exists()
        staged.trust(b"THE CA\n")  # made after the stage: placed in it now
    (host_etc / "ssl").chmod(0o755)  # so that pytest can remove tmp_path
    shared = _shared(staged)
    assert (shared / egress.CA_FILE).read_bytes() == b"THE CA\n"
    assert (shared / egress.BUNDLE_FILE).read_bytes() == b"host CAs\nTHE CA\n"
    modes = {path.name: path.stat().st_mode & 0o777 for path in (shared, *shared.iterdir())}
    assert modes == {shared.name: 0o755, egress.CA_FILE: 0o644, egress.BUNDLE_FILE: 0o644}
    # Not in the certs directory, every file of which Go trusts; the copy keeps its source's bits.
    certs = staged.directory / "ssl" / "certs"
    assert all(b"THE CA" not in path.read_bytes() for path in certs.iterdir() if not path.is_symlink())
    assert (staged.directory / "ssl").stat().st_mode & 0o777 == 0o555


def test_a_changed_host_bundle_is_in_the_shared_bundle_again(tmp_path: Path, host_etc: Path) -> None:
    bundle = _host_bundle(host_etc)
    staged = stage(tmp_path, host_etc)
    staged.trust(b"THE CA\n")
    staged.refresh()
    bundle.write_text("host CAs, and one more\n")  # update-ca-certificates
    staged.refresh()
    assert (_shared(staged) / egress.BUNDLE_FILE).read_bytes() == b"host CAs, and one more\nTHE CA\n"


def test_no_shared_trust_where_the_host_bundle_is_not_linked(tmp_path: Path, host_etc: Path) -> None:
    (host_etc / "ssl" / "certs" / "ca-certificates.crt").symlink_to("../cert.pem")  # as on Fedora
    staged = stage(tmp_path, host_etc)
    staged.refresh()
    staged.trust(b"THE CA\n")
    staged.refresh()
    assert not staged.bundle_linked
    assert not _shared(staged).exists()  # such a sandbox's activation copies the CA into its egress directory
