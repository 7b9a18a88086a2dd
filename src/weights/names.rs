//! Our tensor paths ↔ Ultralytics' state-dict keys (docs/weights.md, "Names").
//!
//! Our modules follow Ultralytics' layer order, so the mapping is a rename per path segment:
//! `backbone.l4.blocks.0.bottleneck.cv1.conv.weight` ↔ `model.4.m.0.cv1.conv.weight`. The only
//! context it needs is whether a C3k2 block is an attention block (layer 22 of YOLO26), whose
//! bottleneck and PSA block sit in a two-entry `nn.Sequential` (`m.0.0`, `m.0.1`).

use std::collections::HashSet;

/// Where one of our tensors lives in Ultralytics' state dict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    /// Ultralytics' key, e.g. `model.23.cv4_kpts.0.weight`.
    pub name: String,
    /// A `Linear` weight: Burn stores `[in, out]`, PyTorch `[out, in]`.
    pub transposed: bool,
}

/// Ultralytics' key for each of our tensor paths, in the order given. `paths` must be all of a
/// model's paths (the attention blocks are recognised from them). Errors name a path that has no
/// Ultralytics counterpart.
pub fn ultralytics_keys(paths: &[String]) -> Result<Vec<Key>, String> {
    let attention: HashSet<&str> = paths
        .iter()
        .filter_map(|p| p.find(".psa.").map(|i| &p[..i]))
        .collect();
    paths
        .iter()
        .map(|p| key(p, &attention).ok_or_else(|| p.clone()))
        .collect()
}

fn key(path: &str, attention: &HashSet<&str>) -> Option<Key> {
    let segs: Vec<&str> = path.split('.').collect();
    let mut out: Vec<String> = Vec::with_capacity(segs.len() + 2);
    let rest = match segs.as_slice() {
        ["backbone" | "neck", layer, rest @ ..] => {
            let index: usize = layer.strip_prefix('l')?.parse().ok()?;
            out.push(format!("model.{index}"));
            body(path, rest, attention, &mut out)?
        }
        ["head", rest @ ..] => {
            out.push("model.23".into());
            head(rest, &mut out)?
        }
        _ => return None,
    };
    let transposed = tail(rest, &mut out)?;
    Some(Key {
        name: out.join("."),
        transposed,
    })
}

/// Backbone and neck blocks (Conv, C3k2, C3k, SPPF, C2PSA, PSA): returns the leaf segments
/// (`conv.weight`, `bn.gamma`, …) still to map.
fn body<'a>(
    path: &str,
    mut segs: &'a [&'a str],
    attention: &HashSet<&str>,
    out: &mut Vec<String>,
) -> Option<&'a [&'a str]> {
    while let [first, rest @ ..] = segs {
        match (*first, rest) {
            ("conv" | "bn", _) => return Some(segs),
            // A C3k2's inner blocks; in an attention block the bottleneck and the PSA block are
            // entries 0 and 1 of one `nn.Sequential`.
            ("blocks", [i, kind @ ("bottleneck" | "c3k" | "psa"), more @ ..]) => {
                out.push(format!("m.{i}"));
                let prefix_len = path.find(&format!(".blocks.{i}.{kind}"))?;
                let block = &path[..prefix_len + ".blocks.".len() + i.len()];
                match (*kind, attention.contains(block)) {
                    ("bottleneck", true) => out.push("0".into()),
                    ("psa", _) => out.push("1".into()),
                    _ => {}
                }
                segs = more;
            }
            // C2PSA's PSA blocks.
            ("blocks", [i, more @ ..]) => {
                out.push(format!("m.{i}"));
                segs = more;
            }
            ("ffn1", more) => {
                out.push("ffn.0".into());
                segs = more;
            }
            ("ffn2", more) => {
                out.push("ffn.1".into());
                segs = more;
            }
            ("cv1" | "cv2" | "cv3" | "attn" | "qkv" | "proj" | "pe", more) => {
                out.push((*first).into());
                segs = more;
            }
            ("m", [j, more @ ..]) => {
                out.push(format!("m.{j}"));
                segs = more;
            }
            _ => return None,
        }
    }
    None
}

/// The head: the one-to-many copy is `cv2`/`cv3`/`cv4*`, the one-to-one copy the same with
/// `one2one_`; the flow is `flow_model`.
fn head<'a>(segs: &'a [&'a str], out: &mut Vec<String>) -> Option<&'a [&'a str]> {
    let (copy, rest) = segs.split_first()?;
    let prefix = match *copy {
        "one2many" => "",
        "one2one" => "one2one_",
        "flow" => return flow(rest, out),
        _ => return None,
    };
    let (name, rest) = match rest {
        ["boxes", i, part, rest @ ..] => {
            let n = match *part {
                "cv1" => "0",
                "cv2" => "1",
                "out" => "2",
                _ => return None,
            };
            (format!("{prefix}cv2.{i}.{n}"), rest)
        }
        ["classes", i, part, rest @ ..] => {
            let n = match *part {
                "dw1" => "0.0",
                "pw1" => "0.1",
                "dw2" => "1.0",
                "pw2" => "1.1",
                "out" => "2",
                _ => return None,
            };
            (format!("{prefix}cv3.{i}.{n}"), rest)
        }
        ["pose", "point_stems", i, part, rest @ ..] => {
            let n = match *part {
                "cv1" => "0",
                "cv2" => "1",
                _ => return None,
            };
            (format!("{prefix}cv4.{i}.{n}"), rest)
        }
        ["pose", "kpts", i, rest @ ..] => (format!("{prefix}cv4_kpts.{i}"), rest),
        ["pose", "sigma", i, rest @ ..] => (format!("{prefix}cv4_sigma.{i}"), rest),
        _ => return None,
    };
    out.push(name);
    Some(rest)
}

fn flow<'a>(segs: &'a [&'a str], out: &mut Vec<String>) -> Option<&'a [&'a str]> {
    let [nets, i, layer, rest @ ..] = segs else {
        return None;
    };
    let net = match *nets {
        "scale_nets" => "s",
        "shift_nets" => "t",
        _ => return None,
    };
    let n = match *layer {
        "fc1" => "0",
        "fc2" => "2",
        "fc3" => "4",
        _ => return None,
    };
    out.push(format!("flow_model.{net}.{i}.{n}"));
    Some(rest)
}

/// The leaf: a conv's `weight`/`bias`, a BatchNorm's `gamma`/`beta` (PyTorch's
/// `weight`/`bias`) and running statistics. Returns whether the tensor is a `Linear` weight.
fn tail(segs: &[&str], out: &mut Vec<String>) -> Option<bool> {
    let flow = out.iter().any(|s| s.starts_with("flow_model"));
    match segs {
        ["conv", leaf @ ("weight" | "bias")] => out.push(format!("conv.{leaf}")),
        ["bn", leaf] => {
            let leaf = match *leaf {
                "gamma" => "weight",
                "beta" => "bias",
                "running_mean" => "running_mean",
                "running_var" => "running_var",
                _ => return None,
            };
            out.push(format!("bn.{leaf}"));
        }
        [leaf @ ("weight" | "bias")] => out.push((*leaf).into()),
        _ => return None,
    }
    Some(flow && segs == ["weight"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(path: &str, all: &[&str]) -> Key {
        let paths: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        let keys = ultralytics_keys(&paths).unwrap();
        let i = all.iter().position(|p| *p == path).unwrap();
        keys[i].clone()
    }

    #[test]
    fn segments_map_to_ultralytics_names() {
        let attention = [
            "neck.l22.blocks.0.bottleneck.cv1.conv.weight",
            "neck.l22.blocks.0.psa.attn.qkv.bn.gamma",
            "neck.l22.blocks.0.psa.ffn2.bn.running_var",
        ];
        let cases = [
            ("backbone.l0.conv.weight", "model.0.conv.weight"),
            ("backbone.l0.bn.gamma", "model.0.bn.weight"),
            ("backbone.l0.bn.beta", "model.0.bn.bias"),
            (
                "backbone.l2.blocks.0.bottleneck.cv2.bn.running_mean",
                "model.2.m.0.cv2.bn.running_mean",
            ),
            (
                "backbone.l6.blocks.0.c3k.m.1.cv2.conv.weight",
                "model.6.m.0.m.1.cv2.conv.weight",
            ),
            (
                "backbone.l6.blocks.0.c3k.cv3.bn.beta",
                "model.6.m.0.cv3.bn.bias",
            ),
            ("backbone.l9.cv2.conv.weight", "model.9.cv2.conv.weight"),
            (
                "backbone.l10.blocks.0.attn.pe.conv.weight",
                "model.10.m.0.attn.pe.conv.weight",
            ),
            (
                "backbone.l10.blocks.0.ffn1.bn.gamma",
                "model.10.m.0.ffn.0.bn.weight",
            ),
            (
                "neck.l22.blocks.0.bottleneck.cv1.conv.weight",
                "model.22.m.0.0.cv1.conv.weight",
            ),
            (
                "neck.l22.blocks.0.psa.attn.qkv.bn.gamma",
                "model.22.m.0.1.attn.qkv.bn.weight",
            ),
            (
                "neck.l22.blocks.0.psa.ffn2.bn.running_var",
                "model.22.m.0.1.ffn.1.bn.running_var",
            ),
            (
                "head.one2many.boxes.1.cv2.conv.weight",
                "model.23.cv2.1.1.conv.weight",
            ),
            (
                "head.one2one.boxes.2.out.bias",
                "model.23.one2one_cv2.2.2.bias",
            ),
            (
                "head.one2many.classes.0.dw2.bn.gamma",
                "model.23.cv3.0.1.0.bn.weight",
            ),
            (
                "head.one2one.classes.1.pw1.conv.weight",
                "model.23.one2one_cv3.1.0.1.conv.weight",
            ),
            (
                "head.one2many.pose.point_stems.2.cv2.bn.running_mean",
                "model.23.cv4.2.1.bn.running_mean",
            ),
            (
                "head.one2one.pose.kpts.0.weight",
                "model.23.one2one_cv4_kpts.0.weight",
            ),
            (
                "head.one2many.pose.sigma.1.bias",
                "model.23.cv4_sigma.1.bias",
            ),
            (
                "head.flow.shift_nets.5.fc3.bias",
                "model.23.flow_model.t.5.4.bias",
            ),
        ];
        for (ours, theirs) in cases {
            let mut all: Vec<&str> = attention.to_vec();
            if !all.contains(&ours) {
                all.push(ours);
            }
            let k = one(ours, &all);
            assert_eq!(k.name, theirs, "{ours}");
            assert!(!k.transposed, "{ours}");
        }
        let k = one(
            "head.flow.scale_nets.0.fc2.weight",
            &["head.flow.scale_nets.0.fc2.weight"],
        );
        assert_eq!(k.name, "model.23.flow_model.s.0.2.weight");
        assert!(k.transposed);
    }

    #[test]
    fn a_bottleneck_outside_an_attention_block_has_no_sequential_index() {
        // Layer 2's bottleneck is `m.0`, layer 22's `m.0.0`: decided by the PSA beside it.
        let all = [
            "backbone.l2.blocks.0.bottleneck.cv1.conv.weight",
            "neck.l22.blocks.0.bottleneck.cv1.conv.weight",
            "neck.l22.blocks.0.psa.attn.proj.conv.weight",
        ];
        assert_eq!(one(all[0], &all).name, "model.2.m.0.cv1.conv.weight");
        assert_eq!(one(all[1], &all).name, "model.22.m.0.0.cv1.conv.weight");
        let without_psa = [all[1]];
        assert_eq!(
            one(all[1], &without_psa).name,
            "model.22.m.0.cv1.conv.weight"
        );
    }

    #[test]
    fn a_path_without_a_counterpart_is_named() {
        let paths = vec![
            "backbone.l0.conv.weight".to_string(),
            "head.one2many.extra.0.weight".to_string(),
        ];
        assert_eq!(
            ultralytics_keys(&paths).unwrap_err(),
            "head.one2many.extra.0.weight"
        );
    }
}
