//! Data errors: each names the file (and line or record) and what was expected.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// (`error` is deliberately not a `source`: the message shows it, and a chained report would
    /// print it twice.)
    #[error("cannot read {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot decode image {path}: {message}")]
    Image { path: PathBuf, message: String },
    #[error("invalid annotation file {path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{json}: image id {image_id} refers to {path}, which does not exist")]
    MissingImage {
        json: PathBuf,
        image_id: u64,
        path: PathBuf,
    },
    #[error("{path}: {record}: {message}")]
    Label {
        path: PathBuf,
        record: String,
        message: String,
    },
}
