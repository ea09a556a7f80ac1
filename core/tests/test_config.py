"""Settings: every SGLANG_FL_* variable, the config file, precedence, and the error texts."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from sglang_fl import ConfigError
from sglang_fl.config import SETTINGS, OrderToken, Settings


def value_and_source(entry: dict) -> dict:
    """The effective value and where it came from (``variable``/``help`` are checked apart)."""
    return {"value": entry["value"], "source": entry["source"]}


def settings(**env: str) -> Settings:
    return Settings.from_environment({f"SGLANG_FL_{k.upper()}": v for k, v in env.items()})


def config_error(**env: str) -> str:
    with pytest.raises(ConfigError) as info:
        settings(**env)
    return str(info.value)


def test_defaults():
    s = Settings.from_environment({})
    assert s.prefer is None
    assert dict(s.per_op) == {}
    assert s.strict is False
    assert s.allow_vendors is None
    assert s.deny_vendors == ()
    assert s.plugins is None
    assert s.disable_plugins == ()
    assert s.dispatch_log is None
    assert s.trace is False
    assert s.config_file is None
    assert set(s.sources.values()) == {"default"}
    assert set(s.sources) == {setting.key for setting in SETTINGS}


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("SGLANG_FL_PREFER", "reference")
    assert Settings.from_environment().prefer == OrderToken("reference")


def test_every_documented_variable_exists():
    names = {s.env for s in SETTINGS}
    assert names == {
        "SGLANG_FL_PREFER",
        "SGLANG_FL_PER_OP",
        "SGLANG_FL_STRICT",
        "SGLANG_FL_ALLOW_VENDORS",
        "SGLANG_FL_DENY_VENDORS",
        "SGLANG_FL_PLUGINS",
        "SGLANG_FL_DISABLE_PLUGINS",
        "SGLANG_FL_DISPATCH_LOG",
        "SGLANG_FL_PLUGIN_TIMEOUT",
        "SGLANG_FL_VERIFY",
        "SGLANG_FL_VERIFY_OPS",
        "SGLANG_FL_TRACE",
        "SGLANG_FL_CUSTOM_OPS",
    }


# -- each variable --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "token"),
    [
        ("flagos", OrderToken("flagos")),
        ("vendor", OrderToken("vendor")),
        ("reference", OrderToken("reference")),
        (" vendor:cuda ", OrderToken("vendor", "cuda")),
        ("impl:vendor.my_chip", OrderToken("impl", "vendor.my_chip")),
    ],
)
def test_prefer(raw, token):
    s = settings(prefer=raw)
    assert s.prefer == token
    assert s.sources["prefer"] == "environment SGLANG_FL_PREFER"


@pytest.mark.parametrize("raw", ["cuda", "vendor:", "impl:", "vendor:bad name", "reference:x"])
def test_prefer_invalid(raw):
    message = config_error(prefer=raw)
    assert "SGLANG_FL_PREFER" in message
    assert "flagos, vendor, vendor:<name>, reference, impl:<impl_id>" in message
    assert repr(raw.strip()) in message


@pytest.mark.parametrize("raw", ["", "  "])
def test_prefer_empty_means_unset(raw):
    s = settings(prefer=raw)
    assert s.prefer is None
    assert s.sources["prefer"] == "environment SGLANG_FL_PREFER"


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", " 1 "])
def test_strict_true(raw):
    s = settings(strict=raw)
    assert s.strict is True
    assert s.sources["strict"] == "environment SGLANG_FL_STRICT"


@pytest.mark.parametrize("raw", ["0", "false", "no", "off", ""])
def test_strict_false(raw):
    assert settings(strict=raw).strict is False


def test_bool_invalid():
    message = config_error(strict="maybe")
    assert "SGLANG_FL_STRICT='maybe' is not a boolean" in message
    assert "allowed: 1, 0, true, false, yes, no" in message


def test_trace():
    assert settings(trace="1").trace is True


@pytest.mark.parametrize(
    "variable", ["allow_vendors", "deny_vendors", "plugins", "disable_plugins"]
)
def test_name_lists(variable):
    s = settings(**{variable: " cuda, my_chip ,ascend-2,,"})
    assert getattr(s, variable) == ("cuda", "my_chip", "ascend-2")
    assert s.sources[variable] == f"environment SGLANG_FL_{variable.upper()}"


@pytest.mark.parametrize(
    "variable", ["allow_vendors", "deny_vendors", "plugins", "disable_plugins"]
)
def test_name_lists_invalid(variable):
    message = config_error(**{variable: "cuda,my chip"})
    assert f"SGLANG_FL_{variable.upper()}='cuda,my chip'" in message
    assert "'my chip' is not a valid name" in message
    assert "letters, digits" in message


def test_plugins_empty_means_none_and_unset_means_all():
    assert settings(plugins="").plugins == ()
    assert settings().plugins is None
    assert settings(allow_vendors="").allow_vendors == ()


def test_dispatch_log(tmp_path):
    s = settings(dispatch_log=str(tmp_path / "log.jsonl"))
    assert s.dispatch_log == tmp_path / "log.jsonl"
    assert settings(dispatch_log="").dispatch_log is None
    assert settings(dispatch_log="~/x.jsonl").dispatch_log == Path("~/x.jsonl").expanduser()


# -- PER_OP ---------------------------------------------------------------------------------------


def test_per_op_syntax():
    s = settings(per_op=" rms_norm = vendor:cuda | reference ; silu_and_mul=impl:vendor.x;")
    assert dict(s.per_op) == {
        "rms_norm": (OrderToken("vendor", "cuda"), OrderToken("reference")),
        "silu_and_mul": (OrderToken("impl", "vendor.x"),),
    }
    assert s.sources["per_op"] == "environment SGLANG_FL_PER_OP"


def test_per_op_unknown_op_suggests_close_match():
    message = config_error(per_op="rms_nrom=reference")
    assert "SGLANG_FL_PER_OP" in message
    assert "unknown op 'rms_nrom' (did you mean 'rms_norm'?)" in message


def test_per_op_entry_without_equals():
    message = config_error(per_op="rms_norm:reference")
    assert "SGLANG_FL_PER_OP='rms_norm:reference'" in message
    assert "has no '='" in message
    assert "op=token|token" in message


def test_per_op_bad_token_names_op():
    message = config_error(per_op="rms_norm=reference|gpu")
    assert "SGLANG_FL_PER_OP (rms_norm)" in message
    assert "invalid selection token 'gpu'" in message


def test_per_op_empty_order():
    message = config_error(per_op="rms_norm=")
    assert "SGLANG_FL_PER_OP (rms_norm)" in message
    assert "invalid selection token ''" in message


def test_per_op_duplicate_op():
    message = config_error(per_op="rms_norm=reference;rms_norm=vendor")
    assert "op 'rms_norm' appears twice" in message


def test_per_op_duplicate_token():
    message = config_error(per_op="rms_norm=reference|reference")
    assert "a token appears twice" in message


# -- unknown variables ----------------------------------------------------------------------------


def test_unknown_variable_warns_with_suggestion(caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_fl.config"):
        s = Settings.from_environment({"SGLANG_FL_PREFFER": "vendor"})
    assert s.prefer is None
    assert "ignoring unknown variable SGLANG_FL_PREFFER" in caplog.text
    assert "did you mean SGLANG_FL_PREFER?" in caplog.text


# -- config file ----------------------------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sglang-fl.toml"
    path.write_text(text)
    return str(path)


def test_config_file_values_and_sources(tmp_path):
    path = write_config(
        tmp_path,
        """
prefer = "vendor:cuda"
strict = true
allow_vendors = ["cuda", "ascend"]
deny_vendors = "bad"
plugins = []
disable_plugins = ["old"]
dispatch_log = "/tmp/x.jsonl"
plugin_timeout = 5
trace = "yes"
verify = 4
verify_ops = ["rms_norm"]
custom_ops = false

[per_op]
rms_norm = ["reference"]
silu_and_mul = "vendor,reference"
""",
    )
    s = settings(config=path)
    assert s.custom_ops is False
    assert s.config_file == Path(path)
    assert s.prefer == OrderToken("vendor", "cuda")
    assert s.strict is True
    assert s.allow_vendors == ("cuda", "ascend")
    assert s.deny_vendors == ("bad",)
    assert s.plugins == ()
    assert s.disable_plugins == ("old",)
    assert s.dispatch_log == Path("/tmp/x.jsonl")
    assert s.plugin_timeout == 5.0
    assert s.trace is True
    assert (s.verify, s.verify_ops) == (4, ("rms_norm",))
    assert dict(s.per_op) == {
        "rms_norm": (OrderToken("reference"),),
        "silu_and_mul": (OrderToken("vendor"), OrderToken("reference")),
    }
    assert set(s.sources.values()) == {f"config file {path}"}


def test_precedence_env_over_file_over_default(tmp_path):
    path = write_config(tmp_path, 'prefer = "vendor"\nstrict = true\n')
    s = settings(config=path, prefer="reference")
    assert s.prefer == OrderToken("reference")  # env wins
    assert s.sources["prefer"] == "environment SGLANG_FL_PREFER"
    assert s.strict is True  # file beats default
    assert s.sources["strict"] == f"config file {path}"
    assert s.trace is False  # default
    assert s.sources["trace"] == "default"


def test_env_wins_even_when_file_value_is_invalid_elsewhere(tmp_path):
    """An invalid file value is an error even if the environment overrides that key."""
    path = write_config(tmp_path, 'strict = "perhaps"\n')
    with pytest.raises(ConfigError, match="is not a boolean"):
        settings(config=path, strict="1")


def test_unknown_file_key_suggests(tmp_path):
    path = write_config(tmp_path, 'prefr = "vendor"\n')
    message = config_error(config=path)
    assert str(path) in message
    assert "unknown key 'prefr' (did you mean 'prefer'?)" in message
    assert "allowed keys: prefer, per_op, strict" in message


def test_invalid_file_value_names_file_key_value(tmp_path):
    path = write_config(tmp_path, "allow_vendors = 5\n")
    message = config_error(config=path)
    assert f"{path}: allow_vendors=5" in message
    assert "comma-separated list of names" in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("prefer = 3", "prefer=3: expected one of flagos, vendor, vendor:<name>, reference"),
        ("strict = 2", "strict=2 is not a boolean; allowed: 1, 0, true, false, yes, no"),
        ("trace = [true]", "trace=[True] is neither a boolean nor a file path"),
        ("dispatch_log = 5", "dispatch_log=5: expected a file path"),
        ("plugins = {a = 1}", "plugins={'a': 1}: expected a comma-separated list of names"),
        ("deny_vendors = ['ok', 'not ok']", "'not ok' is not a valid name"),
    ],
)
def test_invalid_file_values(tmp_path, line, expected):
    path = write_config(tmp_path, line + "\n")
    message = config_error(config=path)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_file_per_op_unknown_op(tmp_path):
    path = write_config(tmp_path, '[per_op]\nrotary_embeding = ["reference"]\n')
    message = config_error(config=path)
    assert "per_op.rotary_embeding" in message
    assert "did you mean 'rotary_embedding'?" in message


def test_file_per_op_not_a_table(tmp_path):
    path = write_config(tmp_path, "per_op = 3\n")
    message = config_error(config=path)
    assert "per_op=3" in message
    assert "op=token|token;op=token" in message


def test_file_per_op_empty_list(tmp_path):
    path = write_config(tmp_path, "[per_op]\nrms_norm = []\n")
    message = config_error(config=path)
    assert "per_op.rms_norm=[]" in message
    assert "non-empty list" in message


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    message = config_error(config=str(missing))
    assert f"SGLANG_FL_CONFIG={str(missing)!r}: file not found" == message


def test_invalid_toml(tmp_path):
    path = write_config(tmp_path, "prefer = \n")
    message = config_error(config=path)
    assert f"SGLANG_FL_CONFIG={path!r}: not valid TOML" in message


def test_config_path_is_a_directory(tmp_path):
    message = config_error(config=str(tmp_path))
    assert message == f"SGLANG_FL_CONFIG={str(tmp_path)!r}: cannot be read (Is a directory)"


def test_config_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('prefer = "vendor:caf\xe9"\n'.encode("latin-1"))
    message = config_error(config=str(path))
    assert f"SGLANG_FL_CONFIG={str(path)!r}: not valid TOML" in message


def test_empty_config_variable_means_no_file():
    s = settings(config="  ")
    assert s.config_file is None


def test_to_dict_is_json_shaped(tmp_path):
    import json

    path = write_config(tmp_path, "[per_op]\nrms_norm = ['vendor:cuda', 'reference']\n")
    s = settings(config=path, deny_vendors="x", dispatch_log=str(tmp_path / "d.jsonl"))
    data = json.loads(json.dumps(s.to_dict()))
    assert data["config_file"] == path
    assert value_and_source(data["settings"]["per_op"]) == {
        "value": {"rms_norm": ["vendor:cuda", "reference"]},
        "source": f"config file {path}",
    }
    assert value_and_source(data["settings"]["deny_vendors"]) == {
        "value": ["x"],
        "source": "environment SGLANG_FL_DENY_VENDORS",
    }
    assert data["settings"]["dispatch_log"]["value"] == str(tmp_path / "d.jsonl")
    assert value_and_source(data["settings"]["prefer"]) == {"value": None, "source": "default"}
    assert list(data["settings"]) == [s.key for s in SETTINGS]
    for setting in SETTINGS:
        entry = data["settings"][setting.key]
        assert entry["variable"] == f"SGLANG_FL_{setting.key.upper()}"
        assert entry["help"] == setting.help
        assert entry["help"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("sglang_attention_backend", "is a selection (which whole backend serves), not an op"),
        ("sglang_graph_runner", "is a selection (which whole backend serves), not an op"),
        ("all_reduce", "is a collective: its reference communicates"),
    ],
)
def test_verify_ops_refuses_what_verify_mode_cannot_check(monkeypatch, name, why):
    """Issue 33: these names were accepted, and nothing was ever verified for them."""
    monkeypatch.setenv("SGLANG_FL_VERIFY_OPS", f"rms_norm,{name}")
    with pytest.raises(ConfigError, match=re.escape(f"SGLANG_FL_VERIFY_OPS: '{name}' {why}")):
        Settings.from_environment()


def test_a_refused_selections_hint_names_its_own_ops(monkeypatch):
    """The graph runner's refusal does not send the user to the attention kernels."""
    monkeypatch.setenv("SGLANG_FL_VERIFY_OPS", "sglang_graph_runner")
    with pytest.raises(ConfigError) as refused:
        Settings.from_environment()
    assert "decode_attention" not in str(refused.value)
    assert "the ops the graphs it captures run instead" in str(refused.value)


def test_verify_ops_takes_the_routed_families(monkeypatch):
    ops = "rms_norm,decode_attention,fused_gate_sigmoid_mul,rms_norm_gated,chunk_gated_delta_rule"
    monkeypatch.setenv("SGLANG_FL_VERIFY_OPS", ops)
    assert Settings.from_environment().verify_ops == tuple(ops.split(","))
