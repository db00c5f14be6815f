"""Shipped GEMM efficiencies stay physical: no fitted ``eta_compute x peak`` above a
measured max-achievable rate a hardware preset cites (``max_achievable_tflops``).

The kernels31 fit priced 2024 MI300X FP8 rows with FP8 coefficients and shipped
``gemm.fp8.eta_compute`` 0.554, i.e. 1449 TFLOPS for a modern FP8 deployment, 14 % above
AMD's measured 1273 (docs/step-time-model.md section 10, kernels32); this catches that.
"""

from __future__ import annotations

import pytest
import yaml

from tuner.errors import ConfigError
from tuner.perf.hardware import PRESET_DIR, hardware_from_dict, list_hardware, load_hardware

FITTED = PRESET_DIR.parent / "fitted"
#: the fit file stores 6 significant figures: a value fitted onto the ceiling may round up
ROUNDING = 1e-5


def _fitted_gemm() -> list[tuple[str, str, str, float]]:
    """(file, gpu, format, eta_compute) for every shipped fitted GEMM coefficient."""
    out = []
    for path in sorted(FITTED.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for gpu, entry in (data.get("hardware") or {}).items():
            for fmt, g in ((entry.get("coefficients") or {}).get("gemm") or {}).items():
                if "eta_compute" in g:  # else the prior's, checked as the prior
                    out.append((path.name, gpu, fmt, float(g["eta_compute"])))
    return out


def test_mi300x_cites_amds_max_achievable_rates():
    """The MI300X figures of ROCm's 'Measuring Max-Achievable FLOPs - Part 2' (2025-02-28)."""
    hw = load_hardware("mi300x")
    assert hw.max_achievable_flops == {"bf16": 708e12, "fp8": 1273e12}
    assert hw.eta_compute_ceiling("fp8") == pytest.approx(0.4868, abs=1e-4)
    assert hw.eta_compute_ceiling("fp4") == 1.0  # nothing cited: no ceiling


@pytest.mark.parametrize("name", list_hardware())
def test_no_gemm_rate_above_a_measured_max_achievable(name: str):
    """Priors and every shipped fit of ``name``: eta_compute x peak <= the cited rate."""
    hw = load_hardware(name)
    rates = [("prior", fmt, g.eta_compute) for fmt, g in hw.coefficients.gemm.items()]
    rates += [(f, fmt, eta) for f, gpu, fmt, eta in _fitted_gemm() if gpu == name]
    for where, fmt, eta in rates:
        maf = hw.max_achievable_flops.get(fmt)
        if maf:
            assert eta * hw.peak(fmt) <= maf * (1 + ROUNDING), (
                f"{name} {where}: gemm.{fmt}.eta_compute {eta} x peak = "
                f"{eta * hw.peak(fmt) / 1e12:.0f} TFLOPS > measured max {maf / 1e12:.0f}")


def test_the_fit_bounds_eta_compute_by_the_ceiling():
    """The published-results fit may not move eta_compute above the cited ceiling."""
    from tuner.perf.fit.to_benchmarks import _params

    hw = load_hardware("mi300x")

    class _Run:  # the least a fit run needs here: a row's TP and the resolved target
        def __init__(self) -> None:
            from tuner.perf.presets import resolve_target
            from tuner.perf.target import Target
            self.resolved = resolve_target(Target(hardware="mi300x", model="llama-3.1-70b",
                                                  tp=1, quantization="fp8"))
            self.row = type("R", (), {"tp": 1})()

    params = {p.name: p for p in _params([_Run()], hw.coefficients, hw)}
    assert params["gemm.fp8.eta_compute"].hi == pytest.approx(1273 / 2614.9)
    assert params["gemm.fp8.eta_compute"].prior <= params["gemm.fp8.eta_compute"].hi


def test_max_achievable_must_name_a_peak_format():
    data = yaml.safe_load((PRESET_DIR / "mi300x.yaml").read_text())
    data["max_achievable_tflops"] = {"fp4": 100}
    with pytest.raises(ConfigError, match="max_achievable_tflops"):
        hardware_from_dict(data, source="x.yaml")
