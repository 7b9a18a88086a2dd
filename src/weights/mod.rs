//! Ultralytics' weights in and out (docs/weights.md): [`load_ultralytics`] reads a YOLO26
//! checkpoint as Ultralytics writes it (`.pt`: their pickled checkpoint or a plain state dict;
//! `.safetensors`: a state dict) into our model; [`export_ultralytics`] writes ours under their
//! names and shapes.

mod names;
mod read;

pub(crate) use read::Owned;

pub use names::{Key, ultralytics_keys};

use crate::model::float_shapes;
use crate::model::{Scale, Task, Yolo, YoloConfig};
use crate::optim::tensors::replace_float_tensors;
use burn::module::Module;
use burn::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read weights {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("weights {path} do not fit this model ({model}): {message}")]
    Mismatch {
        path: PathBuf,
        model: String,
        message: String,
    },
    #[error("cannot write weights {path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// What [`load_ultralytics`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    /// Tensors copied into the model.
    pub loaded: usize,
    /// The head kept its fresh initial weights because the file's head has another shape
    /// (another `nc` or `kpt_shape`, or a detection file for a pose model); the first
    /// difference, in words.
    pub fresh_head: Option<String>,
    /// The file's head tensors this model has no place for (a pose file's keypoint branches
    /// and flow in a detection model).
    pub unused: Vec<String>,
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} tensors loaded", self.loaded)?;
        if let Some(first) = self.unused.first() {
            write!(
                f,
                "; {} of the file's head tensors have no place here and are not used ({first}, …)",
                self.unused.len()
            )?;
        }
        if let Some(why) = &self.fresh_head {
            write!(
                f,
                "; backbone and neck loaded, the head (layer 23) starts fresh: {why}"
            )?;
        }
        Ok(())
    }
}

/// Whether `path` holds Ultralytics weights rather than a burnpose checkpoint: a `.pt`/`.pth`
/// file, or a `.safetensors` file without burnpose's checkpoint metadata (a state dict, e.g.
/// one [`export_ultralytics`] wrote).
pub fn is_ultralytics(path: &Path) -> bool {
    match read::extension(path).as_deref() {
        Some("pt" | "pth") => true,
        Some("safetensors") => {
            read::safetensors_metadata(path).is_some_and(|meta| !meta.contains_key("burnpose"))
        }
        _ => false,
    }
}

/// Whether `path` holds Burn-native weights written by [`save_burn`].
pub fn is_burn_native(path: &Path) -> bool {
    read::safetensors_metadata(path).is_some_and(|meta| meta.contains_key(BURN_MODEL_KEY))
}

/// The metadata key of [`save_burn`]'s files: the model's [`YoloConfig`] as JSON.
const BURN_MODEL_KEY: &str = "burnpose_model";

/// Writes `model` as Burn-native weights: every tensor (parameters and BatchNorm running
/// statistics) with its shape under its module path (`backbone.l0.conv.weight`), through
/// burn-store's safetensors store, which a Burn program reads back with
/// `Yolo::load_from(&mut SafetensorsStore::from_file(path))` into a model built from the
/// metadata's [`YoloConfig`] ([`load_burn`] does both).
pub fn save_burn(model: &Yolo, about: &YoloConfig, path: &Path) -> Result<(), WeightsError> {
    use burn_store::{ModuleSnapshot, SafetensorsStore};
    let err = |message: String| WeightsError::Write {
        path: path.to_path_buf(),
        message,
    };
    let json = serde_json::to_string(about).expect("a YoloConfig serialises");
    // The store writes a scratch file and renames it into place: a failed save keeps the old.
    let mut store = SafetensorsStore::from_file(path)
        .metadata(BURN_MODEL_KEY, json)
        .overwrite(true);
    model
        .valid()
        .save_into(&mut store)
        .map_err(|e| err(e.to_string()))
}

/// Reads weights written by [`save_burn`] into a fresh model on `device`; every tensor must be
/// present with its shape.
pub fn load_burn(path: &Path, device: &Device) -> Result<(YoloConfig, Yolo), WeightsError> {
    use burn_store::{ModuleSnapshot, SafetensorsStore};
    let err = |message: String| WeightsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let about = burn_file_model(path)?;
    let mut model = about.init(device);
    let result = model
        .load_from(&mut SafetensorsStore::from_file(path))
        .map_err(|e| err(e.to_string()))?;
    if !result.missing.is_empty() {
        return Err(err(format!("missing tensors: {:?}", result.missing)));
    }
    Ok((about, model))
}

/// The model of a [`save_burn`] file, from its metadata.
pub fn burn_file_model(path: &Path) -> Result<YoloConfig, WeightsError> {
    let err = |message: String| WeightsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let meta =
        read::safetensors_metadata(path).ok_or_else(|| err("not a safetensors file".into()))?;
    let json = meta.get(BURN_MODEL_KEY).ok_or_else(|| {
        err(format!(
            "no {BURN_MODEL_KEY} metadata (not written by save_burn)"
        ))
    })?;
    serde_json::from_str(json).map_err(|e| err(format!("{BURN_MODEL_KEY}: {e}")))
}

/// Scale, task, classes and keypoint layout of the YOLO26 weights at `path` (for `predict` and
/// `val` on a file that carries no burnpose config).
pub fn file_model(path: &Path) -> Result<YoloConfig, WeightsError> {
    let file = read::read(path, read::Content::Shapes)?;
    let dim = |key: &str| file.get(key).map(|t| t.shape[0]);
    let unknown = |what: &str| WeightsError::Read {
        path: path.to_path_buf(),
        message: format!("not YOLO26 weights: {what}"),
    };
    let stem = dim("model.0.conv.weight").ok_or_else(|| unknown("no model.0.conv.weight"))?;
    let scale = [Scale::N, Scale::S]
        .into_iter()
        .find(|s| s.channels(64) == stem)
        .ok_or_else(|| unknown(&format!("a first layer of {stem} channels (n: 16, s: 32)")))?;
    let nc = dim("model.23.cv3.0.2.weight").ok_or_else(|| unknown("no model.23.cv3.0.2.weight"))?;
    let config = YoloConfig::new(scale, Task::Pose).with_nc(nc);
    match (
        dim("model.23.cv4_kpts.0.weight"),
        dim("model.23.cv4_sigma.0.weight"),
    ) {
        (Some(values), Some(sigmas))
            if sigmas % 2 == 0 && sigmas > 0 && values % (sigmas / 2) == 0 =>
        {
            Ok(config.with_kpt_shape([sigmas / 2, values / (sigmas / 2)]))
        }
        (None, None) => Ok(YoloConfig {
            task: Task::Detect,
            ..config
        }),
        _ => Err(unknown("keypoint layers of inconsistent shapes")),
    }
}

/// One tensor as read from a file, in FP32.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub shape: Vec<usize>,
    /// Empty when only the shapes were read ([`read::Content::Shapes`]).
    pub values: Vec<f32>,
}

/// Loads an Ultralytics YOLO26 checkpoint into `model` (parameters and BatchNorm running
/// statistics; FP16 files are widened to FP32). Every tensor must map by name and shape, except
/// that a head of another shape (layer 23: another `nc`, `kpt_shape` or task) is left as
/// initialised, which the report says: head surgery for fine-tuning on other classes.
pub fn load_ultralytics(model: Yolo, path: &Path) -> Result<(Yolo, LoadReport), WeightsError> {
    let mut file = read::read(path, read::Content::Values)?;
    let mismatch = |message: String| WeightsError::Mismatch {
        path: path.to_path_buf(),
        model: describe(&model),
        message,
    };
    let ours = float_shapes(&model);
    let paths: Vec<String> = ours.iter().map(|(p, _)| p.clone()).collect();
    let keys = ultralytics_keys(&paths)
        .map_err(|p| mismatch(format!("our tensor {p} has no Ultralytics name")))?;
    check_constants(&mut file).map_err(mismatch)?;

    let mut head_differs = None;
    let mut plan = Vec::with_capacity(keys.len());
    for ((ours_path, dims), key) in ours.iter().zip(&keys) {
        let problem = match file.get(&key.name) {
            None => Some(format!("{} is missing", key.name)),
            Some(t) => {
                let want = torch_shape(dims, key.transposed);
                (t.shape != want)
                    .then(|| format!("{} is {:?} in the file, {want:?} here", key.name, t.shape))
            }
        };
        match problem {
            Some(p) if ours_path.starts_with("head.") => {
                head_differs.get_or_insert(p);
            }
            Some(p) => return Err(mismatch(p)),
            None => plan.push((ours_path.clone(), key.clone())),
        }
    }
    let used: std::collections::HashSet<&str> = keys.iter().map(|k| k.name.as_str()).collect();
    let mut unused = Vec::new();
    for k in file.keys() {
        if used.contains(k.as_str()) || k.ends_with(".num_batches_tracked") {
            continue;
        }
        if !k.starts_with("model.23.") {
            return Err(mismatch(format!(
                "{k} has no counterpart in this model (another architecture?)"
            )));
        }
        unused.push(k.clone());
    }
    if head_differs.is_some() {
        plan.retain(|(p, _)| !p.starts_with("head."));
    }

    let device = first_device(&model);
    let mut values = HashMap::with_capacity(plan.len());
    for (ours_path, key) in &plan {
        let t = file.remove(&key.name).expect("checked above");
        let data = if key.transposed {
            transpose(&t)
        } else {
            t.values
        };
        let n = data.len();
        values.insert(
            ours_path.clone(),
            Tensor::<1>::from_data(TensorData::new(data, [n]), &device),
        );
    }
    let loaded = values.len();
    let (model, missing) = replace_float_tensors(model, &mut values);
    debug_assert!(
        missing.is_empty(),
        "paths came from this model: {missing:?}"
    );
    Ok((
        model,
        LoadReport {
            loaded,
            fresh_head: head_differs,
            unused,
        },
    ))
}

/// The RLE flow's fixed buffers as Ultralytics' `RealNVP` registers them (name, shape, values):
/// a standard normal's `loc` and `cov` and the alternating coupling masks, which our flow
/// hard-codes rather than holds.
const FLOW_CONSTANTS: [(&str, &[usize], &[f32]); 3] = [
    ("model.23.flow_model.loc", &[2], &[0.0, 0.0]),
    ("model.23.flow_model.cov", &[2, 2], &[1.0, 0.0, 0.0, 1.0]),
    (
        "model.23.flow_model.mask",
        &[6, 2],
        &[0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0],
    ),
];

/// Takes the [`FLOW_CONSTANTS`] out of `file`. A file whose buffers differ would compute another
/// loss, so it is refused.
fn check_constants(file: &mut BTreeMap<String, Stored>) -> Result<(), String> {
    for (name, _, want) in FLOW_CONSTANTS {
        if let Some(t) = file.remove(name)
            && t.values != want
        {
            return Err(format!(
                "{name} holds {:?}; burnpose's flow uses {want:?}",
                t.values
            ));
        }
    }
    Ok(())
}

/// Writes `model` as an Ultralytics state dict (their names and shapes, FP32) to a safetensors
/// file, with the buffers their modules also hold (`num_batches_tracked`, the flow's constants),
/// so that their `load_state_dict(..., strict=True)` takes it. Written atomically.
pub fn export_ultralytics(model: &Yolo, path: &Path) -> Result<usize, WeightsError> {
    let model = model.valid();
    let ours = float_shapes(&model);
    let paths: Vec<String> = ours.iter().map(|(p, _)| p.clone()).collect();
    let keys = ultralytics_keys(&paths).map_err(|p| WeightsError::Write {
        path: path.to_path_buf(),
        message: format!("our tensor {p} has no Ultralytics name"),
    })?;
    let flat = crate::optim::tensors::float_tensors(&model);
    let mut tensors: BTreeMap<String, read::Owned> = BTreeMap::new();
    for (((_, dims), key), (_, t)) in ours.iter().zip(&keys).zip(flat) {
        let values: Vec<f32> = t
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("f32 after convert");
        let shape = torch_shape(dims, key.transposed);
        let values = if key.transposed {
            // Ours `[in, out]` → `[out, in]`.
            transpose(&Stored {
                shape: dims.clone(),
                values,
            })
        } else {
            values
        };
        if key.name.ends_with("bn.running_var") {
            let counter = key.name.replace("running_var", "num_batches_tracked");
            tensors.insert(counter, read::Owned::i64(vec![], vec![0]));
        }
        tensors.insert(key.name.clone(), read::Owned::f32(shape, values));
    }
    if model.head.flow.is_some() {
        for (name, shape, values) in FLOW_CONSTANTS {
            tensors.insert(
                name.into(),
                read::Owned::f32(shape.to_vec(), values.to_vec()),
            );
        }
    }
    let n = tensors.len();
    read::write_safetensors(tensors, path)?;
    Ok(n)
}

/// `dims` as PyTorch holds the tensor: a `Linear` weight reversed.
fn torch_shape(dims: &[usize], transposed: bool) -> Vec<usize> {
    let mut d = dims.to_vec();
    if transposed {
        d.reverse();
    }
    d
}

/// A 2-D tensor transposed (row-major `[r, c]` → `[c, r]`).
fn transpose(t: &Stored) -> Vec<f32> {
    let [r, c] = [t.shape[0], t.shape[1]];
    let mut out = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = t.values[i * c + j];
        }
    }
    out
}

fn describe(model: &Yolo) -> String {
    let h = &model.head;
    match h.flow {
        Some(_) => format!("pose, nc={}, kpt_shape=[{}, {}]", h.nc, h.nk, h.kpt_dim),
        None => format!("detect, nc={}", h.nc),
    }
}

fn first_device(model: &Yolo) -> Device {
    model.backbone.l0.conv.weight.val().device()
}

#[cfg(test)]
mod tests {
    /// Burn-native files name their model as JSON with exactly the keys scale, task, nc and
    /// kpt_shape (what files written before `YoloConfig` took this role hold too).
    #[test]
    fn the_burn_native_model_json_keeps_its_four_keys() {
        let model = YoloConfig::new(Scale::S, Task::Detect).with_nc(3);
        let json = serde_json::to_value(&model).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort();
        assert_eq!(keys, ["kpt_shape", "nc", "scale", "task"]);
        let back: YoloConfig = serde_json::from_value(json).unwrap();
        assert_eq!(
            (back.scale, back.task, back.nc),
            (Scale::S, Task::Detect, 3)
        );
    }

    /// Reading only the shapes (what `predict` and `val` need to build the model before the
    /// one full read) gives the full read's keys and shapes, for a `.pt` checkpoint and a
    /// `.safetensors` state dict.
    #[test]
    fn a_shapes_only_read_matches_the_full_read() {
        use super::read::{Content, read};
        let pt = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/ultralytics/yolo26n-pose.pt");
        let dir = std::env::temp_dir().join(format!("burnpose-shapes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let st = dir.join("exported.safetensors");
        let device = Device::flex();
        let model = crate::model::YoloConfig::new(crate::model::Scale::N, Task::Detect)
            .with_nc(3)
            .init(&device);
        export_ultralytics(&model, &st).unwrap();
        for path in [pt.as_path(), st.as_path()] {
            let full = read(path, Content::Values).unwrap();
            let shapes = read(path, Content::Shapes).unwrap();
            assert_eq!(full.len(), shapes.len(), "{}", path.display());
            for ((k, f), (k2, s)) in full.iter().zip(&shapes) {
                assert_eq!((k, &f.shape), (k2, &s.shape));
                assert_eq!(f.values.len(), f.shape.iter().product::<usize>());
                assert!(s.values.is_empty());
            }
        }
        assert_eq!(file_model(&st).unwrap().nc, 3);
        std::fs::remove_dir_all(&dir).ok();
    }

    use super::*;

    fn stored(values: &[f32]) -> Stored {
        Stored {
            shape: vec![values.len()],
            values: values.to_vec(),
        }
    }

    #[test]
    fn flow_constants_other_than_ours_are_refused() {
        let ours = || {
            BTreeMap::from([
                ("model.23.flow_model.loc".to_string(), stored(&[0.0, 0.0])),
                (
                    "model.23.flow_model.cov".to_string(),
                    stored(&[1.0, 0.0, 0.0, 1.0]),
                ),
            ])
        };
        let mut file = ours();
        assert_eq!(check_constants(&mut file), Ok(()));
        assert!(file.is_empty(), "the constants are taken out of the file");
        let mut file = ours();
        file.insert("model.23.flow_model.loc".into(), stored(&[0.5, 0.0]));
        let err = check_constants(&mut file).unwrap_err();
        assert!(
            err.contains("model.23.flow_model.loc holds [0.5, 0.0]"),
            "{err}"
        );
        let mut file = ours();
        file.insert("model.23.flow_model.mask".into(), stored(&[1.0; 12]));
        let err = check_constants(&mut file).unwrap_err();
        assert!(err.contains("model.23.flow_model.mask"), "{err}");
    }

    #[test]
    fn a_linear_weight_transposes_both_ways() {
        let t = Stored {
            shape: vec![2, 3],
            values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        let tt = transpose(&t);
        assert_eq!(tt, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let back = transpose(&Stored {
            shape: vec![3, 2],
            values: tt,
        });
        assert_eq!(back, t.values);
    }
}
