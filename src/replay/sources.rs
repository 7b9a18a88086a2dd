//! The static buffers a recorded graph reads the trainer's tensors from (parameters, BatchNorm
//! running statistics, the flow's parameters), and their refresh before each replay.
//!
//! The flat optimizer hands the model's parameters back as views of one buffer (`optim::flat`:
//! a new one at its first step, on CUDA the same one written in place after it, which
//! `optim::flat::in_place_steps` counts), one segment per parameter in the parameter table's order
//! (`optim::layout::Layout`). The recorded parameters' static buffers are segments of one buffer
//! laid out by the same rule, so after an optimizer step the parameters of the stage are one run
//! at the same distances there as here, and the refresh is one copy instead of one per tensor
//! (428 copies and ~13 ms of host time per optimizer step on the nano pose model,
//! docs/perf_log.md AK2). Whatever is not such a run (the first step's separate tensors, a
//! checkpoint just loaded, MuSGD's per-tensor update, the running statistics) is copied tensor by
//! tensor.

use super::copy::copy_into;
use super::copy::{bytes_of, copy_of, cube, write};
use super::recorder::is_running_stat;
use crate::model::ops::{run, segment, storage};
use crate::optim::flat::in_place_steps;
use crate::optim::groups::ParamInfo;
use crate::optim::groups::param_table;
use crate::optim::layout::{Layout, padded};
use crate::optim::tensors::FloatIndex;
use crate::train::spans::{self, Span};
use burn::module::Module;
use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use std::collections::{HashMap, HashSet};

/// The static buffers of one recorded graph set.
pub(super) struct Sources {
    /// `(path, static buffer)`.
    pub(super) buffers: Vec<(String, Tensor<1>)>,
    /// Per buffer, the trainer's tensor it now equals. Held, so that its buffer cannot be updated
    /// in place (CubeCL mutates only buffers with one owner) or reused.
    pub(super) written: Vec<Option<CubeTensor>>,
    /// The parameters' buffers as segments of one.
    params: Option<Segments>,
    /// The flat optimizer's in-place step count at the last refresh
    /// (`optim::flat::in_place_steps`).
    steps_seen: u64,
    /// Where each buffer's path falls among the module's float tensors, learnt on the first
    /// refresh.
    index: FloatIndex,
}

/// Buffers that are segments of `flat` at `layout`: segment `k` is buffer `members[k]`.
/// `live`: `flat` is a run of the optimizer's values ([`SharedParams::live`]).
struct Segments {
    layout: Layout,
    flat: Tensor<1>,
    members: Vec<usize>,
    live: bool,
}

/// The parameters' static buffers as segments of one buffer: segment `k` is the parameter at
/// `paths[k]`. `live`: the buffer is a run of the flat optimizer's own values ([`Pinned`]), not
/// a private copy.
pub(super) struct SharedParams {
    layout: Layout,
    flat: Tensor<1>,
    paths: Vec<String>,
    live: bool,
}

/// The trainer's parameters where the flat optimizer keeps them (`Optimizer::pin`): its
/// parameter table, layout and values buffer, which every step writes in place.
pub(crate) struct Pinned {
    pub(crate) table: Vec<ParamInfo>,
    pub(crate) layout: Layout,
    pub(crate) values: Tensor<1>,
}

/// The run of `pinned`'s values that holds `params` (`(path, numel)`, table order) at
/// `layout`'s distances: when they are consecutive in its table and `current`'s tensors at
/// those paths are views of its values there. `None` otherwise (the recorder then copies).
fn region_in(
    pinned: &Pinned,
    params: &[(String, usize)],
    layout: &Layout,
    current: &HashMap<String, Tensor<1>>,
) -> Option<Tensor<1>> {
    let (start, _) = params.first()?;
    let first = pinned.table.iter().position(|p| p.path == *start)?;
    let base = pinned.layout.offsets[first];
    for (k, (path, n)) in params.iter().enumerate() {
        let i = first + k;
        let at_its_place = pinned.table.get(i).is_some_and(|p| p.path == *path)
            && pinned.layout.sizes[i] == *n
            && pinned.layout.offsets[i] - base == layout.offsets[k];
        if !at_its_place {
            return None;
        }
        let place = storage(current.get(path)?)?;
        if Some(place) != storage(&pinned.layout.view(&pinned.values, i)) {
            return None;
        }
    }
    Some(segment(pinned.values.clone(), base, layout.len, layout.len))
}

/// Private copies of `tensors` (`(path, tensor)` of `net`): the FP32 parameters among them as
/// segments of one new buffer laid out as the flat optimizer lays out `net`'s parameter table,
/// the rest each in its own buffer. With `pinned`, where those parameters are one run of the
/// optimizer's values at that layout ([`region_in`]), the run itself serves as their buffer and
/// nothing is copied. Returns the buffers by path and the parameters' buffer with its layout and
/// paths, if any parameter went there.
pub(super) fn private_copies<M: Module>(
    net: &M,
    tensors: Vec<(String, Tensor<1>)>,
    pinned: Option<&Pinned>,
    device: &Device,
) -> (HashMap<String, Tensor<1>>, Option<SharedParams>) {
    let mut copies: HashMap<String, Tensor<1>> = tensors.into_iter().collect();
    let params: Vec<(String, usize)> = param_table(net)
        .into_iter()
        .filter(|p| copies.get(&p.path).is_some_and(|t| t.dtype() == DType::F32))
        .map(|p| {
            let n = p.numel();
            (p.path, n)
        })
        .collect();
    let shared_paths: HashSet<&str> = params.iter().map(|(p, _)| p.as_str()).collect();
    for (path, t) in copies.iter_mut() {
        if !shared_paths.contains(path.as_str()) {
            *t = copy_of(t.clone());
        }
    }
    let shared = (!params.is_empty()).then(|| {
        let layout = Layout::new(params.iter().map(|(_, n)| *n).collect());
        let paths: Vec<String> = params.iter().map(|(p, _)| p.clone()).collect();
        if let Some(flat) = pinned.and_then(|p| region_in(p, &params, &layout, &copies)) {
            for (i, path) in paths.iter().enumerate() {
                copies.insert(path.clone(), layout.view(&flat, i));
            }
            return SharedParams {
                layout,
                flat,
                paths,
                live: true,
            };
        }
        let flat = Tensor::<1>::zeros([layout.len], (device, DType::F32));
        for (i, (path, _)) in params.iter().enumerate() {
            let view = layout.view(&flat, i);
            write(copies[path].clone(), &view);
            copies.insert(path.clone(), view);
        }
        SharedParams {
            layout,
            flat,
            paths,
            live: false,
        }
    });
    (copies, shared)
}

impl Sources {
    /// `buffers`, each refreshed on its own.
    pub(super) fn separate(buffers: Vec<(String, Tensor<1>)>) -> Self {
        Self {
            written: vec![None; buffers.len()],
            buffers,
            params: None,
            steps_seen: in_place_steps(),
            index: FloatIndex::default(),
        }
    }

    /// `buffers`, of which those at `shared`'s paths are its buffer's segments (from
    /// [`private_copies`]).
    pub(super) fn with_shared(
        buffers: Vec<(String, Tensor<1>)>,
        shared: Option<SharedParams>,
    ) -> Self {
        let mut s = Self::separate(buffers);
        s.params = shared.map(
            |SharedParams {
                 layout,
                 flat,
                 paths,
                 live,
             }| {
                let index: HashMap<&str, usize> = s
                    .buffers
                    .iter()
                    .enumerate()
                    .map(|(i, (p, _))| (p.as_str(), i))
                    .collect();
                let members = paths.iter().map(|p| index[p.as_str()]).collect();
                Segments {
                    layout,
                    flat,
                    members,
                    live,
                }
            },
        );
        s
    }

    /// Bytes of the static buffers the recorder holds (not the optimizer's values it reads in
    /// place).
    pub(super) fn bytes(&self) -> u64 {
        let live: HashSet<usize> = self
            .params
            .iter()
            .filter(|s| s.live)
            .flat_map(|s| s.members.iter().copied())
            .collect();
        let own = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(i, _)| !live.contains(i));
        own.map(|(_, (_, t))| bytes_of(t)).sum()
    }

    /// Copies into each static buffer the tensor at its path in `module`, unless `written` says
    /// the buffer already equals it (the same allocation region, held there so it cannot
    /// change); `stale` (the `StaleSources` control) copies each only once. `walked`: a walk of
    /// `module` made earlier ([`crate::optim::tensors::float_values`]) whose tensors are still
    /// the module's, taken instead of walking it again.
    pub(super) fn refresh<M: Module>(
        &mut self,
        module: &M,
        stale: bool,
        walked: Option<&[Tensor<1>]>,
    ) {
        let paths = self.buffers.iter().map(|(p, _)| p.as_str());
        let current = spans::time(Span::SourcesWalk, || {
            self.index.tensors(module, walked, paths)
        });
        let segments_start = std::time::Instant::now();
        let mut done = vec![false; self.buffers.len()];
        // A flat optimizer step written in place leaves the parameters the same tensors with
        // new values: every parameter is copied again then (not under the control, which
        // copies each once).
        let steps = in_place_steps();
        let moved = !stale && steps != self.steps_seen;
        self.steps_seen = steps;
        let fresh = |path: &str, written: Option<&CubeTensor>, now: &CubeTensor| {
            (!moved || is_running_stat(path)) && up_to_date(written, now, stale)
        };
        if let Some(seg) = &self.params {
            let parts: Vec<Option<Tensor<1>>> =
                seg.members.iter().map(|&b| current[b].clone()).collect();
            let (offsets, sizes) = (&seg.layout.offsets, &seg.layout.sizes);
            let mut i = 0;
            while i < parts.len() {
                let Some((j, whole)) = run(&parts, offsets, sizes, i) else {
                    i += 1;
                    continue;
                };
                let members = &seg.members[i..j];
                let now: Vec<CubeTensor> = parts[i..j]
                    .iter()
                    .map(|t| cube(t.clone().expect("a part of a run")))
                    .collect();
                let unchanged = members
                    .iter()
                    .zip(&now)
                    .all(|(&b, n)| fresh(&self.buffers[b].0, self.written[b].as_ref(), n));
                if !unchanged {
                    let start = offsets[i];
                    let len = whole.dims()[0];
                    let reach = offsets[j - 1] + padded(sizes[j - 1]) - start;
                    let dest = segment(seg.flat.clone(), start, len, reach);
                    // The graphs read the optimizer's values in place: nothing to copy.
                    let itself = storage(&whole).is_some() && storage(&whole) == storage(&dest);
                    if !itself {
                        copy_into(cube(whole), &cube(dest));
                    }
                    for (&b, n) in members.iter().zip(now) {
                        self.written[b] = Some(n);
                    }
                }
                for &b in members {
                    done[b] = true;
                }
                i = j;
            }
        }
        spans::since(Span::SourcesSegments, segments_start);
        let rest_start = std::time::Instant::now();
        for (b, (((path, buffer), written), done)) in self
            .buffers
            .iter()
            .zip(&mut self.written)
            .zip(done)
            .enumerate()
        {
            if done {
                continue;
            }
            let now = cube(
                current[b]
                    .clone()
                    .unwrap_or_else(|| panic!("feature replay: no tensor at {path}")),
            );
            if fresh(path, written.as_ref(), &now) {
                continue;
            }
            copy_into(now.clone(), &cube(buffer.clone()));
            *written = Some(now);
        }
        spans::since(Span::SourcesRest, rest_start);
    }
}

/// Whether a static buffer holding `written` needs no copy of the trainer's `now`: it holds the
/// same tensor, or (`stale`, the `StaleSources` control) it was written once.
fn up_to_date(written: Option<&CubeTensor>, now: &CubeTensor, stale: bool) -> bool {
    (stale && written.is_some()) || written.is_some_and(|w| same_tensor(w, now))
}

/// Whether `a` and `b` are the same region of the same allocation, with the same layout. CubeCL
/// never gives an allocation's id to another, so while `a` is held this means equal values.
pub(super) fn same_tensor(a: &CubeTensor, b: &CubeTensor) -> bool {
    a.handle.memory.descriptor().id == b.handle.memory.descriptor().id
        && a.handle.offset_start == b.handle.offset_start
        && a.handle.offset_end == b.handle.offset_end
        && a.meta == b.meta
        && a.dtype == b.dtype
}
