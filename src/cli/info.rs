use crate::config::Config;
use crate::model::summary;
use anyhow::{Context, bail};
use burn::prelude::*;
use serde::de::DeserializeOwned;
use std::path::Path;

pub fn run(
    config: Option<&Path>,
    scale: Option<String>,
    task: Option<String>,
    nc: Option<usize>,
    imgsz: Option<usize>,
) -> anyhow::Result<()> {
    let mut cfg = match config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(s) = scale {
        cfg.model.scale = flag("scale", &s)?;
    }
    if let Some(t) = task {
        cfg.model.task = flag("task", &t)?;
    }
    if let Some(n) = nc {
        if n == 0 {
            bail!("--nc must be at least 1");
        }
        cfg.model.nc = n;
    }
    let imgsz = imgsz.unwrap_or(cfg.data.imgsz);
    if imgsz == 0 || !imgsz.is_multiple_of(32) {
        bail!("--imgsz must be a positive multiple of 32, got {imgsz}");
    }
    let yolo = cfg.model.yolo();
    // The table needs parameters only, so the CPU device serves every build.
    let model = yolo.init(&Device::flex());
    print!(
        "{}",
        summary::render(&model, &yolo.name(), yolo.task, imgsz)
    );
    Ok(())
}

/// Parses a flag with the same rules as the config key of that name.
fn flag<T: DeserializeOwned>(name: &str, value: &str) -> anyhow::Result<T> {
    toml::Value::String(value.into())
        .try_into()
        .with_context(|| format!("--{name} {value:?} is not a valid model.{name}"))
}
