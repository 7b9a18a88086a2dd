//! burnpose: a YOLO-style pose (and detection) trainer on Burn.

pub mod cli;
pub mod config;
pub mod data;
pub mod eval;
pub mod loss;
pub mod model;
pub mod optim;
pub mod predict;
pub mod replay;
#[cfg(test)]
mod test_util;
pub mod train;
pub mod weights;
