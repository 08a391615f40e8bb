"""The CA files a sandbox whose TLS the egress proxy intercepts trusts, as a pod's supervisor
writes them into the channel volume its workload shares: the CA, the host's bundle then the CA,
and no link the workload planted there followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmshell.core import egress
from warmshell.sandboxio import trust

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_the_trust_files_are_the_ca_and_the_hosts_bundle_then_the_ca(tmp_path: Path) -> None:
    trust.write_trust(tmp_path / "trust", CA)
    assert (tmp_path / "trust" / egress.CA_FILE).read_bytes() == CA
    host = trust.host_bundle()
    bundle = (tmp_path / "trust" / egress.BUNDLE_FILE).read_bytes()
    assert bundle == host + (b"\n" if host and not host.endswith(b"\n") else b"") + CA
    assert sorted(p.name for p in (tmp_path / "trust").iterdir()) == [egress.BUNDLE_FILE, egress.CA_FILE]
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in (tmp_path / "trust").iterdir())
    environment = egress.trust_environment(str(tmp_path / "trust"))
    assert environment["SSL_CERT_FILE"] == str(tmp_path / "trust" / egress.BUNDLE_FILE)
    assert environment["NODE_EXTRA_CA_CERTS"] == str(tmp_path / "trust" / egress.CA_FILE)


def test_written_again_it_replaces_both_files(tmp_path: Path) -> None:
    trust.write_trust(tmp_path / "trust", b"old\n")
    trust.write_trust(tmp_path / "trust", CA)
    assert (tmp_path / "trust" / egress.CA_FILE).read_bytes() == CA
    assert (tmp_path / "trust" / egress.BUNDLE_FILE).read_bytes().endswith(CA)


def test_a_directory_the_workload_made_a_link_is_refused_and_nothing_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "supervisor-only"
    elsewhere.mkdir()
    (tmp_path / "channel").mkdir()
    (tmp_path / "channel" / "trust").symlink_to(elsewhere)
    with pytest.raises(OSError):  # noqa: PT011 - ELOOP or ENOTDIR, as the kernel says
        trust.write_trust(tmp_path / "channel" / "trust", CA)
    assert list(elsewhere.iterdir()) == []


def test_a_file_the_workload_made_a_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "supervisor-file"
    target.write_bytes(b"mine\n")
    directory = tmp_path / "trust"
    directory.mkdir()
    for name in (egress.CA_FILE, egress.BUNDLE_FILE):
        (directory / name).symlink_to(target)
    trust.write_trust(directory, CA)
    assert target.read_bytes() == b"mine\n"
    assert not (directory / egress.CA_FILE).is_symlink()
    assert (directory / egress.CA_FILE).read_bytes() == CA


def test_replace_links_replaces_a_link_or_a_file_and_writes_through_neither(tmp_path: Path) -> None:
    target = tmp_path / "host-bundle.pem"
    target.write_bytes(b"host CAs\n")
    directory = tmp_path / "egress"
    directory.mkdir()
    (directory / "system.pem").symlink_to(target)
    (directory / "ca.pem").write_bytes(b"old copy")
    trust.replace_links(directory, {"system.pem": "/shared/bundle.pem", "ca.pem": "/shared/ca.pem", "new.pem": "/x"})
    assert {p.name: str(p.readlink()) for p in directory.iterdir()} == {
        "system.pem": "/shared/bundle.pem",
        "ca.pem": "/shared/ca.pem",
        "new.pem": "/x",
    }
    assert target.read_bytes() == b"host CAs\n"
    trust.replace_links(directory, {"ca.pem": "/shared/ca.pem"})  # again: the same link, nothing left aside
    assert sorted(p.name for p in directory.iterdir()) == ["ca.pem", "new.pem", "system.pem"]
    (tmp_path / "linked").symlink_to(directory)
    with pytest.raises(OSError):  # noqa: PT011 - ELOOP or ENOTDIR, as the kernel says
        trust.replace_links(tmp_path / "linked", {"ca.pem": "/elsewhere"})
    assert str((directory / "ca.pem").readlink()) == "/shared/ca.pem"


def test_replace_links_refuses_a_directory_that_is_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "planted").symlink_to(tmp_path / "real")
    with pytest.raises(NotADirectoryError):
        trust.replace_links(tmp_path / "planted", {"ca.pem": "/shared/ca.pem"})
    assert list((tmp_path / "real").iterdir()) == []


def test_relink_replaces_only_a_name_already_there(tmp_path: Path) -> None:
    target = tmp_path / "host-bundle.pem"
    target.write_bytes(b"host CAs\n")
    directory = tmp_path / "egress"
    directory.mkdir()
    assert not trust.relink(directory, "system.pem", "/shared/bundle.pem")  # an image's /etc: none there
    assert list(directory.iterdir()) == []
    (directory / "system.pem").symlink_to(target)
    assert trust.relink(directory, "system.pem", "/shared/bundle.pem")
    assert {p.name: str(p.readlink()) for p in directory.iterdir()} == {"system.pem": "/shared/bundle.pem"}
    assert target.read_bytes() == b"host CAs\n"  # replaced, not written through
    (tmp_path / "planted").symlink_to(directory)
    with pytest.raises(NotADirectoryError):
        trust.relink(tmp_path / "planted", "system.pem", "/elsewhere")
    assert str((directory / "system.pem").readlink()) == "/shared/bundle.pem"
