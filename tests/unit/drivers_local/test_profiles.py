"""The warm-pool.toml parser: every rule, with file, key and line in the error."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmshell.core.fingerprints import SandboxShape, fingerprint, shape_of
from warmshell.core.models import Resources, SandboxSpec
from warmshell.core.profiles import Profile, ProfileError, parse_profile

FULL = """\
version = 1
workspace = "default"
replicas = 2
image = ""
runtime_class_name = ""
[environment]
FOO = "bar"
[resources]
cpu = "0.2"
memory = "256Mi"
"""


def parse(text: str, name: str = "p", max_replicas: int = 8) -> Profile:
    return parse_profile(text, name=name, source="pools/p.toml", max_replicas=max_replicas)


def test_full_profile() -> None:
    profile = parse(FULL)
    assert profile == Profile(
        name="p",
        source="pools/p.toml",
        workspace="default",
        replicas=2,
        environment={"FOO": "bar"},
        cpu="200m",
        memory="256Mi",
    )
    assert profile.fingerprint("") == fingerprint(SandboxShape("default", "", {"FOO": "bar"}, 200, 256 * 2**20, 0))


def test_minimal_profile_and_default_image() -> None:
    profile = parse('version = 1\nworkspace = "w"\nreplicas = 1\n')
    assert profile.shape("img") == SandboxShape("w", "img")
    assert parse('version = 1\nworkspace = "w"\nreplicas = 1\nimage = "/x"\n').shape("img").image == "/x"


@pytest.mark.parametrize(
    ("text", "key", "line", "rule"),
    [
        ('version = 1\nworkspace = "w"\nreplicas = 1\ncolour = "red"\n', "colour", 4, "unknown key"),
        ('version = 2\nworkspace = "w"\nreplicas = 1\n', "version", 1, "must be 1"),
        ('version = "1"\nworkspace = "w"\nreplicas = 1\n', "version", 1, "must be 1"),
        ('workspace = "w"\nreplicas = 1\n', "version", None, "required"),
        ('version = 1\nworkspace = ""\nreplicas = 1\n', "workspace", 2, "must not be empty"),
        ("version = 1\nreplicas = 1\n", "workspace", None, "required"),
        ('version = 1\nworkspace = "Big_W"\nreplicas = 1\n', "workspace", 2, "DNS-1123"),
        ('version = 1\nworkspace = "w"\nreplicas = 0\n', "replicas", 3, "between 1 and 8"),
        ('version = 1\nworkspace = "w"\nreplicas = -1\n', "replicas", 3, "between 1 and 8"),
        ('version = 1\nworkspace = "w"\nreplicas = 9\n', "replicas", 3, "between 1 and 8"),
        ('version = 1\nworkspace = "w"\nreplicas = true\n', "replicas", 3, "integer"),
        ('version = 1\nworkspace = "w"\nreplicas = 1.5\n', "replicas", 3, "integer"),
        ('version = 1\nworkspace = "w"\n', "replicas", None, "required"),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\n[environment]\n1X = "a"\n',
            "environment.1X",
            5,
            "[A-Za-z_]",
        ),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\n[environment]\nWARMSHELL_X = "a"\n',
            "environment.WARMSHELL_X",
            5,
            "reserved",
        ),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\n[environment]\nN = 3\n',
            "environment.N",
            5,
            "string",
        ),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\n\n[resources]\ncpu = "lots"\n',
            "resources.cpu",
            6,
            "not a Kubernetes quantity",
        ),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\n[resources]\nmemory = "-1Mi"\n',
            "resources.memory",
            5,
            "greater than zero",
        ),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\n[resources]\ngpu = "1"\n',
            "resources.gpu",
            5,
            "unknown key",
        ),
        ('version = 1\nworkspace = "w"\nreplicas = 1\nenvironment = "x"\n', "environment", 4, "table"),
        ('version = 1\nworkspace = "w"\nreplicas = 1\nimage = "a b"\n', "image", 4, "whitespace"),
        (
            'version = 1\nworkspace = "w"\nreplicas = 1\nruntime_class_name = "Not OK"\n',
            "runtime_class_name",
            4,
            "DNS-1123",
        ),
        ('version = 1\nworkspace = "w"\nreplicas = = 1\n', "(syntax)", 3, "not valid TOML"),
    ],
)
def test_errors_name_file_key_line_and_rule(text: str, key: str, line: int | None, rule: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse(text)
    error = caught.value
    assert (error.source, error.key, error.line) == ("pools/p.toml", key, line)
    assert rule in error.rule
    where = f"pools/p.toml:{line}" if line else "pools/p.toml"
    assert str(error).startswith(f"{where}: {key}: ")


def test_bad_file_name() -> None:
    with pytest.raises(ProfileError, match="file name"):
        parse(FULL, name="My Pool")


def test_quantities_may_be_numbers() -> None:
    text = 'version = 1\nworkspace = "w"\nreplicas = 1\n[resources]\ncpu = 0.5\nmemory = 1048576\n'
    profile = parse(text)
    assert (profile.cpu, profile.memory) == ("500m", "1Mi")


def test_same_pool_ignores_replicas_only() -> None:
    base = parse(FULL)
    assert base.same_pool(parse(FULL.replace("replicas = 2", "replicas = 5")))
    assert not base.same_pool(parse(FULL.replace('FOO = "bar"', 'FOO = "baz"')))


env_names = st.text(alphabet=string.ascii_uppercase + "_", min_size=1, max_size=8).filter(
    lambda k: not k.startswith("WARMSHELL_")
)
env_values = st.text(alphabet=string.ascii_letters + string.digits + " -_./", max_size=16)


@given(
    env=st.dictionaries(env_names, env_values, max_size=5),
    cpu_millis=st.integers(min_value=1, max_value=64_000),
    replicas=st.integers(min_value=1, max_value=8),
)
def test_profile_and_request_shapes_share_a_fingerprint(env: dict[str, str], cpu_millis: int, replicas: int) -> None:
    lines = ["version = 1", 'workspace = "default"', f"replicas = {replicas}", "[environment]"]
    lines += [f'{k} = "{v}"' for k, v in reversed(list(env.items()))]
    lines += ["[resources]", f'cpu = "{cpu_millis}m"']
    profile = parse("\n".join(lines) + "\n")
    # A request spelling the same cpu in cores, with env in another order, matches it.
    spec = SandboxSpec(environment=dict(sorted(env.items())), resources=Resources(cpu=str(cpu_millis / 1000)))
    request = shape_of("default", spec, default_image="")
    assert profile.fingerprint("") == fingerprint(request)


@given(st.text(max_size=200))
def test_parser_never_crashes(text: str) -> None:
    # Any other exception escapes and fails the test.
    failure: ProfileError | None = None
    try:
        parse(text)
    except ProfileError as error:
        failure = error
    assert failure is None or str(failure).startswith("pools/p.toml")


BASE = 'version = 1\nworkspace = "w"\nreplicas = 1\n'


def test_storage_and_process_count() -> None:
    profile = parse(BASE + '[resources]\npids = 256\n[storage]\nworkspace = "2048Mi"\ntmp = "512Mi"\n')
    assert profile.pids == 256
    assert (profile.storage.workspace, profile.storage.tmp) == ("2Gi", "512Mi")
    # A process count is part of the shape (a request can ask for one); storage is not.
    assert profile.shape("").pids == 256
    other = parse(BASE + '[resources]\npids = 256\n[storage]\nworkspace = "4Gi"\n')
    assert profile.fingerprint("") == other.fingerprint("")
    assert not profile.same_pool(other)  # but different storage means different members


@pytest.mark.parametrize(
    ("tail", "key", "rule"),
    [
        ('[storage]\nworkspace = "1k"\n', "storage.workspace", "less than 1Mi"),
        ('[storage]\ntmp = "lots"\n', "storage.tmp", "not a Kubernetes quantity"),
        ("[storage]\nworkspace = 1024\n", "storage.workspace", "must be a size string"),
        ('[storage]\nhome = "1Gi"\n', "storage.home", "unknown key; allowed: workspace, tmp"),
        ('storage = "1Gi"\n', "storage", "must be a table"),
        ("[resources]\npids = 3\n", "resources.pids", "between 16 and 4194304"),
        ('[resources]\npids = "64"\n', "resources.pids", "must be a whole number"),
    ],
)
def test_storage_and_process_count_errors_name_the_key(tail: str, key: str, rule: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse(BASE + tail)
    assert caught.value.key == key
    assert rule in str(caught.value)
    assert caught.value.line is not None


def test_network_rules_are_read_and_left_out_of_the_pool() -> None:
    plain = parse(FULL)
    profile = parse(
        FULL + '[network]\nallow = ["pypi.example:443", "*.githubusercontent.example"]\ndeny = ["10.0.0.0/8"]\n'
    )
    assert profile.network_allow == ("pypi.example:443", "*.githubusercontent.example")
    assert profile.network_deny == ("10.0.0.0/8",)
    assert plain.network_allow is None
    # Applied at activation: the same shape, the same members.
    assert profile.same_pool(plain)
    assert profile.fingerprint("") == plain.fingerprint("")


@pytest.mark.parametrize(
    ("table", "key", "rule"),
    [
        ('allow = ["ok.example", "*.com"]', "network.allow[1]", "a wildcard over a public suffix"),
        ('deny = ["x.example:0"]', "network.deny[0]", "port '0' is not a number"),
        ('allow = "pypi.example"', "network.allow", "must be a list of strings"),
        ("ports = [443]", "network.ports", "unknown key; allowed: allow, deny"),
    ],
)
def test_a_bad_network_rule_names_its_entry_and_line(table: str, key: str, rule: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse(FULL + "[network]\n" + table + "\n")
    assert caught.value.key == key
    assert rule in caught.value.rule
    assert caught.value.line == FULL.count("\n") + 2
