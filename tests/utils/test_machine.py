"""The machine record every benchmark report carries."""

from __future__ import annotations

import json

from seer.utils import machine
from seer.utils.machine import FEATURES, cpu_info, machine_info


def test_cpu_info_names_the_cpu_and_only_known_features() -> None:
    info = cpu_info()
    assert info["model"] and info["arch"] and info["cpus"] >= info["usable_cpus"] >= 1
    assert set(info["features"]) <= set(FEATURES)


def test_features_come_from_the_first_processor(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    text = ("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n\n"
            "processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu\n")
    monkeypatch.setattr(machine, "Path", lambda _: type("P", (), {"read_text": lambda self: text})())
    machine.cpu_info.cache_clear()
    try:
        info = cpu_info()
    finally:
        machine.cpu_info.cache_clear()
    assert info["model"] == "Test CPU" and info["features"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]


def test_machine_info_records_dtype_and_versions() -> None:
    info = machine_info("float32")
    assert info["dtype"] == "float32" and info["python"].count(".") == 2
    json.dumps(info)


def test_auto_dtype_is_bf16_only_where_it_is_native(monkeypatch) -> None:  # noqa: ANN001
    from seer.engine.config import EngineConfig
    from seer.rollout.coordinator import RolloutConfig

    for features, cpu_pick in ((["avx2", "fma"], "float32"), (["avx512f", "avx512bw"], "float32"),
                               (["avx512f", "avx512_bf16"], "bfloat16"), (["amx_tile", "amx_bf16"], "bfloat16"),
                               (["asimd", "bf16"], "bfloat16")):
        monkeypatch.setattr(machine, "cpu_info", lambda f=features: {"features": f})
        assert machine.auto_dtype("cpu") == cpu_pick and machine.auto_dtype("cuda:0") == "bfloat16"
        assert EngineConfig(model="m").dtype == cpu_pick  # the default is auto, resolved at construction
        assert RolloutConfig().engine.dtype == cpu_pick
    assert EngineConfig(model="m", dtype="bfloat16").dtype == "bfloat16"  # an explicit dtype is kept


def test_seer_version(capsys) -> None:  # noqa: ANN001
    import pytest

    from seer import __version__
    from seer.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"seer {__version__}"
