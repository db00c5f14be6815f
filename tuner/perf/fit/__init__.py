"""tuner.perf.fit: where the step-time model's coefficients come from.

One record and the fits that fill it, each module named by what it fits to what:

* :mod:`~tuner.perf.fit.coefficients`: the record itself (``Coefficients``, physical and
  bounded), layered from generic defaults, the hardware preset's priors, the shipped fit
  and a calibration file;
* :mod:`~tuner.perf.fit.published`: the shipped fit to published serving rows
  (``presets/fitted/published.yaml``), the replay's default coefficients;
* :mod:`~tuner.perf.fit.to_probes`: fit to a real server's probes (``tuner calibrate
  --launch/--endpoint``), saved as a :mod:`~tuner.perf.fit.calibration_file`;
* :mod:`~tuner.perf.fit.to_benchmarks`: fit to serving benchmark rows (``tuner calibrate
  --from-benchmarks CSV``: the published CSV or a user's ``vllm bench serve`` results),
  which :mod:`~tuner.perf.fit.benchmark_rows` loads and replays on the twin;
* :mod:`~tuner.perf.fit.parameters` (bounds, vectorised step pricing) and
  :mod:`~tuner.perf.fit.least_squares` (the solver): shared by both fits;
* :mod:`~tuner.perf.fit.bands`: how far off the fitted model is likely to be (error
  bands per metric, GPU family and regime, from the leave-one-series-out residuals;
  ``data/error-bands.json``, written by bench/error_bands.py), narrowed by a calibration.

Plain Python plus PyYAML and NumPy, like the rest of ``tuner.perf``. Importing the
package imports nothing: the step-time model needs only ``coefficients``.
"""
