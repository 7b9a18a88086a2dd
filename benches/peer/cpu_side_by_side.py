"""burnpose and Ultralytics side by side on the CPU, alternating fresh processes on the same data.

usage: python3 benches/peer/cpu_side_by_side.py --python VENV/bin/python [--burnpose PATH]
       [--config configs/pose_nano.toml] [--rounds 2] [--skip 12] [--out runs/peer-cpu]

The config's built-in images are exported once (`burnpose export-yolo`, lossless PNG) and both
trainers fit them with the config's settings: burnpose `fit CONFIG --device cpu --report`,
Ultralytics 8.4.190 through `ultralytics_pose.py --device cpu` with the same epochs, batch, nbs,
image size, warm-up epochs and seed, `optimizer="auto"`, AMP off, RAM cache and 2 loader
workers. Rounds alternate which tool goes first. Each fit's whole process tree is measured here
(wall seconds and user+system CPU seconds from `wait4`). Our last checkpoint is also validated
as Ultralytics validates its own (one-to-many head + NMS, its metric). Writes OUT/cpu.md (a
table of medians over rounds) and OUT/cpu.json (every run). `--python` is an interpreter with torch and
ultralytics (see README.md: a venv outside the repository); the offline settings and a font are
applied here.
"""
import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None, log=None):
    """Runs `cmd`, returns (wall s, CPU s of its process tree, exit code)."""
    start = time.perf_counter()
    with open(log, "w") if log else open(os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return wall, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def median_after(steps, skip):
    post = sorted(steps[skip:])
    return post[len(post) // 2] if post else float("nan")


def last_row(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else {}


def ours(a, i, out):
    name = f"burnpose-{i}"
    report = os.path.join(out, f"{name}.json")
    cmd = [a.burnpose, "fit", a.config, "--device", "cpu", "--name", name, "--exist-ok",
           "--report", report]
    wall, cpu, rc = run(cmd, log=os.path.join(out, f"{name}.log"))
    if rc != 0:
        sys.exit(f"burnpose fit failed (rc {rc}); see {out}/{name}.log")
    r = json.load(open(report))
    metrics = last_row(os.path.join(a.runs, name, "results.csv"))
    box, pose = peer_way(a, name)
    return {
        "tool": "burnpose", "fit_s": r["fit_s"], "process_s": wall, "cpu_s": cpu,
        "steps": len(r["step_ms"]), "step_ms": median_after(r["step_ms"], a.skip),
        "box_map50": float(metrics.get("metrics/box_mAP50", "nan")),
        "pose_map50": float(metrics.get("metrics/pose_mAP50", "nan")),
        "box_map50_peer_way": box, "pose_map50_peer_way": pose,
    }


def peer_way_config(config, out):
    """A copy of `config` whose validation scores as Ultralytics' `val` scores its own: the
    one-to-many head after NMS, Ultralytics' metric (docs/weights.md). The fit itself reports
    the one-to-one head under COCOeval. Any `val_nms` / `val_metric` of the original give way."""
    text = re.sub(r'(?m)^\s*val_(nms|metric)\s*=.*\n?', "", open(config).read())
    keys = '[train]\nval_nms = true\nval_metric = "ultralytics"'
    text, found = re.subn(r'(?m)^\[train\]\s*$', keys, text, count=1)
    if not found:
        text += "\n" + keys + "\n"
    path = os.path.join(out, "config_peer_way.toml")
    open(path, "w").write(text)
    return path


def peer_way(a, name):
    """Box and pose mAP50 of the fit's last checkpoint under `a.peer_way_config`."""
    ckpt = os.path.join(a.runs, name, "last.safetensors")
    res = subprocess.run([a.burnpose, "val", a.peer_way_config, "--device", "cpu",
                          "--checkpoint", ckpt], capture_output=True, text=True)
    m = re.search(r"box mAP50 ([0-9.]+) .*pose mAP50 ([0-9.]+)", res.stdout + res.stderr)
    if res.returncode != 0 or not m:
        sys.exit(f"burnpose val failed (rc {res.returncode}): {res.stderr[-400:]}")
    return float(m.group(1)), float(m.group(2))


def peer(a, i, out, data_yaml, cfg):
    name = f"ultralytics-{i}"
    report = os.path.join(out, f"{name}.json")
    train = cfg["train"]
    cmd = [a.python, os.path.join(HERE, "ultralytics_pose.py"), data_yaml, report,
           "--device", "cpu", "--epochs", str(train["epochs"]), "--batch", str(train["batch"]),
           "--nbs", str(train["nbs"]), "--imgsz", str(cfg["data"]["imgsz"]),
           "--seed", str(train["seed"]), "--workers", "2",
           "--warmup-epochs", str(cfg.get("optim", {}).get("warmup_epochs", 3.0)),
           "--project", os.path.join(out, name)]
    conf = os.path.join(out, "yolo-config")
    font = os.path.join(conf, "Ultralytics", "Arial.ttf")
    if not os.path.exists(font):
        # Ultralytics fetches Arial.ttf from the network otherwise; matplotlib (one of its
        # dependencies) ships DejaVu Sans.
        src = subprocess.run(
            [a.python, "-c", "import matplotlib, os; print(os.path.join("
             "matplotlib.get_data_path(), 'fonts', 'ttf', 'DejaVuSans.ttf'))"],
            check=True, capture_output=True, text=True).stdout.strip()
        os.makedirs(os.path.dirname(font), exist_ok=True)
        shutil.copy(src, font)
    env = dict(os.environ, YOLO_OFFLINE="1", YOLO_CONFIG_DIR=conf)
    wall, cpu, rc = run(cmd, env=env, log=os.path.join(out, f"{name}.log"))
    if rc != 0:
        sys.exit(f"ultralytics failed (rc {rc}); see {out}/{name}.log")
    r = json.load(open(report))
    return {
        "tool": "ultralytics", "fit_s": r["fit_s"], "process_s": wall, "cpu_s": cpu,
        "steps": len(r["step_ms"]), "step_ms": median_after(r["step_ms"], a.skip),
        "box_map50": r.get("box_map50") or float("nan"),
        "pose_map50": r.get("pose_map50") or float("nan"),
        # Ultralytics' own `val` is the peer's way.
        "box_map50_peer_way": r.get("box_map50") or float("nan"),
        "pose_map50_peer_way": r.get("pose_map50") or float("nan"),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    ap.add_argument("--burnpose", default="target/release/burnpose")
    ap.add_argument("--config", default="configs/pose_nano.toml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=12, help="steps left out of the step median")
    ap.add_argument("--out", default="runs/peer-cpu")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    cfg = tomllib.load(open(a.config, "rb"))
    a.runs = os.path.join(out, "runs")
    # burnpose writes its run folders under the config's output.dir: a copy pointing here.
    cfg_copy = os.path.join(out, "config.toml")
    text = open(a.config).read()
    text = re.sub(r'(?m)^dir\s*=.*$', f'dir = "{a.runs}"', text)
    open(cfg_copy, "w").write(text)
    a.config = cfg_copy
    a.peer_way_config = peer_way_config(a.config, out)
    data = os.path.join(out, "data")
    if not os.path.exists(os.path.join(data, "data.yaml")):
        subprocess.run([a.burnpose, "export-yolo", a.config, data], check=True)
    data_yaml = os.path.join(data, "data.yaml")
    runs = []
    for i in range(a.rounds):
        order = [ours, peer] if i % 2 == 0 else [peer, ours]
        for tool in order:
            r = tool(a, i, out) if tool is ours else tool(a, i, out, data_yaml, cfg)
            r["round"] = i
            print(f"round {i} {r['tool']}: fit {r['fit_s']:.1f} s, step {r['step_ms']:.1f} ms, "
                  f"CPU {r['cpu_s']:.1f} s, box/pose mAP50 {r['box_map50']:.2f}/{r['pose_map50']:.2f}",
                  flush=True)
            runs.append(r)
    json.dump(runs, open(os.path.join(out, "cpu.json"), "w"), indent=1)
    med = lambda tool, k: statistics.median(r[k] for r in runs if r["tool"] == tool)
    rows = [
        ("complete fit (s)", "fit_s", "{:.1f}"),
        ("whole process (s)", "process_s", "{:.1f}"),
        (f"step median after {a.skip} steps (ms)", "step_ms", "{:.0f}"),
        ("process CPU per training step, whole fit (ms)", None, "{:.0f}"),
        ("final val box mAP50", "box_map50", "{:.2f}"),
        ("final val pose mAP50", "pose_map50", "{:.2f}"),
        ("final val box mAP50, peer's head and metric", "box_map50_peer_way", "{:.2f}"),
        ("final val pose mAP50, peer's head and metric", "pose_map50_peer_way", "{:.2f}"),
    ]
    lines = [f"`{' '.join(sys.argv)}`, {a.rounds} rounds (medians), {os.cpu_count()} CPUs", "",
             "| | burnpose | Ultralytics |", "|---|---|---|"]
    for label, key, fmt in rows:
        if key is None:
            vals = [statistics.median(1e3 * r["cpu_s"] / r["steps"] for r in runs
                                      if r["tool"] == t) for t in ("burnpose", "ultralytics")]
        else:
            vals = [med(t, key) for t in ("burnpose", "ultralytics")]
        lines.append(f"| {label} | " + " | ".join(fmt.format(v) for v in vals) + " |")
    open(os.path.join(out, "cpu.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
