//! Launch census (`bench-step --census N`, docs/bench.md): per phase of a training step, the
//! CUDA driver calls the host makes (kernel launches, graph launches, copies, everything else),
//! the kernels and copies that run on the GPU, and the GPU's busy time, read through CUPTI.
//!
//! Attribution: the phase clock (`train::timing`) records which phase the training thread is
//! in, after the device sync that ends the previous one; the census steps always run with those
//! syncs, so every driver call belongs to the phase that issued it, whichever host thread makes
//! it (CubeCL launches from its own device thread). A kernel or copy on the GPU belongs to the
//! phase of the driver call it came from (CUPTI's correlation id; for a replayed CUDA graph, the
//! graph launch). Index [`BETWEEN`] is everything outside a step's phases.
//!
//! Only the CUDA build can count ([`Census::start`] says why not elsewhere); the report's
//! arithmetic is plain Rust and tested on the CPU.

pub use super::timing::BETWEEN;
use super::timing::PHASES;
use std::collections::HashMap;

/// How a driver call is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `cuLaunchKernel*`: one kernel, enqueued by the host.
    Launch,
    /// `cuGraphLaunch*`: a recorded graph of many kernels.
    Graph,
    /// `cuMemcpy*` / `cuMemset*`.
    Copy,
    Other,
}

impl CallKind {
    pub fn of(function: &str) -> Self {
        if function.starts_with("cuLaunchKernel") || function.starts_with("cuLaunchCooperative") {
            Self::Launch
        } else if function.starts_with("cuGraphLaunch") {
            Self::Graph
        } else if function.starts_with("cuMemcpy") || function.starts_with("cuMemset") {
            Self::Copy
        } else {
            Self::Other
        }
    }
}

/// What ran on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuKind {
    Kernel,
    Copy,
}

/// One kernel or copy as the GPU ran it.
#[derive(Clone, Debug)]
pub struct GpuRecord {
    pub kind: GpuKind,
    /// CUPTI's correlation id: the driver call that enqueued it.
    pub correlation: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The kernel's name, or the copy's kind.
    pub name: String,
    /// A kernel's grid and block sizes (zero for copies): how much work a launch was.
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// Raw counts of a census, before they are summed per phase.
#[derive(Clone, Debug, Default)]
pub struct Raw {
    /// Per phase row, driver calls by function name.
    pub calls: Vec<HashMap<String, u64>>,
    /// The phase row of each correlation id seen (index = id).
    pub phase_of: Vec<u8>,
    pub gpu: Vec<GpuRecord>,
}

/// One phase's row of the census, per step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseRow {
    pub phase: &'static str,
    pub driver_calls: f64,
    pub launches: f64,
    pub graph_launches: f64,
    pub copy_calls: f64,
    pub kernels_run: f64,
    pub copies_run: f64,
    pub gpu_busy_ms: f64,
    /// The GPU's idle time between the kernels and copies of one driver call: for a replayed
    /// graph, the gaps between its nodes, which busy time leaves out.
    pub graph_gaps_ms: f64,
}

/// A kernel's share of one phase, per step.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRow {
    pub phase: &'static str,
    pub name: String,
    pub runs: f64,
    pub gpu_ms: f64,
}

/// The census of `steps` training steps, per step.
#[derive(Clone, Debug, Default)]
pub struct CensusReport {
    pub steps: usize,
    pub phases: Vec<PhaseRow>,
    /// Every (phase, kernel) pair, most GPU time first.
    pub kernels: Vec<KernelRow>,
    /// Driver calls by function over all phases, most first.
    pub calls: Vec<(String, f64)>,
    /// The last step's kernels and copies in the order the GPU started them (the records split
    /// into `steps` equal runs by count, as every step runs the same launches), with phases.
    pub trace: Vec<(&'static str, GpuRecord)>,
}

fn phase_name(row: usize) -> &'static str {
    PHASES.get(row).copied().unwrap_or("between steps")
}

impl CensusReport {
    /// Sums `raw` per phase and divides by `steps`. GPU records whose correlation id was never
    /// seen in a driver call (none should be) count as [`BETWEEN`].
    pub fn from_raw(raw: &Raw, steps: usize) -> Self {
        let per = 1.0 / steps.max(1) as f64;
        let mut phases: Vec<PhaseRow> = (0..=BETWEEN)
            .map(|i| PhaseRow {
                phase: phase_name(i),
                ..Default::default()
            })
            .collect();
        let mut calls: HashMap<&str, u64> = HashMap::new();
        for (row, by_name) in raw.calls.iter().enumerate().take(BETWEEN + 1) {
            for (name, &n) in by_name {
                let p = &mut phases[row];
                let n_f = n as f64 * per;
                p.driver_calls += n_f;
                match CallKind::of(name) {
                    CallKind::Launch => p.launches += n_f,
                    CallKind::Graph => p.graph_launches += n_f,
                    CallKind::Copy => p.copy_calls += n_f,
                    CallKind::Other => {}
                }
                *calls.entry(name).or_default() += n;
            }
        }
        let row_of = |correlation: u32| {
            raw.phase_of
                .get(correlation as usize)
                .map_or(BETWEEN, |&p| (p as usize).min(BETWEEN))
        };
        let mut kernels: HashMap<(usize, &str), (u64, u64)> = HashMap::new();
        let mut by_call: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for r in &raw.gpu {
            let row = row_of(r.correlation);
            by_call
                .entry(r.correlation)
                .or_default()
                .push((r.start_ns, r.end_ns));
            let ns = r.end_ns.saturating_sub(r.start_ns);
            let p = &mut phases[row];
            match r.kind {
                GpuKind::Kernel => p.kernels_run += per,
                GpuKind::Copy => p.copies_run += per,
            }
            p.gpu_busy_ms += ns as f64 * 1e-6 * per;
            let k = kernels.entry((row, r.name.as_str())).or_default();
            k.0 += 1;
            k.1 += ns;
        }
        for (correlation, spans) in by_call {
            let idle = idle_between(spans);
            phases[row_of(correlation)].graph_gaps_ms += idle as f64 * 1e-6 * per;
        }
        let mut kernels: Vec<KernelRow> = kernels
            .into_iter()
            .map(|((row, name), (n, ns))| KernelRow {
                phase: phase_name(row),
                name: name.to_string(),
                runs: n as f64 * per,
                gpu_ms: ns as f64 * 1e-6 * per,
            })
            .collect();
        kernels.sort_by(|a, b| b.gpu_ms.total_cmp(&a.gpu_ms).then(a.name.cmp(&b.name)));
        let mut calls: Vec<(String, f64)> = calls
            .into_iter()
            .map(|(name, n)| (name.to_string(), n as f64 * per))
            .collect();
        calls.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut ordered: Vec<&GpuRecord> = raw.gpu.iter().collect();
        ordered.sort_by_key(|r| (r.start_ns, r.end_ns));
        let last = ordered.len() - ordered.len() / steps.max(1);
        let trace = ordered[last..]
            .iter()
            .map(|r| (phase_name(row_of(r.correlation)), (*r).clone()))
            .collect();
        Self {
            steps,
            phases,
            kernels,
            calls,
            trace,
        }
    }

    /// `order,phase,call,kind,name,start_us,gpu_us,grid,block` rows of [`Self::trace`]: `call`
    /// the driver call that enqueued the record (CUPTI's correlation id: a replayed graph's
    /// kernels share one, each eager launch has its own), the start from the step's first
    /// record, grid and block as `x×y×z`. Which kernels run beside which (a copy before a
    /// matmul is the matmul's operand) is what the per-kernel sums lose.
    pub fn trace_csv(&self) -> String {
        let mut s = String::from("order,phase,call,kind,name,start_us,gpu_us,grid,block\n");
        let t0 = self.trace.first().map_or(0, |(_, r)| r.start_ns);
        let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
        for (i, (phase, r)) in self.trace.iter().enumerate() {
            s += &format!(
                "{i},{phase},{},{},\"{}\",{:.3},{:.3},{},{}\n",
                r.correlation,
                match r.kind {
                    GpuKind::Kernel => "kernel",
                    GpuKind::Copy => "copy",
                },
                r.name.replace('"', "'"),
                r.start_ns.saturating_sub(t0) as f64 * 1e-3,
                r.end_ns.saturating_sub(r.start_ns) as f64 * 1e-3,
                dims(r.grid),
                dims(r.block)
            );
        }
        s
    }

    /// The census as a markdown table, one row per phase plus the total; `host_ms` (per phase,
    /// from steps timed without CUPTI) adds host ms and µs per driver call.
    pub fn table(&self, host_ms: Option<&[f64]>) -> String {
        let mut s = String::from(
            "| phase | driver calls | kernel launches | graph launches | copy calls | kernels run | copies run | GPU busy ms | host ms | host µs per call | GPU gaps in graphs ms |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let mut total = PhaseRow {
            phase: "**step**",
            ..Default::default()
        };
        let mut total_host = 0.0;
        for (i, p) in self.phases.iter().enumerate() {
            let host = host_ms.and_then(|h| h.get(i).copied());
            // "Between steps" has no host time of its own (NaN): the total is the phases'.
            if let Some(h) = host.filter(|h| h.is_finite()) {
                total_host += h;
            }
            s += &row(p, host);
            total.driver_calls += p.driver_calls;
            total.launches += p.launches;
            total.graph_launches += p.graph_launches;
            total.copy_calls += p.copy_calls;
            total.kernels_run += p.kernels_run;
            total.copies_run += p.copies_run;
            total.gpu_busy_ms += p.gpu_busy_ms;
            total.graph_gaps_ms += p.graph_gaps_ms;
        }
        s += &row(&total, host_ms.map(|_| total_host));
        s
    }

    /// `phase,kernel,runs_per_step,gpu_ms_per_step` rows, most GPU time first.
    pub fn kernels_csv(&self) -> String {
        let mut s = String::from("phase,kernel,runs_per_step,gpu_ms_per_step\n");
        for k in &self.kernels {
            s += &format!(
                "{},\"{}\",{:.2},{:.4}\n",
                k.phase,
                k.name.replace('"', "'"),
                k.runs,
                k.gpu_ms
            );
        }
        s
    }
}

fn row(p: &PhaseRow, host_ms: Option<f64>) -> String {
    let (host, per_call) = match host_ms {
        Some(h) if !h.is_finite() => ("—".into(), "—".into()),
        Some(h) if p.driver_calls > 0.0 => (
            format!("{h:.1}"),
            format!("{:.1}", h * 1e3 / p.driver_calls),
        ),
        Some(h) => (format!("{h:.1}"), "—".into()),
        None => ("—".into(), "—".into()),
    };
    format!(
        "| {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.2} | {host} | {per_call} | {:.2} |\n",
        p.phase,
        p.driver_calls,
        p.launches,
        p.graph_launches,
        p.copy_calls,
        p.kernels_run,
        p.copies_run,
        p.gpu_busy_ms,
        p.graph_gaps_ms
    )
}

/// The time within the `(start, end)` spans' whole extent that none of them covers (ns).
fn idle_between(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort_unstable();
    let Some(&(_, first_end)) = spans.first() else {
        return 0;
    };
    let (mut reach, mut idle) = (first_end, 0);
    for &(start, end) in &spans[1..] {
        idle += start.saturating_sub(reach);
        reach = reach.max(end);
    }
    idle
}

#[cfg(feature = "cuda")]
pub use cupti::Census;

#[cfg(not(feature = "cuda"))]
/// CUPTI counting: only in the CUDA build.
pub struct Census;

#[cfg(not(feature = "cuda"))]
impl Census {
    /// Whether a census can start here (checked before any step runs).
    pub fn available() -> Result<(), String> {
        Err("the launch census reads CUPTI: build with --features cuda and run on a GPU".into())
    }

    pub fn start() -> Result<Self, String> {
        Self::available().map(|()| unreachable!("not available"))
    }

    pub fn finish(self, _steps: usize) -> Result<CensusReport, String> {
        unreachable!("never started")
    }
}

#[cfg(feature = "cuda")]
mod cupti {
    //! The CUPTI side: a driver-API callback that counts calls per phase and remembers each
    //! correlation id's phase, and activity buffers that collect kernels, copies and memsets.
    use super::super::timing::current_phase;
    use super::{CensusReport, GpuKind, GpuRecord, Raw};
    use cudarc::cupti::sys;
    use std::ffi::{CStr, c_void};
    use std::sync::Mutex;

    static RAW: Mutex<Option<Raw>> = Mutex::new(None);
    const BUFFER: usize = 8 << 20;

    /// An active census; one per process at a time.
    pub struct Census {
        subscriber: sys::CUpti_SubscriberHandle,
    }

    // The handle is an opaque CUPTI pointer used only to unsubscribe.
    unsafe impl Send for Census {}

    const KINDS: [sys::CUpti_ActivityKind; 3] = [
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY,
        sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET,
    ];

    fn check(what: &str, r: sys::CUptiResult) -> Result<(), String> {
        if r == sys::CUptiResult::CUPTI_SUCCESS {
            Ok(())
        } else {
            Err(format!("CUPTI {what} failed: {r:?}"))
        }
    }

    impl Census {
        /// Whether a census can start here (checked before any step runs).
        pub fn available() -> Result<(), String> {
            // cudarc panics when the library is absent; say where it is looked for instead.
            if unsafe { sys::is_culib_present() } {
                Ok(())
            } else {
                Err("libcupti was not found: add the CUDA toolkit's extras/CUPTI/lib64 (or the nvidia-cuda-cupti wheel's lib folder) to LD_LIBRARY_PATH".into())
            }
        }

        /// Subscribes to every driver API call and enables kernel, copy and memset records.
        pub fn start() -> Result<Self, String> {
            Self::available()?;
            let mut guard = RAW.lock().map_err(|_| "census state poisoned")?;
            if guard.is_some() {
                return Err("a census is already running".into());
            }
            *guard = Some(Raw {
                calls: vec![Default::default(); super::BETWEEN + 1],
                ..Default::default()
            });
            drop(guard);
            unsafe {
                check(
                    "cuptiActivityRegisterCallbacks",
                    sys::cuptiActivityRegisterCallbacks(Some(requested), Some(completed)),
                )?;
                let mut subscriber = std::ptr::null_mut();
                check(
                    "cuptiSubscribe",
                    sys::cuptiSubscribe(&mut subscriber, Some(on_call), std::ptr::null_mut()),
                )?;
                check(
                    "cuptiEnableDomain",
                    sys::cuptiEnableDomain(
                        1,
                        subscriber,
                        sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
                    ),
                )?;
                for k in KINDS {
                    check("cuptiActivityEnable", sys::cuptiActivityEnable(k))?;
                }
                Ok(Self { subscriber })
            }
        }

        /// Stops counting, flushes the GPU records (the device must be synchronised first) and
        /// returns the counts per step of `steps` steps.
        pub fn finish(self, steps: usize) -> Result<CensusReport, String> {
            unsafe {
                for k in KINDS {
                    check("cuptiActivityDisable", sys::cuptiActivityDisable(k))?;
                }
                check("cuptiActivityFlushAll", sys::cuptiActivityFlushAll(1))?;
                check("cuptiUnsubscribe", sys::cuptiUnsubscribe(self.subscriber))?;
            }
            let raw = RAW
                .lock()
                .map_err(|_| "census state poisoned")?
                .take()
                .ok_or("no census state")?;
            Ok(CensusReport::from_raw(&raw, steps))
        }
    }

    unsafe extern "C" fn on_call(
        _user: *mut c_void,
        domain: sys::CUpti_CallbackDomain,
        _cbid: sys::CUpti_CallbackId,
        data: *const c_void,
    ) {
        if domain != sys::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API || data.is_null() {
            return;
        }
        let data = unsafe { &*(data as *const sys::CUpti_CallbackData) };
        if data.callbackSite != sys::CUpti_ApiCallbackSite::CUPTI_API_ENTER {
            return;
        }
        let phase = current_phase();
        let name = if data.functionName.is_null() {
            "?".into()
        } else {
            unsafe { CStr::from_ptr(data.functionName) }.to_string_lossy()
        };
        let Ok(mut guard) = RAW.lock() else { return };
        let Some(raw) = guard.as_mut() else { return };
        *raw.calls[phase].entry(name.into_owned()).or_default() += 1;
        let id = data.correlationId as usize;
        if raw.phase_of.len() <= id {
            raw.phase_of.resize(id + 1, super::BETWEEN as u8);
        }
        raw.phase_of[id] = phase as u8;
    }

    unsafe extern "C" fn requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
        let layout = std::alloc::Layout::from_size_align(BUFFER, 8).expect("valid layout");
        unsafe {
            *buffer = std::alloc::alloc(layout);
            *size = if (*buffer).is_null() { 0 } else { BUFFER };
            *max = 0;
        }
    }

    unsafe extern "C" fn completed(
        _ctx: cudarc::driver::sys::CUcontext,
        _stream: u32,
        buffer: *mut u8,
        _size: usize,
        valid: usize,
    ) {
        let mut records = Vec::new();
        let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
        while unsafe { sys::cuptiActivityGetNextRecord(buffer, valid, &mut record) }
            == sys::CUptiResult::CUPTI_SUCCESS
        {
            if let Some(r) = unsafe { read(record) } {
                records.push(r);
            }
        }
        let layout = std::alloc::Layout::from_size_align(BUFFER, 8).expect("valid layout");
        unsafe { std::alloc::dealloc(buffer, layout) };
        if let Ok(mut guard) = RAW.lock()
            && let Some(raw) = guard.as_mut()
        {
            raw.gpu.extend(records);
        }
    }

    /// One record's common fields. The fields read sit in the prefix that every version of
    /// these records shares (kernel records 9 to 13, memcpy 5 and 6, memset 4), so the layout
    /// CUPTI writes at run time need not be the one cudarc was generated for; fields are read
    /// unaligned through raw pointers, never as a reference to the whole struct.
    unsafe fn read(r: *const sys::CUpti_Activity) -> Option<GpuRecord> {
        use std::ptr::addr_of;
        let kind = unsafe { addr_of!((*r).kind).read_unaligned() };
        match kind {
            sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
            | sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_KERNEL => {
                let k = r as *const sys::CUpti_ActivityKernel9;
                let name = unsafe { addr_of!((*k).name).read_unaligned() };
                let dim = |v: i32| u32::try_from(v).unwrap_or(0);
                let grid = unsafe {
                    [
                        addr_of!((*k).gridX).read_unaligned(),
                        addr_of!((*k).gridY).read_unaligned(),
                        addr_of!((*k).gridZ).read_unaligned(),
                    ]
                };
                let block = unsafe {
                    [
                        addr_of!((*k).blockX).read_unaligned(),
                        addr_of!((*k).blockY).read_unaligned(),
                        addr_of!((*k).blockZ).read_unaligned(),
                    ]
                };
                Some(GpuRecord {
                    kind: GpuKind::Kernel,
                    correlation: unsafe { addr_of!((*k).correlationId).read_unaligned() },
                    start_ns: unsafe { addr_of!((*k).start).read_unaligned() },
                    end_ns: unsafe { addr_of!((*k).end).read_unaligned() },
                    name: if name.is_null() {
                        "?".into()
                    } else {
                        unsafe { CStr::from_ptr(name) }
                            .to_string_lossy()
                            .into_owned()
                    },
                    grid: grid.map(dim),
                    block: block.map(dim),
                })
            }
            sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMCPY => {
                let m = r as *const sys::CUpti_ActivityMemcpy5;
                let copy_kind = unsafe { addr_of!((*m).copyKind).read_unaligned() };
                Some(GpuRecord {
                    kind: GpuKind::Copy,
                    correlation: unsafe { addr_of!((*m).correlationId).read_unaligned() },
                    start_ns: unsafe { addr_of!((*m).start).read_unaligned() },
                    end_ns: unsafe { addr_of!((*m).end).read_unaligned() },
                    name: format!("memcpy (CUPTI copy kind {copy_kind})"),
                    grid: [0; 3],
                    block: [0; 3],
                })
            }
            sys::CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMSET => {
                let m = r as *const sys::CUpti_ActivityMemset4;
                Some(GpuRecord {
                    kind: GpuKind::Copy,
                    correlation: unsafe { addr_of!((*m).correlationId).read_unaligned() },
                    start_ns: unsafe { addr_of!((*m).start).read_unaligned() },
                    end_ns: unsafe { addr_of!((*m).end).read_unaligned() },
                    name: "memset".into(),
                    grid: [0; 3],
                    block: [0; 3],
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
