//! Position-sensitive attention of YOLO26: Attention, PSABlock, C2PSA (`ultralytics/nn/modules/block.py`).

use super::conv::{ConvBn, ConvBnConfig};
use super::ops::softmax::softmax_last;
use super::precision::matmul;
use burn::prelude::*;

/// Multi-head self-attention over the H·W tokens of a feature map.
#[derive(Config, Debug)]
pub struct AttentionConfig {
    /// Channels (`dim`).
    pub dim: usize,
    pub heads: usize,
    /// key_dim = int(head_dim · attn_ratio).
    #[config(default = 0.5)]
    pub attn_ratio: f64,
}

impl AttentionConfig {
    pub fn init(&self, device: &Device) -> Attention {
        let head_dim = self.dim / self.heads;
        let key_dim = (head_dim as f64 * self.attn_ratio) as usize;
        let qkv_out = self.dim + 2 * key_dim * self.heads;
        Attention {
            qkv: ConvBnConfig::new(self.dim, qkv_out)
                .with_act(false)
                .init(device),
            proj: ConvBnConfig::new(self.dim, self.dim)
                .with_act(false)
                .init(device),
            pe: ConvBnConfig::new(self.dim, self.dim)
                .with_kernel(3)
                .with_groups(self.dim)
                .with_act(false)
                .init(device),
            heads: self.heads,
            key_dim,
            head_dim,
        }
    }
}

#[derive(Module, Debug)]
pub struct Attention {
    pub qkv: ConvBn,
    pub proj: ConvBn,
    /// Depthwise 3×3 positional encoding applied to v.
    pub pe: ConvBn,
    pub heads: usize,
    pub key_dim: usize,
    pub head_dim: usize,
}

impl Attention {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let [b, c, h, w] = x.dims();
        let n = h * w;
        // Per head the channel order is [q | k | v].
        let qkv = self
            .qkv
            .forward(x)
            .reshape([b, self.heads, 2 * self.key_dim + self.head_dim, n]);
        let q = qkv.clone().narrow(2, 0, self.key_dim);
        let k = qkv.clone().narrow(2, self.key_dim, self.key_dim);
        let v = qkv.narrow(2, 2 * self.key_dim, self.head_dim);
        let scale = (self.key_dim as f64).powf(-0.5);
        let attn = softmax_last(matmul(q.swap_dims(2, 3), k) * scale);
        let out = matmul(v.clone(), attn.swap_dims(2, 3)).reshape([b, c, h, w]);
        let y = out + self.pe.forward(v.reshape([b, c, h, w]));
        self.proj.forward(y)
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        let n = (h * w) as u64;
        let (heads, kd, hd) = (self.heads as u64, self.key_dim as u64, self.head_dim as u64);
        self.qkv.macs(h, w).0
            + self.proj.macs(h, w).0
            + self.pe.macs(h, w).0
            + heads * n * n * (kd + hd)
    }
}

/// `x + attn(x)`, then `x + ffn(x)` with a 2× pointwise FFN.
#[derive(Config, Debug)]
pub struct PsaBlockConfig {
    pub channels: usize,
    pub heads: usize,
}

impl PsaBlockConfig {
    pub fn init(&self, device: &Device) -> PsaBlock {
        let c = self.channels;
        PsaBlock {
            attn: AttentionConfig::new(c, self.heads).init(device),
            ffn1: ConvBnConfig::new(c, 2 * c).init(device),
            ffn2: ConvBnConfig::new(2 * c, c).with_act(false).init(device),
        }
    }
}

#[derive(Module, Debug)]
pub struct PsaBlock {
    pub attn: Attention,
    pub ffn1: ConvBn,
    pub ffn2: ConvBn,
}

impl PsaBlock {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let x = x.clone() + self.attn.forward(x);
        x.clone() + self.ffn2.forward(self.ffn1.forward(x))
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.attn.macs(h, w) + self.ffn1.macs(h, w).0 + self.ffn2.macs(h, w).0
    }
}

/// CSP wrapper around `n` PSA blocks: `cv2(cat(a, psa(b)))` with `(a, b) = split(cv1(x))`.
#[derive(Config, Debug)]
pub struct C2psaConfig {
    pub channels: usize,
    #[config(default = 1)]
    pub n: usize,
}

impl C2psaConfig {
    pub fn init(&self, device: &Device) -> C2psa {
        let c = self.channels / 2;
        C2psa {
            cv1: ConvBnConfig::new(self.channels, 2 * c).init(device),
            cv2: ConvBnConfig::new(2 * c, self.channels).init(device),
            blocks: (0..self.n)
                .map(|_| PsaBlockConfig::new(c, c / 64).init(device))
                .collect(),
        }
    }
}

#[derive(Module, Debug)]
pub struct C2psa {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
    pub blocks: Vec<PsaBlock>,
}

impl C2psa {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let mut halves = self.cv1.forward(x).chunk(2, 1);
        let b = halves.pop().expect("two halves");
        let a = halves.pop().expect("two halves");
        let b = self.blocks.iter().fold(b, |y, blk| blk.forward(y));
        self.cv2.forward(Tensor::cat(vec![a, b], 1))
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.cv1.macs(h, w).0
            + self.cv2.macs(h, w).0
            + self.blocks.iter().map(|b| b.macs(h, w)).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamCount;

    #[test]
    fn c2psa_count_matches_reference() {
        let d = Device::flex();
        // yolo_spec §1.2 layer 10.
        assert_eq!(C2psaConfig::new(256).init(&d).param_count(), 249_728);
    }

    #[test]
    fn attention_keeps_shape() {
        let d = Device::flex();
        let attn = AttentionConfig::new(128, 2).init(&d);
        assert_eq!((attn.key_dim, attn.head_dim), (32, 64));
        let y = attn.forward(Tensor::ones([2, 128, 4, 5], &d));
        assert_eq!(y.dims(), [2, 128, 4, 5]);
    }
}
