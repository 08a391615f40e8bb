"""A profile's `[setup]`: its parsing rules, its copies' sources checked and digested when the
directory is read, and the content key that names its built image."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.profiles import Profile, ProfileError, Setup, parse_profile, split_copy
from warmshell.drivers.local.pools import preparing, reloading

HEAD = 'version = 1\nworkspace = "default"\nreplicas = 1\n'


def parse(text: str) -> Profile:
    return parse_profile(HEAD + text, name="p", source="pools/p.toml", max_replicas=8)


def test_a_setup_table_is_parsed_in_full() -> None:
    profile = parse(
        '[setup]\nfrom = "tools:1"\nrun = ["make", "make test"]\ncopy = ["src:/workspace/src"]\n'
        'allow_net = ["pypi.org"]\n'
    )
    assert profile.setup == Setup("tools:1", ("make", "make test"), (("src", "/workspace/src"),), ("pypi.org",))
    assert profile.image == ""
    assert not profile.same_pool(parse('[setup]\nfrom = "tools:1"\nrun = ["make"]\n'))


@pytest.mark.parametrize(
    ("text", "key", "rule"),
    [
        ('[setup]\nfrom = "t:1"\nrun = ["make"]\nshell = "bash"\n', "setup.shell", "unknown key"),
        ('[setup]\nfrom = "t:1"\nrun = []\n', "setup.run", "must be a non-empty list of commands"),
        ('[setup]\nfrom = "t:1"\n', "setup.run", "must be a non-empty list of commands"),
        ('[setup]\nfrom = "t:1"\nrun = [""]\n', "setup.run", "must be a list of non-empty strings"),
        ('[setup]\nrun = ["make"]\n', "setup.from", "is required"),
        ('[setup]\nfrom = "t:1"\nrun = ["make"]\ncopy = ["src"]\n', "setup.copy", "must be LOCAL:PATH"),
        ('[setup]\nfrom = "t:1"\nrun = ["make"]\ncopy = ["src:rel"]\n', "setup.copy", "absolute PATH"),
        ('[setup]\nfrom = "t:1"\nrun = ["make"]\nallow_net = ["a b"]\n', "setup.allow_net[0]", ""),
        ('image = "t:1"\n[setup]\nfrom = "t:1"\nrun = ["make"]\n', "image", "must be unset with [setup]"),
        ('setup = "make"\n', "setup", "must be a table"),
    ],
)
def test_bad_setups_name_their_field(text: str, key: str, rule: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse(text)
    assert caught.value.key == key
    assert rule in str(caught.value)


def test_copies_are_resolved_checked_and_digested_when_the_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("one")
    text = HEAD + '[setup]\nfrom = "t:1"\nrun = ["make"]\ncopy = ["src:/workspace/src"]\n'
    (tmp_path / "p.toml").write_text(text)
    (tmp_path / "q.toml").write_text(text.replace("src:", "nowhere:"))
    profiles, errors = reloading.load(tmp_path, max_replicas=8)
    setup = profiles["p"].setup
    assert setup is not None
    assert setup.copies == ((str(tmp_path / "src"), "/workspace/src"),)
    assert errors["q"].key == "setup.copy"
    assert "'nowhere'" in str(errors["q"])
    assert "does not exist" in str(errors["q"])
    (tmp_path / "src" / "a.txt").write_text("two")
    changed = reloading.load(tmp_path, max_replicas=8)[0]["p"].setup
    assert changed is not None
    assert changed.copied != setup.copied  # a copied file's content is part of the setup


def test_the_content_key_covers_the_setup_and_the_base_digest() -> None:
    setup = Setup("t:1", ("make",))
    key = preparing.content_key(setup, "t:1@sha256:aa")
    assert key == preparing.content_key(Setup("t:1", ("make",)), "t:1@sha256:aa")
    assert key != preparing.content_key(setup, "t:1@sha256:bb")
    assert key != preparing.content_key(Setup("t:1", ("make", "make test")), "t:1@sha256:aa")
    assert key != preparing.content_key(Setup("t:1", ("make",), allow_net=("pypi.org",)), "t:1@sha256:aa")
    assert preparing.image_tag("p", key) == f"setup/p:{key[:20]}"


@given(
    st.text(min_size=1).filter(lambda t: "\n" not in t),
    st.text(alphabet=st.characters(blacklist_characters=":"), max_size=20),
)
def test_a_copy_splits_at_its_last_colon_and_needs_an_absolute_path(local: str, rest: str) -> None:
    assert split_copy(f"{local}:/{rest}") == (local, f"/{rest}")
    if not rest.startswith("/"):
        assert split_copy(f"{local}:{rest}") is None
