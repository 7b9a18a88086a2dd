use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("cfg.toml"))
}

#[test]
fn empty_config_gives_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c, Config::default());
    assert!(!c.replay.enabled);
    assert_eq!(c.model.yolo().name(), "yolo26n-pose");
}

#[test]
fn replay_scope_defaults_by_task() {
    assert_eq!(parse("").unwrap().replay_scope(), Scope::Features);
    let detect = parse("[model]\ntask = \"detect\"\n").unwrap();
    assert_eq!(detect.replay_scope(), Scope::Network);
    let pose = parse("[replay]\nscope = \"network\"\n").unwrap();
    assert_eq!(pose.replay_scope(), Scope::Network);
}

/// `replay.shared_parameters` reads the flat optimizer's buffers: refused without them, with the
/// key and what to set.
#[test]
fn shared_parameters_need_the_flat_update() {
    let ok = parse("[replay]\nshared_parameters = true\n").unwrap();
    assert!(ok.replay.shared_parameters && ok.optim.flat_update);
    let e = parse("[replay]\nshared_parameters = true\n[optim]\nflat_update = false\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("replay.shared_parameters") && e.contains("optim.flat_update = true"),
        "{e}"
    );
}

/// `replay.defer_readback` reads the recorded loss late: on by default with the step scope
/// only, can be turned off there, and is refused with another scope, with the key and what to
/// set.
#[test]
fn defer_readback_follows_the_step_scope() {
    let step = "[replay]\nscope = \"step\"\n[train]\nloss_on = \"device\"\n";
    assert!(parse(step).unwrap().defer_readback());
    let off = "[replay]\nscope = \"step\"\ndefer_readback = false\n[train]\nloss_on = \"device\"\n";
    assert!(!parse(off).unwrap().defer_readback());
    assert!(!parse("").unwrap().defer_readback());
    assert!(
        !parse("[replay]\ndefer_readback = false\n")
            .unwrap()
            .defer_readback()
    );
    let e = parse("[replay]\ndefer_readback = true\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("replay.defer_readback") && e.contains("replay.scope = \"step\""),
        "{e}"
    );
}

/// `replay.upload_ahead` is on by default with the step scope only, can be turned off there,
/// and is refused with another scope, with the key and what to set.
#[test]
fn upload_ahead_follows_the_step_scope() {
    let step = "[replay]\nscope = \"step\"\n[train]\nloss_on = \"device\"\n";
    assert!(parse(step).unwrap().upload_ahead());
    assert!(!parse("").unwrap().upload_ahead());
    assert!(
        !parse("[replay]\nupload_ahead = false\n")
            .unwrap()
            .upload_ahead()
    );
    let off = step.replace("[train]", "upload_ahead = false\n[train]");
    assert!(!parse(&off).unwrap().upload_ahead());
    let e = parse("[replay]\nupload_ahead = true\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("replay.upload_ahead") && e.contains("replay.scope = \"step\""),
        "{e}"
    );
}

/// `replay.record_update` records the flat optimizer's update: refused without it, with the key
/// and what to set.
#[test]
fn record_update_needs_the_flat_update() {
    let ok = parse("[replay]\nrecord_update = true\n").unwrap();
    assert!(ok.record_update() && ok.optim.flat_update);
    // Unset: on with the flat update, off without it; `false` turns it off.
    assert!(parse("").unwrap().record_update());
    let per_tensor = parse("[optim]\nflat_update = false\n").unwrap();
    assert!(!per_tensor.record_update());
    assert!(
        !parse("[replay]\nrecord_update = false\n")
            .unwrap()
            .record_update()
    );
    let e = parse("[replay]\nrecord_update = true\n[optim]\nflat_update = false\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("replay.record_update") && e.contains("optim.flat_update = true"),
        "{e}"
    );
}

/// `replay.one_graph` records the step scope's three graphs as one, by default: `true` is
/// refused with any other scope (the default one included), with the key and what to set;
/// `false` keeps the step scope's three graphs and is no error elsewhere.
#[test]
fn one_graph_needs_the_step_scope() {
    let (step, device) = ("scope = \"step\"\n", "[train]\nloss_on = \"device\"\n");
    let of = |key: &str, scope: &str, train: &str| {
        parse(&format!("[replay]\n{scope}{key}{train}"))
            .unwrap()
            .one_graph()
    };
    assert!(of("", step, device));
    assert!(of("one_graph = true\n", step, device));
    assert!(!of("one_graph = false\n", step, device));
    assert!(!of("", "", ""));
    assert!(!of("one_graph = false\n", "scope = \"network\"\n", ""));
    for scope in ["", "scope = \"features\"\n", "scope = \"network\"\n"] {
        let e = parse(&format!("[replay]\n{scope}one_graph = true\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("replay.one_graph") && e.contains("replay.scope = \"step\""),
            "{scope}: {e}"
        );
    }
}

/// `replay.scope = "step"` cuts where "network" does and needs the device loss (the refusal
/// names the key and what to set); every precision records, FP16 with its loss scale.
#[test]
fn step_scope_needs_the_device_loss() {
    let step = parse("[replay]\nscope = \"step\"\n[train]\nloss_on = \"device\"\n").unwrap();
    assert_eq!(step.replay_scope(), Scope::Step);
    assert_eq!(step.replay_scope().cut(), Scope::Network);
    let e = parse("[replay]\nscope = \"step\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("replay.scope") && e.contains("loss_on = \"device\""),
        "{e}"
    );
    let fp16 =
        parse("[replay]\nscope = \"step\"\n[train]\nloss_on = \"device\"\nprecision = \"fp16\"\n")
            .unwrap();
    assert_eq!(fp16.replay_scope(), Scope::Step);
}

#[test]
fn shipped_configs_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 8, "{n} configs in {}", dir.display());
}

#[test]
fn bench_configs_differ_from_the_seed_shape_only_in_their_key() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let seed = Config::load(&dir.join("bench_seed.toml")).unwrap();
    let mut b16 = Config::load(&dir.join("bench_seed_b16.toml")).unwrap();
    assert_eq!(b16.train.batch, 16);
    b16.train.batch = seed.train.batch;
    b16.output.name = seed.output.name.clone();
    assert_eq!(b16, seed);
    let mut network = Config::load(&dir.join("bench_seed_network.toml")).unwrap();
    assert_eq!(network.replay_scope(), Scope::Network);
    network.replay.scope = None;
    network.output.name = seed.output.name.clone();
    assert_eq!(network, seed);
    let mut step = Config::load(&dir.join("bench_seed_step.toml")).unwrap();
    assert!(step.one_graph());
    assert_eq!(step.replay_scope(), Scope::Step);
    assert_eq!(step.train.loss_on, LossOn::Device);
    step.replay.scope = None;
    step.train.loss_on = seed.train.loss_on;
    step.train.object_slots = seed.train.object_slots;
    step.output.name = seed.output.name.clone();
    assert_eq!(step, seed);
}

#[test]
fn unknown_key_names_key_and_file() {
    let e = parse("[model]\nscael = \"n\"\n").unwrap_err().to_string();
    assert!(e.contains("cfg.toml") && e.contains("scael"), "{e}");
    let e = parse("[trainer]\nepochs = 1\n").unwrap_err().to_string();
    assert!(e.contains("trainer"), "{e}");
}

#[test]
fn wrong_type_names_key() {
    let e = parse("[train]\nbatch = \"four\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch") && e.contains("cfg.toml"), "{e}");
    let e = parse("[model]\nscale = \"q\"\n").unwrap_err().to_string();
    assert!(e.contains("scale") || e.contains("unknown variant"), "{e}");
}

#[test]
fn bad_values_name_the_key() {
    for (text, key) in [
        ("[data]\nimgsz = 100\n", "data.imgsz"),
        ("[train]\nbatch = 0\n", "train.batch"),
        ("[optim]\nlr0 = -1.0\n", "optim.lr0"),
        ("[optim]\nmomentum = 1.5\n", "optim.momentum"),
        ("[model]\nnc = 0\n", "model.nc"),
        ("[data]\nsource = \"coco\"\n", "data.path"),
        ("[augment]\nmosaic = 1.5\n", "augment.mosaic"),
        ("[data]\nlast_batch = \"pad\"\n", "last_batch"),
        ("[augment]\nscale = 1.0\n", "augment.scale"),
        ("[augment]\nhsv_v = -0.1\n", "augment.hsv_v"),
        ("[model]\nkpt_shape = [5, 3]\n", "model.kpt_shape"),
        (
            "[model]\ntask = \"detect\"\n[replay]\nscope = \"features\"\n",
            "replay.scope",
        ),
        ("[replay]\nscope = \"head\"\n", "scope"),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("cfg.toml"), "{text}: {e}");
    }
}

#[test]
fn missing_file_names_it() {
    let e = Config::load(Path::new("no/such.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no/such.toml"), "{e}");
}

#[test]
fn builtin_data_takes_17_keypoints_only() {
    let e = parse("[model]\nkpt_shape = [5, 2]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("17 keypoints") && e.contains("[5, 2]"), "{e}");
    // Another keypoint count is fine with a dataset of its own, and detection has none.
    parse("[model]\nkpt_shape = [5, 2]\n[data]\nsource = \"yolo\"\npath = \"d.yaml\"\n").unwrap();
    parse("[model]\ntask = \"detect\"\nkpt_shape = [5, 2]\n").unwrap();
}

#[test]
fn every_optimizer_is_selectable() {
    use crate::optim::Rule;
    use crate::train::trainer::resolve_optimizer;
    for (name, rule) in [
        ("sgd", Rule::Sgd),
        ("musgd", Rule::MuSgd),
        ("adamw", Rule::AdamW),
    ] {
        let cfg = parse(&format!(
            "[optim]\noptimizer = \"{name}\"\nlr0 = 0.003\nmomentum = 0.8\n"
        ))
        .unwrap();
        assert_eq!(
            resolve_optimizer(&cfg, 64),
            (rule, 0.003, 0.8, cfg.optim.warmup_bias_lr),
            "{name}"
        );
    }
    let cfg = parse("[optim]\noptimizer = \"adam\"\n")
        .unwrap_err()
        .to_string();
    assert!(cfg.contains("optimizer") || cfg.contains("adam"), "{cfg}");
}

/// The replay keys of earlier versions (`model.capture_network`, the `[capture]` section with its
/// `scope` and the never-read `warmup_steps`): a config file naming them is told where each went;
/// a checkpoint that stored them (every earlier one did) still loads, with their values.
#[test]
fn old_replay_keys_are_explained_and_old_stored_configs_load() {
    let told = |text: &str, what: &[&str]| {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains("cfg.toml"), "{e}");
        for w in what {
            assert!(e.contains(w), "{e} does not say {w}");
        }
    };
    told(
        "[capture]\nwarmup_steps = 3\n",
        &["[replay]", "warmup_steps", "removed"],
    );
    told(
        "[capture]\nscope = \"network\"\n",
        &["[capture]", "[replay]"],
    );
    told(
        "[model]\ncapture_network = true\n",
        &["model.capture_network", "replay.enabled"],
    );
    let mut cfg = Config::default();
    cfg.replay.scope = Some(Scope::Network);
    cfg.replay.enabled = true;
    let mut old: toml::Table = toml::from_str(&toml::to_string(&cfg).unwrap()).unwrap();
    old.remove("replay");
    let capture: toml::Table = toml::from_str("scope = \"network\"\nwarmup_steps = 3\n").unwrap();
    old.insert("capture".into(), capture.into());
    old.get_mut("model")
        .and_then(|m| m.as_table_mut())
        .unwrap()
        .insert("capture_network".into(), true.into());
    let text = toml::to_string(&old).unwrap();
    assert!(
        text.contains("warmup_steps = 3") && text.contains("capture_network = true"),
        "{text}"
    );
    assert_eq!(Config::from_stored(&text).unwrap(), cfg);
    // Only `model.capture_network`, without a `[capture]` section.
    let mut only: toml::Table =
        toml::from_str(&toml::to_string(&Config::default()).unwrap()).unwrap();
    only.remove("replay");
    only.get_mut("model")
        .and_then(|m| m.as_table_mut())
        .unwrap()
        .insert("capture_network".into(), true.into());
    let loaded = Config::from_stored(&toml::to_string(&only).unwrap()).unwrap();
    assert!(loaded.replay.enabled && loaded.replay.scope.is_none());
    assert!(Config::from_stored("[capture]\nbogus = 1\n").is_err());
}

/// `configs/defaults.toml` (what `burnpose config` prints) holds every key, each at its default:
/// uncommented, its optional keys too, it names exactly the keys a config has.
#[test]
fn the_defaults_file_holds_every_key_at_its_default() {
    assert_eq!(parse(DEFAULTS).unwrap(), Config::default());
    let uncommented: String = DEFAULTS
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if rest.split_once(" = ").is_some_and(|(k, _)| is_key(k)) => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let full = parse(&uncommented).unwrap();
    let keys = |text: &str| -> Vec<String> {
        let table: toml::Table = toml::from_str(text).unwrap();
        let mut keys: Vec<String> = table
            .iter()
            .flat_map(|(section, v)| {
                v.as_table()
                    .unwrap()
                    .keys()
                    .map(move |k| format!("{section}.{k}"))
            })
            .collect();
        keys.sort();
        keys
    };
    let mut every = Config::default();
    every.data.path = Some("x".into());
    every.replay.scope = Some(Scope::Features);
    every.replay.one_graph = Some(false);
    every.replay.record_update = Some(false);
    every.replay.upload_ahead = Some(false);
    every.replay.defer_readback = Some(false);
    every.model.weights = Some("x.pt".into());
    assert_eq!(keys(&uncommented), keys(&every.to_toml()));
    // Only the optional keys differ from the defaults once uncommented.
    assert!(full.data.path.is_some() && full.replay.scope.is_some());
    assert_eq!(full.replay.one_graph, Some(false));
    assert_eq!(full.replay.record_update, Some(false));
    assert_eq!(full.replay.defer_readback, Some(false));
    assert_eq!(full.replay.upload_ahead, Some(false));
    assert!(full.model.weights.is_some());
    assert_eq!(
        Config {
            data: DataSection {
                path: None,
                ..full.data.clone()
            },
            replay: ReplaySection::default(),
            model: ModelSection {
                weights: None,
                ..full.model.clone()
            },
            ..full
        },
        Config::default()
    );
}

fn is_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

/// `device.kernels` is now `device.conv_bn_ops`: a config file naming the old key is told the new
/// one; a checkpoint that stored the old key (every earlier one did) loads with its value.
#[test]
fn renamed_kernels_key_is_explained_and_old_stored_configs_load() {
    let e = parse("[device]\nkernels = \"stock\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cfg.toml") && e.contains("device.conv_bn_ops") && e.contains("rename"),
        "{e}"
    );
    let mut cfg = Config::default();
    cfg.device.conv_bn_ops = crate::model::ops::ConvBnOps::Staged;
    let text = toml::to_string(&cfg)
        .unwrap()
        .replace("conv_bn_ops = ", "kernels = ");
    assert!(text.contains("kernels = \"staged\""), "{text}");
    assert_eq!(Config::from_stored(&text).unwrap(), cfg);
}
