"""Config: file, then environment, then flags; every mistake names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ListenAddress, env_name, load_config
from gateway.config.quiet import quiet_hours
from gateway.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def test_defaults_need_no_file(tmp_path: Path) -> None:
    """With no file and no environment the documented defaults apply."""
    config = load_config(None, env={"GATEWAY_DATA_DIR": str(tmp_path)})
    assert config.device_listen == ListenAddress("0.0.0.0", 8765)
    assert config.host_listen == ListenAddress("127.0.0.1", 8766)
    assert config.host_listen.is_loopback and not config.device_listen.is_loopback
    assert config.mqtt_listen == ListenAddress("0.0.0.0", 1883)
    assert config.data_dir == tmp_path and config.tools_mode == "auto"


def test_environment_overrides_file_and_flags_override_both(tmp_path: Path) -> None:
    """Precedence: file < GATEWAY_* < flags."""
    path = write(tmp_path, 'host_listen = "127.0.0.1:9000"\n[calls]\ntimeout = 5\n')
    env = {"GATEWAY_HOST_LISTEN": "127.0.0.1:9001", "GATEWAY_CALLS_TIMEOUT": "7.5"}
    config = load_config(path, env=env, flags={"host_listen": "[::1]:9002", "data_dir": None})
    assert config.host_listen == ListenAddress("::1", 9002)
    assert str(config.host_listen) == "[::1]:9002"
    assert config.call_timeout == 7.5


def test_fixed_environment_names() -> None:
    """The names DESIGN.md fixes follow from the naming rule."""
    assert env_name("", "data_dir") == "GATEWAY_DATA_DIR"
    assert env_name("", "host_token") == "GATEWAY_HOST_TOKEN"
    assert env_name("tools", "mode") == "GATEWAY_TOOLS_MODE"


def test_the_two_public_urls_have_names_that_say_which_and_the_former_ones_work(
    tmp_path: Path,
) -> None:
    """device_url (boards) and [host] remote_url (remote apps); public_url, [host] public_url,
    GATEWAY_PUBLIC_URL (DESIGN.md's fixed name) and GATEWAY_HOST_PUBLIC_URL still work, each
    noted once with its new name; the new name wins where both are given."""
    path = tmp_path / "gateway.toml"
    path.write_text('public_url = "http://192.168.1.20:8765"\n'
                    '[host]\npublic_url = "https://devices.example.com"\n')  # fmt: skip
    former = load_config(path, env={})
    assert former.public_url == "http://192.168.1.20:8765"
    assert former.host_public_url == "https://devices.example.com"
    assert former.renamed == (
        "public_url is now device_url",
        "host.public_url is now host.remote_url",
    )
    env = {
        "GATEWAY_PUBLIC_URL": "http://10.0.0.5:8765",
        "GATEWAY_HOST_PUBLIC_URL": "https://a.example",
    }
    assert load_config(env=env).renamed == (
        "GATEWAY_PUBLIC_URL is now GATEWAY_DEVICE_URL",
        "GATEWAY_HOST_PUBLIC_URL is now GATEWAY_HOST_REMOTE_URL",
    )
    both = load_config(env={**env, "GATEWAY_DEVICE_URL": "http://10.0.0.6:8765",
                            "GATEWAY_HOST_REMOTE_URL": "https://b.example"})  # fmt: skip
    assert (both.public_url, both.host_public_url) == ("http://10.0.0.6:8765", "https://b.example")
    current = load_config(env={"GATEWAY_DEVICE_URL": "http://10.0.0.6:8765"})
    assert current.public_url == "http://10.0.0.6:8765" and current.renamed == ()
    assert load_config(flags={"public_url": "http://10.0.0.7:8765"}).public_url.endswith("7:8765")


def test_config_file_from_gateway_config_and_shared_device_token(tmp_path: Path) -> None:
    """GATEWAY_CONFIG names the file; GATEWAY_DEVICE_TOKEN adds to configured tokens."""
    path = write(tmp_path, 'device_tokens = ["a"]\nmqtt_listen = "off"\n')
    config = load_config(None, env={"GATEWAY_CONFIG": str(path), "GATEWAY_DEVICE_TOKEN": "b"})
    assert config.device_tokens == ("b", "a")
    assert config.mqtt_listen is None


def test_device_tables(tmp_path: Path) -> None:
    """[devices."<id>"] sets a device's name, timeouts and policy."""
    path = write(
        tmp_path,
        '[devices]\ndiscovery_timeout = 9\n[devices."AA:BB"]\nname = "kitchen"\n'
        'user_tools = ["self.reboot"]\ntool_timeouts = { "self.slow" = 90 }\n',
    )
    config = load_config(path, env={})
    options = config.device("aa:bb")
    assert options.name == "kitchen" and options.user_tools == ("self.reboot",)
    assert options.tool_timeouts == {"self.slow": 90.0}
    assert config.discovery_timeout == 9.0
    assert config.device("unknown").name is None


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ('device_listen = "nohost"', {}, "device_listen"),
        ('device_listen = "h:99999"', {}, "device_listen"),
        ("", {"GATEWAY_TOOLS_MODE": "all"}, "GATEWAY_TOOLS_MODE"),
        ("", {"GATEWAY_AUDIT_ENABLED": "maybe"}, "GATEWAY_AUDIT_ENABLED"),
        ("[tools]\nmeta_threshold = 2.5", {}, "tools.meta_threshold"),
        ("[tools]\nsurprise = 1", {}, "tools.surprise"),
        ("tools = 3", {}, "tools"),
        ('[devices."x"]\ncolour = "red"', {}, 'devices."x".colour'),
        ('[devices."x"]\ntool_timeouts = 3', {}, 'devices."x".tool_timeouts'),
        ("device_tokens = [1]", {}, "device_tokens"),
    ],
)
def test_mistakes_name_their_key(tmp_path: Path, text: str, env: dict[str, str], key: str) -> None:
    """Each wrong value raises ConfigError naming the key."""
    with pytest.raises(ConfigError) as excinfo:
        load_config(write(tmp_path, text), env=env)
    assert excinfo.value.key == key


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A config path that does not exist is reported, not raised as OSError."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml", env={})


def test_example_config_documents_every_key_and_loads() -> None:
    """config/gateway.example.toml names every key and loads to the defaults."""
    from gateway.config.keys import FIELDS

    path = Path(__file__).resolve().parent.parent / "config" / "gateway.example.toml"
    text = path.read_text()
    for table, key, _, _ in FIELDS:
        assert f"{key} =" in text, key
        if table:
            assert f"[{table}]" in text, table
    config = load_config(path, env={"GATEWAY_DATA_DIR": "/tmp/unused"})
    defaults = load_config(None, env={"GATEWAY_DATA_DIR": "/tmp/unused"})
    assert config == defaults


def test_limits_table_from_file_and_environment(tmp_path: Path) -> None:
    """[limits] keys load from the file and GATEWAY_LIMITS_*; a bad address names its key."""
    path = tmp_path / "gateway.toml"
    path.write_text('[limits]\nper_address = 8\nexempt_addresses = ["10.0.0.0/8", "::1"]\n')
    env = {"GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_LIMITS_HANDSHAKE_TIMEOUT": "2.5"}
    config = load_config(path, env=env)
    assert config.limits_per_address == 8 and config.limits_handshake_timeout == 2.5
    assert config.limits_exempt_addresses == ("10.0.0.0/8", "::1")
    none_exempt = load_config(None, env={**env, "GATEWAY_LIMITS_EXEMPT_ADDRESSES": ""})
    assert none_exempt.limits_exempt_addresses == ()
    path.write_text('[limits]\nexempt_addresses = ["nowhere"]\n')
    with pytest.raises(ConfigError, match="limits.exempt_addresses"):
        load_config(path, env=env)


def test_call_bounds_from_file_and_environment(tmp_path: Path) -> None:
    """[calls] max_in_flight (at least 1) and max_queued (0 allowed: never wait)."""
    path = write(tmp_path, "[calls]\nmax_in_flight = 2\nmax_queued = 0\n")
    env = {"GATEWAY_DATA_DIR": str(tmp_path)}
    config = load_config(path, env=env)
    assert (config.call_max_in_flight, config.call_max_queued) == (2, 0)
    config = load_config(path, env={**env, "GATEWAY_CALLS_MAX_QUEUED": "0"})
    assert config.call_max_queued == 0
    defaults = load_config(None, env=env)
    assert (defaults.call_max_in_flight, defaults.call_max_queued) == (4, 32)
    for text, key in [("max_in_flight = 0", "calls.max_in_flight"),
                      ("max_queued = -1", "calls.max_queued"),
                      ("max_queued = false", "calls.max_queued")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            load_config(write(tmp_path, f"[calls]\n{text}\n"), env=env)


def test_cluster_table_from_file_and_environment(tmp_path: Path) -> None:
    """[cluster] is off by default; the broker is a mqtt(s) URL, the replica a topic-safe name."""
    env = {"GATEWAY_DATA_DIR": str(tmp_path)}
    assert load_config(None, env=env).cluster_broker == ()
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[cluster]\nbroker = "mqtts://emqx:8883"\nname = "fleet"\nca_file = "/ca.pem"\n'
    )
    config = load_config(path, env={**env, "GATEWAY_CLUSTER_REPLICA": "gw-1"})
    assert (config.cluster_broker, config.cluster_name) == (("mqtts://emqx:8883",), "fleet")
    assert config.cluster_replica == "gw-1" and config.cluster_ca_file == Path("/ca.pem")
    for bad in ("http://emqx", "mqtt://", "mqtt://u:p@emqx", "mqtt://emqx:port", "mqtt://e/x"):
        with pytest.raises(ConfigError, match="CLUSTER_BROKER"):
            load_config(None, env={**env, "GATEWAY_CLUSTER_BROKER": bad})
    with pytest.raises(ConfigError, match="CLUSTER_REPLICA"):
        load_config(None, env={**env, "GATEWAY_CLUSTER_REPLICA": "gw/1"})


def test_cluster_broker_lists_the_nodes_to_fail_over_to(tmp_path: Path) -> None:
    """A TOML array, or comma-separated in the environment; each URL checked alone."""
    env = {"GATEWAY_DATA_DIR": str(tmp_path)}
    path = tmp_path / "gateway.toml"
    path.write_text('[cluster]\nbroker = ["mqtt://emqx1:1883", "mqtt://emqx2"]\n')
    assert load_config(path, env=env).cluster_broker == ("mqtt://emqx1:1883", "mqtt://emqx2")
    nodes = {**env, "GATEWAY_CLUSTER_BROKER": "mqtt://n1:1883, mqtt://n2:1883,"}
    assert load_config(None, env=nodes).cluster_broker == ("mqtt://n1:1883", "mqtt://n2:1883")
    with pytest.raises(ConfigError, match="CLUSTER_BROKER.*http://n2"):
        load_config(None, env={**env, "GATEWAY_CLUSTER_BROKER": "mqtt://n1,http://n2"})
    path.write_text("[cluster]\nbroker = [1883]\n")
    with pytest.raises(ConfigError, match="list of strings"):
        load_config(path, env=env)
    with pytest.raises(ConfigError, match="CLUSTER_AUTH_TOKEN.*16 or more"):
        load_config(None, env={**env, "GATEWAY_CLUSTER_AUTH_TOKEN": "short"})


def test_upstream_from_file_per_device_and_environment(tmp_path: Path) -> None:
    """[upstream] ota_url applies to every device; a device's own `upstream` wins, "off" too."""
    path = write(
        tmp_path,
        '[upstream]\nota_url = "https://api.tenclass.net/xiaozhi/ota/"\ntimeout = 4\n'
        "fleet_tools = true\n"
        '[devices."AA:BB:CC:DD:EE:01"]\nupstream = "http://10.0.0.2:8002/xiaozhi/ota/"\n'
        '[devices."aa:bb:cc:dd:ee:02"]\nupstream = "off"\n',
    )
    config = load_config(path, env={"GATEWAY_DATA_DIR": str(tmp_path)})
    assert config.upstream_timeout == 4 and config.upstream_enabled
    assert config.upstream_fleet_tools
    assert config.upstream_for("aa:bb:cc:dd:ee:01") == "http://10.0.0.2:8002/xiaozhi/ota/"
    assert config.upstream_for("aa:bb:cc:dd:ee:02") is None
    assert config.upstream_for("aa:bb:cc:dd:ee:03") == "https://api.tenclass.net/xiaozhi/ota/"
    env = {"GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_UPSTREAM_OTA_URL": "off"}
    assert load_config(path, env=env).upstream_for("aa:bb:cc:dd:ee:03") is None
    assert not load_config(None, env={"GATEWAY_DATA_DIR": str(tmp_path)}).upstream_enabled


@pytest.mark.parametrize("url", ["ftp://x/ota/", "api.tenclass.net/xiaozhi/ota/", "http://:1/",
                                 "http://h:99999/"])  # fmt: skip
def test_an_upstream_that_is_no_ota_url_names_its_key(tmp_path: Path, url: str) -> None:
    env = {"GATEWAY_DATA_DIR": str(tmp_path), "GATEWAY_UPSTREAM_OTA_URL": url}
    with pytest.raises(ConfigError, match="GATEWAY_UPSTREAM_OTA_URL.*OTA URL"):
        load_config(None, env=env)
    path = write(tmp_path, f'[devices."aa:bb:cc:dd:ee:01"]\nupstream = "{url}"\n')
    with pytest.raises(ConfigError, match=r'devices\."aa:bb:cc:dd:ee:01"\.upstream'):
        load_config(path, env={"GATEWAY_DATA_DIR": str(tmp_path)})


def test_a_device_s_quiet_hours_switch_and_rate_are_read_and_bad_spans_refused(
    tmp_path: Path,
) -> None:
    """``quiet`` spans midnight when its end comes first; a span that is no span is refused."""
    path = tmp_path / "gateway.toml"
    path.write_text('[devices]\nmessages_per_hour = 3\n[devices."aa:bb"]\nquiet = "22:00-07:00"\n'
                    "messages = false\nmessages_per_hour = 1\n")  # fmt: skip
    config = load_config(path, env={})
    options = config.device("aa:bb")
    assert (config.messages_per_hour, options.messages, options.messages_per_hour) == (3, False, 1)
    assert options.quiet is not None and str(options.quiet) == "22:00-07:00"
    assert [options.quiet.covers(m) for m in (21 * 60 + 59, 22 * 60, 0, 7 * 60 - 1, 7 * 60)] == [
        False, True, True, True, False]  # fmt: skip
    assert quiet_hours("quiet", "off") is None
    for bad in ("22:00", "25:00-07:00", "07:00-07:00", 7):
        with pytest.raises(ConfigError, match="quiet"):
            quiet_hours("quiet", bad)


NAMED = """host_token = "the-owners-own-host-token"
[[host.tokens]]
name = "tablet"
token = "tablet-token-0123456789"
devices = ["sim-esp32_0002", "kitchen*"]
"""


def test_named_host_tokens_load_and_never_show_their_secret(tmp_path: Path) -> None:
    """[[host.tokens]] gives each token a name and its devices; repr and check-config's
    settings say only that the token is set."""
    from gateway.config import settings

    config = load_config(write(tmp_path, NAMED), env={})
    (tablet,) = config.host_tokens
    assert (tablet.name, tablet.devices) == ("tablet", ("sim-esp32_0002", "kitchen*"))
    assert tablet.token == "tablet-token-0123456789"
    shown = repr(config) + repr(settings(config))
    assert "tablet-token-0123456789" not in shown and "host.tokens[0].token" in shown


PHONE = """[[host.tokens]]
name = "phone"
token = "phone-token-0123456789"
devices = ["porch"]
"""


@pytest.mark.parametrize(
    ("text", "key", "why"),
    [
        (NAMED.replace("tablet-token-0123456789", "short"), "host.tokens[0].token", "5 char"),
        (
            NAMED.replace("tablet-token-0123456789", "the-owners-own-host-token"),
            "host.tokens[0].token",
            "same token as host_token",
        ),
        (
            NAMED + PHONE.replace("phone-token", "tablet-token"),
            "host.tokens[1].token",
            "same token as 'tablet'",
        ),
        (NAMED + PHONE.replace('"phone"', '"tablet"'), "host.tokens[1].name", "used twice"),
        (NAMED + PHONE.replace('["porch"]', "[]"), "host.tokens[1].devices", "device ids"),
        (NAMED + PHONE + 'colour = "red"\n', "host.tokens[1].colour", "unknown key"),
    ],
)
def test_a_short_or_shared_named_token_is_refused_at_load(
    tmp_path: Path, text: str, key: str, why: str
) -> None:
    """A named token under 16 characters, one used twice (or the host token's), a name used
    twice: a ConfigError naming the entry, never the token itself."""
    with pytest.raises(ConfigError, match=why) as excinfo:
        load_config(write(tmp_path, text), env={})
    assert excinfo.value.key == key
    assert "0123456789" not in str(excinfo.value) and "owners-own" not in str(excinfo.value)


def test_named_tokens_need_the_owners_host_token(tmp_path: Path) -> None:
    """Without host_token the dashboard and /api would be open to a named token's holder."""
    text = NAMED.replace('host_token = "the-owners-own-host-token"\n', "")
    with pytest.raises(ConfigError, match="need host_token") as excinfo:
        load_config(write(tmp_path, text), env={})
    assert excinfo.value.key == "host.tokens"
