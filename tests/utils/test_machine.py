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
