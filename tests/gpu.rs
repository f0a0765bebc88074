//! The pipeline on a CUDA device, checked against the same pipeline on the CPU (the reference).
//! Each test prints `skipped: no CUDA device` and passes where there is no GPU, and fails
//! instead when `GPUFEED_REQUIRE_GPU=1`.

mod common;

use common::{gpu_present, mean_and_p999, repo_path, rss_bytes};
use gpufeed::{
    ChannelOrder, CudaUnavailable, DType, Decode, Device, EpochReport, Error, Layout, OnError,
    Pipeline, PipelineBuilder, Profile, ResizeMode, Source, Stage,
};

/// The tests share one process and one GPU; the memory tests read process-wide figures, so the
/// tests run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every batch of one epoch: (ids, output bytes) per batch.
fn collect(builder: PipelineBuilder) -> Vec<(Vec<String>, Vec<u8>, Vec<usize>)> {
    let mut pipeline = builder.build().expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("next_batch") {
        let host = batch.images().to_host().expect("to_host");
        out.push((
            batch.ids().to_vec(),
            host.to_le_bytes(),
            host.shape().to_vec(),
        ));
    }
    out
}

fn sources() -> Source {
    // The bundled photos and every test fixture, real and odd formats alike.
    let mut paths: Vec<_> = std::fs::read_dir("assets")
        .expect("assets/")
        .chain(std::fs::read_dir("tests/fixtures").expect("tests/fixtures/"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e != "md" && e != "txt"))
        .collect();
    paths.sort();
    Source::paths(paths)
}

#[test]
fn gpu_pipeline_equals_cpu_reference_for_every_dtype_layout_order() {
    let _serial = serial();
    if !gpu_present("gpu_pipeline_equals_cpu_reference_for_every_dtype_layout_order") {
        return;
    }
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for order in [ChannelOrder::Rgb, ChannelOrder::Bgr] {
                let builder = |device| {
                    Pipeline::builder()
                        .source(sources())
                        .batch_size(5)
                        .dtype(dtype)
                        .layout(layout)
                        .channel_order(order)
                        .device(device)
                };
                let gpu = collect(builder(Device::Cuda(0)));
                let cpu = collect(builder(Device::Cpu));
                assert_eq!(gpu.len(), cpu.len());
                for (g, c) in gpu.iter().zip(&cpu) {
                    assert_eq!(g.0, c.0, "same images in the same order");
                    assert_eq!(g.2, c.2, "same shape");
                    assert!(
                        g.1 == c.1,
                        "{dtype:?} {layout:?} {order:?}: GPU output differs from the CPU \
                         reference for {:?}",
                        g.0
                    );
                }
            }
        }
    }
}

#[test]
fn prefetch_depths_give_identical_output() {
    let _serial = serial();
    if !gpu_present("prefetch_depths_give_identical_output") {
        return;
    }
    let run = |prefetch| {
        collect(
            Pipeline::builder()
                .source(sources())
                .batch_size(3)
                .prefetch(prefetch)
                .threads(3)
                .device(Device::Cuda(0)),
        )
    };
    let first = run(1);
    for depth in 2..=4 {
        assert!(
            run(depth) == first,
            "prefetch {depth} differs from prefetch 1"
        );
    }
}

#[test]
fn missing_device_ordinal_is_a_clear_error() {
    let _serial = serial();
    if !gpu_present("missing_device_ordinal_is_a_clear_error") {
        return;
    }
    let err = Pipeline::builder()
        .source(Source::directory("assets").expect("assets"))
        .device(Device::Cuda(999))
        .build()
        .expect_err("device 999 should not exist");
    assert!(
        matches!(
            &err,
            Error::CudaUnavailable(CudaUnavailable::NoSuchDevice { ordinal: 999, .. })
        ) && err.to_string().contains("999"),
        "{err}"
    );
}

#[test]
fn bad_files_are_skipped_on_the_gpu_too() {
    let _serial = serial();
    if !gpu_present("bad_files_are_skipped_on_the_gpu_too") {
        return;
    }
    let mut paths = vec![std::path::PathBuf::from("assets/chelsea.png")];
    paths.push("tests/does-not-exist.jpg".into());
    paths.push("assets/rocket.jpg".into());
    let mut pipeline = Pipeline::builder()
        .source(Source::paths(paths))
        .batch_size(4)
        .on_error(OnError::Skip)
        .device(Device::Cuda(0))
        .build()
        .expect("build");
    let batch = pipeline.next_batch().expect("batch").expect("one batch");
    assert_eq!(batch.len(), 2);
    assert_eq!(batch.skipped().len(), 1);
    assert!(batch.skipped()[0].id.contains("does-not-exist"));
    let host = batch.images().to_host().expect("to_host");
    assert!(host.to_f32_vec().iter().all(|v| v.is_finite()));
    assert!(pipeline.next_batch().expect("end").is_none());
}

/// Reads the whole GPU's free memory, so it needs the GPU to itself: another process opening a
/// GPU lane meanwhile takes a gigabyte and fails it. Run the test suites one after another.
#[test]
fn creating_and_dropping_pipelines_leaks_neither_device_nor_host_memory() {
    let _serial = serial();
    if !gpu_present("creating_and_dropping_pipelines_leaks_neither_device_nor_host_memory") {
        return;
    }
    let build = || {
        Pipeline::builder()
            .source(Source::directory("assets").expect("assets"))
            .batch_size(64)
            .threads(2)
            .device(Device::Cuda(0))
            .build()
            .expect("build")
    };
    // Warm up once (context, allocator pools), then measure across 100 pipelines, half of them
    // dropped mid-epoch with batches still in flight.
    drop(build());
    let (free_before, _) = gpufeed::cuda::device_memory(0).expect("memory");
    let rss_before = rss_bytes();
    for i in 0..100 {
        let mut pipeline = build();
        if i % 2 == 0 {
            let batch = pipeline.next_batch().expect("batch").expect("a batch");
            assert_eq!(batch.len(), 7);
        }
    }
    let (free_after, _) = gpufeed::cuda::device_memory(0).expect("memory");
    let rss_after = rss_bytes();
    let device_growth = free_before.saturating_sub(free_after);
    println!(
        "100 pipelines: device memory -{} MB, host RSS {} -> {} MB",
        device_growth / 1_000_000,
        rss_before / 1_000_000,
        rss_after / 1_000_000
    );
    // One pipeline pins 2 x 64 x 150 kB = 19 MB and holds 10 MB on the device: 100 leaked
    // pipelines would show gigabytes.
    assert!(
        device_growth < 64 << 20,
        "device memory grew by {device_growth} bytes"
    );
    assert!(
        rss_after < rss_before + (128 << 20),
        "host RSS grew from {rss_before} to {rss_after}"
    );
}

#[test]
fn a_batch_too_big_for_the_machine_is_a_clear_error() {
    let _serial = serial();
    if !gpu_present("a_batch_too_big_for_the_machine_is_a_clear_error") {
        return;
    }
    // 4096 x 4096 x 3 bytes per image, 100,000 images: 5 TB of staging. (The epoch holds
    // 100,000 positions: a batch is never cut below them.)
    let result = Pipeline::builder()
        .source(Source::paths(vec![repo_path("assets/rocket.jpg"); 100_000]))
        .batch_size(100_000)
        .resize(ResizeMode::stretch(4096, 4096))
        .device(Device::Cuda(0))
        .build();
    match result {
        Err(e @ Error::OutOfDeviceMemory { .. }) | Err(e @ Error::InvalidOption { .. }) => {
            println!("refused: {e}")
        }
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
}

#[test]
fn twenty_epochs_keep_host_memory_flat() {
    let _serial = serial();
    if !gpu_present("twenty_epochs_keep_host_memory_flat") {
        return;
    }
    let mut pipeline = Pipeline::builder()
        .source(sources())
        .batch_size(8)
        .shuffle(1)
        .threads(2)
        .device(Device::Cuda(0))
        .build()
        .expect("build");
    let pinned = pipeline.pinned_bytes();
    let mut rss = Vec::new();
    for epoch in 0..20 {
        if epoch > 0 {
            pipeline.next_epoch().expect("next epoch");
        }
        let mut images = 0;
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            images += batch.len();
        }
        assert_eq!(images, pipeline.len());
        rss.push(rss_bytes());
        assert_eq!(pipeline.pinned_bytes(), pinned);
    }
    println!(
        "20 epochs of {} images: RSS after epoch 1 {:.1} MB, after epoch 10 {:.1} MB, after epoch 20 \
         {:.1} MB; pinned staging {:.1} MB",
        pipeline.len(),
        rss[0] as f64 / 1e6,
        rss[9] as f64 / 1e6,
        rss[19] as f64 / 1e6,
        pinned as f64 / 1e6
    );
    // RSS is process-wide, and the other tests' threads may still be exiting during the first
    // epochs: compare the steady state, epoch 5 to epoch 20.
    assert!(
        rss[19] < rss[4] + (32 << 20),
        "RSS grew from {} after epoch 5 to {} bytes after epoch 20",
        rss[4],
        rss[19]
    );
}

/// A kernel that keeps a stream busy for about `cycles` clock cycles: the slow consumer.
const SPIN_KERNEL: &str = r#"
extern "C" __global__ void gpufeed_test_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"#;

/// About 20 ms on a 1.7-2 GHz GPU: long enough for several batches to be produced meanwhile.
const SPIN_CYCLES: i64 = 40_000_000;

/// How a slow consumer takes each batch in [`slow_consumer_reads`].
#[derive(Debug, Clone, Copy)]
enum Handoff {
    /// `DeviceTensor::device_ptr_on(&consumer)`.
    RawPointer,
    /// A versioned DLPack export for the consumer's stream, deleted right after the read is
    /// queued (what a framework does when its tensor dies before its kernels run).
    Dlpack,
    /// The same through the stream's raw handle, as the Python protocol passes it.
    DlpackHandle,
    /// The legacy default stream (`__dlpack__(stream=1)`, PyTorch's default stream).
    DlpackLegacyStream,
}

/// Every batch of one epoch read by a slow consumer on another stream: for each batch the
/// consumer spins ~20 ms, then copies the batch's memory by raw address; the batch is dropped
/// (and the export deleted) as soon as that work is queued, while the pipeline goes on writing
/// the next batches. Returns the copies, downloaded after the consumer finished.
fn slow_consumer_reads(builder: PipelineBuilder, handoff: Handoff) -> Vec<Vec<u8>> {
    use gpufeed::cudarc::driver::{result, DevicePtrMut, LaunchConfig, PushKernelArg};
    use gpufeed::dlpack::{export_versioned, ConsumerStream};
    use std::sync::Arc;

    let mut pipeline = builder.build().expect("build");
    let own = gpufeed::cuda::new_stream(0).expect("a consumer stream");
    let consumer = match handoff {
        Handoff::DlpackLegacyStream => own.context().default_stream(),
        _ => own,
    };
    let ptx = gpufeed::cudarc::nvrtc::compile_ptx(SPIN_KERNEL).expect("compile the spin kernel");
    let spin = consumer
        .context()
        .load_module(ptx)
        .and_then(|m| m.load_function("gpufeed_test_spin"))
        .expect("load the spin kernel");
    let mut copies = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("next_batch") {
        let bytes = batch.images().len() * batch.images().dtype().size_of();
        let images = Arc::new(batch.into_images());
        let mut export = None;
        let source = match handoff {
            Handoff::RawPointer => images
                .as_device()
                .expect("a device batch")
                .device_ptr_on(&consumer)
                .expect("device_ptr_on"),
            Handoff::Dlpack | Handoff::DlpackHandle | Handoff::DlpackLegacyStream => {
                let stream = match handoff {
                    // SAFETY: the handle is `consumer`'s, which outlives every batch here.
                    Handoff::DlpackHandle => unsafe {
                        ConsumerStream::from_handle(consumer.cu_stream() as usize)
                    },
                    Handoff::DlpackLegacyStream => ConsumerStream::legacy_default(),
                    _ => ConsumerStream::stream(&consumer),
                };
                let e = export_versioned(&images, &stream).expect("export");
                // SAFETY: the export is alive.
                let data = unsafe { (*e.as_ptr()).dl_tensor.data } as u64;
                export = Some(e);
                data
            }
        };
        let mut builder = consumer.launch_builder(&spin);
        builder.arg(&SPIN_CYCLES);
        // SAFETY: the kernel takes one `long long`; it reads and writes no memory.
        unsafe { builder.launch(LaunchConfig::for_num_elems(1)) }.expect("spin");
        let mut copy = consumer.alloc_zeros::<u8>(bytes).expect("alloc a copy");
        {
            let (target, _record_write) = copy.device_ptr_mut(&consumer);
            // SAFETY: `source` holds `bytes` bytes of the batch, which the handoff keeps alive
            // for work queued on `consumer`; `target` is a fresh allocation of `bytes` bytes.
            unsafe { result::memcpy_dtod_async(target, source, bytes, consumer.cu_stream()) }
                .expect("copy on the consumer stream");
        }
        // The consumer's work is queued, not done: let go of everything at once.
        drop(export);
        drop(images);
        copies.push(copy);
    }
    consumer.synchronize().expect("consumer done");
    copies
        .iter()
        .map(|c| consumer.clone_dtoh(c).expect("download a copy"))
        .collect()
}

#[test]
fn a_slow_consumer_on_another_stream_never_sees_the_next_batch() {
    let _serial = serial();
    if !gpu_present("a_slow_consumer_on_another_stream_never_sees_the_next_batch") {
        return;
    }
    let builder = |device| {
        Pipeline::builder()
            .source(sources())
            .batch_size(3)
            .prefetch(3)
            .device(device)
    };
    let want: Vec<Vec<u8>> = collect(builder(Device::Cpu))
        .into_iter()
        .map(|(_, bytes, _)| bytes)
        .collect();
    assert!(want.len() >= 8, "enough batches to overlap: {}", want.len());
    for handoff in [
        Handoff::RawPointer,
        Handoff::Dlpack,
        Handoff::DlpackHandle,
        Handoff::DlpackLegacyStream,
    ] {
        let started = std::time::Instant::now();
        let got = slow_consumer_reads(builder(Device::Cuda(0)), handoff);
        eprintln!(
            "slow consumer, {handoff:?}: {} batches in {:.0} ms",
            got.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(got.len(), want.len(), "{handoff:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w,
                "{handoff:?}: batch {i} as the consumer read it differs from the reference: \
                 its memory was reused before the consumer was done"
            );
        }
    }
}

#[test]
fn device_batches_name_their_memory() {
    let _serial = serial();
    if !gpu_present("device_batches_name_their_memory") {
        return;
    }
    use gpufeed::half::f16;
    let mut pipeline = Pipeline::builder()
        .source(sources())
        .batch_size(4)
        .device(Device::Cuda(0))
        .build()
        .expect("build");
    let stream = pipeline.cuda_stream().expect("a CUDA stream").clone();
    let batch = pipeline.next_batch().expect("next_batch").expect("a batch");
    let images = batch.images().as_device().expect("on the device");
    assert_eq!(images.ordinal(), 0);
    assert_eq!(images.strides(), [3 * 224 * 224, 224 * 224, 224, 1]);
    assert_eq!(batch.images().strides(), images.strides());
    assert_eq!(**images.stream(), *stream);
    let slice = images.as_slice::<f16>().expect("an f16 slice");
    assert!(slice.len() >= images.len());
    assert!(images.as_slice::<f32>().is_none());
    let host = images.to_host().expect("to_host");
    let owned = match batch.into_images() {
        gpufeed::Tensor::Device(t) => t.into_slice::<f16>().expect("the f16 slice"),
        gpufeed::Tensor::Host(_) => panic!("a host batch"),
    };
    let downloaded = stream.clone_dtoh(&owned).expect("download");
    assert_eq!(
        &downloaded[..host.len()],
        host.as_slice::<f16>().expect("f16 elements")
    );
}

/// A folder of every kind of file the GPU lane must hand back: bad files, CMYK, a truncated
/// JPEG, PNG, WebP, beside baseline colour JPEGs, a gray and a progressive one.
fn mixed_folder() -> common::TempDir {
    let dir = common::TempDir::new("hybrid-mixed");
    let fixtures = [
        "rgb420.jpg",
        "rgb444.jpg",
        "UPPER.JPG",
        "progressive.jpg",
        "cmyk.jpg",
        "ycck.jpg",
        "gray.jpg",
        "rgba.png",
        "lossy.webp",
        "sampling_2x1_all.jpg",
    ];
    for name in fixtures {
        std::fs::copy(
            common::repo_path(&format!("tests/fixtures/{name}")),
            dir.join(format!("f_{name}")),
        )
        .expect("copy");
    }
    for name in [
        "rocket.jpg",
        "retina.jpg",
        "hubble_deep_field.jpg",
        "chelsea.png",
    ] {
        std::fs::copy(common::repo_path(&format!("assets/{name}")), dir.join(name)).expect("copy");
    }
    let jpeg = std::fs::read(common::repo_path("assets/rocket.jpg")).expect("rocket");
    std::fs::write(dir.join("t_truncated.jpg"), &jpeg[..jpeg.len() / 2]).expect("write");
    std::fs::write(dir.join("u_not_an_image.jpg"), b"hello").expect("write");
    std::fs::write(dir.join("v_empty.jpg"), b"").expect("write");
    dir
}

/// What one epoch of a pipeline gave.
struct EpochRun {
    ids: Vec<String>,
    /// Skipped files as "id: reason".
    skipped: Vec<String>,
    /// Images decoded by (the CPU lane, the GPU lane).
    decoded_by: (usize, usize),
    profile: Profile,
}

/// Every batch of an epoch of the pipeline `builder` builds (each copied to the host).
fn epoch(builder: PipelineBuilder) -> EpochRun {
    let mut pipeline = builder.build().expect("build");
    let mut ids = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        ids.extend(batch.ids().iter().cloned());
        batch.images().to_host().expect("host");
    }
    let report = pipeline.epoch_report();
    EpochRun {
        ids,
        skipped: report.skipped.iter().map(|e| e.to_string()).collect(),
        decoded_by: (report.decoded_by_cpu, report.decoded_by_gpu),
        profile: pipeline.profile(),
    }
}

/// Hybrid decoding accounts for every file exactly as CPU decoding does (same images, same
/// order, same skipped files with the same reasons), the GPU lane decodes the baseline colour
/// JPEGs it is offered, and the files it cannot take go to the CPU lane; its profile splits
/// the GPU lane's calls into their decode and their resize.
#[test]
fn hybrid_accounts_for_every_file_like_the_cpu() {
    let _serial = serial();
    if !gpu_present("hybrid_accounts_for_every_file_like_the_cpu") {
        return;
    }
    let dir = mixed_folder();
    let builder = |decode| {
        Pipeline::builder()
            .source(Source::directory(dir.path()).expect("list"))
            .batch_size(5)
            .decode(decode)
            .gpu_share(1.0)
            .device(Device::Cuda(0))
    };
    let cpu = epoch(builder(Decode::Cpu));
    let hybrid = epoch(builder(Decode::Hybrid));
    assert_eq!(hybrid.ids, cpu.ids, "same images in the same order");
    assert_eq!(
        hybrid.skipped, cpu.skipped,
        "same files skipped for the same reasons"
    );
    assert_eq!(cpu.decoded_by, (cpu.ids.len(), 0));
    let (by_cpu, by_gpu) = hybrid.decoded_by;
    assert_eq!(by_cpu + by_gpu, cpu.ids.len());
    // rgb420, rgb444, UPPER, rocket, retina, hubble: baseline colour JPEGs.
    assert!(by_gpu >= 6, "the GPU lane decoded {by_gpu}");
    assert!(
        by_cpu >= 5,
        "CMYK, YCCK, the PNGs and WebP stay on the CPU: {by_cpu}"
    );
    // The profile splits the GPU lane's calls into their decode and their resize: both run
    // inside a call, so they are counted at most once a call and take no more than its time.
    let profile = &hybrid.profile;
    let (call, decode, resize) = (
        profile.get(Stage::GpuCall),
        profile.get(Stage::GpuDecode),
        profile.get(Stage::GpuResize),
    );
    assert!(resize.count >= 1, "no call resized: {profile}");
    assert!(
        resize.count <= decode.count && decode.count <= call.count,
        "{profile}"
    );
    assert!(
        decode.seconds + resize.seconds <= call.seconds + 1e-6,
        "{profile}"
    );
    println!(
        "hybrid: {by_cpu} images by the CPU, {by_gpu} by the GPU; skipped {:?}",
        hybrid.skipped
    );
}

/// The niceness (Linux's scheduling priority, per thread) in a `/proc/.../stat` line.
fn niceness_in_stat(stat: &str) -> i32 {
    // Field 19; the name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 1..];
    after_name
        .split_whitespace()
        .nth(16)
        .and_then(|field| field.parse().ok())
        .expect("the niceness field")
}

/// The niceness of each of this process's threads whose name starts with `prefix`.
fn threads_niceness(prefix: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|task| {
            let task = task.ok()?.path();
            let name = std::fs::read_to_string(task.join("comm")).ok()?;
            let stat = std::fs::read_to_string(task.join("stat")).ok()?;
            name.starts_with(prefix).then(|| niceness_in_stat(&stat))
        })
        .collect()
}

/// In hybrid decoding the CPU lane's threads run below the GPU lane's (which keep the GPU busy
/// with a few threads) and the rest of the process; with CPU decoding they run as it does, and
/// so they do in hybrid decoding when most of the work is of files the GPU lane cannot take
/// (`sources()`: about seven tenths of its expected work is PNG, WebP, GIF, TIFF and BMP).
#[test]
fn the_cpu_lanes_threads_yield_to_the_gpu_lanes_in_hybrid_decoding() {
    let _serial = serial();
    if !gpu_present("the_cpu_lanes_threads_yield_to_the_gpu_lanes_in_hybrid_decoding") {
        return;
    }
    let ours = niceness_in_stat(&std::fs::read_to_string("/proc/thread-self/stat").expect("stat"));
    let jpegs = || {
        let names = ["rocket.jpg", "retina.jpg", "hubble_deep_field.jpg"];
        Source::paths(
            (0..12)
                .map(|i| format!("assets/{}", names[i % 3]))
                .collect::<Vec<_>>(),
        )
    };
    for (what, source, decode, lowered) in [
        ("JPEGs", jpegs(), Decode::Hybrid, (ours + 10).min(19)),
        ("mostly other formats", sources(), Decode::Hybrid, ours),
        ("every format", sources(), Decode::Cpu, ours),
    ] {
        let decode_name = format!("{decode:?}, {what}");
        let mut pipeline = Pipeline::builder()
            .source(source)
            .batch_size(5)
            .threads(3)
            .decode(decode)
            .device(Device::Cuda(0))
            .build()
            .expect("build");
        pipeline.next_batch().expect("a batch").expect("a batch");
        let lane = threads_niceness("gpufeed-ahead");
        assert_eq!(
            lane,
            vec![lowered; 3],
            "{decode_name}: the CPU lane's threads"
        );
        let others = threads_niceness("");
        assert!(
            others.iter().filter(|&&n| n == ours).count() > 1,
            "{decode_name}: the other threads keep the process's priority: {others:?}"
        );
        println!(
            "{decode_name}: the CPU lane's 3 threads at niceness {lowered}, the process at {ours}"
        );
    }
}

/// With a given share the same images go to the same lane: the same settings give the same bytes
/// on every run, whatever the thread count, and the share is reported as given.
#[test]
fn hybrid_output_with_a_given_share_is_the_same_on_every_run() {
    let _serial = serial();
    if !gpu_present("hybrid_output_with_a_given_share_is_the_same_on_every_run") {
        return;
    }
    let source = || {
        Source::paths(
            vec![common::repo_path("assets/rocket.jpg"); 7]
                .into_iter()
                .chain([
                    common::repo_path("tests/fixtures/rgb420.jpg"),
                    common::repo_path("tests/fixtures/gray.jpg"),
                ]),
        )
    };
    let run = |share: f32, threads| {
        let mut pipeline = Pipeline::builder()
            .source(source())
            .batch_size(4)
            .threads(threads)
            .decode(Decode::Hybrid)
            .gpu_share(share)
            .device(Device::Cuda(0))
            .build()
            .expect("build");
        let mut bits = Vec::new();
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            bits.extend(batch.images().to_host().expect("host").to_le_bytes());
        }
        (bits, pipeline.gpu_share())
    };
    let (first, share) = run(0.5, 1);
    assert_eq!(share, Some(0.5));
    assert!(run(0.5, 3).0 == first, "threads change nothing");
    assert!(run(0.5, 2).0 == first, "runs change nothing");
}

/// With no share given, the CPU lane starts at once and the GPU lane joins the epoch under way
/// once it has opened (here, on 4,400 files in batches of 8: more images than the lane's ring
/// holds, taken slowly until the lane joins); the share then follows the lanes. Every image arrives exactly once, the GPU lane
/// decodes some, and the bytes differ from the CPU lane's only by the engines' inverse DCT.
#[test]
fn hybrid_lane_joins_an_epoch_under_way_and_follows_the_lanes() {
    let _serial = serial();
    if !gpu_present("hybrid_lane_joins_an_epoch_under_way_and_follows_the_lanes") {
        return;
    }
    let files = 4_400;
    let source = || {
        Source::paths(
            (0..files)
                .map(|i| match i % 3 {
                    0 => common::repo_path("assets/rocket.jpg"),
                    1 => common::repo_path("tests/fixtures/rgb420.jpg"),
                    _ => common::repo_path("tests/fixtures/rgb444.jpg"),
                })
                .collect::<Vec<_>>(),
        )
    };
    let run = |decode: Decode| {
        let mut pipeline = Pipeline::builder()
            .source(source())
            .batch_size(8)
            .decode(decode)
            .dtype(DType::F32)
            .device(Device::Cuda(0))
            .build()
            .expect("build");
        let mut seen = vec![0u32; files];
        let mut pixels = Vec::new();
        let mut by_gpu = 0;
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            for &i in batch.indices() {
                seen[i] += 1;
            }
            by_gpu += batch.decoded_by().1;
            pixels.extend(batch.images().to_host().expect("host").to_le_bytes());
            if decode == Decode::Auto && by_gpu == 0 {
                // A slow consumer until the lane has joined: the CPU lane alone would finish
                // these small files (550 batches) before the lane opens (a second or two).
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        (
            seen,
            pixels,
            by_gpu,
            pipeline.gpu_share(),
            pipeline.decode_description(),
        )
    };
    let (seen, cpu_pixels, cpu_by_gpu, cpu_share, _) = run(Decode::Cpu);
    assert!(seen.iter().all(|&n| n == 1));
    assert_eq!((cpu_by_gpu, cpu_share), (0, None));
    let (seen, pixels, by_gpu, share, description) = run(Decode::Auto);
    assert!(seen.iter().all(|&n| n == 1), "every image exactly once");
    assert!(by_gpu > 0, "the GPU lane joined: {description}");
    assert!(by_gpu < files, "the CPU lane started before it");
    let share = share.expect("the share in force is reported");
    assert!((0.0..=1.0).contains(&share), "{share}");
    println!("auto: {by_gpu} of {files} by the GPU lane, share {share}: {description}");
    // f32 values of normalized u8 pixels: compare the levels they came from.
    let levels = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (a, b) = (levels(&pixels), levels(&cpu_pixels));
    // ImageNet's std is about 0.225: a level is 1 / (255 * 0.225) in normalized units.
    let level = 1.0 / (255.0 * 0.225);
    let mean = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32;
    assert!(mean / level <= 0.005, "mean {} levels", mean / level);
}

/// The lanes start on the next epoch as soon as every position of the current one is in a batch,
/// before the consumer asks for it. An epoch so begun gives the bytes it gives when nothing is
/// held back, and so does the epoch after one abandoned part-way.
#[test]
fn hybrid_epochs_begun_early_or_after_an_abandoned_one_are_exact() {
    let _serial = serial();
    if !gpu_present("hybrid_epochs_begun_early_or_after_an_abandoned_one_are_exact") {
        return;
    }
    let source = || {
        Source::paths(
            vec![common::repo_path("assets/rocket.jpg"); 30]
                .into_iter()
                .chain(vec![common::repo_path("tests/fixtures/rgb420.jpg"); 8])
                .chain(vec![common::repo_path("tests/fixtures/gray.jpg"); 4]),
        )
    };
    let build = || {
        Pipeline::builder()
            .source(source())
            .batch_size(4)
            .shuffle(7)
            .decode(Decode::Hybrid)
            .gpu_share(0.5)
            .device(Device::Cuda(0))
            .build()
            .expect("build")
    };
    let bytes = |batch: &gpufeed::Batch| {
        let mut bits = batch.indices().iter().map(|&i| i as u8).collect::<Vec<_>>();
        bits.extend(batch.images().to_host().expect("host").to_le_bytes());
        bits
    };
    // Every batch taken at once, three epochs.
    let mut pipeline = build();
    let mut epochs = Vec::new();
    for epoch in 0..3 {
        if epoch > 0 {
            pipeline.next_epoch().expect("next epoch");
        }
        let mut batches = Vec::new();
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            batches.push(bytes(&batch));
        }
        assert_eq!(batches.len(), 11);
        epochs.push(batches);
    }
    // The same, but the last batch of epoch 0 taken late (the lanes have begun epoch 1 by
    // then), and epoch 1 abandoned after its first batch.
    let mut pipeline = build();
    let mut first = Vec::new();
    while first.len() < 10 {
        let batch = pipeline.next_batch().expect("batch").expect("a batch");
        first.push(bytes(&batch));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let batch = pipeline
        .next_batch()
        .expect("batch")
        .expect("the last batch");
    first.push(bytes(&batch));
    assert!(pipeline.next_batch().expect("end").is_none());
    assert!(first == epochs[0], "epoch 0 changed");
    pipeline.next_epoch().expect("epoch 1");
    let batch = pipeline.next_batch().expect("batch").expect("a batch");
    assert!(
        bytes(&batch) == epochs[1][0],
        "epoch 1, begun early, changed"
    );
    pipeline.next_epoch().expect("epoch 2");
    let mut third = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        third.push(bytes(&batch));
    }
    assert!(
        third == epochs[2],
        "the epoch after an abandoned one changed"
    );
}

/// The hybrid output against Pillow's (torchvision's) on the bundled JPEG photos and fixtures,
/// every image through the GPU lane: within the fidelity bars.
#[test]
fn hybrid_output_is_within_the_fidelity_bars() {
    let _serial = serial();
    if !gpu_present("hybrid_output_is_within_the_fidelity_bars") {
        return;
    }
    let manifest =
        std::fs::read_to_string(common::repo_path("tests/golden/MANIFEST.txt")).expect("manifest");
    let cases: Vec<(String, String)> = manifest
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let default = f.get(3).is_none_or(|v| *v == "default");
            (default && f[0].to_lowercase().ends_with(".jpg"))
                .then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect();
    let mut pipeline = Pipeline::builder()
        .source(Source::paths(
            cases.iter().map(|(i, _)| common::repo_path(i)),
        ))
        .batch_size(64)
        .mean_std([0.0; 3], [1.0 / 255.0; 3])
        .dtype(DType::F32)
        .layout(Layout::Nhwc)
        .decode(Decode::Hybrid)
        .gpu_share(1.0)
        .device(Device::Cuda(0))
        .build()
        .expect("build");
    let batch = pipeline.next_batch().expect("batch").expect("one batch");
    let (_, by_gpu) = batch.decoded_by();
    let values = batch.images().to_host().expect("host").to_f32_vec();
    let per_image = values.len() / batch.len();
    let mut diffs = Vec::new();
    for (id, pixels) in batch.ids().iter().zip(values.chunks(per_image)) {
        let (_, golden) = cases
            .iter()
            .find(|(i, _)| common::repo_path(i).display().to_string() == *id)
            .expect("case");
        let want = image::open(common::repo_path(&format!("tests/golden/{golden}")))
            .expect("golden")
            .into_rgb8();
        diffs.extend(
            want.as_raw()
                .iter()
                .zip(pixels)
                .map(|(&w, &g)| (w as f32 - g).abs()),
        );
    }
    let (mean, p999) = mean_and_p999(&mut diffs);
    println!(
        "hybrid vs Pillow on {} JPEGs ({by_gpu} by the GPU lane): mean {mean:.3}, p99.9 {p999}",
        batch.len()
    );
    assert!(by_gpu >= 6, "the GPU lane decoded {by_gpu}");
    assert!(mean <= 0.5 && p999 <= 3.0, "mean {mean:.3}, p99.9 {p999}");
}

/// A folder of `files` ImageNet-sized JPEGs (4:2:0, 300 to 499 by 250 to 399 pixels): parts of
/// a photo, each with noise of its own, so that no two images are alike.
fn imagenet_sized_folder(files: usize) -> common::TempDir {
    use rayon::prelude::*;
    use turbojpeg_region::{encode, EncodeOptions, Format};
    let dir = common::TempDir::new("engines-beside-assisted");
    let photo = image::open(common::repo_path("assets/astronaut.png"))
        .expect("photo")
        .to_rgb8();
    (0..files).into_par_iter().for_each(|i| {
        let i = i as u32;
        let (w, h) = (300 + (i * 37) % 200, 250 + (i * 53) % 150);
        let (x, y) = (
            (i * 7) % (photo.width() - w),
            (i * 11) % (photo.height() - h),
        );
        let mut rgb = image::imageops::crop_imm(&photo, x, y, w, h)
            .to_image()
            .into_raw();
        let mut state = i.wrapping_mul(2_654_435_761) | 1;
        for p in rgb.iter_mut() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            *p = p.saturating_add((state % 9) as u8).saturating_sub(4);
        }
        let bytes = encode(&rgb, w, h, Format::Rgb, &EncodeOptions::default()).expect("encode");
        std::fs::write(dir.join(format!("{i:05}.jpg")), bytes).expect("write");
    });
    dir
}

/// The JPEG engines and the assisted path decoding small files side by side, the SMs busy:
/// every image of two epochs is the CPU lane's, within the engines' inverse DCT. (The engines
/// write a call's pixels as it is submitted, not in their stream's order: before the decoder
/// waited for the work queued ahead of a call, a few of every 8,192 images came out with pixels
/// of the engines' next call, on the H100 machine.)
#[test]
fn engines_beside_the_assisted_path_leave_every_image_whole() {
    let _serial = serial();
    if !gpu_present("engines_beside_the_assisted_path_leave_every_image_whole") {
        return;
    }
    let dir = imagenet_sized_folder(8192);
    let builder = |decode| {
        Pipeline::builder()
            .source(Source::directory(dir.path()).expect("folder"))
            .batch_size(256)
            .mean_std([0.0; 3], [1.0 / 255.0; 3])
            .dtype(DType::F32)
            .decode(decode)
            .gpu_share(1.0)
            .device(Device::Cuda(0))
    };
    // Each image's levels, by id.
    let mut reference = std::collections::HashMap::new();
    let mut cpu = builder(Decode::Cpu).build().expect("build");
    for batch in &mut cpu {
        let batch = batch.expect("batch");
        let values = batch.images().to_host().expect("host").to_f32_vec();
        let per_image = values.len() / batch.len();
        for (id, image) in batch.ids().iter().zip(values.chunks(per_image)) {
            let levels: Vec<u8> = image.iter().map(|&v| v as u8).collect();
            reference.insert(id.clone(), levels);
        }
    }
    drop(cpu);
    let mut hybrid = builder(Decode::Hybrid).build().expect("build");
    let (mut at, mut by_engines, mut by_assisted) = (0, 0, 0);
    let (mut worst, mut wrong) = (0.0f32, Vec::new());
    for _ in 0..2 {
        for batch in &mut hybrid {
            let batch = batch.expect("batch");
            let values = batch.images().to_host().expect("host").to_f32_vec();
            let per_image = values.len() / batch.len();
            for (id, image) in batch.ids().iter().zip(values.chunks(per_image)) {
                let want = reference.get(id).expect("an image of the CPU lane's run");
                let mean = image
                    .iter()
                    .zip(want)
                    .map(|(&g, &w)| (g - w as f32).abs())
                    .sum::<f32>()
                    / per_image as f32;
                worst = worst.max(mean);
                if mean > 2.0 {
                    wrong.push(format!("{id} (mean difference {mean:.1})"));
                }
                at += 1;
            }
        }
        let report = hybrid.epoch_report();
        by_engines += report.decoded_by_gpu - report.decoded_by_assisted;
        by_assisted += report.decoded_by_assisted;
    }
    println!(
        "{at} images: {by_engines} by the engines, {by_assisted} by the assisted path; the worst \
         image's mean difference from the CPU lane {worst:.3}"
    );
    assert_eq!(at, 2 * reference.len(), "both epochs made every image");
    assert!(
        by_engines > 0 && by_assisted > 0,
        "both paths of the GPU lane decoded: engines {by_engines}, assisted {by_assisted}"
    );
    assert!(wrong.is_empty(), "{} images wrong: {wrong:?}", wrong.len());
}

/// Twenty epochs of hybrid decoding leave host and device memory where the first ones left them,
/// counted from the epoch by which the GPU lane has finished opening (its decoder sets join one
/// at a time beside the first epochs, each taking its device memory; on this small folder an
/// epoch takes a few tens of milliseconds, and the engines a second or more).
/// (Unshuffled: with a new order every epoch, the engines' own buffers grow, within their
/// bounds, whenever a call is larger than any before; this folder is small enough to find new
/// ones for many epochs.)
#[test]
fn hybrid_memory_is_flat_over_twenty_epochs() {
    let _serial = serial();
    if !gpu_present("hybrid_memory_is_flat_over_twenty_epochs") {
        return;
    }
    let dir = mixed_folder();
    let mut pipeline = Pipeline::builder()
        .source(Source::directory(dir.path()).expect("list"))
        .batch_size(6)
        .decode(Decode::Hybrid)
        .device(Device::Cuda(0))
        .build()
        .expect("build");
    let opening = |description: &str| {
        [
            "while the GPU decode lane opens",
            "opening beside",
            "still being made",
        ]
        .iter()
        .any(|words| description.contains(words))
    };
    let started = std::time::Instant::now();
    let mut first = 0;
    loop {
        for batch in &mut pipeline {
            assert_eq!(batch.expect("batch").epoch(), first);
        }
        first += 1;
        let description = pipeline.decode_description();
        if !opening(&description) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the GPU lane still opening after a minute: {description}"
        );
    }
    let mut rss = Vec::new();
    let mut free = Vec::new();
    for epoch in first..first + 20 {
        for batch in &mut pipeline {
            let batch = batch.expect("batch");
            assert_eq!(batch.epoch(), epoch);
        }
        rss.push(rss_bytes());
        free.push(gpufeed::cuda::device_memory(0).expect("memory").0);
    }
    println!(
        "hybrid, 20 epochs: RSS {} -> {} MB, device free {} -> {} MB (by epoch: {:?} MB)",
        rss[4] >> 20,
        rss[19] >> 20,
        free[4] >> 20,
        free[19] >> 20,
        free.iter().map(|f| f >> 20).collect::<Vec<_>>()
    );
    assert!(rss[19] < rss[4] + (32 << 20), "host memory grew");
    assert!(free[19] + (64 << 20) > free[4], "device memory grew");
}

/// Training transforms on the GPU lane: every JPEG through the engines draws the box and flip
/// the CPU lane draws for it (reported on the batch), and its pixels are the CPU lane's within
/// the fidelity bars; the same settings give the same bytes again.
#[test]
fn hybrid_random_crops_and_flips_match_the_cpu_lane() {
    let _serial = serial();
    if !gpu_present("hybrid_random_crops_and_flips_match_the_cpu_lane") {
        return;
    }
    let photos = [
        "assets/rocket.jpg",
        "assets/retina.jpg",
        "assets/hubble_deep_field.jpg",
    ];
    let source = || Source::paths((0..18).map(|i| common::repo_path(photos[i % 3])));
    let run = |decode: Decode| {
        let mut pipeline = Pipeline::builder()
            .source(source())
            .imagenet_train(96, 21)
            .batch_size(6)
            .mean_std([0.0; 3], [1.0 / 255.0; 3])
            .dtype(DType::F32)
            .layout(Layout::Nhwc)
            .decode(decode)
            .gpu_share(1.0)
            .device(Device::Cuda(0))
            .build()
            .expect("build");
        let mut rows = Vec::new();
        let mut by_gpu = 0;
        for epoch in 0..2 {
            for batch in &mut pipeline {
                let batch = batch.expect("batch");
                assert_eq!(batch.epoch(), epoch);
                by_gpu += batch.decoded_by().1;
                let values = batch.images().to_host().expect("host").to_f32_vec();
                let per = values.len() / batch.len();
                let crops = batch.crops().expect("draws").to_vec();
                for (i, &index) in batch.indices().iter().enumerate() {
                    rows.push((
                        epoch,
                        index,
                        crops[i],
                        values[i * per..(i + 1) * per].to_vec(),
                    ));
                }
            }
        }
        rows.sort_by_key(|r| (r.0, r.1));
        (rows, by_gpu)
    };
    let (cpu, _) = run(Decode::Cpu);
    let (gpu, by_gpu) = run(Decode::Hybrid);
    assert_eq!(by_gpu, 36, "every JPEG decoded by the engines");
    let mut diffs = Vec::new();
    let mut flipped = 0;
    for (c, g) in cpu.iter().zip(&gpu) {
        assert_eq!(
            (c.0, c.1, c.2),
            (g.0, g.1, g.2),
            "the same draws on both lanes"
        );
        flipped += usize::from(g.2.flipped);
        diffs.extend(c.3.iter().zip(&g.3).map(|(a, b)| (a - b).abs()));
    }
    let (mean, p999) = mean_and_p999(&mut diffs);
    println!("hybrid training crops vs the CPU lane: mean {mean:.3}, p99.9 {p999}, {flipped} of 36 flipped");
    assert!(mean <= 0.5 && p999 <= 3.0, "mean {mean:.3}, p99.9 {p999}");
    assert!((4..=32).contains(&flipped));
    assert!(run(Decode::Hybrid).0 == gpu, "the same bytes on every run");
}

/// One batch of a hybrid run as its consumer saw it: epoch, ids, padding flags, draws, skipped
/// files, (cpu, gpu) decoded, bytes.
type HybridBatch = (
    u64,
    Vec<String>,
    Vec<bool>,
    Option<Vec<gpufeed::CropDraw>>,
    Vec<String>,
    (usize, usize),
    Vec<u8>,
);

/// The batches up to epoch `epochs`, or the first `stop` of them.
fn hybrid_batches(pipeline: &mut Pipeline, epochs: u64, stop: Option<usize>) -> Vec<HybridBatch> {
    let mut seen = Vec::new();
    for _ in pipeline.epoch()..epochs {
        for batch in &mut *pipeline {
            let batch = batch.expect("batch");
            seen.push((
                batch.epoch(),
                batch.ids().to_vec(),
                batch.padded().to_vec(),
                batch.crops().map(<[gpufeed::CropDraw]>::to_vec),
                batch.skipped().iter().map(|e| e.to_string()).collect(),
                batch.decoded_by(),
                batch.images().to_host().expect("host").to_le_bytes(),
            ));
            if Some(seen.len()) == stop {
                return seen;
            }
        }
    }
    seen
}

/// Hybrid decoding stopped after any batch and resumed from its saved state gives the bytes,
/// ids, draws, skipped files and lanes of the uninterrupted run when the share was given: the
/// state records it, and the resumed pipeline pins it, so every image is decoded by the lane it
/// went to; a running pipeline given the state pins it too, and an explicit other share is
/// refused. (A share that follows the lanes is recorded as it stood, and pinned on resume: the
/// rows, ids and draws are then the same, and the bytes differ only where the engines' inverse
/// DCT decoded an image the other run's CPU lane did, or the reverse.)
#[test]
fn hybrid_runs_resume_row_for_row_with_the_share_pinned() {
    let _serial = serial();
    if !gpu_present("hybrid_runs_resume_row_for_row_with_the_share_pinned") {
        return;
    }
    let source = || {
        let files = [
            ("assets/rocket.jpg", 14),
            ("assets/retina.jpg", 6),
            ("tests/fixtures/rgb420.jpg", 6),
            ("tests/fixtures/progressive.jpg", 3),
            ("tests/fixtures/gray.jpg", 3),
            ("tests/fixtures/cmyk.jpg", 2),
        ];
        let mut paths: Vec<_> = files
            .iter()
            .flat_map(|&(file, n)| vec![common::repo_path(file); n])
            .collect();
        paths.push(common::repo_path("tests/fixtures/missing.jpg"));
        Source::paths(paths)
    };
    let builder = || {
        Pipeline::builder()
            .source(source())
            .imagenet_train(64, 3)
            .batch_size(4)
            .decode(Decode::Hybrid)
            .device(Device::Cuda(0))
    };
    // 34 images, one missing: 9 batches an epoch.
    for (given, stop) in [
        (Some(0.5), 1),
        (Some(0.25), 9),
        (Some(0.75), 13),
        (Some(0.5), 4),
        (Some(1.0), 11),
    ] {
        let mut first = match given {
            Some(share) => builder().gpu_share(share),
            None => builder(),
        }
        .build()
        .expect("build");
        let mut seen = hybrid_batches(&mut first, 2, Some(stop));
        let state = first.state();
        drop(first);
        let share = state.gpu_share().expect("the share is in the state");
        assert!(given.is_none_or(|g| g == share));
        let whole = hybrid_batches(
            &mut builder().gpu_share(share).build().expect("build"),
            2,
            None,
        );
        assert_eq!(whole.len(), 18);
        assert!(
            whole.iter().any(|b| !b.4.is_empty()),
            "the missing file is reported"
        );
        if share > 0.0 {
            assert!(
                whole.iter().any(|b| b.5 .1 > 0),
                "the GPU lane decoded some"
            );
        }
        let text = state.to_json();
        let mut resumed = builder()
            .threads(3)
            .resume(gpufeed::PipelineState::from_json(&text).expect("state"))
            .build()
            .expect("resume");
        assert_eq!(
            resumed.gpu_share(),
            Some(share),
            "the state's share is pinned"
        );
        seen.extend(hybrid_batches(&mut resumed, 2, None));
        assert!(
            seen == whole,
            "share {share}, stopped after {stop}: the runs differ"
        );
        // A running pipeline (its own share measured) given the state.
        let mut running = builder().build().expect("build");
        hybrid_batches(&mut running, 2, Some(2));
        running.resume(&state).expect("resume");
        assert!(
            hybrid_batches(&mut running, 2, None) == whole[stop..],
            "share {share}: a running pipeline given the state"
        );
        println!("hybrid resume after {stop} batches: share {share} pinned, bytes equal");
    }
    let mut first = builder().gpu_share(0.5).build().expect("build");
    hybrid_batches(&mut first, 1, Some(1));
    match builder().gpu_share(0.25).resume(first.state()).build() {
        Err(Error::Resume(gpufeed::ResumeError::Options(differences))) => {
            assert_eq!(differences.len(), 1);
            assert_eq!(differences[0].option, "gpu_share");
        }
        other => panic!("another share must be refused, got {:?}", other.err()),
    }
}

/// An ImageFolder of the bundled photos in three classes, for MixUp's and CutMix's labels.
fn labelled_folder() -> common::TempDir {
    let dir = common::TempDir::new("augment-folder");
    let photos = [
        "rocket.jpg",
        "retina.jpg",
        "hubble_deep_field.jpg",
        "chelsea.png",
        "coffee.png",
    ];
    for i in 0..15 {
        let class = dir.join(["a", "b", "c"][i % 3]);
        std::fs::create_dir_all(&class).expect("class");
        let name = photos[i % photos.len()];
        std::fs::copy(
            common::repo_path(&format!("assets/{name}")),
            class.join(format!("{i}_{name}")),
        )
        .expect("copy");
    }
    dir
}

/// Every batch of an epoch: (images' bits, soft labels' bits, augmentations, mix).
fn augmented(builder: PipelineBuilder) -> Vec<(Vec<u8>, Option<Vec<u8>>, String)> {
    let mut pipeline = builder.build().expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        out.push((
            batch.images().to_host().expect("host").to_le_bytes(),
            batch
                .soft_labels()
                .map(|t| t.to_host().expect("host").to_le_bytes()),
            format!("{:?} {:?}", batch.augmentations(), batch.mix()),
        ));
    }
    out
}

/// Options set on a builder.
type Settings = fn(PipelineBuilder) -> PipelineBuilder;

/// The augmentation kernels on the whole pipeline give the CPU device's bytes exactly, for
/// every policy, the colour jitter, erasing and both mixings, in every dtype and layout.
#[test]
fn augmented_gpu_pipeline_equals_the_cpu_device() {
    let _serial = serial();
    if !gpu_present("augmented_gpu_pipeline_equals_the_cpu_device") {
        return;
    }
    let folder = labelled_folder();
    let settings: [(&str, Settings); 4] = [
        ("recipe", |b| {
            b.recipe(gpufeed::Recipe::TorchvisionImagenet, 160, 3)
        }),
        ("rand-augment + jitter + mixup", |b| {
            b.imagenet_train(96, 4)
                .augment(gpufeed::Augment::RandAugment {
                    num_ops: 3,
                    magnitude: 15,
                })
                .color_jitter(0.4, 0.4, 0.4, 0.2)
                .mixup(0.8)
        }),
        ("auto-augment + cutmix + erasing", |b| {
            b.imagenet_train(224, 5)
                .augment(gpufeed::Augment::AutoAugment)
                .random_erasing(0.5)
                .cutmix(1.0)
        }),
        ("trivial-augment-wide alone", |b| {
            b.imagenet_train(128, 6)
                .augment(gpufeed::Augment::TrivialAugmentWide)
        }),
    ];
    for (name, set) in settings {
        for (dtype, layout) in [
            (DType::F16, Layout::Nchw),
            (DType::F32, Layout::Nhwc),
            (DType::BF16, Layout::Nchw),
        ] {
            let builder = |device| {
                set(Pipeline::builder()
                    .source(Source::image_folder(folder.path()).expect("folder"))
                    .batch_size(6))
                .dtype(dtype)
                .layout(layout)
                .device(device)
            };
            let gpu = augmented(builder(Device::Cuda(0)));
            let cpu = augmented(builder(Device::Cpu));
            assert_eq!(gpu.len(), cpu.len());
            for (k, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                assert_eq!(g.2, c.2, "{name}: the same draws");
                assert!(
                    g.0 == c.0,
                    "{name} {dtype:?} {layout:?}: batch {k} differs from the CPU device"
                );
                assert!(g.1 == c.1, "{name}: batch {k}'s soft labels differ");
            }
        }
    }
}

/// With augmentations, hybrid decoding gives the same bytes on 1 and 16 threads (and on every
/// run), and another seed other bytes.
#[test]
fn augmented_hybrid_output_does_not_depend_on_threads() {
    let _serial = serial();
    if !gpu_present("augmented_hybrid_output_does_not_depend_on_threads") {
        return;
    }
    let folder = labelled_folder();
    let run = |threads: usize, seed: u64| {
        augmented(
            Pipeline::builder()
                .source(Source::image_folder(folder.path()).expect("folder"))
                .batch_size(4)
                .recipe(gpufeed::Recipe::TorchvisionImagenet, 224, seed)
                .decode(Decode::Hybrid)
                .gpu_share(0.5)
                .threads(threads)
                .device(Device::Cuda(0)),
        )
    };
    let one = run(1, 8);
    assert!(one == run(16, 8), "1 and 16 threads differ");
    assert!(one != run(16, 9), "another seed, other bytes");
}

/// A folder of camera-size JPEGs (1.2 to 3 Mpx): baseline 4:2:0, 4:4:4 and gray, restart
/// intervals, one progressive; a photo scaled up with fresh noise from `seed`.
fn large_folder(seed: u64) -> common::TempDir {
    use turbojpeg_region::{encode, Colorspace, EncodeOptions, Format, Restart, Sampling};
    let dir = common::TempDir::new("hybrid-large");
    let photo = image::open(common::repo_path("assets/astronaut.png"))
        .expect("photo")
        .to_rgb8();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in 0..24u32 {
        let (w, h) = (1280 + 37 * i, 960 + 29 * (i % 7));
        let mut rgb = image::imageops::resize(&photo, w, h, image::imageops::Triangle).into_raw();
        for p in rgb.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *p = p.saturating_add((state % 7) as u8).saturating_sub(3);
        }
        let options = match i % 6 {
            0 => EncodeOptions {
                sampling: Sampling::S444,
                quality: 95,
                ..Default::default()
            },
            1 => EncodeOptions {
                colorspace: Colorspace::Gray,
                ..Default::default()
            },
            2 => EncodeOptions {
                restart: Restart::Mcus(5),
                ..Default::default()
            },
            3 if i == 3 => EncodeOptions {
                progressive: true,
                ..Default::default()
            },
            _ => EncodeOptions::default(),
        };
        let (pixels, format) = match options.colorspace {
            Colorspace::Gray => (rgb.chunks(3).map(|p| p[1]).collect(), Format::Gray),
            _ => (rgb, Format::Rgb),
        };
        let bytes = encode(&pixels, w, h, format, &options).expect("encode");
        std::fs::write(dir.join(format!("photo_{i:02}.jpg")), bytes).expect("write");
    }
    dir
}

/// A pipeline of 8-image f32 batches of raw levels (0-255) over the photos of `dir`, on GPU 0.
fn large_photos_pipeline(dir: &std::path::Path, decode: Decode) -> PipelineBuilder {
    Pipeline::builder()
        .source(Source::directory(dir).expect("folder"))
        .batch_size(8)
        .mean_std([0.0; 3], [1.0 / 255.0; 3])
        .dtype(DType::F32)
        .decode(decode)
        .device(Device::Cuda(0))
}

/// The mean and the 99.9th percentile of the differences between `a` and `b`, value by value.
fn difference(a: &[f32], b: &[f32]) -> (f32, f32) {
    let mut diffs: Vec<f32> = a.iter().zip(b).map(|(a, b)| (a - b).abs()).collect();
    mean_and_p999(&mut diffs)
}

/// With CPU decoding the lane prepares its images into page-locked memory of their own, ahead of
/// the batches, and each crosses to its place in the batch from there: once that memory is
/// allocated (a chunk after each batch while the batches copy longer than they wait, as here,
/// where the lane is far ahead of the batches) an epoch copies no image into the staging, and
/// every epoch's output is the CPU device's, byte for byte. The order is shuffled each epoch, so
/// an image left over in memory reused from an earlier batch would be another image's pixels.
#[test]
fn cpu_lane_images_upload_from_page_locked_memory_of_their_own() {
    let _serial = serial();
    if !gpu_present("cpu_lane_images_upload_from_page_locked_memory_of_their_own") {
        return;
    }
    let builder = |device| {
        Pipeline::builder()
            .source(sources())
            .batch_size(7)
            .decode(Decode::Cpu)
            .dtype(DType::F32)
            .shuffle(11)
            .device(device)
    };
    let mut gpu = builder(Device::Cuda(0)).build().expect("build");
    let mut cpu = builder(Device::Cpu).build().expect("build");
    let mut copied_before = None;
    for epoch in 0..40 {
        let (gpu_ids, gpu_values, _) = read_epoch(&mut gpu);
        let (cpu_ids, cpu_values, _) = read_epoch(&mut cpu);
        assert_eq!(
            gpu_ids, cpu_ids,
            "epoch {epoch}: the same images in the same order"
        );
        assert!(
            gpu_values == cpu_values,
            "epoch {epoch}: the output differs from the CPU device's"
        );
        let copied = gpu.profile().get(Stage::StagingCopy).count;
        if copied_before == Some(copied) {
            return;
        }
        copied_before = Some(copied);
    }
    panic!(
        "every one of 40 epochs copied images into the staging ({copied_before:?} in all): the \
         CPU lane never prepared into page-locked memory of its own"
    );
}

/// The images the CPU lane finishes while the device opens (its reach, here the whole epoch of
/// 300 images) are laid out by position, and those it has begun by the first batch are
/// page-locked in place then: the batches upload those from where they lie (how many depends on
/// how far the lane got while the device opened; the rest are copied into the staging), and the
/// epoch's output is the CPU device's, byte for byte; so is the next epoch's, made without them.
#[test]
fn images_made_while_the_device_opens_upload_from_where_they_lie() {
    let _serial = serial();
    if !gpu_present("images_made_while_the_device_opens_upload_from_where_they_lie") {
        return;
    }
    let mut photos: Vec<_> = std::fs::read_dir("assets")
        .expect("assets/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    photos.sort();
    assert!(!photos.is_empty());
    let images = 300;
    let builder = |device| {
        Pipeline::builder()
            .source(Source::paths(photos.iter().cycle().take(images).cloned()))
            .batch_size(16)
            .decode(Decode::Cpu)
            .dtype(DType::F32)
            .device(device)
    };
    let mut gpu = builder(Device::Cuda(0)).build().expect("build");
    let mut cpu = builder(Device::Cpu).build().expect("build");
    for epoch in 0..2 {
        let (gpu_ids, gpu_values, report) = read_epoch(&mut gpu);
        let (cpu_ids, cpu_values, _) = read_epoch(&mut cpu);
        assert_eq!(report.images, images);
        assert_eq!(gpu_ids, cpu_ids, "epoch {epoch}: the same images in order");
        assert!(
            gpu_values == cpu_values,
            "epoch {epoch}: the output differs from the CPU device's"
        );
    }
}

/// One epoch of `pipeline`: its ids, its values and its report.
fn read_epoch(pipeline: &mut Pipeline) -> (Vec<String>, Vec<f32>, EpochReport) {
    let (mut ids, mut values) = (Vec::new(), Vec::new());
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        ids.extend(batch.ids().iter().cloned());
        values.extend(batch.images().to_host().expect("host").to_f32_vec());
    }
    (ids, values, pipeline.epoch_report().clone())
}

/// Large photos through hybrid decoding: the GPU lane's assisted path takes part of them beside
/// the engines, and the progressive one (its coefficients decoded on a CPU thread), every photo
/// is delivered once in order, and the output differs from the CPU decode's by at most 0.005
/// levels on average (the assisted path adds nothing: it is libjpeg-turbo's decode bit for bit).
#[test]
fn large_photos_take_the_assisted_path_beside_the_engines() {
    let _serial = serial();
    if !gpu_present("large_photos_take_the_assisted_path_beside_the_engines") {
        return;
    }
    let dir = large_folder(7);
    let run = |decode: Decode| {
        let builder = large_photos_pipeline(dir.path(), decode);
        let builder = match decode {
            Decode::Hybrid => builder.gpu_share(1.0).assisted_share(0.5),
            _ => builder,
        };
        read_epoch(&mut builder.build().expect("build"))
    };
    let (cpu_ids, cpu, _) = run(Decode::Cpu);
    let (ids, hybrid, report) = run(Decode::Hybrid);
    assert_eq!(ids, cpu_ids);
    assert_eq!(
        report.decoded_by_cpu, 0,
        "the progressive photo is the GPU lane's too"
    );
    assert!(
        report.decoded_by_assisted > 0 && report.decoded_by_assisted < report.decoded_by_gpu,
        "assisted {} of the GPU lane's {}",
        report.decoded_by_assisted,
        report.decoded_by_gpu
    );
    let (mean, p999) = difference(&cpu, &hybrid);
    println!(
        "large photos, hybrid ({} by the engines, {} by the assisted path) vs CPU decode: \
         mean {mean:.4}, p99.9 {p999}",
        report.decoded_by_gpu - report.decoded_by_assisted,
        report.decoded_by_assisted
    );
    assert!(mean <= 0.005, "mean {mean:.4} levels, p99.9 {p999}");
}

/// Large photos through hybrid decoding with the share following the lanes. With the assisted
/// path taking every large baseline file (the default), the epoch is its: the JPEG engines are
/// not opened at all. With it taking half, the GPU lane starts with its assisted path while its
/// engines open beside it, and the engines join later. Every epoch, before and after they join,
/// delivers every photo once in order, within 0.005 levels of the CPU decode on average.
#[test]
fn large_photos_start_on_the_assisted_path_while_the_engines_open() {
    let _serial = serial();
    if !gpu_present("large_photos_start_on_the_assisted_path_while_the_engines_open") {
        return;
    }
    let dir = large_folder(11);
    let build = |decode: Decode| {
        large_photos_pipeline(dir.path(), decode)
            .build()
            .expect("build")
    };
    let (cpu_ids, cpu, _) = read_epoch(&mut build(Decode::Cpu));
    let mut assisted_alone = build(Decode::Hybrid);
    for epoch in 0..2 {
        let (ids, values, report) = read_epoch(&mut assisted_alone);
        assert_eq!(ids, cpu_ids);
        let (mean, p999) = difference(&cpu, &values);
        assert!(mean <= 0.005, "mean {mean:.4} levels, p99.9 {p999}");
        assert_eq!(
            report.decoded_by_assisted, report.decoded_by_gpu,
            "epoch {epoch}: every photo of the GPU lane's is the assisted path's"
        );
        assisted_alone.next_epoch().expect("next epoch");
    }
    let description = assisted_alone.decode_description();
    assert!(
        description.contains("not opened: the assisted path takes the epoch's large files"),
        "{description}"
    );
    drop(assisted_alone);
    let mut pipeline = large_photos_pipeline(dir.path(), Decode::Hybrid)
        .assisted_share(0.5)
        .build()
        .expect("build");
    let started = std::time::Instant::now();
    let (mut assisted_before_engines, mut epochs_after_engines) = (0, 0);
    while epochs_after_engines < 2 {
        assert!(
            started.elapsed().as_secs() < 60,
            "the engines did not join: {}",
            pipeline.decode_description()
        );
        let engines_opening = pipeline.decode_description().contains("opening beside");
        let (ids, values, report) = read_epoch(&mut pipeline);
        assert_eq!(ids, cpu_ids);
        let (mean, p999) = difference(&cpu, &values);
        assert!(mean <= 0.005, "mean {mean:.4} levels, p99.9 {p999}");
        if engines_opening {
            assisted_before_engines += report.decoded_by_assisted;
        }
        if pipeline.decode_description().contains("joined") {
            epochs_after_engines += 1;
        }
        pipeline.next_epoch().expect("next epoch");
    }
    println!("{}", pipeline.decode_description());
    assert!(
        assisted_before_engines > 0,
        "no photo took the assisted path while the engines opened"
    );
}

/// One patch-sequence batch as its consumer saw it: ids, token bits, layout rows, each image's
/// plan, cu_seqlens, mask and coordinates, (cpu, gpu) decoded.
type PatchRows = (
    Vec<String>,
    Vec<u32>,
    Vec<gpufeed::patches::PatchPlan>,
    Vec<i32>,
    Vec<i32>,
    Vec<[i64; 2]>,
    (usize, usize),
);

/// Every batch of two epochs. On a CUDA device each batch's memory is filled with NaN (all bits
/// set) before it is freed, so that the batches allocated in its place after it show any token
/// the kernel left unwritten.
fn patch_rows(builder: PipelineBuilder) -> Vec<PatchRows> {
    let mut pipeline = builder.build().expect("build");
    let mut rows = Vec::new();
    for _ in 0..2 {
        for batch in &mut pipeline {
            let batch = batch.expect("batch");
            let info = batch.patches().expect("patches").clone();
            let host = batch.tokens().expect("tokens").to_host().expect("host");
            let bits: Vec<u32> = match host.data() {
                gpufeed::HostData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                gpufeed::HostData::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
                gpufeed::HostData::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
                other => panic!("tokens of {:?}", other.dtype()),
            };
            rows.push((
                batch.ids().to_vec(),
                bits,
                info.plans().to_vec(),
                info.cu_seqlens(),
                info.mask(),
                info.coordinates(),
                batch.decoded_by(),
            ));
            if let gpufeed::Tensor::Device(tokens) = batch.into_images() {
                let stream = tokens.stream().clone();
                let data = tokens.into_data().expect("the tokens' memory");
                let poisoned = match data {
                    gpufeed::DeviceData::F32(mut s) => {
                        stream.memcpy_htod(&vec![f32::from_bits(u32::MAX); s.len()], &mut s)
                    }
                    gpufeed::DeviceData::F16(mut s) => stream.memcpy_htod(
                        &vec![gpufeed::half::f16::from_bits(u16::MAX); s.len()],
                        &mut s,
                    ),
                    gpufeed::DeviceData::BF16(mut s) => stream.memcpy_htod(
                        &vec![gpufeed::half::bf16::from_bits(u16::MAX); s.len()],
                        &mut s,
                    ),
                    _ => Ok(()),
                };
                poisoned.expect("poisoning a batch's memory");
            }
        }
    }
    rows
}

/// The presets a patch-sequence pipeline is compared on, in every element type.
fn patch_presets() -> Vec<(gpufeed::patches::Patches, DType, u64)> {
    use gpufeed::patches::Patches;
    vec![
        (Patches::qwen2_vl().max_pixels(28 * 28 * 256), DType::F16, 0),
        (
            Patches::qwen2_vl().max_pixels(28 * 28 * 128).torchvision(),
            DType::BF16,
            0,
        ),
        (Patches::siglip2_naflex(), DType::F32, 0),
        (
            Patches::timm_naflex()
                .seq_lens(&[64, 128, 256])
                .tokens_per_batch(8 * 256),
            DType::F16,
            7,
        ),
    ]
}

fn patch_pipeline(
    patches: gpufeed::patches::Patches,
    dtype: DType,
    seed: u64,
    device: Device,
) -> PipelineBuilder {
    Pipeline::builder()
        .source(sources())
        .patches(patches)
        .batch_size(6)
        .seed(seed)
        .shuffle(seed)
        .dtype(dtype)
        .device(device)
}

/// With the CPU threads decoding, a patch-sequence pipeline on the GPU (the arena uploaded,
/// `kernels/patches.cu`) gives the CPU device's tokens bit for bit, with the same plans, grids,
/// masks and coordinates, for every preset and element type (every fixture, odd ones included;
/// each batch's memory poisoned before it is freed).
#[test]
fn patch_pipelines_on_the_gpu_equal_the_cpu_device() {
    let _serial = serial();
    if !gpu_present("patch_pipelines_on_the_gpu_equal_the_cpu_device") {
        return;
    }
    for (patches, dtype, seed) in patch_presets() {
        let cpu = patch_rows(patch_pipeline(patches, dtype, seed, Device::Cpu));
        let gpu =
            patch_rows(patch_pipeline(patches, dtype, seed, Device::Cuda(0)).decode(Decode::Cpu));
        assert_eq!(cpu.len(), gpu.len(), "{:?}", patches.preset);
        for (c, g) in cpu.iter().zip(&gpu) {
            assert_eq!(c.0, g.0, "ids");
            assert_eq!((&c.2, &c.3, &c.4, &c.5), (&g.2, &g.3, &g.4, &g.5), "plans");
            let differing = c.1.iter().zip(&g.1).filter(|(a, b)| a != b).count();
            assert_eq!(differing, 0, "{:?} {dtype}: {:?}", patches.preset, c.0);
        }
    }
}

/// With the GPU lane decoding (a share of 1: every JPEG it can take; and the default, the share
/// following the lanes' rates), a patch-sequence pipeline plans every image as the CPU device
/// does (the same boxes, sizes, grids, masks and coordinates) and its tokens stay within the
/// fidelity bars of the decoders' inverse DCT (the JPEG engines' differs from libjpeg-turbo's by
/// a level here and there before the resize; the assisted path and the CPU lane agree bit for
/// bit); with a share given, every run gives the same bits.
#[test]
fn patch_pipelines_decoded_on_the_gpu_lane_plan_every_image_as_the_cpu_device() {
    let _serial = serial();
    if !gpu_present("patch_pipelines_decoded_on_the_gpu_lane_plan_every_image_as_the_cpu_device") {
        return;
    }
    for (patches, _, seed) in patch_presets() {
        // Values in 0..1 units: a level is 1/255.
        let patches = patches.mean_std([0.0; 3], [1.0; 3]);
        let cpu = patch_rows(patch_pipeline(patches, DType::F32, seed, Device::Cpu));
        let hybrid = |share: Option<f32>| {
            let builder = patch_pipeline(patches, DType::F32, seed, Device::Cuda(0));
            patch_rows(match share {
                Some(share) => builder.decode(Decode::Hybrid).gpu_share(share),
                None => builder,
            })
        };
        for share in [Some(1.0), None] {
            let gpu = hybrid(share);
            let by_gpu: usize = gpu.iter().map(|r| r.6 .1).sum();
            assert_eq!(cpu.len(), gpu.len());
            let mut diffs = Vec::new();
            for (c, g) in cpu.iter().zip(&gpu) {
                assert_eq!(c.0, g.0, "ids");
                assert_eq!((&c.2, &c.3, &c.4, &c.5), (&g.2, &g.3, &g.4, &g.5), "plans");
                diffs.extend(
                    c.1.iter()
                        .zip(&g.1)
                        .map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs() * 255.0),
                );
            }
            let (mean, p999) = mean_and_p999(&mut diffs);
            println!(
                "{:?} share {share:?}: {by_gpu} images by the GPU lane, mean {mean:.3}, p99.9 \
                 {p999:.2} levels",
                patches.preset
            );
            if share.is_some() {
                assert!(by_gpu > 0, "the GPU lane decoded none");
                assert!(gpu == hybrid(share), "the same bits on every run");
            }
            assert!(mean <= 0.5 && p999 <= 3.0, "mean {mean:.3}, p99.9 {p999}");
        }
    }
}
