//! Weight files as a map from Ultralytics' key to an FP32 tensor: `.pt` through burn-store's
//! PyTorch reader, `.safetensors` through the safetensors crate; and the safetensors writer for
//! the export.

use super::{Stored, WeightsError};
use burn::tensor::{DType, TensorData};
use burn_store::pytorch::{PytorchError, PytorchReader};
use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

/// What [`read`] takes from a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// Every tensor's values, widened to FP32.
    Values,
    /// Only the shapes (`Stored::values` empty): enough to tell which model a file holds, without
    /// reading and widening millions of values.
    Shapes,
}

/// The file's floating-point tensors by key, keys starting at Ultralytics' `model.` (the layer
/// list); integer tensors (`num_batches_tracked`) are dropped.
pub(crate) fn read(
    path: &Path,
    content: Content,
) -> Result<BTreeMap<String, Stored>, WeightsError> {
    let err = |message: String| WeightsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let tensors = match extension(path).as_deref() {
        Some("safetensors") => read_safetensors(path, content).map_err(err)?,
        Some("pt" | "pth") => read_pt(path, content).map_err(err)?,
        _ => {
            return Err(err(
                "expected a .pt or .pth file (Ultralytics' checkpoint or a state dict) or a \
                 .safetensors state dict"
                    .into(),
            ));
        }
    };
    let tensors = normalise_keys(tensors);
    if !tensors.keys().any(|k| k.starts_with("model.0.")) {
        return Err(err(
            "no YOLO layer weights found (expected keys such as model.0.conv.weight)".into(),
        ));
    }
    Ok(tensors)
}

/// `path`'s extension in lower case (`.PT` is a `.pt`).
pub(crate) fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// An Ultralytics checkpoint holds the model under `ema` (while training) or `model`; a state
/// dict holds the tensors at its root.
fn read_pt(path: &Path, content: Content) -> Result<BTreeMap<String, Stored>, String> {
    let mut last = None;
    for key in [Some("ema"), Some("model"), None] {
        let reader = match key {
            Some(k) => PytorchReader::with_top_level_key(path, k),
            None => PytorchReader::new(path),
        };
        match reader {
            Ok(r) if !r.is_empty() => return tensors_of(r, content),
            Ok(_) => {}
            Err(e @ (PytorchError::Io(_) | PytorchError::Zip(_) | PytorchError::Tar(_))) => {
                return Err(e.to_string());
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => format!("no tensors found ({e})"),
        None => "no tensors found".into(),
    })
}

fn tensors_of(reader: PytorchReader, content: Content) -> Result<BTreeMap<String, Stored>, String> {
    let mut out = BTreeMap::new();
    for (name, t) in reader.into_tensors() {
        use burn_store::pytorch_reader::DType as T;
        let dtype = match t.dtype() {
            T::F32 => DType::F32,
            T::F16 => DType::F16,
            T::BF16 => DType::BF16,
            T::F64 => DType::F64,
            _ => continue,
        };
        let shape = t.shape().to_vec();
        let stored = match content {
            Content::Shapes => Stored {
                shape,
                values: Vec::new(),
            },
            Content::Values => widen(t.read().map_err(|e| e.to_string())?, shape, dtype),
        };
        out.insert(name, stored);
    }
    Ok(out)
}

fn read_safetensors(path: &Path, content: Content) -> Result<BTreeMap<String, Stored>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            Dtype::F64 => DType::F64,
            _ => continue,
        };
        let shape = view.shape().to_vec();
        let stored = match content {
            Content::Shapes => Stored {
                shape,
                values: Vec::new(),
            },
            Content::Values => widen(view.data().to_vec(), shape, dtype),
        };
        out.insert(name, stored);
    }
    Ok(out)
}

fn widen(bytes: Vec<u8>, shape: Vec<usize>, dtype: DType) -> Stored {
    let values = TensorData::from_bytes_vec(bytes, shape.clone(), dtype)
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 after convert");
    Stored { shape, values }
}

/// Keys relative to the layer list: a state dict of the whole `PoseModel` starts at `model.0.`
/// already; anything before the first `model.<digit>` (a wrapper's prefix) is dropped.
fn normalise_keys(tensors: BTreeMap<String, Stored>) -> BTreeMap<String, Stored> {
    tensors
        .into_iter()
        .map(|(k, v)| {
            let start = k
                .match_indices("model.")
                .map(|(i, _)| i)
                .find(|&i| {
                    (i == 0 || k.as_bytes()[i - 1] == b'.')
                        && k[i + 6..].starts_with(|c: char| c.is_ascii_digit())
                })
                .unwrap_or(0);
            (k[start..].to_string(), v)
        })
        .collect()
}

/// The `__metadata__` of a safetensors file's header (`None` when it cannot be read).
pub(crate) fn safetensors_metadata(
    path: &Path,
) -> Option<std::collections::HashMap<String, String>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    // A header is JSON of a few kB per tensor; a larger "length" is not a safetensors file.
    if len > 100 << 20 {
        return None;
    }
    let mut header = vec![0u8; len];
    f.read_exact(&mut header).ok()?;
    let json: serde_json::Value = serde_json::from_slice(&header).ok()?;
    let meta = json.get("__metadata__").cloned().unwrap_or_default();
    Some(serde_json::from_value(meta).unwrap_or_default())
}

/// A tensor to write into a safetensors file: an export's, a checkpoint's.
pub(crate) struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Owned {
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self {
            dtype: Dtype::F32,
            shape,
            bytes,
        }
    }

    /// FP32 values already as little-endian bytes (a device read's).
    pub fn f32_bytes(shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        Self {
            dtype: Dtype::F32,
            shape,
            bytes,
        }
    }

    pub fn i64(shape: Vec<usize>, values: Vec<i64>) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self {
            dtype: Dtype::I64,
            shape,
            bytes,
        }
    }
}

impl View for &Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

pub(crate) fn write_safetensors(
    tensors: BTreeMap<String, Owned>,
    path: &Path,
) -> Result<(), WeightsError> {
    let err = |message: String| WeightsError::Write {
        path: path.to_path_buf(),
        message,
    };
    let info = std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(), // what safetensors' torch loader expects
    )]);
    let bytes =
        safetensors::serialize(tensors.iter(), Some(info)).map_err(|e| err(e.to_string()))?;
    crate::train::report::write_atomic(path, &bytes).map_err(|e| err(e.to_string()))
}
