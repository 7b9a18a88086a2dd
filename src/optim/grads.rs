//! Gradients by parameter, flattened to `[numel]`. `GradientsParams` is keyed by tensor rank; these
//! read the rank from the parameter table, so callers (clipping, accumulation, checkpoints,
//! data-parallel all-reduce) do not each dispatch on it.

use super::groups::ParamInfo;
use super::layout::{Layout, Span, padded};
use super::tensors::flattened as flat;
use crate::model::ops::segment;
use burn::optim::GradientsParams;
use burn::prelude::*;

fn unsupported(p: &ParamInfo) -> ! {
    panic!("parameter {} has unsupported rank {}", p.path, p.dims.len())
}

/// `p`'s gradient, if it has one.
pub fn get_flat(grads: &GradientsParams, p: &ParamInfo) -> Option<Tensor<1>> {
    match p.dims.len() {
        1 => grads.get::<1>(p.id).map(flat),
        2 => grads.get::<2>(p.id).map(flat),
        3 => grads.get::<3>(p.id).map(flat),
        4 => grads.get::<4>(p.id).map(flat),
        _ => unsupported(p),
    }
}

/// `p`'s gradient, removed from `grads`.
pub fn take_flat(grads: &mut GradientsParams, p: &ParamInfo) -> Option<Tensor<1>> {
    match p.dims.len() {
        1 => grads.remove::<1>(p.id).map(flat),
        2 => grads.remove::<2>(p.id).map(flat),
        3 => grads.remove::<3>(p.id).map(flat),
        4 => grads.remove::<4>(p.id).map(flat),
        _ => unsupported(p),
    }
}

/// Registers `g` (`[numel]`) as `p`'s gradient, in `p`'s shape.
pub fn put_flat(grads: &mut GradientsParams, p: &ParamInfo, g: Tensor<1>) {
    let d = &p.dims;
    match d.len() {
        // Already `[numel]`: registered as it is (no reshape's dispatch).
        1 => {
            debug_assert_eq!(g.dims(), [d[0]], "{}", p.path);
            grads.register::<1>(p.id, g)
        }
        2 => grads.register::<2>(p.id, g.reshape([d[0], d[1]])),
        3 => grads.register::<3>(p.id, g.reshape([d[0], d[1], d[2]])),
        4 => grads.register::<4>(p.id, g.reshape([d[0], d[1], d[2], d[3]])),
        _ => unsupported(p),
    }
}

/// Gradients of `params` as segments of one flat buffer, as feature replay hands them out:
/// accumulating two of them with the same parameters is one addition of the buffers.
#[derive(Clone, Debug)]
pub struct FlatGrads {
    pub params: Vec<ParamInfo>,
    pub layout: Layout,
    pub buf: Tensor<1>,
    /// `Some` when `buf` is the recorder's own buffer, which its next backward rewrites: what
    /// keeps these gradients past that must hold a copy made by this function instead.
    pub copy: Option<fn(Tensor<1>) -> Tensor<1>>,
}

impl FlatGrads {
    /// These gradients on a buffer of their own (a copy of a recorder's buffer), registered in
    /// `into` as views of it.
    pub fn owned(self, into: &mut GradientsParams) -> Self {
        if self.copy.is_none() {
            return self;
        }
        let owned = self.detached();
        owned.put_views(into);
        owned
    }

    /// These gradients on a buffer of their own: a copy of a recorder's buffer, queued now (the
    /// same bits), or themselves when they have one already.
    pub fn detached(self) -> Self {
        match self.copy {
            None => self,
            Some(copy) => Self {
                buf: copy(self.buf),
                copy: None,
                ..self
            },
        }
    }

    /// Registers every gradient in `into` as a view of the buffer.
    pub fn put_views(&self, into: &mut GradientsParams) {
        for (i, p) in self.params.iter().enumerate() {
            put_flat(into, p, self.layout.view(&self.buf, i));
        }
    }

    /// Where these gradients lie among `table`'s parameters laid out by `layout`: the index of
    /// the first, when they are `table`'s parameters from there on, in its order, at
    /// `layout`'s distances (so the buffer's span is one run of a buffer laid out by
    /// `layout`); `None` otherwise.
    pub fn place_in(&self, table: &[ParamInfo], layout: &Layout) -> Option<usize> {
        let first = self.params.first()?;
        let start = table.iter().position(|p| p.id == first.id)?;
        let (base, own) = (layout.offsets[start], self.layout.offsets[0]);
        let fits = self.params.iter().enumerate().all(|(k, p)| {
            let i = start + k;
            table.get(i).is_some_and(|t| t.id == p.id)
                && layout.sizes[i] == self.layout.sizes[k]
                && layout.offsets[i] - base == self.layout.offsets[k] - own
        });
        fits.then_some(start)
    }

    /// The run [`FlatGrads::place_in`] found at `start`: where it lies in a buffer laid out by
    /// `layout` and its values, from the first segment's start to the last one's end (the
    /// padding between them included), as `Layout::each_run` gives a run of views of the
    /// buffer.
    pub fn run_at(&self, start: usize, layout: &Layout) -> (Span, Tensor<1>) {
        let last = self.params.len() - 1;
        let own = self.layout.offsets[0];
        let len = self.layout.offsets[last] + self.layout.sizes[last] - own;
        let reach = self.layout.offsets[last] + padded(self.layout.sizes[last]) - own;
        let at = Span {
            start: layout.offsets[start],
            len,
            reach,
        };
        (at, segment(self.buf.clone(), own, len, reach))
    }

    /// Whether `other` holds the same parameters in the same places.
    pub fn same_layout(&self, other: &FlatGrads) -> bool {
        self.layout.len == other.layout.len
            && self
                .params
                .iter()
                .map(|p| p.id)
                .eq(other.params.iter().map(|p| p.id))
    }
}

/// Adds a micro-batch's `grads` to `pending`, per parameter; a parameter absent from every
/// micro-batch stays absent. `pending_flat` are the buffers that some of `pending` are views of:
/// where one of `flats` (buffers some of `grads` are views of) holds the same parameters in the
/// same places as one of them, those are summed as one addition of the two buffers (per value
/// the same sum) and handed on as views of the result. `kept`: `pending` outlives this step (no
/// optimizer step consumes it now), so views of a recorder's buffer ([`FlatGrads::copy`]) that
/// it would hold as they are become views of a copy.
pub fn accumulate(
    pending: &mut Option<GradientsParams>,
    pending_flat: &mut Vec<FlatGrads>,
    mut grads: GradientsParams,
    flats: Vec<FlatGrads>,
    table: &[ParamInfo],
    kept: bool,
) {
    let Some(mut sums) = pending.take() else {
        *pending_flat = flats
            .into_iter()
            .map(|f| if kept { f.owned(&mut grads) } else { f })
            .collect();
        *pending = Some(grads);
        return;
    };
    // A pending buffer without a match this micro-batch is dropped: its views in `sums` stay
    // as they are, summed per tensor from now on.
    let mut old = std::mem::take(pending_flat);
    for new in flats {
        match old.iter().position(|o| o.same_layout(&new)) {
            Some(i) => {
                let old = old.swap_remove(i);
                for p in &new.params {
                    take_flat(&mut grads, p);
                }
                let sum = FlatGrads {
                    buf: old.buf + new.buf,
                    copy: None,
                    ..new
                };
                sum.put_views(&mut sums);
                pending_flat.push(sum);
            }
            // A parameter without a pending gradient keeps this micro-batch's view as it is.
            None if kept => {
                new.owned(&mut grads);
            }
            None => {}
        }
    }
    for p in table {
        if let Some(g) = take_flat(&mut grads, p) {
            let sum = match take_flat(&mut sums, p) {
                Some(old) => old + g,
                None => g,
            };
            put_flat(&mut sums, p, sum);
        }
    }
    *pending = Some(sums);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Scale, Task, YoloConfig};
    use crate::optim::groups::param_table;
    use burn::tensor::Distribution;

    /// A flat buffer holding a run of the parameter table (as a recorder hands out) is placed
    /// where the run starts, and its one run gathers the bytes that gathering its views one by
    /// one gives; buffers whose parameters are not such a run are not placed.
    #[test]
    fn a_flat_buffer_of_a_run_of_the_table_gathers_as_its_views() {
        let d = Device::flex();
        d.seed(9);
        let table = param_table(&YoloConfig::new(Scale::N, Task::Pose).init(&d));
        let layout = Layout::new(table.iter().map(ParamInfo::numel).collect());
        // A buffer as the recorder's: values in the segments, zeros in the padding (on CUDA a
        // run's copy carries the padding between its segments either way).
        let flat_of = |params: Vec<ParamInfo>| {
            let own = Layout::new(params.iter().map(ParamInfo::numel).collect());
            let parts = own
                .sizes
                .iter()
                .map(|&n| Some(Tensor::<1>::random([n], Distribution::Default, &d)))
                .collect();
            let buf = own.gather(parts, &d);
            FlatGrads {
                params,
                layout: own,
                buf,
                copy: None,
            }
        };
        let f = flat_of(table[10..60].to_vec());
        assert_eq!(f.place_in(&table, &layout), Some(10));
        let (at, whole) = f.run_at(10, &layout);
        assert_eq!(at.start, layout.offsets[10]);
        let mut views = GradientsParams::new();
        f.put_views(&mut views);
        let parts: Vec<Option<Tensor<1>>> =
            table.iter().map(|p| take_flat(&mut views, p)).collect();
        assert_eq!(parts.iter().filter(|p| p.is_some()).count(), 50);
        let one_by_one = layout.gather(parts, &d);
        let as_a_run =
            Tensor::<1>::zeros([layout.len], &d).slice_assign(at.start..at.start + at.len, whole);
        let bits = |t: Tensor<1>| -> Vec<u32> {
            let v: Vec<f32> = t.into_data().try_to_vec().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        let (a, b) = (bits(one_by_one), bits(as_a_run));
        let first = a.iter().zip(&b).position(|(x, y)| x != y);
        assert_eq!(first, None, "the run's gather differs from the views'");
        assert!(b.iter().any(|&x| x != 0), "nothing gathered");
        let mut swapped = table[10..60].to_vec();
        swapped.swap(3, 4);
        assert_eq!(
            flat_of(swapped).place_in(&table, &layout),
            None,
            "out of order"
        );
        let mut gapped = table[10..20].to_vec();
        gapped.remove(5);
        assert_eq!(
            flat_of(gapped).place_in(&table, &layout),
            None,
            "one missing"
        );
        let tail = flat_of(table[table.len() - 3..].to_vec());
        assert_eq!(
            tail.place_in(&table, &layout),
            Some(table.len() - 3),
            "the last"
        );
        let mut beyond = table[table.len() - 3..].to_vec();
        beyond.push(table[0].clone());
        assert_eq!(
            flat_of(beyond).place_in(&table, &layout),
            None,
            "past the end"
        );
    }
}
