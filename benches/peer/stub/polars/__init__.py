"""Stand-in for polars on the GPU machine, which lacks it (its runtime wheel alone is 54 MB, more
than a call can carry next to our binary). Ultralytics imports polars only to read its own
results.csv back (inside `try ... except Exception`, so failing here yields `{}`) and to draw plots
(`plots=False` in ultralytics_pose.py). Training, timing and metrics do not touch it."""


def _absent(*_args, **_kwargs):
    raise RuntimeError("polars is not installed on this machine (benches/peer/stub)")


read_csv = _absent
DataFrame = _absent
