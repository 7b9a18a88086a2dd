use super::*;

fn record(kind: GpuKind, correlation: u32, ns: u64, name: &str) -> GpuRecord {
    GpuRecord {
        kind,
        correlation,
        start_ns: 1_000,
        end_ns: 1_000 + ns,
        name: name.into(),
        grid: [1; 3],
        block: [32, 1, 1],
    }
}

#[test]
fn calls_and_gpu_time_land_in_the_phase_that_issued_them() {
    let mut raw = Raw {
        calls: vec![HashMap::new(); BETWEEN + 1],
        ..Default::default()
    };
    let head = PHASES.iter().position(|p| *p == "head").unwrap();
    raw.calls[head].insert("cuLaunchKernel".into(), 6);
    raw.calls[head].insert("cuMemcpyHtoDAsync_v2".into(), 2);
    raw.calls[head].insert("cuFuncSetAttribute".into(), 6);
    raw.calls[2].insert("cuGraphLaunch".into(), 2);
    // Correlation 1 and 2: head launches; 3: the stage's graph launch.
    raw.phase_of = vec![BETWEEN as u8, head as u8, head as u8, 2];
    raw.gpu = vec![
        record(GpuKind::Kernel, 1, 2_000_000, "conv"),
        record(GpuKind::Kernel, 2, 1_000_000, "conv"),
        record(GpuKind::Copy, 2, 500_000, "memcpy"),
        record(GpuKind::Copy, 1, 500_000, "memcpy"),
        record(GpuKind::Kernel, 3, 4_000_000, "graph kernel"),
        record(GpuKind::Kernel, 3, 4_000_000, "graph kernel"),
        // Never seen in a call: counted between steps, not lost.
        record(GpuKind::Kernel, 99, 1_000_000, "stray"),
        record(GpuKind::Kernel, 0, 1_000_000, "stray"),
    ];
    let r = CensusReport::from_raw(&raw, 2);
    let h = &r.phases[head];
    assert_eq!(
        (
            h.driver_calls,
            h.launches,
            h.copy_calls,
            h.kernels_run,
            h.copies_run
        ),
        (7.0, 3.0, 1.0, 1.0, 1.0)
    );
    assert!((h.gpu_busy_ms - 2.0).abs() < 1e-9, "{}", h.gpu_busy_ms);
    let f = &r.phases[2];
    assert_eq!(
        (f.graph_launches, f.launches, f.kernels_run),
        (1.0, 0.0, 1.0)
    );
    assert!((f.gpu_busy_ms - 4.0).abs() < 1e-9);
    assert_eq!(r.phases[BETWEEN].kernels_run, 1.0);
    assert_eq!(r.kernels[0].name, "graph kernel");
    assert_eq!(
        r.kernels[1],
        KernelRow {
            phase: "head",
            name: "conv".into(),
            runs: 1.0,
            gpu_ms: 1.5
        }
    );
    // Ties in count go by name.
    assert_eq!(r.calls[0], ("cuFuncSetAttribute".to_string(), 3.0));
    assert_eq!(r.calls[1], ("cuLaunchKernel".to_string(), 3.0));
    let mut host = [1.0; BETWEEN + 1];
    host[BETWEEN] = f64::NAN;
    let t = r.table(Some(&host));
    // 7 driver calls per step over 1 ms of host time: 142.9 µs each.
    assert!(
        t.contains("| head | 7 | 3 | 0.0 | 1 | 1 | 1 | 2.00 | 1.0 | 142.9 |"),
        "{t}"
    );
    assert!(
        t.lines()
            .last()
            .unwrap()
            .starts_with("| **step** | 8 | 3 | 1.0 | 1 | 3 | 1 | 7.00 | 11.0 |"),
        "{t}"
    );
    assert!(
        r.kernels_csv()
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("features,\"graph kernel\",1.00,4.0000")
    );
}

/// The gaps between one graph launch's kernels are its phase's; overlapping kernels leave
/// none, a lone launch none, and the time between two launches is not a graph's gap.
#[test]
fn gaps_between_a_graphs_kernels_are_counted_per_phase() {
    let span = |correlation: u32, start_ns: u64, end_ns: u64| GpuRecord {
        kind: GpuKind::Kernel,
        correlation,
        start_ns,
        end_ns,
        name: "k".into(),
        grid: [1; 3],
        block: [1; 3],
    };
    let loss = PHASES.iter().position(|p| *p == "loss").unwrap();
    let raw = Raw {
        calls: vec![HashMap::new(); BETWEEN + 1],
        // 1 and 2: two graph launches of the loss phase; 3: one eager launch of the head.
        phase_of: vec![BETWEEN as u8, loss as u8, loss as u8, 3],
        gpu: vec![
            // Out of order, as CUPTI may deliver them (µs): 0–1 covered twice, a 0.5 gap, two
            // kernels back to back, a 0.25 gap.
            span(1, 3_000_000, 4_000_000),
            span(1, 0, 1_000_000),
            span(1, 1_500_000, 2_500_000),
            span(1, 2_500_000, 2_750_000),
            span(1, 500_000, 1_000_000),
            // The second launch, far later: only its own 2 ms gap counts.
            span(2, 100_000_000, 101_000_000),
            span(2, 103_000_000, 104_000_000),
            // A lone kernel: no gap.
            span(3, 200_000_000, 201_000_000),
        ],
    };
    let r = CensusReport::from_raw(&raw, 1);
    let gaps = r.phases[loss].graph_gaps_ms;
    assert!((gaps - 2.75).abs() < 1e-9, "{gaps}");
    assert_eq!(r.phases[3].graph_gaps_ms, 0.0);
    let t = r.table(None);
    assert!(t.contains("| loss | 0 | 0 | 0.0 | 0 | 7 | 0 |"), "{t}");
    assert!(t.lines().last().unwrap().ends_with("| 2.75 |"), "{t}");
}

#[test]
fn call_kinds() {
    assert_eq!(CallKind::of("cuLaunchKernel"), CallKind::Launch);
    assert_eq!(CallKind::of("cuLaunchKernelEx"), CallKind::Launch);
    assert_eq!(CallKind::of("cuGraphLaunch"), CallKind::Graph);
    assert_eq!(CallKind::of("cuMemcpyDtoHAsync_v2"), CallKind::Copy);
    assert_eq!(CallKind::of("cuMemsetD8Async"), CallKind::Copy);
    assert_eq!(CallKind::of("cuFuncSetAttribute"), CallKind::Other);
}

#[cfg(not(feature = "cuda"))]
#[test]
fn the_cpu_build_says_why_it_cannot_count() {
    let e = Census::start().err().expect("no CUPTI without CUDA");
    assert!(e.contains("--features cuda"), "{e}");
}

/// The trace is the last step's records in the order the GPU started them, each with its
/// phase, grid and block, and times from the step's first record.
#[test]
fn the_trace_is_the_last_steps_records_in_start_order() {
    let head = PHASES.iter().position(|p| *p == "head").unwrap();
    let at = |correlation: u32, start_ns: u64, name: &str, grid: [u32; 3]| GpuRecord {
        kind: GpuKind::Kernel,
        correlation,
        start_ns,
        end_ns: start_ns + 500,
        name: name.into(),
        grid,
        block: [256, 1, 1],
    };
    let raw = Raw {
        calls: vec![HashMap::new(); BETWEEN + 1],
        phase_of: vec![BETWEEN as u8, head as u8, 2, head as u8, 2],
        gpu: vec![
            // Delivered out of order; two steps of two records each.
            at(4, 9_000, "b", [2, 1, 1]),
            at(1, 1_000, "a", [1, 1, 1]),
            at(3, 8_000, "a", [3, 1, 1]),
            at(2, 2_000, "b", [4, 1, 1]),
        ],
    };
    let r = CensusReport::from_raw(&raw, 2);
    let names: Vec<_> = r.trace.iter().map(|(p, g)| (*p, g.name.as_str())).collect();
    assert_eq!(names, [("head", "a"), (PHASES[2], "b")]);
    let csv = r.trace_csv();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows[0],
        "order,phase,call,kind,name,start_us,gpu_us,grid,block"
    );
    assert_eq!(rows[1], "0,head,3,kernel,\"a\",0.000,0.500,3x1x1,256x1x1");
    assert_eq!(
        rows[2],
        format!("1,{},4,kernel,\"b\",1.000,0.500,2x1x1,256x1x1", PHASES[2])
    );
    assert_eq!(rows.len(), 3);
}
