//! Model sizes ("scales") and the channel/repeat rules of `parse_model` (yolo_spec §1.1).

use serde::{Deserialize, Serialize};

/// A registered model size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    N,
    S,
}

impl Scale {
    /// (depth, width, max_channels).
    fn factors(self) -> (f64, f64, usize) {
        match self {
            Scale::N => (0.50, 0.25, 1024),
            Scale::S => (0.50, 0.50, 1024),
        }
    }

    /// Output channels of a block whose YAML width is `c`: ceil(min(c, max)·width / 8)·8.
    pub fn channels(self, c: usize) -> usize {
        let (_, width, max) = self.factors();
        ((c.min(max) as f64 * width) / 8.0).ceil() as usize * 8
    }

    /// Repeats of a block whose YAML repeat is `n`.
    pub fn repeats(self, n: usize) -> usize {
        let (depth, _, _) = self.factors();
        if n > 1 {
            ((n as f64 * depth).round() as usize).max(1)
        } else {
            n
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::N => "n",
            Scale::S => "s",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_scaling() {
        assert_eq!(Scale::N.channels(64), 16);
        assert_eq!(Scale::N.channels(1024), 256);
        assert_eq!(Scale::S.channels(1024), 512);
        assert_eq!(Scale::N.repeats(2), 1);
        assert_eq!(Scale::N.repeats(1), 1);
    }
}
