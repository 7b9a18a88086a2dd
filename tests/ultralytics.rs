//! Ultralytics' weights in our model: the forward pass against Ultralytics' own outputs, made by
//! `benches/peer/weights_fixtures.py` (tests/fixtures/ultralytics/meta.json says with which
//! versions): a seeded YOLO26n-pose saved as Ultralytics saves a checkpoint, and the raw head
//! outputs of the pose model and of the detection model built from the same weights, in eval and
//! in train mode, on two real COCO images letterboxed to 160 px by burnpose (read from
//! `../shared/data`, never committed). docs/weights.md has the numbers.

mod common;

use common::fixtures::*;

use burn::prelude::*;
use burnpose::data::Instance;
use burnpose::eval::postprocess::one2one;
use burnpose::loss::E2eLoss;
use burnpose::loss::assign::Anchors;
use burnpose::model::{Scale, Task, Yolo, YoloConfig};
use burnpose::weights::{export_ultralytics, load_ultralytics};
use safetensors::SafeTensors;
use std::path::PathBuf;

/// Writes the input for `benches/peer/weights_fixtures.py` to `$BURNPOSE_FIXTURE_INPUT`.
#[test]
#[ignore = "makes the fixtures' input; run by hand (benches/peer/weights_fixtures.py)"]
fn write_fixture_input() {
    let path = std::env::var("BURNPOSE_FIXTURE_INPUT").expect("BURNPOSE_FIXTURE_INPUT");
    let values = input_values().expect("../shared/data");
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(
        safetensors::Dtype::F32,
        vec![2, 3, SIZE, SIZE],
        &bytes,
    )
    .unwrap();
    safetensors::serialize_to_file([("input", view)], None, std::path::Path::new(&path)).unwrap();
}

fn eval_parity(task: Task, name: &str) {
    let d = Device::flex();
    let Some(x) = input(&d) else { return };
    assert_close(&eval_rows(model(task, &d), x, name));
}

/// The check can fail: one BatchNorm scale of the last backbone layer off by 1 % moves the
/// outputs past the tolerance.
#[test]
fn a_tensor_off_by_one_percent_fails_the_eval_check() {
    let d = Device::flex();
    let Some(x) = input(&d) else { return };
    let m = model(Task::Pose, &d);
    let path = "backbone.l10.blocks.0.attn.pe.bn.gamma";
    let (_, gamma) = burnpose::optim::tensors::float_tensors(&m)
        .into_iter()
        .find(|(p, _)| p == path)
        .unwrap();
    let mut values = std::collections::HashMap::from([(path.to_string(), gamma * 1.01)]);
    let (m, missing) = burnpose::optim::tensors::replace_float_tensors(m, &mut values);
    assert!(missing.is_empty());
    let rows = eval_rows(m, x, "pose");
    let worst = rows.iter().map(|(_, e)| *e).fold(0.0, f32::max);
    assert!(worst > 1e-3, "a perturbed model passed: {rows:?}");
}

fn train_parity(task: Task, name: &str) {
    let fx = Outputs::open();
    let d = Device::flex().autodiff();
    let Some(x) = input(&d) else { return };
    let out = model(task, &d).forward(x);
    let mut rows = compare(&out.one2many, &fx, &format!("{name}.train.one2many"));
    rows.extend(compare(&out.one2one, &fx, &format!("{name}.train.one2one")));
    assert_close(&rows);
}

#[test]
fn pose_eval_forward_matches_ultralytics() {
    eval_parity(Task::Pose, "pose");
}

#[test]
fn pose_train_forward_matches_ultralytics() {
    train_parity(Task::Pose, "pose");
}

#[test]
fn detect_eval_forward_matches_ultralytics() {
    eval_parity(Task::Detect, "detect");
}

#[test]
fn detect_train_forward_matches_ultralytics() {
    train_parity(Task::Detect, "detect");
}

/// Ultralytics' end-to-end detections (`end2end=True`: top 300 of the one-to-one head,
/// `[x1, y1, x2, y2, score, class, (x, y, v) × 17]`) against ours from the same head.
#[test]
fn pose_end_to_end_detections_match_ultralytics() {
    let fx = Outputs::open();
    let d = Device::flex();
    let Some(input) = input(&d) else { return };
    let m = model(Task::Pose, &d);
    let [_, _, h, w] = input.dims();
    let out = m.head.forward_one2one(&m.features(input));
    let ours = one2one(&out, &Anchors::new(h, w), 17, 300, 0.0);
    let (shape, theirs) = fx.get("pose.eval.end2end");
    let [b, k, width] = [shape[0], shape[1], shape[2]];
    assert_eq!(width, 6 + 51);
    let mut worst = 0.0f32;
    for (img, dets) in ours.iter().enumerate() {
        assert_eq!(dets.len(), k, "image {img}");
        for (i, det) in dets.iter().enumerate() {
            let row = &theirs[(img * k + i) * width..][..width];
            let mut ours_row: Vec<f32> = det.bbox.to_vec();
            ours_row.push(det.score);
            ours_row.push(det.class as f32);
            ours_row.extend(det.keypoints.iter().flatten());
            // Pixel coordinates are compared relative to the image size: a box edge near 0
            // is a difference of two values of ~100 px.
            for (j, (a, b)) in ours_row.iter().zip(row).enumerate() {
                let coordinate = j < 4 || (j >= 6 && (j - 6) % 3 != 2);
                let scale = if coordinate { SIZE as f32 } else { 1.0 };
                worst = worst.max((a - b).abs() / b.abs().max(scale));
            }
        }
    }
    assert_eq!(ours.len(), b);
    eprintln!("end-to-end detections: worst relative difference {worst:.2e}");
    assert!(worst <= 1e-4, "{worst:.3e}");
}

/// Writes the fixture model as [`export_ultralytics`] writes it to `$BURNPOSE_EXPORT`, for
/// `benches/peer/weights_roundtrip.py` (Ultralytics' strict loader on our export).
#[test]
#[ignore = "for benches/peer/weights_roundtrip.py; run by hand"]
fn write_exported_fixture_model() {
    let path = std::env::var("BURNPOSE_EXPORT").expect("BURNPOSE_EXPORT");
    export_ultralytics(
        &model(Task::Pose, &Device::flex()),
        std::path::Path::new(&path),
    )
    .unwrap();
}

/// Ours → Ultralytics' names and shapes → ours again gives the same model, tensor by tensor.
#[test]
fn export_then_import_gives_the_same_tensors() {
    let d = Device::flex();
    let m = model(Task::Pose, &d);
    let dir = std::env::temp_dir().join(format!("burnpose-export-{}", std::process::id()));
    let path = dir.join("model.safetensors");
    let written = export_ultralytics(&m, &path).unwrap();
    // Every entry of Ultralytics' own state dict for YOLO26n-pose (nc=1).
    assert_eq!(written, 879);
    let fresh = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let (back, report) = load_ultralytics(fresh, &path).unwrap();
    assert_eq!(report.fresh_head, None);
    let a = burnpose::optim::tensors::float_tensors(&m);
    let b = burnpose::optim::tensors::float_tensors(&back);
    assert_eq!(a.len(), b.len());
    for ((pa, ta), (pb, tb)) in a.into_iter().zip(b) {
        assert_eq!(pa, pb);
        assert_eq!(
            ta.into_data().try_to_vec::<f32>().unwrap(),
            tb.into_data().try_to_vec::<f32>().unwrap(),
            "{pa}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A pose checkpoint into a model with other classes: backbone and neck load, the head stays as
/// initialised, and the report says why.
#[test]
fn another_head_starts_fresh_and_is_reported() {
    let d = Device::flex();
    let fresh = YoloConfig::new(Scale::N, Task::Pose).with_nc(3).init(&d);
    let before = fresh.head.one2many.boxes[0].out.weight.val().into_data();
    let (m, report) = load_ultralytics(fresh, &fixture("yolo26n-pose.pt")).unwrap();
    let why = report.fresh_head.expect("head reported");
    assert!(why.contains("model.23."), "{why}");
    assert_eq!(
        m.head.one2many.boxes[0].out.weight.val().into_data(),
        before
    );
    let full = model(Task::Pose, &d);
    assert_eq!(
        m.backbone.l0.conv.weight.val().into_data(),
        full.backbone.l0.conv.weight.val().into_data()
    );
}

/// Weights of another scale are refused with the first tensor that differs.
#[test]
fn another_scale_is_refused_with_the_tensor_named() {
    let d = Device::flex();
    let small = YoloConfig::new(Scale::S, Task::Pose).init(&d);
    let err = load_ultralytics(small, &fixture("yolo26n-pose.pt"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.0.conv.weight") && err.contains("yolo26n-pose.pt"),
        "{err}"
    );
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burnpose-weights-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A one-epoch CPU config at 64 px over the built-in images, with `extra` appended.
fn tiny_config(dir: &std::path::Path, extra: &str) -> PathBuf {
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nimgsz = 64\ntrain_images = 4\nval_images = 2\nworkers = 0\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"fit\"\n{extra}",
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    cfg
}

/// `model.weights` gives the trainer's model and its EMA the file's weights.
#[test]
fn a_fit_starts_from_the_weights_in_model_and_ema() {
    let dir = temp_dir("trainer");
    let pt = fixture("yolo26n-pose.pt");
    let cfg_path = tiny_config(
        &dir,
        &format!("[model]\nweights = {:?}\n", pt.to_str().unwrap()),
    );
    let cfg = burnpose::config::Config::load(&cfg_path).unwrap();
    let t = burnpose::train::Trainer::new(cfg, &cfg_path, Device::flex()).unwrap();
    let want = model(Task::Pose, &Device::flex());
    let key = |m: &Yolo| {
        m.neck.l22.blocks[0]
            .psa
            .as_ref()
            .unwrap()
            .attn
            .qkv
            .bn
            .running_var
            .value()
            .into_data()
    };
    assert_eq!(key(&t.model.valid()), key(&want));
    assert_eq!(key(&t.ema.model), key(&want));
    assert_eq!(
        t.ema.model.head.one2one.pose.as_ref().unwrap().kpts[2]
            .weight
            .val()
            .into_data(),
        want.head.one2one.pose.as_ref().unwrap().kpts[2]
            .weight
            .val()
            .into_data()
    );

    // Frozen layers hold the loaded weights (loading comes before freezing).
    let mut cfg = burnpose::config::Config::load(&cfg_path).unwrap();
    cfg.train.freeze = burnpose::config::Freeze::First(1);
    let t = burnpose::train::Trainer::new(cfg, &cfg_path, Device::flex()).unwrap();
    let w = t.model.backbone.l0.conv.weight.val();
    assert!(!w.is_require_grad(), "layer 0 frozen");
    assert_eq!(
        w.into_data(),
        want.backbone.l0.conv.weight.val().into_data()
    );
}

/// `fit --weights`, `val --checkpoint` and `predict` take Ultralytics weights.
#[test]
fn fit_val_and_predict_take_ultralytics_weights() {
    let dir = temp_dir("cli");
    let pt = fixture("yolo26n-pose.pt");
    let pt = pt.to_str().unwrap();
    let cfg = tiny_config(&dir, "");
    let cfg = cfg.to_str().unwrap();
    let (ok, text) = common::burnpose(&["fit", cfg, "--weights", pt]);
    assert!(ok, "{text}");
    assert!(
        text.contains("model.weights") && text.contains("750 tensors loaded"),
        "{text}"
    );
    let stored = std::fs::read_to_string(dir.join("runs/fit/config.toml")).unwrap();
    assert!(stored.contains("yolo26n-pose.pt"), "{stored}");

    // The fit's checkpoint back under Ultralytics' names: the same EMA tensors.
    let last = dir.join("runs/fit/last.safetensors");
    let exported = dir.join("exported.safetensors");
    let (ok, text) = common::burnpose(&[
        "export",
        last.to_str().unwrap(),
        "--format",
        "ultralytics",
        "--out",
        exported.to_str().unwrap(),
    ]);
    assert!(ok && text.contains("879 tensors"), "{text}");
    let d = Device::flex();
    let (_, ema) = burnpose::train::checkpoint::load_model(&last, &d).unwrap();
    let fresh = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let (back, _) = load_ultralytics(fresh, &exported).unwrap();
    let flat = |m: &Yolo| -> Vec<f32> {
        burnpose::optim::tensors::float_tensors(m)
            .into_iter()
            .flat_map(|(_, t)| t.into_data().try_to_vec::<f32>().unwrap())
            .collect()
    };
    assert_eq!(flat(&back), flat(&ema));

    // Burn-native: shaped tensors under our module paths, read back through burn-store.
    let native = dir.join("native.safetensors");
    let (ok, text) = common::burnpose(&[
        "export",
        last.to_str().unwrap(),
        "--format",
        "burn",
        "--out",
        native.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    let (about, loaded) = burnpose::weights::load_burn(&native, &d).unwrap();
    assert_eq!(
        (about.scale, about.task, about.nc),
        (Scale::N, Task::Pose, 1)
    );
    assert_eq!(flat(&loaded), flat(&ema));

    let (ok, text) = common::burnpose(&["val", cfg, "--checkpoint", pt]);
    assert!(ok && text.contains("Ultralytics weights"), "{text}");
    assert!(text.contains("one-to-one head"), "{text}");

    let photo = dir.join("photo.png");
    image::RgbImage::from_fn(100, 80, |x, y| {
        image::Rgb([(x * 2) as u8, (y * 3) as u8, 90])
    })
    .save(&photo)
    .unwrap();
    let out = dir.join("predicted");
    let (ok, text) = common::burnpose(&[
        "predict",
        pt,
        photo.to_str().unwrap(),
        "--imgsz",
        "64",
        "--device",
        "cpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert!(out.join("predictions.json").is_file(), "{text}");
    // `predict` takes the Burn-native file as well.
    let out = dir.join("predicted-native");
    let (ok, text) = common::burnpose(&[
        "predict",
        native.to_str().unwrap(),
        photo.to_str().unwrap(),
        "--imgsz",
        "64",
        "--device",
        "cpu",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok && out.join("predictions.json").is_file(), "{text}");
}

/// Each way a weights file can be wrong gets one error naming the file and what is wrong.
#[test]
fn bad_weights_are_named() {
    let dir = temp_dir("bad");
    let cfg = tiny_config(&dir, "");
    let cfg = cfg.to_str().unwrap();
    let fit = |extra: &[&str]| {
        let mut args = vec!["fit", cfg];
        args.extend(extra);
        common::burnpose(&args)
    };
    let (ok, text) = fit(&["--weights", "no/such.pt"]);
    assert!(
        !ok && text.contains("model.weights") && text.contains("no/such.pt"),
        "{text}"
    );
    let onnx = dir.join("model.onnx");
    std::fs::write(&onnx, b"onnx").unwrap();
    let (ok, text) = fit(&["--weights", onnx.to_str().unwrap()]);
    assert!(
        !ok && text.contains("model.onnx") && text.contains("expected a .pt"),
        "{text}"
    );
    let junk = dir.join("junk.pt");
    std::fs::write(&junk, b"not a pickle").unwrap();
    let (ok, text) = fit(&["--weights", junk.to_str().unwrap()]);
    assert!(!ok && text.contains("junk.pt"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    let foreign = dir.join("foreign.safetensors");
    let bytes = [0u8; 8];
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &bytes).unwrap();
    safetensors::serialize_to_file([("encoder.weight", view)], None, &foreign).unwrap();
    let (ok, text) = fit(&["--weights", foreign.to_str().unwrap()]);
    assert!(
        !ok && text.contains("foreign.safetensors") && text.contains("no YOLO layer weights"),
        "{text}"
    );
    let (ok, text) = fit(&["--weights", "a.pt", "--resume", "b.safetensors"]);
    assert!(!ok && text.contains("--resume"), "{text}");
    // Nano weights in a small model: the first tensor that differs is named.
    let small = tiny_config(&dir, "[model]\nscale = \"s\"\n");
    let pt = fixture("yolo26n-pose.pt");
    let (ok, text) = common::burnpose(&[
        "fit",
        small.to_str().unwrap(),
        "--weights",
        pt.to_str().unwrap(),
    ]);
    assert!(
        !ok && text.contains("model.0.conv.weight is [16, 3, 3, 3] in the file"),
        "{text}"
    );
}

/// A tensor outside the head that the model has no place for: another architecture.
#[test]
fn an_unknown_tensor_outside_the_head_is_refused() {
    let dir = temp_dir("extra");
    let d = Device::flex();
    let path = dir.join("model.safetensors");
    export_ultralytics(&model(Task::Pose, &d), &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let extra = [0u8; 16];
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
    views.push((
        "model.9.extra.weight".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &extra).unwrap(),
    ));
    let with_extra = dir.join("extra.safetensors");
    safetensors::serialize_to_file(views, None, &with_extra).unwrap();
    let fresh = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let err = load_ultralytics(fresh, &with_extra)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("extra.safetensors")
            && err.contains("model.9.extra.weight has no counterpart in this model"),
        "{err}"
    );
}

#[test]
fn predict_split_on_weights_needs_a_config() {
    let pt = fixture("yolo26n-pose.pt");
    let (ok, text) = common::burnpose(&["predict", pt.to_str().unwrap(), "--split", "val"]);
    assert!(
        !ok && text.contains("holds Ultralytics weights, which name no dataset"),
        "{text}"
    );
}

/// The fixtures' seeded targets (meta.json) per image.
fn fixture_labels(keypoints: bool) -> Vec<Vec<Instance>> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("meta.json")).unwrap()).unwrap();
    let mut labels = vec![Vec::new(), Vec::new()];
    for t in meta["targets"].as_array().unwrap() {
        let f = |v: &serde_json::Value| v.as_f64().unwrap() as f32;
        let b: Vec<f32> = t["box"].as_array().unwrap().iter().map(f).collect();
        let kpts = t["keypoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| [f(&k[0]), f(&k[1]), f(&k[2])])
            .collect();
        labels[t["image"].as_u64().unwrap() as usize].push(Instance {
            class: t["class"].as_u64().unwrap() as usize,
            bbox: [b[0], b[1], b[2], b[3]],
            keypoints: if keypoints { kpts } else { Vec::new() },
        });
    }
    labels
}

/// Every parameter's gradient norm after `total.backward()`, by Ultralytics' name.
fn grad_norms(m: &Yolo, grads: &burn::tensor::Gradients) -> std::collections::HashMap<String, f32> {
    use burn::module::Param;
    use burnpose::model::{FloatSink, walk_floats};
    struct Norms<'a> {
        grads: &'a burn::tensor::Gradients,
        out: Vec<(String, f32)>,
    }
    impl FloatSink for Norms<'_> {
        fn float<const D: usize>(&mut self, path: &str, param: &Param<Tensor<D>>) {
            if let Some(g) = param.val().grad(self.grads) {
                let norm = g.powi_scalar(2).sum().sqrt().into_scalar::<f32>();
                self.out.push((path.to_string(), norm));
            }
        }
    }
    let mut norms = Norms {
        grads,
        out: Vec::new(),
    };
    walk_floats(m, &mut norms);
    let paths: Vec<String> = norms.out.iter().map(|(p, _)| p.clone()).collect();
    let keys = burnpose::weights::ultralytics_keys(&paths).unwrap();
    keys.into_iter()
        .zip(norms.out)
        .map(|(k, (_, n))| (k.name, n))
        .collect()
}

/// Ultralytics' E2E loss on the fixed batch (each logged term, the total) and every
/// parameter's gradient norm against ours: terms within 1e-4, norms within 1e-3 (relative).
fn loss_parity(task: Task, name: &str) {
    let d = Device::flex().autodiff();
    let Some(x) = input(&d) else { return };
    let fx = Outputs::open();
    let m = model(task, &d);
    let out = m.forward(x);
    let loss = E2eLoss::new(task, 17, [SIZE, SIZE]);
    let targets = loss.targets(&out, &fixture_labels(task == Task::Pose));
    let l = loss.compute(&out, &targets, m.head.flow.as_ref());
    let total = l.total.clone().into_scalar::<f32>();
    let items: Vec<f32> = l.items.clone().into_data().try_to_vec::<f32>().unwrap();
    let (_, their_total) = fx.get(&format!("{name}.loss.total"));
    let (_, their_items) = fx.get(&format!("{name}.loss.items"));
    // Ultralytics logs the detection loss as (box, cls, dfl); ours is always the six terms.
    let ours_items: Vec<f32> = match task {
        Task::Pose => items.clone(),
        Task::Detect => vec![items[0], items[3], items[4]],
    };
    let rel = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-6);
    eprintln!(
        "{name} loss: total {total} vs {}, terms {ours_items:?} vs {their_items:?}",
        their_total[0]
    );
    let mut worst_term = rel(total, their_total[0]);
    for (a, b) in ours_items.iter().zip(&their_items) {
        worst_term = worst_term.max(rel(*a, *b));
    }
    let grads = l.total.backward();
    let ours = grad_norms(&m, &grads);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("meta.json")).unwrap()).unwrap();
    let names: Vec<&str> = meta["grad_norm_names"][name]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let (_, theirs) = fx.get(&format!("{name}.grad_norms"));
    assert_eq!(names.len(), theirs.len());
    // A gradient that is exactly zero (a bias that the next train-mode BatchNorm subtracts out:
    // SPPF's first conv, the PSA blocks' last ones) is float noise in both: below float32's
    // resolution of the largest norm it counts as zero; every other norm is compared relatively.
    let largest = theirs.iter().fold(0.0f32, |m, t| m.max(*t));
    let (zero, noise) = (1e-9 * largest, 1e-7 * largest);
    let mut worst_grad = (0.0f32, String::new());
    let mut zeros = 0;
    for (n, t) in names.iter().zip(&theirs) {
        let o = *ours
            .get(*n)
            .unwrap_or_else(|| panic!("no gradient for {n}"));
        let e = if *t < zero {
            zeros += 1;
            assert!(o < noise, "{n}: {o}, exactly {t}");
            0.0
        } else {
            (o - t).abs() / t
        };
        if e > worst_grad.0 {
            worst_grad = (e, format!("{n}: {o} vs {t}"));
        }
    }
    assert_eq!(ours.len(), names.len(), "parameters with a gradient");
    eprintln!(
        "{name} loss: worst term {worst_term:.2e}, worst gradient norm {:.2e} ({}); {zeros} \
         gradients exactly zero",
        worst_grad.0, worst_grad.1
    );
    assert!(worst_term <= 1e-4, "{worst_term:.3e}");
    assert!(
        worst_grad.0 <= 1e-3,
        "{:.3e} at {}",
        worst_grad.0,
        worst_grad.1
    );
}

#[test]
fn pose_loss_and_gradients_match_ultralytics() {
    loss_parity(Task::Pose, "pose");
}

#[test]
fn detect_loss_and_gradients_match_ultralytics() {
    loss_parity(Task::Detect, "detect");
}
