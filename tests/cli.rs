//! The binary as a user runs it (CPU build).

mod common;

use common::burnpose;

#[test]
fn info_prints_reference_totals() {
    let (ok, text) = burnpose(&["info"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("3679464 parameters (2262624 backbone+neck)"),
        "{text}"
    );
    assert!(text.contains("Pose26"), "{text}");
    assert!(text.contains("56x8400 anchors"), "{text}");
    let (ok, text) = burnpose(&["info", "--task", "detect", "--nc", "80", "--imgsz", "320"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("yolo26n (Detect)") && text.contains("84x2100 anchors"),
        "{text}"
    );
}

#[test]
fn info_rejects_bad_flags() {
    let (ok, text) = burnpose(&["info", "--scale", "q"]);
    assert!(!ok && text.contains("--scale"), "{text}");
    let (ok, text) = burnpose(&["info", "--imgsz", "100"]);
    assert!(!ok && text.contains("--imgsz"), "{text}");
}

/// The launch census and the launch benchmark refuse what they cannot count, and a build
/// without CUDA its kernels' choices, with one error before any training step runs.
#[test]
fn census_and_launch_bench_refuse_a_cpu_device_up_front() {
    let (ok, text) = burnpose(&[
        "bench-step",
        "configs/pose_nano.toml",
        "--device",
        "cpu",
        "--census",
        "2",
    ]);
    assert!(!ok && text.contains("--census"), "{text}");
    assert!(!text.contains("bench-step cpu"), "steps ran first: {text}");
    assert!(!text.contains("panicked"), "{text}");
    let (ok, text) = burnpose(&["bench-launch", "--launches", "0"]);
    assert!(!ok && text.contains("--launches"), "{text}");
    // The kernels' CUDA-only choices are refused by a build without CUDA, named.
    if !cfg!(feature = "cuda") {
        for (flag, value) in [
            ("--reduced-wgrad", "true"),
            ("--grads-in-place", "false"),
            ("--stats-in-place", "true"),
            ("--bn-single-pass", "true"),
            ("--grad-operands", "true"),
            ("--input-operands", "true"),
            ("--conv-padding", "32"),
        ] {
            let (ok, text) = burnpose(&[
                "bench-step",
                "configs/pose_nano.toml",
                "--device",
                "cpu",
                flag,
                value,
            ]);
            assert!(!ok && text.contains(flag), "{flag}: {text}");
            assert!(!text.contains("bench-step cpu"), "steps ran first: {text}");
        }
    }
}

/// `bench-step --unsynced N` runs N more steps after the timed ones and prints their pace.
#[test]
fn bench_step_times_unsynced_steps() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-unsynced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        "[data]\nimgsz = 64\ntrain_images = 4\nval_images = 2\n[train]\nbatch = 2\nnbs = 2\n",
    )
    .unwrap();
    let args = ["--device", "cpu", "--skip", "1", "--steps", "2"];
    let (ok, text) = burnpose(
        &[
            &["bench-step", cfg.to_str().unwrap()][..],
            &args,
            &["--unsynced", "3", "--spans"],
        ]
        .concat(),
    );
    assert!(ok, "{text}");
    // The spans of the three steps: the images, stage and accumulation of each (the CPU's
    // loss runs in autodiff, no span of the recorded step's).
    let spans = text
        .lines()
        .find(|l| l.starts_with("host ms per unsynced step by span (runs): "))
        .unwrap_or_else(|| panic!("{text}"));
    for part in ["images ", "stage ", "accumulate "] {
        let runs = spans
            .split(part)
            .nth(1)
            .and_then(|r| r.split(['(', ')']).nth(1))
            .unwrap_or_else(|| panic!("{part}: {spans}"));
        assert_eq!(runs, "3", "{part}: {spans}");
    }
    assert!(spans.contains("loss 0.00 (0)"), "{spans}");
    let line = text
        .lines()
        .find(|l| l.starts_with("unsynced: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.ends_with(
            "ms per step over 3 steps (no device sync between them; 0 read late; 0 uploaded ahead)"
        ),
        "{line}"
    );
    let ms: f64 = line["unsynced: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ms > 0.0, "{line}");
    let (ok, text) = burnpose(&[&["bench-step", cfg.to_str().unwrap()][..], &args].concat());
    assert!(ok && !text.contains("unsynced"), "{text}");
    let (ok, text) = burnpose(
        &[
            &["bench-step", cfg.to_str().unwrap()][..],
            &args,
            &["--spans"],
        ]
        .concat(),
    );
    assert!(!ok && text.contains("--unsynced"), "--spans alone: {text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fit_trains_and_writes_run_folder() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tiny.toml");
    let runs = dir.join("runs");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nimgsz = 64\ntrain_images = 4\nval_images = 2\n[train]\nepochs = 2\nbatch = 2\nnbs = 2\n[output]\ndir = {:?}\nname = \"x\"\n",
            runs.to_str().unwrap()
        ),
    )
    .unwrap();
    let (ok, text) = burnpose(&[
        "fit",
        cfg.to_str().unwrap(),
        "--device",
        "cpu",
        "--name",
        "tiny",
        "--phases",
        "--events",
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("epoch 2/2: loss") && text.contains("state hashes"),
        "{text}"
    );
    // --phases: each epoch's step median and phase medians, every phase named.
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("step median")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    for phase in burnpose::train::trainer::PHASES {
        assert!(
            lines[1].contains(&format!("{phase} ")),
            "{phase}: {}",
            lines[1]
        );
    }
    assert!(
        lines[1].contains("2 with an optimizer step"),
        "{}",
        lines[1]
    );
    let run = runs.join("tiny");
    // steps.csv: a row per timed step, with its phases.
    let steps = std::fs::read_to_string(run.join("steps.csv")).unwrap();
    let rows: Vec<&str> = steps.lines().collect();
    assert_eq!(rows.len(), 5, "{steps}");
    assert!(rows[0].starts_with(
        "iteration,optimizer_step,step_ms,event_ms,in_use_mib,reserved_mib,upload_ms"
    ));
    assert!(rows[0].ends_with("readback_ms"), "{}", rows[0]);
    for (i, row) in rows[1..].iter().enumerate() {
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells.len(), rows[0].split(',').count(), "{row}");
        assert_eq!((cells[0], cells[1]), (i.to_string().as_str(), "1"), "{row}");
        assert!(cells[2].parse::<f64>().unwrap() > 0.0, "{row}");
        // --events: the device's clock (wall clock between syncs on the CPU).
        assert!(cells[3].parse::<f64>().unwrap() > 0.0, "{row}");
    }
    let csv = std::fs::read_to_string(run.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(run.join("last.safetensors").is_file() && run.join("config.toml").is_file());
    let png = image::open(run.join("results.png")).expect("results.png decodes");
    assert!(png.width() > 0 && png.height() > 0);
    let (ok, text) = burnpose(&[
        "fit",
        cfg.to_str().unwrap(),
        "--resume",
        run.join("last.safetensors").to_str().unwrap(),
    ]);
    assert!(
        ok && text.contains("resumed") && text.contains("done: 2 epochs"),
        "{text}"
    );
}

#[test]
fn fit_with_bad_config_names_file_and_key() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[train]\nbatchsize = 4\n").unwrap();
    let (ok, text) = burnpose(&["fit", path.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("bad.toml") && text.contains("batchsize"),
        "{text}"
    );
    let (ok, text) = burnpose(&["fit", "configs/does_not_exist.toml"]);
    assert!(!ok && text.contains("does_not_exist.toml"), "{text}");
}

/// `bench` runs fresh fit processes for both arms and writes the comparison. On the CPU the replay
/// arm falls back to native, which the table must say; both arms then compute the same thing, so
/// their hashes must match.
#[test]
fn bench_runs_pairs_and_writes_tables() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nimgsz = 64\ntrain_images = 4\nval_images = 2\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[output]\ndir = {:?}\n",
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let out = dir.join("bench");
    let peer = dir.join("peer.json");
    std::fs::write(
        &peer,
        r#"{"tool": "ultralytics", "version": "8.4.190", "fit_s": 116.4, "process_s": 122.1,
            "step_ms": [300.0, 170.0, 179.0, 190.0], "peak_allocated_mib": 791.2,
            "peak_reserved_mib": 940.0}"#,
    )
    .unwrap();
    let bench = |extra: &[&str]| {
        let (cfg, out) = (cfg.to_str().unwrap(), out.to_str().unwrap());
        let mut args = vec![
            "bench", cfg, "--pairs", "1", "--skip", "1", "--device", "cpu",
        ];
        args.extend(["--out", out]);
        args.extend(extra);
        burnpose(&args)
    };
    let (ok, text) = bench(&["--peer", peer.to_str().unwrap(), "--events"]);
    assert!(ok, "{text}");
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(md.contains("| complete fit (s) |"), "{md}");
    // The peer's column: its own numbers, the step median after the same skip.
    assert!(md.contains("| ultralytics 8.4.190 (one run) |"), "{md}");
    assert!(
        md.contains("data: built-in synthetic images, 4 train / 2 val") && md.contains("64 px"),
        "{md}"
    );
    assert!(
        md.contains(" 116.4 |\n") && md.contains(" 179.0 |\n"),
        "{md}"
    );
    assert!(md.contains("pair 1: equal") && md.contains("warm"), "{md}");
    assert!(
        md.contains("replay arm ran natively") && md.contains("CUDA"),
        "{md}"
    );
    let csv = std::fs::read_to_string(out.join("bench.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    // Two steps per fit, one skipped: the step column is filled.
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert!(row[5].parse::<f64>().unwrap() > 0.0, "{csv}");
    // --events: the device-clock step column too (wall clock between syncs on the CPU).
    assert!(
        csv.lines().next().unwrap().contains("device clock"),
        "{csv}"
    );
    assert!(row[6].parse::<f64>().unwrap() > 0.0, "{csv}");
    // Where the fit's seconds went: setup, steps, validation and the rest all measured, and
    // the parts inside the complete fit.
    // The header's names, a quoted one (it holds a comma) as one name.
    let header: Vec<String> = csv
        .lines()
        .next()
        .unwrap()
        .split('"')
        .enumerate()
        .flat_map(|(i, part)| match i % 2 {
            1 => vec![part.to_string()],
            _ => part
                .split(',')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect(),
        })
        .collect();
    assert_eq!(header.len(), row.len(), "{csv}");
    let column = |name: &str| {
        let i = header.iter().position(|c| c == name);
        row[i.unwrap_or_else(|| panic!("no column {name}: {csv}"))]
            .parse::<f64>()
            .unwrap()
    };
    let fit = column("complete fit (s)");
    let setup = column("complete fit: setup (s)");
    let steps = column("complete fit: all steps (s)");
    let validation = column("complete fit: validation (s)");
    let outside = column("complete fit: outside the epochs (s)");
    assert!(
        setup > 0.0 && steps > 0.0 && validation > 0.0 && outside > 0.0,
        "{csv}"
    );
    assert!(setup + steps + validation + outside <= fit + 1e-3, "{csv}");
    assert!(
        md.contains("| complete fit: outside the epochs (s) |"),
        "{md}"
    );
    assert!(
        md.contains("| post-warm-up step, device clock (ms) |"),
        "{md}"
    );

    // `--resume` keeps the finished native fit and runs only the missing replay fit.
    std::fs::remove_file(out.join("reports/bench-replay-0.json")).unwrap();
    let (ok, text) = bench(&["--resume"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("native fit: kept") && text.contains("replay fit ..."),
        "{text}"
    );
    let again = std::fs::read_to_string(out.join("bench.csv")).unwrap();
    assert_eq!(
        again.lines().nth(1),
        csv.lines().nth(1),
        "native row changed"
    );
    assert_eq!(again.lines().count(), 3, "{again}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench --unsynced`: the fits time their steps without syncs, so the table gives their mean
/// as the pace and no synced step median or in-step memory; each report says how it was timed.
#[test]
fn bench_unsynced_gives_the_pace_instead_of_the_step_median() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-unsynced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nimgsz = 64\ntrain_images = 6\nval_images = 2\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[output]\ndir = {:?}\n",
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let out = dir.join("bench");
    let (ok, text) = burnpose(&[
        "bench",
        cfg.to_str().unwrap(),
        "--pairs",
        "1",
        "--skip",
        "1",
        "--device",
        "cpu",
        "--unsynced",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("reports/bench-native-0.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["unsynced"], true, "{report}");
    let steps: Vec<f64> = report["step_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(steps.len(), 3, "one time per step: {report}");
    assert!(report["peak_in_step_mib"].is_null(), "{report}");
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    let row = |name: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no row {name}: {md}"))
            .to_string()
    };
    // The pace is the mean of the last two steps of the native fit, as its column shows.
    let pace = (steps[1] + steps[2]) / 2.0;
    let native: f64 = row("post-warm-up pace, unsynced mean (ms)")
        .split('|')
        .nth(2)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((native - pace).abs() < 0.051, "{native} vs {pace}: {md}");
    assert!(row("post-warm-up step (ms)").contains("n/a"), "{md}");
    // The device clock times synced steps: refused together, before any fit.
    let (ok, text) = burnpose(&[
        "bench",
        cfg.to_str().unwrap(),
        "--unsynced",
        "--events",
        "--device",
        "cpu",
    ]);
    assert!(!ok && text.contains("--events"), "{text}");
    assert!(!text.contains("fit ..."), "a fit started: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A wrong `--peer` file fails at once, named, before any fit runs.
#[test]
fn bench_checks_the_peer_report_first() {
    let (ok, text) = burnpose(&[
        "bench",
        "configs/pose_nano.toml",
        "--device",
        "cpu",
        "--peer",
        "no_such_peer.json",
    ]);
    assert!(!ok && text.contains("no_such_peer.json"), "{text}");
    assert!(!text.contains("fit ..."), "a fit started: {text}");
}

/// A missing file is named once, with the OS reason once (not repeated by the error chain).
#[test]
fn missing_files_are_reported_once() {
    for args in [
        vec!["fit", "/nonexistent/burnpose.toml"],
        vec![
            "fit",
            "configs/pose_nano.toml",
            "--resume",
            "/nonexistent/last.safetensors",
        ],
    ] {
        let (ok, text) = burnpose(&args);
        assert!(!ok, "{text}");
        let path = args.last().unwrap();
        assert!(text.contains(path), "{text}");
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
    }
}

#[test]
fn duplicate_label_rows_are_dropped_with_one_warning() {
    // As Ultralytics: a label file's repeated rows train once, and the file is named.
    let dir = std::env::temp_dir().join(format!("burnpose-cli-dup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ds = dir.join("ds");
    for split in ["train", "val"] {
        std::fs::create_dir_all(ds.join(format!("images/{split}"))).unwrap();
        std::fs::create_dir_all(ds.join(format!("labels/{split}"))).unwrap();
        for name in ["a", "b"] {
            image::RgbImage::from_pixel(40, 30, image::Rgb([90, 120, 150]))
                .save(ds.join(format!("images/{split}/{name}.png")))
                .unwrap();
            let row = "0 0.5 0.5 0.4 0.3\n";
            let rows = if split == "train" && name == "a" {
                row.repeat(3)
            } else {
                row.to_string()
            };
            std::fs::write(ds.join(format!("labels/{split}/{name}.txt")), rows).unwrap();
        }
    }
    std::fs::write(
        ds.join("data.yaml"),
        "train: images/train\nval: images/val\nnames: [thing]\n",
    )
    .unwrap();
    let cfg = dir.join("dup.toml");
    std::fs::write(
        &cfg,
        format!(
            "[model]\ntask = \"detect\"\nnc = 1\n[data]\nsource = \"yolo\"\npath = {:?}\nimgsz = 64\nworkers = 0\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"dup\"\n",
            ds.join("data.yaml").to_str().unwrap(),
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok && text.contains("done: 1 epochs"), "{text}");
    let warning = "labels/train/a.txt: 2 duplicate label row(s) dropped";
    assert_eq!(text.matches(warning).count(), 1, "{text}");
    assert_eq!(text.matches("duplicate label row").count(), 1, "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Label Studio's COCO export as its converter writes it: `result.json` beside `images/`, each
/// `file_name` `images/<name>`, category ids from 0, rectangles (`segmentation: []`) and polygons,
/// no keypoints. Named as the split, the file trains a detector.
#[test]
fn label_studio_coco_export_trains_a_detector() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-ls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let export = dir.join("export");
    std::fs::create_dir_all(export.join("images")).unwrap();
    for name in ["1a2b3c4d-cat.png", "5e6f7a8b-dog.png"] {
        image::RgbImage::from_pixel(40, 30, image::Rgb([90, 120, 150]))
            .save(export.join("images").join(name))
            .unwrap();
    }
    let json = r#"{"images": [{"width": 40, "height": 30, "id": 0, "file_name": "images/1a2b3c4d-cat.png"},
  {"width": 40, "height": 30, "id": 1, "file_name": "images/5e6f7a8b-dog.png"}],
 "categories": [{"id": 0, "name": "thing"}],
 "annotations": [
  {"id": 0, "image_id": 0, "category_id": 0, "segmentation": [], "bbox": [4, 3, 20, 15], "ignore": 0, "iscrowd": 0, "area": 300},
  {"id": 1, "image_id": 1, "category_id": 0, "segmentation": [[10.0, 5.0, 30.0, 5.0, 30.0, 25.0]], "bbox": [10.0, 5.0, 20.0, 20.0], "ignore": 0, "iscrowd": 0, "area": 200.0}],
 "info": {"year": 2026, "version": "1.0", "description": "", "contributor": "Label Studio", "url": "", "date_created": "2026-12-02 12:00:00"}}"#;
    std::fs::write(export.join("result.json"), json).unwrap();
    let cfg = dir.join("ls.toml");
    std::fs::write(
        &cfg,
        format!(
            "[model]\ntask = \"detect\"\nnc = 1\n[data]\nsource = \"coco\"\npath = {:?}\ntrain_split = \"result.json\"\nval_split = \"result.json\"\nimgsz = 64\nworkers = 0\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"ls\"\n",
            export.to_str().unwrap(),
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok && text.contains("done: 1 epochs"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `burnpose config` prints the commented defaults; with a config, every key of it as a run
/// reads it, which loads back as the same config.
#[test]
fn config_prints_the_defaults_and_a_filled_in_config() {
    let (ok, text) = burnpose(&["config"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("[replay]") && text.contains("# scope = "),
        "{text}"
    );
    assert_eq!(text, burnpose::config::DEFAULTS);
    let dir = std::env::temp_dir().join(format!("burnpose-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mine.toml");
    std::fs::write(
        &path,
        "[train]\nepochs = 7\n[replay]\nscope = \"network\"\n",
    )
    .unwrap();
    let (ok, text) = burnpose(&["config", path.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(
        text.contains("epochs = 7") && text.contains("imgsz = 640"),
        "{text}"
    );
    let filled = dir.join("filled.toml");
    std::fs::write(&filled, &text).unwrap();
    assert_eq!(
        burnpose::config::Config::load(&filled).unwrap(),
        burnpose::config::Config::load(&path).unwrap()
    );
    let (ok, text) = burnpose(&["config", "no/such.toml"]);
    assert!(!ok && text.contains("no/such.toml"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
