//! Layer table of a model (what `burnpose info` prints): parameters, output shape and compute
//! per layer, in Ultralytics' layer numbering.

use super::conv::ConvBn;
use super::params::ParamCount;
use super::yolo::{Task, Yolo};

/// One row of the layer table.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRow {
    pub index: usize,
    /// Source layers (`-1` = the previous one).
    pub from: &'static str,
    pub module: &'static str,
    pub params: usize,
    /// Output `[C, H, W]`, or `[C, anchors, 0]` for the head.
    pub out: [usize; 3],
    /// Multiply-accumulates for one image.
    pub macs: u64,
}

fn out_c(conv: &ConvBn) -> usize {
    conv.conv.weight.shape().dims::<4>()[0]
}

/// Rows for one `imgsz × imgsz` image.
pub fn layer_table(model: &Yolo, imgsz: usize) -> Vec<LayerRow> {
    let b = &model.backbone;
    let n = &model.neck;
    let mut rows = Vec::new();
    let mut push = |from, module, params, out: [usize; 3], macs| {
        let index = rows.len();
        rows.push(LayerRow {
            index,
            from,
            module,
            params,
            out,
            macs,
        });
    };
    let r = |stride: usize| imgsz / stride;
    let conv_row = |c: &ConvBn, h_in: usize| {
        let (m, h, _) = c.macs(h_in, h_in);
        (c.param_count(), [out_c(c), h, h], m)
    };
    let (p, o, m) = conv_row(&b.l0, imgsz);
    push("-1", "Conv", p, o, m);
    let (p, o, m) = conv_row(&b.l1, r(2));
    push("-1", "Conv", p, o, m);
    push(
        "-1",
        "C3k2",
        b.l2.param_count(),
        [out_c(&b.l2.cv2), r(4), r(4)],
        b.l2.macs(r(4), r(4)),
    );
    let (p, o, m) = conv_row(&b.l3, r(4));
    push("-1", "Conv", p, o, m);
    push(
        "-1",
        "C3k2",
        b.l4.param_count(),
        [out_c(&b.l4.cv2), r(8), r(8)],
        b.l4.macs(r(8), r(8)),
    );
    let (p, o, m) = conv_row(&b.l5, r(8));
    push("-1", "Conv", p, o, m);
    let c6 = out_c(&b.l6.cv2);
    push(
        "-1",
        "C3k2",
        b.l6.param_count(),
        [c6, r(16), r(16)],
        b.l6.macs(r(16), r(16)),
    );
    let (p, o, m) = conv_row(&b.l7, r(16));
    push("-1", "Conv", p, o, m);
    push(
        "-1",
        "C3k2",
        b.l8.param_count(),
        [out_c(&b.l8.cv2), r(32), r(32)],
        b.l8.macs(r(32), r(32)),
    );
    push(
        "-1",
        "SPPF",
        b.l9.param_count(),
        [out_c(&b.l9.cv2), r(32), r(32)],
        b.l9.macs(r(32), r(32)),
    );
    let c10 = out_c(&b.l10.cv2);
    push(
        "-1",
        "C2PSA",
        b.l10.param_count(),
        [c10, r(32), r(32)],
        b.l10.macs(r(32), r(32)),
    );
    push("-1", "Upsample", 0, [c10, r(16), r(16)], 0);
    push("[-1, 6]", "Concat", 0, [c10 + c6, r(16), r(16)], 0);
    let c13 = out_c(&n.l13.cv2);
    push(
        "-1",
        "C3k2",
        n.l13.param_count(),
        [c13, r(16), r(16)],
        n.l13.macs(r(16), r(16)),
    );
    push("-1", "Upsample", 0, [c13, r(8), r(8)], 0);
    let c4 = out_c(&b.l4.cv2);
    push("[-1, 4]", "Concat", 0, [c13 + c4, r(8), r(8)], 0);
    let c16 = out_c(&n.l16.cv2);
    push(
        "-1",
        "C3k2",
        n.l16.param_count(),
        [c16, r(8), r(8)],
        n.l16.macs(r(8), r(8)),
    );
    let (p, o, m) = conv_row(&n.l17, r(8));
    push("-1", "Conv", p, o, m);
    push("[-1, 13]", "Concat", 0, [o[0] + c13, r(16), r(16)], 0);
    let c19 = out_c(&n.l19.cv2);
    push(
        "-1",
        "C3k2",
        n.l19.param_count(),
        [c19, r(16), r(16)],
        n.l19.macs(r(16), r(16)),
    );
    let (p, o, m) = conv_row(&n.l20, r(16));
    push("-1", "Conv", p, o, m);
    push("[-1, 10]", "Concat", 0, [o[0] + c10, r(32), r(32)], 0);
    let c22 = out_c(&n.l22.cv2);
    push(
        "-1",
        "C3k2",
        n.l22.param_count(),
        [c22, r(32), r(32)],
        n.l22.macs(r(32), r(32)),
    );
    let head = &model.head;
    let sizes = [8, 16, 32].map(|s| (r(s), r(s)));
    let anchors: usize = sizes.iter().map(|(h, w)| h * w).sum();
    let per_anchor = 4 + head.nc + head.nk * head.kpt_dim;
    let module = if head.flow.is_some() {
        "Pose26"
    } else {
        "Detect"
    };
    let macs = head.one2many.macs(sizes) + head.one2one.macs(sizes);
    push(
        "[16, 19, 22]",
        module,
        head.param_count(),
        [per_anchor, anchors, 0],
        macs,
    );
    rows
}

/// Total GFLOPs (2 · MACs) for one image.
pub fn gflops(rows: &[LayerRow]) -> f64 {
    2.0 * rows.iter().map(|r| r.macs).sum::<u64>() as f64 / 1e9
}

/// The table as text, Ultralytics-style.
pub fn render(model: &Yolo, name: &str, task: Task, imgsz: usize) -> String {
    let rows = layer_table(model, imgsz);
    let mut s = format!(
        "{:>4} {:>14} {:>9} {:>10} {:>18} {:>8}\n",
        "idx", "from", "module", "params", "output", "GFLOPs"
    );
    for r in &rows {
        let out = if r.out[2] == 0 {
            format!("{}x{} anchors", r.out[0], r.out[1])
        } else {
            format!("{}x{}x{}", r.out[0], r.out[1], r.out[2])
        };
        s += &format!(
            "{:>4} {:>14} {:>9} {:>10} {:>18} {:>8.3}\n",
            r.index,
            r.from,
            r.module,
            r.params,
            out,
            2.0 * r.macs as f64 / 1e9
        );
    }
    let total: usize = rows.iter().map(|r| r.params).sum();
    s += &format!(
        "{name} ({task:?}): {} layers, {total} parameters ({} backbone+neck), {:.1} GFLOPs at {imgsz}x{imgsz}\n",
        rows.len(),
        model.feature_params(),
        gflops(&rows)
    );
    s
}
